# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The window math against a reference: attention read through the cropped block table
must equal dense attention over exactly the sinks and the window."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.reference import (
    dense_attention,
    window_positions,
)
from tests.cpu_testbed.window_cases import Case, build_case, cases
from vllm_ascend.worker.v2.spec_decode.draft_window.window import (
    BlockTableWindow,
    WindowSpec,
    align_sinks,
    lcm_alignment,
    seq_lens_upper_bound,
    window_seq_lens,
)

# The same code on every vLLM line: run once, in .venv (design/testing.md).
pytestmark = pytest.mark.release_independent


def apply_window(case: Case) -> tuple[WindowSpec, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    spec = WindowSpec(case.window_size, case.alignment, case.sink_size)
    n = case.seq_lens.shape[0]
    skip, windowed = torch.empty(n, dtype=torch.int32), torch.empty(n, dtype=torch.int32)
    window_seq_lens(case.seq_lens, spec, skip_out=skip, out=windowed)
    cropped = []
    for g in case.groups:
        window = BlockTableWindow(spec, g.block_size, max_num_reqs=n + 2, device="cpu")
        cropped.append(window.gather(g.full_block_table, skip, windowed, n))
    return spec, window_starts(skip, spec.sink_size), windowed, cropped


def window_starts(skip: torch.Tensor, sinks: int) -> torch.Tensor:
    """Where each read resumes after its sinks: S + skip; 0 where nothing is left out (the
    read is then [0, L), whatever the window start between 0 and S)."""
    return torch.where(skip > 0, skip + sinks, 0)


def window_blocks(full_row: torch.Tensor, b: int, start: int, end: int, sinks: int = 0) -> set[int]:
    """Block ids of the full table that hold absolute positions [0, min(sinks, start)) and
    [start, end)."""
    return {int(x) for x in full_row[window_positions(start, end, sinks) // b]}


@settings(max_examples=300, deadline=None)
@given(cases())
def test_draft_reads_exactly_the_window(case: Case):
    spec, start, windowed, cropped = apply_window(case)
    sinks = spec.sink_size
    for i, length in enumerate(case.seq_lens.tolist()):
        if length == 0:
            continue
        s, w = int(start[i]), int(windowed[i])
        for g, table in zip(case.groups, cropped, strict=True):
            q = case.k[i][length - 1 : length] * 0.5 + 0.1
            got, touched = g.cache.read(q, table[i], w)
            expected = dense_attention(q, case.k[i], case.v[i], s, length, sinks)
            torch.testing.assert_close(got, expected)
            full_row = g.full_block_table[i]
            assert touched == window_blocks(full_row, g.block_size, s, length, sinks)
            assert w <= spec.max_read_len


@settings(max_examples=150, deadline=None)
@given(cases())
def test_unwindowed_read_is_dense_attention_over_the_whole_context(case: Case):
    for i, length in enumerate(case.seq_lens.tolist()):
        if not length:
            continue
        for g in case.groups:
            q = case.k[i][length - 1 : length]
            got, _ = g.cache.read(q, g.full_block_table[i], length)
            torch.testing.assert_close(got, dense_attention(q, case.k[i], case.v[i], 0, length))


@settings(max_examples=300, deadline=None)
@given(cases())
def test_window_bounds_and_padded_rows(case: Case):
    spec, start, windowed, cropped = apply_window(case)
    lengths, sinks = case.seq_lens.long(), spec.sink_size
    # Start is block-aligned for every group and never past the context.
    assert bool((start % spec.alignment == 0).all()) and bool((start <= lengths).all())
    real = lengths > 0
    # The draft sees at least its sinks and window (or everything), at most S + W + a - 1.
    least = torch.clamp(lengths[real], max=sinks + spec.window_size)
    assert bool((windowed[real] >= least).all())
    assert bool((windowed <= spec.max_read_len).all())
    for g, table in zip(case.groups, cropped, strict=True):
        b = g.block_size
        assert table.shape[1] == spec.max_window_blocks(b)
        for i in range(len(lengths)):
            if not real[i]:
                assert int(windowed[i]) == 0 and not table[i].any()
                continue
            full_row = g.full_block_table[i]
            num_cols = full_row.shape[0]
            last = min(-(-int(lengths[i]) // b), num_cols)
            if int(start[i]) <= sinks:
                # Sinks and window meet: exactly the unwindowed read.
                assert int(windowed[i]) == int(lengths[i])
                columns = full_row[:last]
            else:
                # The sink columns, the window's columns, then the null block.
                columns = torch.cat([full_row[: sinks // b], full_row[int(start[i]) // b : last]])
            assert torch.equal(table[i, : len(columns)], columns)
            assert not table[i, len(columns) :].any()


@settings(max_examples=300, deadline=None)
@given(cases(), st.integers(0, 300))
def test_host_bound_stays_an_upper_bound_after_the_step_the_parent_adds(case: Case, slack):
    spec, _, windowed, _ = apply_window(case)
    for step in range(min(spec.max_read_len, 8) + 1):
        # The caller only knows U >= L - step; vLLM's builder then adds `step`.
        upper = torch.clamp(case.seq_lens - step, min=0) + slack
        bound = seq_lens_upper_bound(upper, spec, out=torch.empty_like(upper), step=step)
        assert bool((bound + step >= windowed).all()), (bound, step, windowed)


@pytest.mark.parametrize(
    ("window_size", "alignment"),
    [(64, 16), (128, 64), (5, 4), (1, 1), (33, 8), (100, 48)],
)
def test_host_bound_is_the_tightest_bound(window_size, alignment):
    """For U >= 1 the bound equals the longest read that any L <= U can need."""
    for sinks in (0, alignment, 3 * alignment):
        assert_bound_is_the_running_maximum(WindowSpec(window_size, alignment, sinks))


def assert_bound_is_the_running_maximum(spec: WindowSpec) -> None:
    edge = spec.sink_size + spec.window_size + spec.alignment
    lengths = torch.arange(0, 4 * edge, dtype=torch.int32)
    start, windowed = torch.empty_like(lengths), torch.empty_like(lengths)
    window_seq_lens(lengths, spec, skip_out=start, out=windowed)
    running_max = torch.cummax(windowed, dim=0).values
    bound = seq_lens_upper_bound(lengths, spec, out=torch.empty_like(lengths))
    assert torch.equal(bound[1:], running_max[1:].int())


def test_windowing_an_upper_bound_by_the_formula_is_not_a_bound():
    """Why the host bound is truncated, not windowed: the windowed length is a sawtooth."""
    spec = WindowSpec(64, 16)
    start, windowed = torch.empty(2, dtype=torch.int32), torch.empty(2, dtype=torch.int32)
    window_seq_lens(torch.tensor([80, 79], dtype=torch.int32), spec, skip_out=start, out=windowed)
    assert windowed.tolist() == [64, 79]  # the formula applied to U = 80 gives 64 < 79
    bound = seq_lens_upper_bound(
        torch.tensor([80], dtype=torch.int32), spec, out=torch.empty(1, dtype=torch.int32)
    )
    assert bound.tolist() == [79]


def test_alignment_is_the_lcm_of_the_groups_block_sizes():
    assert lcm_alignment([16]) == 16
    assert lcm_alignment([16, 64]) == 64
    assert lcm_alignment([16, 24]) == 48
    with pytest.raises(ValueError, match="positive integers"):
        lcm_alignment([16, 0])


def test_one_windowed_length_serves_groups_of_different_block_sizes():
    """With blocks of 16 and 24 tokens the start is a multiple of 48, a block boundary in
    both tables, so both cropped tables read exactly [start, L)."""
    case = build_case([16, 24], window_size=50, seq_lens=[130, 47, 0], extra_cols=0, seed=3)
    spec, start, windowed, cropped = apply_window(case)
    assert spec.alignment == 48
    assert start.tolist() == [48, 0, 0] and windowed.tolist() == [82, 47, 0]
    for g, table in zip(case.groups, cropped, strict=True):
        got, touched = g.cache.read(case.k[0][-1:], table[0], 82)
        torch.testing.assert_close(
            got, dense_attention(case.k[0][-1:], case.k[0], case.v[0], 48, 130)
        )
        assert touched == window_blocks(g.full_block_table[0], g.block_size, 48, 130)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window_size": 0, "alignment": 16}, "window_size must be >= 1"),
        ({"window_size": 8, "alignment": 0}, "alignment must be >= 1"),
        ({"window_size": 8, "alignment": 16, "sink_size": 8}, "multiple of the alignment 16"),
    ],
)
def test_window_spec_rejects_impossible_windows(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WindowSpec(**kwargs)


def test_block_size_must_divide_the_alignment():
    with pytest.raises(ValueError, match="does not divide the alignment"):
        WindowSpec(64, 48).max_window_blocks(32)


def test_per_step_math_writes_only_into_its_persistent_buffers():
    """The same storage is returned every step, and nothing the caller owns is written."""
    spec = WindowSpec(64, 16)
    window = BlockTableWindow(spec, 16, max_num_reqs=8, device="cpu")
    full = torch.arange(1, 4 * 30 + 1, dtype=torch.int32).reshape(4, 30)
    full_before = full.clone()
    start, windowed = torch.empty(8, dtype=torch.int32), torch.empty(8, dtype=torch.int32)
    ptrs = set()
    for lengths in ([10, 60, 200, 64], [300, 1, 0, 77]):
        seq_lens = torch.tensor(lengths, dtype=torch.int32)
        before = seq_lens.clone()
        window_seq_lens(seq_lens, spec, skip_out=start[:4], out=windowed[:4])
        ptrs.add(window.gather(full, start, windowed, 4).data_ptr())
        assert torch.equal(seq_lens, before)
    assert ptrs == {window.block_table.data_ptr()}
    assert torch.equal(full, full_before)


@settings(max_examples=200, deadline=None)
@given(cases(), st.data())
def test_a_multi_token_pass_keeps_every_query_inside_its_window(case: Case, data):
    """A draft prefill queries the last q tokens of each request: every query token reads
    exactly the sinks and [start, its position], the start stays block-aligned, and a chunk
    longer than the window keeps its whole chunk."""
    n = case.seq_lens.shape[0]
    query_lens = torch.tensor(
        [data.draw(st.integers(1, length)) if length else 0 for length in case.seq_lens.tolist()],
        dtype=torch.int32,
    )
    spec = WindowSpec(case.window_size, case.alignment, case.sink_size)
    sinks = spec.sink_size
    skip, windowed = torch.empty(n, dtype=torch.int32), torch.empty(n, dtype=torch.int32)
    window_seq_lens(case.seq_lens, spec, skip_out=skip, out=windowed, query_lens=query_lens)
    start = window_starts(skip, sinks)
    bound = seq_lens_upper_bound(
        case.seq_lens + 3, spec, out=torch.empty(n, dtype=torch.int32), query_lens=query_lens
    )
    assert bool((bound >= windowed).all())
    for g in case.groups:
        width = -(
            -(sinks + max(case.window_size, int(query_lens.max())) + spec.alignment - 1)
            // g.block_size
        )
        window = BlockTableWindow(spec, g.block_size, max_num_reqs=n, device="cpu", width=width)
        table = window.gather(g.full_block_table, skip, windowed, n)
        for i, length in enumerate(case.seq_lens.tolist()):
            if not length:
                continue
            s, w, q = int(start[i]), int(windowed[i]), int(query_lens[i])
            assert s % spec.alignment == 0 and s <= length - q
            assert w >= min(length, sinks + case.window_size)
            assert w <= sinks + max(case.window_size, q) + spec.alignment - 1
            queries = case.k[i][length - q : length] * 0.5
            got, touched = g.cache.read(queries, table[i], w)
            torch.testing.assert_close(
                got, dense_attention(queries, case.k[i], case.v[i], s, length, sinks)
            )
            full_row = g.full_block_table[i]
            assert touched == window_blocks(full_row, g.block_size, s, length, sinks)


def test_sinks_are_rounded_up_to_whole_columns_of_the_cropped_table():
    assert [align_sinks(s, 16) for s in (0, 1, 16, 17, 64)] == [0, 16, 16, 32, 64]
    assert align_sinks(20, 48) == 48
    with pytest.raises(ValueError, match=">= 0"):
        align_sinks(-1, 16)
    with pytest.raises(ValueError, match="multiple of the alignment 16"):
        WindowSpec(64, 16, 20)


def test_sinks_and_window_of_one_request_around_where_they_part():
    """W = 64, a = 16, S = 16, one group of 16-token blocks: up to L = 95 the window
    starts at or before the sinks' end and the read is the whole context; from L = 96 on
    the first block is kept, then the window's blocks."""
    spec = WindowSpec(64, 16, 16)
    lengths = torch.tensor([10, 79, 95, 96, 200, 0], dtype=torch.int32)
    skip, windowed = torch.empty_like(lengths), torch.empty_like(lengths)
    window_seq_lens(lengths, spec, skip_out=skip, out=windowed)
    # Window starts 0, 0, 16, 32, 128: what lies between the sinks' end (16) and them.
    assert skip.tolist() == [0, 0, 0, 16, 112, 0]
    assert windowed.tolist() == [10, 79, 95, 80, 88, 0]
    full = torch.arange(1, 6 * 13 + 1, dtype=torch.int32).reshape(6, 13)
    table = BlockTableWindow(spec, 16, 6, "cpu").gather(full, skip, windowed, 6)
    assert table.shape[1] == 6  # ceil((16 + 64 + 15) / 16)
    assert table[2, :6].tolist() == full[2, :6].tolist() and not table[2, 6:].any()
    assert table[3, :5].tolist() == full[3, [0, 2, 3, 4, 5]].tolist()
    assert table[4, :6].tolist() == full[4, [0, 8, 9, 10, 11, 12]].tolist()
    assert not table[5].any()
