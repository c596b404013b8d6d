# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""``draft_window_min_context``: the window engages from a context length on.

References: a row below the threshold must read exactly its whole context (dense attention
over ``[0, L)`` through the cropped table, the blocks of the full table in order); a row at
or above it must read exactly what the window without a threshold reads (lengths, skips and
cropped tables equal, that window being the one pinned to dense attention over the window
and to the released MRV1 adapter elsewhere).
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.reference import dense_attention
from tests.cpu_testbed.window_cases import Case, cases
from vllm_ascend.worker.v2.spec_decode.draft_window.window import (
    BlockTableWindow,
    WindowSpec,
    effective_min_context,
    seq_lens_upper_bound,
    window_seq_lens,
)


def windowed(case: Case, spec: WindowSpec, query_lens: torch.Tensor | None = None):
    """Lengths, skips and every group's cropped table of ``spec`` over the case."""
    n = case.seq_lens.shape[0]
    skip, lengths = torch.empty(n, dtype=torch.int32), torch.empty(n, dtype=torch.int32)
    window_seq_lens(case.seq_lens, spec, skip_out=skip, out=lengths, query_lens=query_lens)
    q = 0 if query_lens is None else int(query_lens.max())
    tables = []
    for g in case.groups:
        width = -(-spec.read_cap(q) // g.block_size)
        window = BlockTableWindow(spec, g.block_size, n, "cpu", width=width)
        tables.append(window.gather(g.full_block_table, skip, lengths, n).clone())
    return skip, lengths, tables


def specs(case: Case) -> tuple[WindowSpec, WindowSpec]:
    with_threshold = WindowSpec(case.window_size, case.alignment, case.sink_size, case.min_context)
    return with_threshold, WindowSpec(case.window_size, case.alignment, case.sink_size)


def assert_whole_or_window(case: Case, query_lens: torch.Tensor | None = None) -> None:
    spec, plain = specs(case)
    skip, lengths, tables = windowed(case, spec, query_lens)
    plain_skip, plain_lengths, plain_tables = windowed(case, plain, query_lens)
    below = 0
    for i, length in enumerate(case.seq_lens.tolist()):
        if length >= case.min_context or length == 0:
            # At or above the threshold: exactly the window (padded rows: nothing).
            assert int(skip[i]) == int(plain_skip[i]) and int(lengths[i]) == int(plain_lengths[i])
            for table, plain_table in zip(tables, plain_tables, strict=True):
                width = plain_table.shape[1]
                assert torch.equal(table[i, :width], plain_table[i])
                assert not table[i, width:].any()
            continue
        below += 1
        # Below: the whole context, through the full table's own blocks, read for real.
        assert int(skip[i]) == 0 and int(lengths[i]) == length
        q = 1 if query_lens is None else int(query_lens[i])
        queries = case.k[i][length - q : length] * 0.5
        for g, table in zip(case.groups, tables, strict=True):
            got, touched = g.cache.read(queries, table[i], length)
            torch.testing.assert_close(
                got, dense_attention(queries, case.k[i], case.v[i], 0, length)
            )
            columns = -(-length // g.block_size)
            assert touched == {int(x) for x in g.full_block_table[i, :columns]}
            assert not table[i, columns:].any()


@settings(max_examples=300, deadline=None)
@given(cases(threshold=True))
def test_rows_below_the_threshold_read_whole_and_the_others_their_window(case: Case):
    assert_whole_or_window(case)


@settings(max_examples=200, deadline=None)
@given(cases(threshold=True), st.data())
def test_a_multi_token_pass_with_a_threshold(case: Case, data):
    query_lens = torch.tensor(
        [data.draw(st.integers(1, length)) if length else 0 for length in case.seq_lens.tolist()],
        dtype=torch.int32,
    )
    assert_whole_or_window(case, query_lens)


@settings(max_examples=300, deadline=None)
@given(cases(threshold=True), st.integers(0, 300))
def test_host_bound_with_a_threshold_stays_an_upper_bound_after_the_step(case: Case, slack):
    spec, _ = specs(case)
    _, lengths, _ = windowed(case, spec)
    for step in range(min(spec.max_read_len, 8) + 1):
        upper = torch.clamp(case.seq_lens - step, min=0) + slack
        bound = seq_lens_upper_bound(upper, spec, out=torch.empty_like(upper), step=step)
        assert bool((bound + step >= lengths).all()), (bound, step, lengths)


@pytest.mark.parametrize(
    ("window_size", "alignment", "sinks", "above"),
    [
        (64, 16, 0, 1),
        (64, 16, 16, 40),
        (5, 4, 0, 3),
        (33, 8, 8, 100),
        (100, 48, 0, 200),
        (1, 1, 0, 1),
    ],
)
def test_host_bound_with_a_threshold_is_the_tightest_bound(window_size, alignment, sinks, above):
    """For U >= 1 the bound equals the longest read any L <= U needs: below the threshold
    the whole length, so the bound is min(U, M - 1) until the threshold, then M - 1."""
    spec = WindowSpec(window_size, alignment, sinks, sinks + window_size + alignment + above)
    lengths = torch.arange(0, 3 * spec.min_context, dtype=torch.int32)
    skip, read = torch.empty_like(lengths), torch.empty_like(lengths)
    window_seq_lens(lengths, spec, skip_out=skip, out=read)
    running_max = torch.cummax(read, dim=0).values
    bound = seq_lens_upper_bound(lengths, spec, out=torch.empty_like(lengths))
    assert torch.equal(bound[1:], running_max[1:].int())
    assert int(bound[-1]) == spec.min_context - 1 == spec.max_read_len


@pytest.mark.parametrize(
    ("window_size", "alignment", "sinks"), [(64, 16, 0), (64, 16, 32), (5, 4, 4), (100, 48, 48)]
)
def test_a_threshold_at_or_below_the_reach_changes_nothing(window_size, alignment, sinks):
    """Up to S + W + a every context below the threshold is read whole by the plain window
    already, so such a threshold is applied as 0; the first one above it changes a read."""
    reach = sinks + window_size + alignment
    plain = WindowSpec(window_size, alignment, sinks)
    lengths = torch.arange(0, reach, dtype=torch.int32)
    skip, read = torch.empty_like(lengths), torch.empty_like(lengths)
    window_seq_lens(lengths, plain, skip_out=skip, out=read)
    assert torch.equal(read, lengths)  # every L < reach reads whole without a threshold
    for asked in (1, reach - 1, reach):
        assert effective_min_context(asked, window_size, alignment, sinks) == 0
        with pytest.raises(ValueError, match=f"above S \\+ W \\+ a = {reach}"):
            WindowSpec(window_size, alignment, sinks, asked)
    assert effective_min_context(reach + 1, window_size, alignment, sinks) == reach + 1
    at_reach = torch.tensor([reach], dtype=torch.int32)
    window_seq_lens(at_reach, plain, skip_out=skip[:1], out=read[:1])
    assert int(read[0]) < reach  # a threshold of reach + 1 would keep this row whole
    window_seq_lens(
        at_reach,
        WindowSpec(window_size, alignment, sinks, reach + 1),
        skip_out=skip[:1],
        out=read[:1],
    )
    assert int(read[0]) == reach
    with pytest.raises(ValueError, match=">= 0"):
        effective_min_context(-1, window_size, alignment, sinks)


def test_one_request_around_the_threshold():
    """W = 64, a = 16, M = 200: up to L = 199 the whole context, from 200 on the window."""
    spec = WindowSpec(64, 16, 0, 200)
    assert spec.max_read_len == 199 and spec.max_window_blocks(16) == 13
    lengths = torch.tensor([79, 80, 199, 200, 201, 300, 0], dtype=torch.int32)
    skip, read = torch.empty_like(lengths), torch.empty_like(lengths)
    window_seq_lens(lengths, spec, skip_out=skip, out=read)
    assert read.tolist() == [79, 80, 199, 72, 73, 76, 0]
    assert skip.tolist() == [0, 0, 0, 128, 128, 224, 0]
    host = seq_lens_upper_bound(lengths, spec, out=torch.empty_like(lengths))
    assert host.tolist() == [79, 80, 199, 199, 199, 199, 0]
