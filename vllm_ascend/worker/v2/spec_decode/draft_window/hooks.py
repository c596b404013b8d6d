"""The wrappers around vLLM's speculator methods, one per path that reads the draft's KV
(``lines.py`` says which methods each supported line has; ``install.py`` installs them).

- ``set_attn``: creates the speculator's window once, before any graph capture.
- ``_build_attn_metadata``: the choke point every draft metadata build goes through
  (``_build_uniform_attn_metadata`` forwards to it). Windows the inputs, then builds.
- ``_update_draft_decode_metadata``: the in-place update a FULL graph records; the window
  refresh (device ops into persistent buffers) is recorded with it.
- ``DFlashSpeculator.capture``: captures through the windowed views, so the graphs read
  the persistent windowed buffers that the two paths above refresh.

EAGLE/EAGLE3 (``TargetDependentARSpeculator``) also need:

- ``propose`` and ``_prefill``: the draft prefill reuses the target's metadata dict; the
  draft layers' entries are replaced by metadata built for the window through the draft's
  own builders (the target's objects are never touched).
- ``capture``: names the capture path, the one place a draft prefill runs outside
  ``propose`` (on the target's dummy metadata; its graphs are PIECEWISE at most).
- ``init_cudagraph_manager``: a FULL prefill graph would read the target's captured
  buffers, so the draft prefill runs without FULL graphs when the window is on; the decode
  graph manager is marked so that its capture goes through the windowed views
  (``SpeculatorCudaGraphManager.capture``).
- ``_fused_multi_step_decode``: its metadata serves every later draft step (refreshed in
  place each step), so its host bound covers them all.

On vllm-ascend (0.30.0rc2, ``AutoRegressiveSpeculator`` in vLLM 0.30) the same roles are
played by vLLM's ``propose``/``_prefill``/``init_cudagraph_manager`` and vllm-ascend's own
``capture`` and ``AutoRegressiveAclGraphManager.capture``; and vllm-ascend tells its kernel
host lengths of its own for each decode step (the target's length plus the step), so
``_calc_next_seq_lens_cpu`` and ``build_fia_params`` are wrapped to window those, and the
build takes the window start from the same told length on the device
(``Mrv2DraftWindow.refresh(told_step=...)``).

Each wrapper names its path on the window (``Mrv2DraftWindow.path``), so that the run-time
proof (``proof.py``) can check once per path that the builders received the window, and
name the path when they did not. With the window off each wrapper costs one attribute check.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from vllm.config.compilation import CUDAGraphMode
from vllm.logger import init_logger
from vllm.v1.attention.backends.utils import PAD_SLOT_ID

from vllm_ascend.worker.v2.spec_decode.draft_window.config import (
    KEY,
    SINKS_KEY,
    DraftWindowConfig,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.fused import enable_if_trusted
from vllm_ascend.worker.v2.spec_decode.draft_window.mrv2 import (
    Mrv2DraftWindow,
    block_table_units,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.policy import (
    decide_groups,
    describe_decisions,
    refuse_method,
    refuse_parallel_layout,
    refuse_told_length_paths,
    refuse_unproven_paths,
    told_bound_family,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.proof import (
    UPDATE_PATH,
    WindowNotInPathError,
    WindowProof,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.window import (
    align_sinks,
    lcm_alignment,
    window_seq_lens,
)

# A child of vLLM's "vllm" logger, so the lines reach vLLM's configured handler.
logger = init_logger("vllm.draft_window")

WINDOW_ATTR = "draft_window"
# A speculator whose set_attn never ran through the hook has no window attribute at all.
_UNSET = object()
# False once uninstalled: wrappers that another plugin's wrapper keeps in place (install.py)
# then make no window, and so change nothing.
ACTIVE = False
# The supported line installed (lines.py), set by install.py.
LINE: Any = None

# Path names, as the run-time proof reports them.
BUILD_PATH = "DraftModelSpeculator._build_attn_metadata"
DFLASH_CAPTURE_PATH = "DFlashSpeculator.capture"
AR_CAPTURE_PATH = "TargetDependentARSpeculator.capture"
# The installed line's names of the paths whose classes differ between lines (the draft
# prefill, the decode graph manager's capture), set as the hooks are made.
PATHS = {"prefill": "TargetDependentARSpeculator._prefill"}
# The speculators' own capture methods (their qualified names), which run a draft prefill
# outside propose.
AR_CAPTURE_PATHS = {AR_CAPTURE_PATH}

# Future offset per method. DFlash and DSpark seq_lens already count the query stretch.
# EAGLE windows every draft step afresh (a rebuild, or the in-place update recorded in the
# fused graph), so each device window serves only the step it is made for.
FUTURE_OFFSET = {"dflash": 0, "dspark": 0, "eagle": 0, "eagle3": 0}
# Drafts whose first pass is a prefill over the target's batch (any query length).
PREFILL_METHODS = frozenset({"eagle", "eagle3"})
# Drafts that read the target's own KV cache: a draft-only window does not apply.
SHARED_KV_METHODS = frozenset({"mtp"})


def create_draft_window(speculator: Any) -> Mrv2DraftWindow | None:
    """Validate the config against this speculator and build its window, or None (off)."""
    config = DraftWindowConfig.from_additional_config(speculator.vllm_config.additional_config)
    if not config.enabled:
        return None
    window_size = config.draft_window_size
    sink_tokens = config.draft_attention_sinks
    method = speculator.method
    if method in SHARED_KV_METHODS:
        logger.warning(
            "%s=%d%s is ignored for method %r: its draft layers share the target's KV "
            "cache and attention, which the window must not crop.",
            KEY,
            window_size,
            f" with {SINKS_KEY}={sink_tokens}" if sink_tokens else "",
            method,
        )
        return None
    refuse_method(method, LINE, window_size)
    # DFlash/DSpark query 1 + K tokens per request; EAGLE's prefill queries the verify chunk.
    query_stretch = speculator.num_speculative_steps + 1
    if window_size < query_stretch:
        raise ValueError(
            f"{KEY}={window_size} is smaller than the {query_stretch} query tokens "
            f"method {method!r} drafts per request (num_speculative_tokens + 1): the window "
            f"must hold the draft's own queries. Use {KEY} >= {query_stretch}."
        )
    if getattr(speculator.vllm_config.model_config, "is_mm_prefix_lm", False):
        raise ValueError(
            f"{KEY}={window_size} does not support prefix-LM multimodal targets: their "
            f"bidirectional image spans are placed in absolute positions that a cropped "
            f"draft table no longer uses. Remove {KEY} for this model."
        )
    refuse_parallel_layout(speculator.vllm_config.parallel_config, window_size)
    future_offset = FUTURE_OFFSET[method]
    decisions = decide_groups(speculator.kv_cache_config, speculator.attn_groups)
    refuse_unproven_paths(speculator, LINE, decisions, window_size)
    for decision in decisions:
        if decision.unknown:
            logger.warning(
                "%s: draft KV-cache group %d has a spec the window does not know (%s); it is "
                "left alone.",
                KEY,
                decision.group_id,
                decision.spec_kind,
            )
    draft_group_ids = [d.group_id for d in decisions if d.windowed]
    if not draft_group_ids:
        logger.warning(
            "%s=%d: no draft KV-cache group is one the window applies to, so the draft "
            "window stays off; %s.",
            KEY,
            window_size,
            describe_decisions(decisions),
        )
        return None
    units = block_table_units(speculator.block_tables)
    alignment = lcm_alignment([int(units[g]) for g in draft_group_ids])
    sink_size = align_sinks(sink_tokens, alignment)
    max_model_len = speculator.max_model_len
    # A read leaves tokens out once start > S, which needs L + K - W >= S + a for some
    # L <= max_model_len.
    if max_model_len + future_offset - window_size - sink_size < alignment:
        logger.info(
            "%s=%d%s never crops with max_model_len=%d (the window start moves in steps of "
            "%d tokens); the draft window stays off.",
            KEY,
            window_size,
            f" with {sink_size} attention sinks" if sink_size else "",
            max_model_len,
            alignment,
        )
        return None
    window = Mrv2DraftWindow(
        window_size=window_size,
        future_offset=future_offset,
        input_buffers=speculator.input_buffers,
        block_tables=speculator.block_tables,
        draft_group_ids=draft_group_ids,
        max_num_reqs=speculator.max_num_reqs,
        device=speculator.device,
        # DFlash queries its stretch every step; an EAGLE decode step one token, and its
        # draft prefill whole target chunks.
        max_query_len=1 if method in PREFILL_METHODS else query_stretch,
        max_chunk_len=speculator.max_num_tokens if method in PREFILL_METHODS else None,
        attention_sinks=sink_size,
    )
    if method == "dspark" and _target_is_deepseek_v4(speculator):
        logger.warning(
            "%s=%d with a DeepSeek-V4 target: its DSpark draft is trained with the target "
            "for long context, and a window may lower acceptance. The window stays on.",
            KEY,
            window_size,
        )
    logger.info(
        "Draft KV window on for %s: %s=%d%s, the draft reads at most %d tokens per request%s; "
        "block sizes per KV-cache group %s, alignment %d, future offset %d%s.",
        method,
        KEY,
        window_size,
        _sinks_phrase(sink_tokens, sink_size, alignment),
        window.spec.max_read_len,
        # A draft prefill keeps a whole query chunk longer than the window (window.py).
        f" (a draft prefill chunk longer than the window: the chunk and at most "
        f"{sink_size + alignment - 1} more)"
        if method in PREFILL_METHODS
        else "",
        window.group_block_sizes,
        window.spec.alignment,
        future_offset,
        "" if all(d.windowed for d in decisions) else f"; {describe_decisions(decisions)}",
    )
    window.leave_groups_alone(
        speculator.attn_groups, [d.group_id for d in decisions if not d.windowed]
    )
    mla = any(
        group.backend.__name__ == "AscendMLABackend"
        for d in decisions if d.windowed for group in speculator.attn_groups[d.group_id]
    )  # fmt: skip
    # Where vllm-ascend's kernel takes the host bound plus the query stretch as the exact
    # length: DSpark's FIA on GLM-family targets (its MLA drafts take an exact copy
    # instead, windowed by _exact_host_lengths), DFlash's MLA.
    glm_dspark = method == "dspark" and not mla and told_bound_family(speculator, LINE)
    if glm_dspark or (method == "dflash" and mla):
        window.told_source = speculator.target_input_buffers.seq_lens
        window.max_model_len = max_model_len
        window.told_bound = True
    if method in PREFILL_METHODS and LINE.ar_told_target_lengths:
        # vllm-ascend's EAGLE decode tells the kernel the target's length plus the step.
        if getattr(speculator, "use_fused_multi_step_decode", False):
            raise ValueError(
                f"{KEY}={window_size} is not supported on {LINE.name} with the fused "
                f"multi-step draft decode (a draft attention backend that updates its "
                f"metadata in place): vllm-ascend's host lengths are written per step. "
                f"Remove {KEY}."
            )
        window.told_source = speculator.target_input_buffers.seq_lens
        window.max_model_len = max_model_len
    if window.told_source is not None:
        refuse_told_length_paths(speculator, LINE, decisions, window_size,
                                 per_step=method in PREFILL_METHODS)  # fmt: skip
    window.proof = WindowProof(speculator, window)
    enable_if_trusted(window, logger, KEY)
    return window


def window_of(speculator: Any) -> Mrv2DraftWindow | None:
    """The speculator's window, None when off.

    Before ``set_attn`` there is none yet. A speculator whose ``set_attn`` ran but not
    through the hook (a subclass that overrides it without ``super()``) has none: with the
    window asked for, that is an error, never a silent unwindowed draft.
    """
    window = getattr(speculator, WINDOW_ATTR, _UNSET)
    if window is not _UNSET:
        return window
    if "kv_cache_config" not in vars(speculator):
        # set_attn has not run yet (vLLM's profiling run proposes before the KV cache
        # exists): no window yet, and nothing decided.
        return None
    vllm_config = getattr(speculator, "vllm_config", None)
    additional = getattr(vllm_config, "additional_config", None)
    if ACTIVE and DraftWindowConfig.from_additional_config(additional).enabled:
        raise WindowNotInPathError(
            f"draft window not in the path: {type(speculator).__name__}.set_attn did not "
            f"run through the window's hook (an override of DraftModelSpeculator.set_attn "
            f"without super()?), so its draft has no window although {KEY} is set. Windowing "
            f"it is not supported: remove {KEY}, or report the path."
        )
    setattr(speculator, WINDOW_ATTR, None)
    return None


def _sinks_phrase(sink_tokens: int, sink_size: int, alignment: int) -> str:
    if not sink_size:
        return ""
    if sink_size == sink_tokens:
        return f" with the first {sink_size} tokens as attention sinks"
    return (
        f" with the first {sink_size} tokens as attention sinks ({SINKS_KEY}={sink_tokens} "
        f"rounded up to the alignment {alignment})"
    )


def _target_is_deepseek_v4(speculator: Any) -> bool:
    hf_config = getattr(speculator.vllm_config.model_config, "hf_config", None)
    return str(getattr(hf_config, "model_type", "")).startswith("deepseek_v4")


def _set_attn(original: Callable) -> Callable:
    @functools.wraps(original)
    def set_attn(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        setattr(self, WINDOW_ATTR, create_draft_window(self) if ACTIVE else None)

    return set_attn


def _build_attn_metadata(original: Callable) -> Callable:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def build_attn_metadata(self, *args: Any, **kwargs: Any) -> Any:
        window = window_of(self)
        if window is None:
            return original(self, *args, **kwargs)
        window.num_builds += 1
        if window.num_builds == 1:
            logger.info("Draft KV window active: the first draft metadata build is windowed.")
        bound = signature.bind(self, *args, **kwargs)
        arguments = bound.arguments
        num_reqs = arguments["num_reqs"]
        step = arguments["step"]
        told = window.told_source is not None and step > 0
        window.refresh(arguments["batch_desc"].num_reqs or num_reqs,
                       told_step=step if told else None)  # fmt: skip
        if window.told_bound:
            arguments["seq_lens_cpu_upper_bound"] = window.told_host_bound(
                arguments["seq_lens_cpu_upper_bound"], num_reqs, step
            )
        else:
            arguments["seq_lens_cpu_upper_bound"] = window.host_upper_bound(
                arguments["seq_lens_cpu_upper_bound"], num_reqs, step,
                extra_steps=window.host_extra_steps,
            )  # fmt: skip
        with window.swapped_into(self, BUILD_PATH, window.windowed_attn_groups):
            metadata = original(*bound.args, **bound.kwargs)
        if window.left_alone_attn_groups is None:
            return metadata
        # The groups the window leaves alone: vLLM's own build from vLLM's own inputs.
        with window.left_alone_only(self):
            left_alone = original(self, *args, **kwargs)
        if metadata is None:
            return left_alone
        metadata.update(left_alone or {})
        return metadata

    return build_attn_metadata


def _update_draft_decode_metadata(original: Callable) -> Callable:
    @functools.wraps(original)
    def update_draft_decode_metadata(self, attn_metadata: Any, num_reqs: int) -> None:
        window = window_of(self)
        if window is None:
            return original(self, attn_metadata, num_reqs)
        window.refresh(num_reqs)
        # A backend with smaller kernel blocks reads a kernel-block table that only a
        # build maps; the update skips the build, so map the refreshed windows here
        # (a write into the group's persistent table, fit for recording in a graph).
        for g, cropped in window.windows.items():
            for group in self.attn_groups[g]:
                if group.kernel_block_size is not None:
                    group.map_to_kernel_block_table(cropped.block_table[:num_reqs])
        with window.on_path(UPDATE_PATH):
            original(self, attn_metadata, num_reqs)

    return update_draft_decode_metadata


def _capture(original: Callable) -> Callable:
    @functools.wraps(original)
    def capture(self) -> None:
        window = window_of(self)
        if window is None:
            return original(self)
        window.proof.capture_on(DFLASH_CAPTURE_PATH)
        with window.swapped_into(self, DFLASH_CAPTURE_PATH):
            return original(self)

    return capture


def _propose(original: Callable) -> Callable:
    @functools.wraps(original)
    def propose(self, input_batch: Any, *args: Any, **kwargs: Any) -> Any:
        window = window_of(self)
        if window is None:
            return original(self, input_batch, *args, **kwargs)
        # The draft prefill builds its windowed metadata from the target's batch.
        window.prefill_batch = input_batch
        window.prefill_windowed = False
        try:
            drafts = original(self, input_batch, *args, **kwargs)
        finally:
            window.prefill_batch = None
        target_metadata = kwargs["attn_metadata"] if "attn_metadata" in kwargs else args[0]
        # The draft prefill reads the target's metadata unless the _prefill hook replaced
        # the draft layers' entries: a subclass that overrides _prefill without super()
        # would have the draft read its whole context.
        if target_metadata is not None and not window.prefill_windowed:
            raise WindowNotInPathError(
                f"draft window not in the path: {type(self).__name__}.propose ran its draft "
                f"prefill without the window's hook {PATHS['prefill']} (an override without "
                f"super()?), so the draft prefill read the target's unwindowed metadata. "
                f"Windowing it is not supported: remove {KEY}, or report the path."
            )
        return drafts

    return propose


def _prefill(original: Callable) -> Callable:
    signature = inspect.signature(original)
    PATHS["prefill"] = original.__qualname__

    @functools.wraps(original)
    def prefill(self, *args: Any, **kwargs: Any) -> Any:
        window = window_of(self)
        if window is None:
            return original(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        target_metadata = bound.arguments["attn_metadata"]
        if target_metadata is None:
            window.prefill_windowed = True  # no metadata: the draft reads nothing
            return original(*bound.args, **bound.kwargs)
        if window.prefill_batch is None:
            # Only a graph capture runs the prefill outside propose; it builds its dummy
            # metadata through the target's builders, and the prefill graphs it records
            # are PIECEWISE at most (_init_cudagraph_manager), so attention runs eagerly.
            if not AR_CAPTURE_PATHS.intersection(window.path):
                raise WindowNotInPathError(
                    f"draft window not in the path: {type(self).__name__}._prefill ran with "
                    f"the target's metadata outside the window's propose hook (an override "
                    f"of propose without super()?), so the draft prefill would read the "
                    f"target's unwindowed metadata. Windowing it is not supported: remove "
                    f"{KEY}, or report the path."
                )
            return original(*bound.args, **bound.kwargs)
        window.prefill_windowed = True
        batch = window.prefill_batch
        draft_metadata = windowed_prefill_metadata(self, window, batch)
        bound.arguments["attn_metadata"] = {**target_metadata, **draft_metadata}
        # Without FULL prefill graphs a PIECEWISE prefill may pad past the target's padded
        # token count; those slots must write nowhere (a graph may record the KV write).
        slot_mappings = self.block_tables.slot_mappings
        slot_mappings[:, batch.num_tokens_after_padding : bound.arguments["num_tokens"]].fill_(
            PAD_SLOT_ID
        )
        return original(*bound.args, **bound.kwargs)

    return prefill


def windowed_prefill_metadata(speculator: Any, window: Mrv2DraftWindow, batch: Any) -> dict:
    """The draft layers' prefill metadata: the target's batch, read through the window.

    Built by vLLM's own ``ModelState.prepare_attn`` with the draft's attention groups, as
    the target runner builds the target's (eager/PIECEWISE sizes), from the windowed
    ``seq_lens`` of the target's lengths and the cropped tables.
    """
    n = batch.num_reqs
    window.refresh(n, seq_lens=batch.seq_lens, query_start_loc=batch.query_start_loc)
    query_lens_cpu = torch.from_numpy(np.diff(batch.query_start_loc_np[: n + 1]))
    bound = window.host_upper_bound(batch.seq_lens_cpu_upper_bound, n, 0, query_lens_cpu)[:n]
    # NOTE: vLLM keeps the host bound exact for prefill rows, and builders (MLA) rely on it
    # (context = bound - q); there the same windowing applied to the exact host length
    # gives the exact windowed length.
    prefilling = torch.from_numpy(batch.is_prefilling_np[:n])
    if bool(prefilling.any()):
        windowed = _window_exact(window, batch.seq_lens_cpu_upper_bound[:n], query_lens_cpu)
        bound[prefilling] = windowed[prefilling]
    changes: dict[str, Any] = {"seq_lens": window.seq_lens[:n], "seq_lens_cpu_upper_bound": bound}
    fields = {f.name for f in dataclasses.fields(batch)}
    if "prompt_lens" in fields:
        # Prompt lengths feed the target's restricted-SWA prefix, in absolute positions
        # the cropped tables no longer use; draft layers have no such prefix.
        changes["prompt_lens"] = None
    seq_lens_np = getattr(batch, "seq_lens_np", None)
    if seq_lens_np is not None:
        # vllm-ascend's exact host mirror of the target's lengths, which its kernel takes
        # as the exact lengths: windowed by the device's arithmetic (the mirror is exact).
        exact = torch.from_numpy(np.ascontiguousarray(seq_lens_np[:n], dtype=np.int32))
        changes["seq_lens_np"] = _window_exact(window, exact, query_lens_cpu).numpy()
    windowed_batch = dataclasses.replace(batch, **changes)
    block_tables = tuple(t[:n] for t in window.block_tables.input_block_tables)
    model_state = speculator.model_state
    # The model state may keep what it built (vllm-ascend keeps the target's metadata for
    # its graph replays, and takes its max_seq_len from max_model_len): the draft's
    # build leaves every attribute as it was.
    kept = dict(vars(model_state))
    if isinstance(kept.get("max_model_len"), int) and n:
        model_state.max_model_len = min(kept["max_model_len"], int(bound.max()))
    try:
        with window.on_path(PATHS["prefill"]):
            return model_state.prepare_attn(
                windowed_batch,
                CUDAGraphMode.NONE,
                block_tables,
                speculator.block_tables.slot_mappings[:, : batch.num_tokens],
                # The groups the window leaves alone keep the target's metadata (_prefill).
                window.windowed_attn_groups or speculator.attn_groups,
                speculator.kv_cache_config,
            )
    finally:
        for name in set(vars(model_state)) - set(kept):
            delattr(model_state, name)
        vars(model_state).update(kept)
        # The prefill's metadata holds the wide tables; everything else (decode builds, a
        # graph capture's dummy tables) reads the per-step ones.
        window.block_tables.windows = window.windows


def _window_exact(window: Mrv2DraftWindow, exact: torch.Tensor, query_lens: torch.Tensor):
    """Exact host lengths of a multi-token pass, windowed by the device's arithmetic."""
    windowed = torch.empty_like(exact)
    window_seq_lens(exact, window.spec, skip_out=torch.empty_like(exact), out=windowed,
                    query_lens=query_lens.to(exact.dtype))  # fmt: skip
    return windowed


