"""The wrappers around vLLM 0.33.0's speculator methods, one per path that reads the
draft's KV, and their installation.

- ``set_attn``: creates the speculator's window once, before any graph capture.
- ``_build_attn_metadata``: the choke point every draft metadata build goes through
  (``_build_uniform_attn_metadata`` forwards to it). Windows the inputs, then builds.
- ``_update_draft_decode_metadata``: the in-place update a FULL graph records; the window
  refresh (device ops into persistent buffers) is recorded with it.
- ``DFlashSpeculator.capture``: captures through the windowed views, so the graphs read
  the persistent windowed buffers that the two paths above refresh.

With the window off each wrapper costs one attribute check.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from vllm.logger import init_logger

from vllm_ascend.worker.v2.spec_decode.draft_window.config import KEY, DraftWindowConfig
from vllm_ascend.worker.v2.spec_decode.draft_window.mrv2 import (
    Mrv2DraftWindow,
    block_table_units,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.window import lcm_alignment

logger = init_logger(__name__)

WINDOW_ATTR = "draft_window"
_WRAPPED_MARK = "__draft_window_wraps__"

# Future offset per method: DFlash and DSpark seq_lens already count the query stretch.
FUTURE_OFFSET = {"dflash": 0, "dspark": 0}
# Drafts that read the target's own KV cache: a draft-only window does not apply.
SHARED_KV_METHODS = frozenset({"mtp"})


def create_draft_window(speculator: Any) -> Mrv2DraftWindow | None:
    """Validate the config against this speculator and build its window, or None (off)."""
    config = DraftWindowConfig.from_additional_config(speculator.vllm_config.additional_config)
    if not config.enabled:
        return None
    window_size = config.draft_window_size
    method = speculator.method
    if method in SHARED_KV_METHODS:
        logger.warning(
            "%s=%d is ignored for method %r: its draft layers share the target's KV cache "
            "and attention, which the window must not crop.",
            KEY,
            window_size,
            method,
        )
        return None
    if method not in FUTURE_OFFSET:
        raise ValueError(
            f"{KEY}={window_size} is not supported on Model Runner V2 for speculative "
            f"method {method!r}; supported: {', '.join(sorted(FUTURE_OFFSET))}. Remove "
            f"{KEY} from additional_config or use one of those methods."
        )
    num_query_per_req = speculator.num_query_per_req
    if window_size < num_query_per_req:
        raise ValueError(
            f"{KEY}={window_size} is smaller than the {num_query_per_req} query tokens "
            f"method {method!r} drafts per request (num_speculative_tokens + 1): the window "
            f"must hold the draft's own queries. Use {KEY} >= {num_query_per_req}."
        )
    if speculator.dcp_size > 1:
        raise ValueError(
            f"{KEY}={window_size} does not support decode context parallelism "
            f"(decode_context_parallel_size={speculator.dcp_size}): each rank holds an "
            f"interleaved shard of the KV, which one block-aligned window cannot crop. "
            f"Use decode_context_parallel_size=1 or remove {KEY}."
        )
    future_offset = FUTURE_OFFSET[method]
    draft_group_ids = [g for g, groups in enumerate(speculator.attn_groups) if groups]
    units = block_table_units(speculator.block_tables)
    alignment = lcm_alignment([int(units[g]) for g in draft_group_ids])
    max_model_len = speculator.max_model_len
    # start > 0 needs L + K - W >= a for some L <= max_model_len.
    if max_model_len + future_offset - window_size < alignment:
        logger.info(
            "%s=%d never crops with max_model_len=%d (the window start moves in steps of "
            "%d tokens); the draft window stays off.",
            KEY,
            window_size,
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
    )
    if method == "dspark" and _target_is_deepseek_v4(speculator):
        logger.warning(
            "%s=%d with a DeepSeek-V4 target: its DSpark draft is trained with the target "
            "for long context, and a window may lower acceptance. The window stays on.",
            KEY,
            window_size,
        )
    logger.info(
        "Draft KV window on for %s: %s=%d, the draft reads at most %d tokens per request; "
        "block sizes per KV-cache group %s, alignment %d, future offset %d.",
        method,
        KEY,
        window_size,
        window.spec.max_read_len,
        window.group_block_sizes,
        window.spec.alignment,
        future_offset,
    )
    return window


def _target_is_deepseek_v4(speculator: Any) -> bool:
    hf_config = getattr(speculator.vllm_config.model_config, "hf_config", None)
    return str(getattr(hf_config, "model_type", "")).startswith("deepseek_v4")


def _set_attn(original: Callable) -> Callable:
    @functools.wraps(original)
    def set_attn(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        setattr(self, WINDOW_ATTR, create_draft_window(self))

    return set_attn


def _build_attn_metadata(original: Callable) -> Callable:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def build_attn_metadata(self, *args: Any, **kwargs: Any) -> Any:
        window: Mrv2DraftWindow | None = getattr(self, WINDOW_ATTR)
        if window is None:
            return original(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        arguments = bound.arguments
        num_reqs = arguments["num_reqs"]
        window.refresh(arguments["batch_desc"].num_reqs or num_reqs)
        arguments["seq_lens_cpu_upper_bound"] = window.host_upper_bound(
            arguments["seq_lens_cpu_upper_bound"], num_reqs, arguments["step"]
        )
        with window.swapped_into(self):
            return original(*bound.args, **bound.kwargs)

    return build_attn_metadata


def _update_draft_decode_metadata(original: Callable) -> Callable:
    @functools.wraps(original)
    def update_draft_decode_metadata(self, attn_metadata: Any, num_reqs: int) -> None:
        window: Mrv2DraftWindow | None = getattr(self, WINDOW_ATTR)
        if window is not None:
            window.refresh(num_reqs)
            # A backend with smaller kernel blocks reads a kernel-block table that only a
            # build maps; the update skips the build, so map the refreshed windows here
            # (a write into the group's persistent table, fit for recording in a graph).
            for g, cropped in window.windows.items():
                for group in self.attn_groups[g]:
                    if group.kernel_block_size is not None:
                        group.map_to_kernel_block_table(cropped.block_table[:num_reqs])
        original(self, attn_metadata, num_reqs)

    return update_draft_decode_metadata


def _capture(original: Callable) -> Callable:
    @functools.wraps(original)
    def capture(self) -> None:
        window: Mrv2DraftWindow | None = getattr(self, WINDOW_ATTR)
        if window is None:
            return original(self)
        with window.swapped_into(self):
            return original(self)

    return capture


def _targets() -> list[tuple[type, str, Callable, tuple[str, ...]]]:
    """(class, method, wrapper factory, parameters the wrapper relies on)."""
    from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    return [
        (DraftModelSpeculator, "set_attn", _set_attn,
         ("model_state", "kv_cache_config", "block_tables", "target_input_buffers",
          "target_attn_groups")),
        (DraftModelSpeculator, "_build_attn_metadata", _build_attn_metadata,
         ("num_reqs", "batch_desc", "query_start_loc_np", "seq_lens_cpu_upper_bound", "step")),
        (DraftModelSpeculator, "_update_draft_decode_metadata", _update_draft_decode_metadata,
         ("attn_metadata", "num_reqs")),
        (DFlashSpeculator, "capture", _capture, ()),
    ]  # fmt: skip


def install() -> None:
    """Wrap the speculator methods once; a second call changes nothing."""
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    targets = _targets()
    for cls, name, _, required in targets:
        method = cls.__dict__.get(name)
        if method is None:
            raise RuntimeError(
                f"draft window: vLLM's {cls.__name__} has no method {name!r} to hook; this "
                f"project supports vLLM 0.33.x. Remove {KEY} or install vLLM 0.33."
            )
        original = getattr(method, _WRAPPED_MARK, method)
        missing = [p for p in required if p not in inspect.signature(original).parameters]
        if missing:
            raise RuntimeError(
                f"draft window: vLLM's {cls.__name__}.{name} no longer takes {missing}; this "
                f"project supports vLLM 0.33.x. Remove {KEY} or install vLLM 0.33."
            )
    if not hasattr(DraftModelSpeculator, WINDOW_ATTR):
        setattr(DraftModelSpeculator, WINDOW_ATTR, None)
    for cls, name, wrap, _ in targets:
        method = cls.__dict__[name]
        if hasattr(method, _WRAPPED_MARK):
            continue
        wrapper = wrap(method)
        setattr(wrapper, _WRAPPED_MARK, method)
        setattr(cls, name, wrapper)


def uninstall() -> None:
    """Put vLLM's own methods back (for tests that compare with and without the project)."""
    for cls, name, _, _ in _targets():
        method = cls.__dict__.get(name)
        if method is not None and hasattr(method, _WRAPPED_MARK):
            setattr(cls, name, getattr(method, _WRAPPED_MARK))
