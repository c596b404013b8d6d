# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Parity with the released MRV1 `SlidingWindowAdapter` (vllm-ascend 0.26.0rc1), and the
seed's numbers. MRV1 windows with one kernel block size, so the alignment here is `b`."""

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.reference import dense_attention
from tests.cpu_testbed.window_cases import build_case
from vllm_ascend.worker.v2.spec_decode.draft_window.window import (
    BlockTableWindow,
    WindowSpec,
    seq_lens_upper_bound,
    window_seq_lens,
)

# The same code on every vLLM line: run once, in .venv (design/testing.md).
pytestmark = pytest.mark.release_independent

HOST_MIRRORS = ("seq_lens_cpu", "_seq_lens_cpu", "parallel_draft_seq_lens_cpu")


def run_mrv1(mrv1, window_size, block_size, future_offset, seq_lens, full_block_table):
    """The released adapter on a metadata object carrying the device lengths and exact
    host mirrors of them, as the MRV1 proposer hands it."""
    adapter = mrv1.SlidingWindowAdapter(
        window_size, block_size, max(len(seq_lens), 1), future_offset, torch.device("cpu")
    )
    cam = SimpleNamespace(
        block_table_tensor=full_block_table,
        seq_lens=seq_lens.clone(),
        seq_lens_cpu_upper_bound=None,
        **{name: seq_lens.clone() for name in HOST_MIRRORS},
    )
    adapter.apply(cam)
    assert cam.block_table_tensor.data_ptr() == adapter._block_table_clone.data_ptr()
    return cam


def run_ours(window_size, block_size, future_offset, seq_lens, full_block_table):
    """Our window arithmetic, as MRV1 uses it: metadata that also serves ``future_offset``
    later tokens (EAGLE's later steps; 0 for DFlash/DSpark). The window itself has no future
    offset (every pass is windowed for itself); the same arithmetic over the length the last
    served step reads (``L + K``) gives that metadata's start, the length read now is
    ``L - skip``, and its table covers ``L + K - skip`` tokens."""
    spec = WindowSpec(window_size, block_size)
    n = seq_lens.shape[0]
    last = seq_lens + future_offset * (seq_lens > 0).to(seq_lens.dtype)
    skip, last_read = torch.empty_like(seq_lens), torch.empty_like(seq_lens)
    window_seq_lens(last, spec, skip_out=skip, out=last_read)
    windowed = seq_lens - skip
    # Exact host mirrors go through the same function on the host copy.
    host_skip, host_last = torch.empty_like(seq_lens), torch.empty_like(seq_lens)
    window_seq_lens(last.clone(), spec, skip_out=host_skip, out=host_last)
    host_windowed = seq_lens.clone() - host_skip
    window = BlockTableWindow(spec, block_size, max_num_reqs=n, device="cpu")
    table = window.gather(full_block_table, skip, last_read, n)
    return windowed, host_windowed, table


