# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""vLLM's ``DraftModelSpeculator`` (``spec_decode/speculator.py``, alike on both releases), the
base every family builds through:

- ``set_attn`` makes each speculator's window once, before any graph capture:
  settings -> plan -> window -> path check (``create_draft_window``);
- ``_build_attn_metadata`` (``_build_draft_attn_metadata`` on vLLM 0.29): the choke point
  every draft metadata build goes through (``_build_uniform_attn_metadata`` forwards to it),
  an EAGLE decode step's build too: windows the inputs, then builds;
- ``_update_draft_decode_metadata`` (vLLM 0.33): the in-place update a FULL graph records;
  the window's refresh (device ops into persistent buffers) is recorded with it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from vllm_ascend.worker.v2.spec_decode.draft_window import plan as planning
from vllm_ascend.worker.v2.spec_decode.draft_window.config import (
    KEY,
    MIN_CONTEXT_KEY,
    SINKS_KEY,
    DraftWindowConfig,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.fused_check import enable_if_trusted
from vllm_ascend.worker.v2.spec_decode.draft_window.groups import describe_decisions
from vllm_ascend.worker.v2.spec_decode.draft_window.hooks.common import (
    WINDOW_ATTR,
    Installed,
    around,
    propose_state,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.log import logger
from vllm_ascend.worker.v2.spec_decode.draft_window.mrv2 import Mrv2DraftWindow
from vllm_ascend.worker.v2.spec_decode.draft_window.path_check import UPDATE_PATH, PathCheck
from vllm_ascend.worker.v2.spec_decode.draft_window.release import Release


def create_draft_window(speculator: Any, release: Release) -> Mrv2DraftWindow | None:
    """The speculator's window on ``release``, or None (off): the settings validated, the
    plan made against the speculator, the window built from it, its builders watched."""
    config = DraftWindowConfig.from_additional_config(speculator.vllm_config.additional_config)
    if not config.enabled:
        return None
    plan = planning.plan(speculator, config, release)
    if plan is None:
        return None
    window = Mrv2DraftWindow(
        plan,
        speculator.input_buffers,
        speculator.block_tables,
        speculator.max_num_reqs,
        speculator.device,
        attn_groups=speculator.attn_groups,
        host_mirror=release.host_mirror,
    )
    window.path_check = PathCheck(window, speculator, release)
    _say_on(speculator.method, window)
    enable_if_trusted(window, logger, KEY)
    return window


def _say_on(method: str, window: Mrv2DraftWindow) -> None:
    """The one start-up line: what the window will do."""
    spec, plan = window.spec, window.plan
    sinks = ""
    if spec.sink_size:
        sinks = f" with the first {spec.sink_size} tokens as attention sinks"
        if spec.sink_size != plan.sink_tokens:
            sinks += (
                f" ({SINKS_KEY}={plan.sink_tokens} rounded up to the alignment {spec.alignment})"
            )
    # A draft prefill keeps a whole query chunk longer than the window (window.py).
    chunk = ""
    if plan.max_chunk_len is not None:
        chunk = (
            f" (a draft prefill chunk longer than the window: the chunk and at most "
            f"{spec.sink_size + spec.alignment - 1} more)"
        )
    engaged = ""
    if spec.min_context:
        engaged = (
            f", from a context of {spec.min_context} tokens on ({MIN_CONTEXT_KEY}; "
            f"shorter contexts read whole)"
        )
    groups = ""
    if plan.unwindowed_group_ids:
        groups = f"; {describe_decisions(plan.decisions)}"
    per_rank, units = "", "block sizes"
    if window.dcp is not None:
        # A rank reads its share of the window: at most this, the first rank's share.
        per_rank = (
            f", about {spec.max_read_len // window.dcp.cp_size} per rank (at most "
            f"{window.dcp.local_len(spec.max_read_len)} on one rank of "
            f"{window.dcp.describe()})"
        )
        units = "tokens per table column (a sharded table's column spans every rank)"
    logger.info(
        "Draft KV window on for %s: %s=%d%s%s, the draft reads at most %d tokens "
        "per request%s%s; %s per KV-cache group %s, alignment %d%s.",
        method,
        KEY,
        spec.window_size,
        sinks,
        engaged,
        spec.max_read_len,
        per_rank,
        chunk,
        units,
        window.group_block_sizes,
        spec.alignment,
        groups,
    )


def set_attn(original: Callable, installed: Installed) -> Callable:
    """``DraftModelSpeculator.set_attn``: vLLM's own, then the speculator's window."""

    @functools.wraps(original)
    def wrapper(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        window = create_draft_window(self, installed.release) if installed.active else None
        setattr(self, WINDOW_ATTR, window)

    return wrapper


def build_attn_metadata(original: Callable, installed: Installed) -> Callable:
    """``DraftModelSpeculator._build_attn_metadata`` (``_build_draft_attn_metadata`` on vLLM
    0.29): the window refreshed (its start from the
    kernel's actual lengths, where the release computes them on the host), the host bound
    windowed, then vLLM's build through the windowed views; the groups not windowed get
    vLLM's own build."""
    signature = inspect.signature(original)
    path = original.__qualname__

    def body(self: Any, window: Mrv2DraftWindow, *args: Any, **kwargs: Any) -> Any:
        state = propose_state(self)
        state.num_builds += 1
        if state.num_builds == 1:
            logger.info("Draft KV window active: the first draft metadata build is windowed.")
        bound = signature.bind(self, *args, **kwargs)
        arguments = bound.arguments
        num_reqs, step = arguments["num_reqs"], arguments["step"]
        # The padded batch: vLLM 0.30 and later pass a batch descriptor, 0.29 the count.
        desc = arguments.get("batch_desc")
        num_reqs_padded = (desc.num_reqs or num_reqs) if desc else arguments["num_reqs_padded"]
        host_bound = arguments["seq_lens_cpu_upper_bound"]
        chunk = _chunk_query_lens(window, arguments.get("query_start_loc_np"), num_reqs)
        if chunk is not None:
            # A pass over query chunks (a draft model's prefill): each chunk stays whole in
            # its window, read through the wider tables.
            window.refresh(num_reqs_padded, query_start_loc=self.input_buffers.query_start_loc)
            host_bound = window.host_upper_bound(host_bound, num_reqs, step, chunk)
        else:
            actual = window.actual is not None and step > 0
            window.refresh(num_reqs_padded, actual_step=step if actual else None)
            if window.actual is not None and window.actual.from_bound:
                host_bound = window.actual_host_bound(host_bound, num_reqs, step)
            else:
                host_bound = window.host_upper_bound(
                    host_bound, num_reqs, step, extra_steps=state.extra_steps
                )
        arguments["seq_lens_cpu_upper_bound"] = host_bound
        max_query_len = 1 if chunk is None else int(chunk.max())
        # The slot mapping the caller hands the build (vLLM's own): the path check's reference.
        window.build_slot_mappings = arguments.get("slot_mappings")
        try:
            # A pass over chunks is a path of its own (its own tables), checked on its own.
            label = path if chunk is None else f"{path} (over query chunks)"
            with window.swapped_into(self, label, window.windowed_attn_groups, max_query_len):
                metadata = original(*bound.args, **bound.kwargs)
        finally:
            window.build_slot_mappings = None
            # Everything after a chunk pass (decode builds, captures) reads the per-step tables.
            window.block_tables.windows = window.windows
        if window.unwindowed_attn_groups is None:
            return metadata
        # The groups not windowed: vLLM's own build from vLLM's own inputs.
        with window.unwindowed_only(self):
            unwindowed = original(self, *args, **kwargs)
        if metadata is None:
            return unwindowed
        metadata.update(unwindowed or {})
        return metadata

    return around(original, installed, body)


def _chunk_query_lens(window: Mrv2DraftWindow, query_start_loc_np: Any, num_reqs: int) -> Any:
    """The host query lengths of a build whose queries are longer than the window's per-step
    passes (``plan.max_query_len``), where the plan has tables for such chunks; else None."""
    if query_start_loc_np is None or window.chunk_windows is window.windows:
        return None
    lengths = torch.from_numpy(np.diff(query_start_loc_np[: num_reqs + 1]).astype(np.int32))
    if not num_reqs or int(lengths.max()) <= window.plan.max_query_len:
        return None
    return lengths


def update_draft_decode_metadata(original: Callable, installed: Installed) -> Callable:
    """``DraftModelSpeculator._update_draft_decode_metadata``: the window refreshed in the
    persistent buffers the recorded metadata references, then vLLM's update."""

    def body(self: Any, window: Mrv2DraftWindow, attn_metadata: Any, num_reqs: int) -> None:
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

    return around(original, installed, body)
