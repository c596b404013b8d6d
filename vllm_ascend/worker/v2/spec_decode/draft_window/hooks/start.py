"""The window's start: ``DraftModelSpeculator.set_attn`` (alike on both lines) makes each
speculator's window once, before any graph capture, from the policy's plan."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from vllm_ascend.worker.v2.spec_decode.draft_window import policy
from vllm_ascend.worker.v2.spec_decode.draft_window.config import (
    KEY,
    MIN_CONTEXT_KEY,
    SINKS_KEY,
    DraftWindowConfig,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.groups import describe_decisions
from vllm_ascend.worker.v2.spec_decode.draft_window.hooks.common import WINDOW_ATTR, Installed
from vllm_ascend.worker.v2.spec_decode.draft_window.lines import Line
from vllm_ascend.worker.v2.spec_decode.draft_window.log import logger
from vllm_ascend.worker.v2.spec_decode.draft_window.mrv2 import (
    Mrv2DraftWindow,
    ToldLengths,
    Watch,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.trust import enable_if_trusted


def create_draft_window(speculator: Any, line: Line) -> Mrv2DraftWindow | None:
    """Validate the config against this speculator on ``line`` and build its window, or
    None (off)."""
    config = DraftWindowConfig.from_additional_config(speculator.vllm_config.additional_config)
    if not config.enabled:
        return None
    plan = policy.plan(speculator, config, line)
    if plan is None:
        return None
    told = None
    if plan.told is not None:
        told = ToldLengths(
            speculator.target_input_buffers.seq_lens,
            speculator.max_model_len,
            bound=plan.told == "bound",
        )
    window = Mrv2DraftWindow(
        plan.window_size,
        speculator.input_buffers,
        speculator.block_tables,
        plan.windowed_group_ids,
        speculator.max_num_reqs,
        speculator.device,
        max_query_len=plan.max_query_len,
        max_chunk_len=plan.max_chunk_len,
        attention_sinks=plan.sink_tokens,
        min_context=plan.min_context,
        told=told,
        attn_groups=speculator.attn_groups,
        left_alone_group_ids=plan.left_alone_group_ids,
        watch=Watch(
            speculator, line.host_mirror, line.built_host_lengths, line.bound_as_exact_rows
        ),
    )
    _say_on(speculator.method, plan, window)
    enable_if_trusted(window, logger, KEY)
    return window


def _say_on(method: str, plan: policy.Plan, window: Mrv2DraftWindow) -> None:
    """The one start-up line: what the window will do."""
    spec = window.spec
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
    if plan.left_alone_group_ids:
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
        plan.window_size,
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
        window = create_draft_window(self, installed.line) if installed.active else None
        setattr(self, WINDOW_ATTR, window)

    return wrapper