def zero_pad(table: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(table, (0, width - table.shape[1]))


def both_with_equal_lengths(mrv1, batch):
    """Run both on one batch; assert equal device lengths and host mirrors; return the two
    cropped tables zero-padded to one width, and the windowed lengths."""
    window_size, b, k, seq_lens, table = batch
    cam = run_mrv1(mrv1, window_size, b, k, seq_lens, table)
    windowed, host_windowed, ours = run_ours(window_size, b, k, seq_lens, table)
    assert torch.equal(windowed, cam.seq_lens)
    for name in HOST_MIRRORS:
        assert torch.equal(host_windowed, getattr(cam, name)), name
    width = max(ours.shape[1], cam.block_table_tensor.shape[1])
    return zero_pad(ours, width), zero_pad(cam.block_table_tensor, width), windowed


@st.composite
def batches(draw, future_offset=None):
    block_size = draw(st.sampled_from([1, 4, 16, 64, 128]))
    window_size = draw(st.integers(1, 600))
    k = draw(st.integers(0, min(window_size - 1, 8))) if future_offset is None else future_offset
    if k >= window_size:
        window_size = k + 1
    lengths = draw(st.lists(st.one_of(st.just(0), st.integers(1, 3000)), min_size=1, max_size=8))
    num_cols = max(-(-(max(lengths) + k) // block_size), 1) + draw(st.integers(0, 2))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    table = torch.randint(1, 1 << 20, (len(lengths), num_cols), generator=gen, dtype=torch.int32)
    return window_size, block_size, k, torch.tensor(lengths, dtype=torch.int32), table


@settings(max_examples=400, deadline=None)
@given(batches(future_offset=0))
def test_dflash_and_dspark_window_equals_mrv1_exactly(mrv1, batch):
    """K = 0: device lengths, exact host mirrors and the whole cropped table match."""
    ours, theirs, _ = both_with_equal_lengths(mrv1, batch)
    assert torch.equal(ours, theirs)


@settings(max_examples=400, deadline=None)
@given(batches())
def test_eagle_window_equals_mrv1_except_the_columns_mrv1_leaves_out(mrv1, batch):
    """K > 0: lengths match; the tables match except for the columns of the K future
    tokens, which MRV1 zeroes and ours takes from the full table."""
    _, b, k, seq_lens, table = batch
    ours, theirs, windowed = both_with_equal_lengths(mrv1, batch)
    for i, (length, w) in enumerate(zip(seq_lens.tolist(), windowed.tolist(), strict=True)):
        mrv1_needed = -(-w // b)
        assert torch.equal(ours[i, :mrv1_needed], theirs[i, :mrv1_needed])
        assert not theirs[i, mrv1_needed:].any()
        our_needed = -(-(w + k) // b) if length else 0
        first = (length - w) // b
        cols = range(mrv1_needed, min(our_needed, table.shape[1] - first))
        # Exactly the blocks holding the future tokens, which MRV1 loses.
        assert ours[i, mrv1_needed:].tolist()[: len(cols)] == [
            int(table[i, first + c]) for c in cols
        ]


def test_mrv1_needed_columns_defect_and_ours_covers_it(mrv1):
    """W=64, b=16, K=3, L=64: MRV1's clone has 4 valid columns, but the first later draft
    step reads 65 tokens and finds block id 0 in column 4. Ours reads the real block."""
    case = build_case([16], window_size=64, seq_lens=[64], extra_cols=0, seed=7, lookahead=3)
    group = case.groups[0]
    cam = run_mrv1(mrv1, 64, 16, 3, case.seq_lens, group.full_block_table)
    windowed, _, ours = run_ours(64, 16, 3, case.seq_lens, group.full_block_table)
    assert windowed.tolist() == [64] and cam.seq_lens.tolist() == [64]
    assert cam.block_table_tensor[0, 4] == 0
    assert ours[0, 4] == group.full_block_table[0, 4] != 0

    q = case.k[0][64:65]
    expected = dense_attention(q, case.k[0], case.v[0], 0, 65)
    got, touched = group.cache.read(q, ours[0], 65)
    torch.testing.assert_close(got, expected)
    assert 0 not in touched
    mrv1_got, mrv1_touched = group.cache.read(q, cam.block_table_tensor[0], 65)
    assert 0 in mrv1_touched  # the null block: not the draft's KV of position 64
    assert not torch.allclose(mrv1_got, expected, equal_nan=True)


def test_seed_numbers_eagle3_window_64_block_16_offset_3(mrv1):
    seq_lens = torch.tensor([10, 60, 200, 64], dtype=torch.int32)
    table = torch.arange(1, 4 * 20 + 1, dtype=torch.int32).reshape(4, 20)
    windowed, host_windowed, _ = run_ours(64, 16, 3, seq_lens, table)
    assert windowed.tolist() == host_windowed.tolist() == [10, 60, 72, 64]
    assert run_mrv1(mrv1, 64, 16, 3, seq_lens, table).seq_lens.tolist() == [10, 60, 72, 64]


def test_seed_numbers_dflash_window_128_block_64_on_device_and_every_host_mirror(mrv1):
    seq_lens = torch.tensor([300], dtype=torch.int32)
    table = torch.arange(1, 11, dtype=torch.int32).reshape(1, 10)
    windowed, host_windowed, cropped = run_ours(128, 64, 0, seq_lens, table)
    assert windowed.tolist() == host_windowed.tolist() == [172]
    assert cropped[0].tolist() == [3, 4, 5]  # blocks of tokens [128, 320)
    cam = run_mrv1(mrv1, 128, 64, 0, seq_lens, table)
    assert cam.seq_lens.tolist() == [172]
    for name in HOST_MIRRORS:
        assert getattr(cam, name).tolist() == [172], name


@pytest.mark.parametrize(("upper", "longer_read"), [(300, 255), (80, 79)])
def test_mrv1_upper_bound_mirror_is_not_a_bound_and_ours_is(mrv1, upper, longer_read):
    """MRV1 windows `seq_lens_cpu_upper_bound` by the formula; where it is only a bound, a
    shorter request can read more than that. Ours stays a bound (and is the tightest)."""
    window_size, b = (128, 64) if upper == 300 else (64, 16)
    adapter = mrv1.SlidingWindowAdapter(window_size, b, 1, 0, torch.device("cpu"))
    bound_tensor = torch.tensor([upper], dtype=torch.int32)
    cam = SimpleNamespace(
        block_table_tensor=torch.ones(1, 8, dtype=torch.int32),
        seq_lens=bound_tensor.clone(),
        seq_lens_cpu_upper_bound=bound_tensor.clone(),
    )
    adapter.apply(cam)
    spec = WindowSpec(window_size, b)
    start, read = torch.empty(1, dtype=torch.int32), torch.empty(1, dtype=torch.int32)
    window_seq_lens(torch.tensor([longer_read], dtype=torch.int32), spec, skip_out=start, out=read)
    ours = seq_lens_upper_bound(bound_tensor, spec, out=torch.empty_like(bound_tensor))
    assert int(cam.seq_lens_cpu_upper_bound) < int(read)  # MRV1's "bound" is exceeded
    assert int(ours) == int(read) == window_size + b - 1