def _ar_capture(original: Callable) -> Callable:
    path = original.__qualname__
    AR_CAPTURE_PATHS.add(path)

    @functools.wraps(original)
    def capture(self) -> None:
        window = window_of(self)
        if window is None:
            return original(self)
        with window.on_path(path):
            return original(self)

    return capture


def _told_host_lengths(original: Callable) -> Callable:
    """vllm-ascend's EAGLE decode: the host lengths its kernel takes for a draft step
    (``seq_lens_list``, ``seq_lens_cpu``), windowed like the device side of the same step."""

    @functools.wraps(original)
    def calc_next_seq_lens_cpu(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        lengths = original(self, *args, **kwargs)
        window = window_of(self)
        if window is None:
            return lengths
        return window.window_host_lengths(lengths)

    return calc_next_seq_lens_cpu


def _exact_host_lengths(original: Callable) -> Callable:
    """vllm-ascend's DSpark on MLA: the exact host copy of the draft's device lengths its
    kernel takes, windowed by the device's arithmetic (the copy is exact, so the start is
    the device's)."""

    @functools.wraps(original)
    def prepare_draft_dcp_metadata_inputs(self, *args: Any, **kwargs: Any) -> Any:
        seq_lens_cpu, is_prefilling = original(self, *args, **kwargs)
        window = window_of(self)
        if window is not None and seq_lens_cpu is not None:
            window.window_host_lengths(seq_lens_cpu)
        return seq_lens_cpu, is_prefilling

    return prepare_draft_dcp_metadata_inputs


def _fia_params(original: Callable) -> Callable:
    """vllm-ascend's EAGLE FULL-graph replay: the per-step ``actual_seq_lengths_kv`` it
    hands the captured kernel, windowed like the device side of each recorded step."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def build_fia_params(self, *args: Any, **kwargs: Any) -> list:
        params = original(self, *args, **kwargs)
        window = window_of(self)
        if window is None:
            return params
        if signature.bind(self, *args, **kwargs).arguments["is_draft_model_prefill"]:
            # Only a FULL draft-prefill graph replays with these; the window runs the draft
            # prefill without one (_init_cudagraph_manager).
            raise WindowNotInPathError(
                f"draft window not in the path: {type(self).__name__}.build_fia_params was "
                f"asked for a FULL draft-prefill graph, which reads the target's unwindowed "
                f"metadata; the window runs the draft prefill without FULL graphs. Remove "
                f"{KEY}, or report the path."
            )
        # vllm-ascend hands every layer of a step the same list: window each list once (the
        # entry keeps the list alive, so its id is not reused meanwhile).
        windowed: dict[int, tuple[list[int], list[int]]] = {}
        for param in params:
            told = param["actual_seq_lengths_kv"]
            if id(told) not in windowed:
                lengths = torch.tensor(told, dtype=torch.int32)
                windowed[id(told)] = (told, window.window_host_lengths(lengths).tolist())
            param["actual_seq_lengths_kv"] = windowed[id(told)][1]
        return params

    return build_fia_params


def _init_cudagraph_manager(original: Callable) -> Callable:
    """A FULL prefill graph would read the target's captured metadata, so with the window on
    the draft prefill's graph manager is made without FULL graphs. vLLM makes both managers
    here, from the graph manager class its speculator module names (which vllm-ascend
    replaces with its own); the prefill manager (``decode_query_len > 1``) is made with the
    lowered mode in the first place: a second manager made afterwards would repeat the
    first's start-up work, which vllm-ascend's refuses to do twice."""
    module = sys.modules[original.__module__]

    @functools.wraps(original)
    def init_cudagraph_manager(self, cudagraph_mode: CUDAGraphMode) -> None:
        window = window_of(self)
        if window is None or not cudagraph_mode.has_full_cudagraphs():
            original(self, cudagraph_mode)
            if window is not None and self.decode_cudagraph_manager is not None:
                setattr(self.decode_cudagraph_manager, WINDOW_ATTR, window)
            return
        prefill_mode = (
            CUDAGraphMode.PIECEWISE
            if cudagraph_mode.has_piecewise_cudagraphs()
            else CUDAGraphMode.NONE
        )
        manager_cls = module.SpeculatorCudaGraphManager
        parameters = inspect.signature(manager_cls).parameters

        def make_manager(*args: Any, **kwargs: Any) -> Any:
            bound = inspect.Signature(list(parameters.values())).bind(*args, **kwargs)
            if bound.arguments["decode_query_len"] > 1:
                bound.arguments["cudagraph_mode"] = prefill_mode
            return manager_cls(*bound.args, **bound.kwargs)

        module.SpeculatorCudaGraphManager = make_manager
        try:
            original(self, cudagraph_mode)
        finally:
            module.SpeculatorCudaGraphManager = manager_cls
        logger.info(
            "%s: the draft prefill runs with cudagraph mode %s instead of %s, so that its "
            "metadata is built for the window at every step.",
            KEY,
            prefill_mode.name,
            cudagraph_mode.name,
        )
        if self.decode_cudagraph_manager is not None:
            setattr(self.decode_cudagraph_manager, WINDOW_ATTR, window)

    return init_cudagraph_manager


def _manager_capture(original: Callable) -> Callable:
    signature = inspect.signature(original)
    path = original.__qualname__

    @functools.wraps(original)
    def capture(self, *args: Any, **kwargs: Any) -> None:
        window: Mrv2DraftWindow | None = getattr(self, WINDOW_ATTR, None)
        if window is None:
            return original(self, *args, **kwargs)
        # The decode graphs record the persistent windowed buffers.
        bound = signature.bind(self, *args, **kwargs)
        bound.arguments["input_buffers"] = window.input_buffers
        bound.arguments["block_tables"] = window.block_tables
        window.proof.capture_on(path)
        with window.on_path(path):
            return original(*bound.args, **bound.kwargs)

    return capture


def _fused_multi_step_decode(original: Callable) -> Callable:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def fused_multi_step_decode(self, *args: Any, **kwargs: Any) -> None:
        window = window_of(self)
        if window is None:
            return original(self, *args, **kwargs)
        steps = signature.bind(self, *args, **kwargs).arguments["num_speculative_steps"]
        # Built at step 1, the metadata serves steps 1 .. steps - 1.
        window.host_extra_steps = max(steps - 2, 0)
        try:
            return original(self, *args, **kwargs)
        finally:
            window.host_extra_steps = 0

    return fused_multi_step_decode


# The factories by the names ``lines.py`` gives them.
WRAPPERS: dict[str, Callable[[Callable], Callable]] = {
    "set_attn": _set_attn,
    "build_attn_metadata": _build_attn_metadata,
    "update_draft_decode_metadata": _update_draft_decode_metadata,
    "capture": _capture,
    "propose": _propose,
    "ar_capture": _ar_capture,
    "told_host_lengths": _told_host_lengths,
    "fia_params": _fia_params,
    "exact_host_lengths": _exact_host_lengths,
    "prefill": _prefill,
    "init_cudagraph_manager": _init_cudagraph_manager,
    "manager_capture": _manager_capture,
    "fused_multi_step_decode": _fused_multi_step_decode,
}
