# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""A window's plan over chosen groups of block tables, without a speculator: the shape
``plan.plan`` derives at ``set_attn``, for windows built directly over real or synthetic
tables (the test bed, the benchmarks, the GPU check)."""

from __future__ import annotations

from collections.abc import Sequence

from vllm_ascend.worker.v2.spec_decode.draft_window.dcp import DcpLayout, column_tokens
from vllm_ascend.worker.v2.spec_decode.draft_window.views import block_table_units
from vllm_ascend.worker.v2.spec_decode.draft_window.window import WindowSpec
from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import ActualSeqLens, Plan


def plan_over(
    window_size: int,
    block_tables,
    group_ids: Sequence[int],
    *,
    sink_tokens: int = 0,
    min_context: int = 0,
    max_query_len: int = 1,
    max_chunk_len: int | None = None,
    actual: ActualSeqLens | None = None,
) -> Plan:
    """The plan over ``group_ids`` of ``block_tables``: their DCP layout read, the shape
    derived from their tokens per column."""
    layout = DcpLayout.of(block_tables)
    units = column_tokens(block_table_units(block_tables), group_ids, layout)
    spec = WindowSpec.derive(window_size, units.values(), sink_tokens, min_context)
    return Plan(
        spec,
        units,
        layout,
        max_query_len=max_query_len,
        max_chunk_len=max_chunk_len,
        actual=actual,
        sink_tokens=sink_tokens,
    )
