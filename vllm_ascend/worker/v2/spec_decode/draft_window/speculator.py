# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""A draft speculator's window: made at ``set_attn`` (``create_draft_window``), applied to
every draft metadata build (``build_attn_metadata``) and DFlash-family capture."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.logger import logger

from vllm_ascend.worker.v2.spec_decode.draft_window import plan as planning
from vllm_ascend.worker.v2.spec_decode.draft_window.config import (
    FREE_KV_KEY,
    KEY,
    MIN_CONTEXT_KEY,
    SINKS_KEY,
    DraftWindowConfig,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.groups import Freed, describe_decisions
from vllm_ascend.worker.v2.spec_decode.draft_window.release import Release
from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import DraftWindow

if TYPE_CHECKING:
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator


def create_draft_window(
    speculator: DraftModelSpeculator, release: Release, freed: Freed | None = None
) -> DraftWindow | None:
    """The speculator's window on ``release`` (None: off): settings, then plan, then window."""
    # A config without additional_config (a stand-in) asks for no window.
    additional = getattr(speculator.vllm_config, "additional_config", None)
    config = DraftWindowConfig.from_additional_config(additional)
    if not config.enabled:
        return None
    plan = planning.plan(speculator, config, release, freed)
    if plan is None and freed is not None:
        # The draft's KV before its last `freed.tokens` tokens is gone: unwindowed, it would
        # read freed blocks. Refused, never served.
        raise ValueError(
            f"{FREE_KV_KEY}=true freed the draft's KV before the last {freed.tokens} tokens of "
            f"each request, but the draft window is off for method {speculator.method!r} "
            f"({type(speculator).__name__}; the log says why): remove {FREE_KV_KEY}."
        )
    if plan is None:
        return None
    window = DraftWindow(
        plan,
        speculator.input_buffers,
        speculator.block_tables,
        speculator.max_num_reqs,
        speculator.device,
        attn_groups=speculator.attn_groups,
        host_mirror=release.host_mirror,
        table_width=release.block_table_width_function(),
    )
    _say_on(speculator.method, window)
    return window


def _say_on(method: str, window: DraftWindow) -> None:
    """The one start-up line: what the window will do."""
    spec, plan = window.spec, window.plan
    sinks = ""
    if spec.sink_size:
        sinks = f" with the first {spec.sink_size} tokens as attention sinks"
        if spec.sink_size != plan.sink_tokens:
            sinks += f" ({SINKS_KEY}={plan.sink_tokens} rounded up to the alignment {spec.alignment})"
    # A draft prefill keeps a whole query chunk longer than the window (window.py).
    chunk = ""
    if plan.max_chunk_len is not None:
        chunk = (
            f" (a draft prefill chunk longer than the window: the chunk and at most "
            f"{spec.sink_size + spec.alignment - 1} more)"
        )
    engaged = ""
    if spec.min_context:
        engaged = f", from a context of {spec.min_context} tokens on ({MIN_CONTEXT_KEY}; shorter contexts read whole)"
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


def build_attn_metadata(
    speculator: DraftModelSpeculator,
    window: DraftWindow | None,
    build: Callable[..., dict[str, Any] | None],
    arguments: dict[str, Any],
    path: str,
) -> dict[str, Any] | None:
    """vLLM's draft metadata build ``build(**arguments)`` through the window: refreshed, the host
    bound windowed, built on the windowed views; other groups get vLLM's own build."""
    if window is None:
        return build(**arguments)
    state = window.propose
    state.num_builds += 1
    if state.num_builds == 1:
        logger.info("Draft KV window active: the first draft metadata build is windowed.")
    windowed = dict(arguments)
    num_reqs, step = arguments["num_reqs"], arguments["step"]
    # The padded batch: vLLM 0.30 and later pass a batch descriptor, 0.29 the count.
    desc = arguments.get("batch_desc")
    num_reqs_padded = (desc.num_reqs or num_reqs) if desc else arguments["num_reqs_padded"]
    host_bound = arguments["seq_lens_cpu_upper_bound"]
    chunk = _chunk_query_lens(window, arguments.get("query_start_loc_np"), num_reqs)
    if chunk is not None:
        # A pass over query chunks (a draft model's prefill): each chunk stays whole in its
        # window, read through the wider tables.
        window.refresh(num_reqs_padded, query_start_loc=speculator.input_buffers.query_start_loc)
        host_bound = window.host_upper_bound(host_bound, num_reqs, step, chunk)
    else:
        actual = window.actual is not None and step > 0
        window.refresh(num_reqs_padded, actual_step=step if actual else None)
        if window.actual is not None and window.actual.from_bound:
            host_bound = window.actual_host_bound(host_bound, num_reqs, step)
        else:
            host_bound = window.host_upper_bound(host_bound, num_reqs, step, extra_steps=state.extra_steps)
    windowed["seq_lens_cpu_upper_bound"] = host_bound
    max_query_len = 1 if chunk is None else int(chunk.max())
    # The slot mapping the caller hands the build (vLLM's own), for a check of the builders.
    window.build_slot_mappings = arguments.get("slot_mappings")
    try:
        # A pass over chunks is a path of its own (its own tables), checked on its own.
        label = path if chunk is None else f"{path} (over query chunks)"
        with window.swapped_into(speculator, label, window.windowed_attn_groups, max_query_len):
            metadata = build(**windowed)
    finally:
        window.build_slot_mappings = None
        # Everything after a chunk pass (decode builds, captures) reads the per-step tables.
        window.block_tables.windows = window.windows
    if window.unwindowed_attn_groups is None:
        return metadata
    # The groups not windowed: vLLM's own build from vLLM's own inputs.
    with window.unwindowed_only(speculator):
        unwindowed = build(**arguments)
    if metadata is None:
        return unwindowed
    metadata.update(unwindowed or {})
    return metadata


def _chunk_query_lens(window: DraftWindow, query_start_loc_np: np.ndarray | None, num_reqs: int) -> torch.Tensor | None:
    """Host query lengths of a build longer than the per-step passes, where planned."""
    if query_start_loc_np is None or window.chunk_windows is window.windows:
        return None
    lengths = torch.from_numpy(np.diff(query_start_loc_np[: num_reqs + 1]).astype(np.int32))
    if not num_reqs or int(lengths.max()) <= window.plan.max_query_len:
        return None
    return lengths


def capture_query_pass(
    speculator: DraftModelSpeculator,
    window: DraftWindow | None,
    capture: Callable[[], None],
    path: str,
) -> None:
    """A DFlash-family ``capture()`` through the windowed views (persistent buffers)."""
    if window is None:
        return capture()
    if window.path_check is not None:
        window.path_check.capture_on(path)
    with window.swapped_into(speculator, path):
        return capture()
