# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The one-launch window refresh (overlay/fused.py) equals the torch path bit for bit.

Runs the project's Triton kernel under Triton's interpreter on CPU (``TRITON_INTERPRET=1``;
timings there mean nothing) over property cases: several KV-cache groups and block sizes,
attention sinks, padded rows, lengths at the full table's edge, draft
prefill query chunks, actual lengths (vllm-ascend's EAGLE), and a ``draft_window_min_context``
with rows on both sides of it. Every output the torch path
writes is compared: the windowed lengths, the skips, the told windowed lengths, and every
column of every group's cropped table.
"""

import dataclasses
import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from types import SimpleNamespace

import pytest
import torch

from testbed.plans import plan_over
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import fused, fused_check
from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import ActualSeqLens, DraftWindow

# The same code on every vLLM line: run once, in .venv (design/testing.md).
pytestmark = pytest.mark.release_independent

CASES = 24


def make_window(gen, block_sizes, window_size, sinks, rows, extra_cols, actual=None, min_context=0):
    """A window over random full tables whose widths end near the longest length, so
    reads reach the table's edge."""
    alignment = math.lcm(*block_sizes)
    max_len = 3 * (window_size + sinks + alignment)
    tables = [
        torch.randint(
            1, 50_000, (rows, -(-max_len // b) + extra_cols), generator=gen, dtype=torch.int32
        )
        for b in block_sizes
    ]
    window = DraftWindow(
        plan_over(
            window_size,
            SimpleNamespace(input_block_tables=tables, block_sizes=block_sizes),
            list(range(len(block_sizes))),
            max_chunk_len=2 * window_size,
            sink_tokens=sinks,
            min_context=min_context,
            actual=actual,
        ),
        SimpleNamespace(seq_lens=torch.zeros(rows, dtype=torch.int32)),
        SimpleNamespace(input_block_tables=tables, block_sizes=block_sizes),
        rows,
        torch.device("cpu"),
    )
    fused.enable_fused(window)
    return window, max_len


def case(seed, actual=False, threshold=False):
    """``told``: a window whose kernel is told the target's lengths (vllm-ascend's EAGLE):
    the draft's own lengths plus up to 4 rejected tokens, padded rows 0. ``threshold``: a
    min_context between the window's reach and the longest length, with rows just below,
    at and above it."""
    gen = torch.Generator().manual_seed(seed)
    layouts = [[16], [16, 32], [16, 64, 128], [32, 32]]
    block_sizes = layouts[seed % len(layouts)]
    window_size = [64, 100, 256][seed % 3]
    sinks = [0, 0, 16, 40][seed % 4]
    rows = 9
    extra_cols = [0, 1, 5][seed % 3]
    actual_source = torch.zeros(rows, dtype=torch.int32)
    actual_lengths = None
    if actual:
        actual_lengths = ActualSeqLens(
            actual_source, 3 * (window_size + sinks + math.lcm(*block_sizes))
        )
    alignment = math.lcm(*block_sizes)
    # The window's reach S + W + a (sinks rounded up to the alignment).
    reach = -(-sinks // alignment) * alignment + window_size + alignment
    min_context = reach + 1 + (seed * 37) % (window_size + alignment) if threshold else 0
    window, max_len = make_window(
        gen, block_sizes, window_size, sinks, rows, extra_cols, actual_lengths, min_context
    )
    assert window.spec.min_context == min_context
    # Lengths up to what the narrowest full table holds.
    max_len = min(
        t.shape[1] * b
        for t, b in zip(window.block_tables.base.input_block_tables, block_sizes, strict=True)
    )
    lengths = torch.randint(0, max_len + 1, (rows,), generator=gen, dtype=torch.int32)
    # The full tables' edge: a length that fills the narrowest table, and one just short of
    # it.
    lengths[0], lengths[1] = max_len, max_len - 1
    if threshold:
        lengths[2:5] = torch.tensor([min_context - 1, min_context, min_context + 1])
    num_padded = 1 + seed % 3
    lengths[rows - num_padded :] = 0
    rejected = torch.randint(0, 5, (rows,), generator=gen, dtype=torch.int32)
    actual_source.copy_(torch.where(lengths > 0, lengths + rejected, 0))
    return gen, window, lengths, rows, max_len


@pytest.mark.parametrize("seed", range(CASES))
def test_decode_refresh_equals_the_torch_path(seed):
    _, window, lengths, rows, _ = case(seed)
    assert fused_check.compare_with_torch(window, rows, lengths) == []


@pytest.mark.parametrize("seed", range(CASES))
def test_prefill_refresh_with_query_chunks_equals_the_torch_path(seed):
    gen, window, lengths, rows, _ = case(seed)
    chunk = torch.randint(1, 2 * window.spec.window_size, (rows,), generator=gen, dtype=torch.int32)
    query_lens = torch.minimum(chunk, lengths)
    qsl = torch.zeros(rows + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(query_lens, 0)
    assert fused_check.compare_with_torch(window, rows, lengths, query_start_loc=qsl) == []


@pytest.mark.parametrize("seed", range(CASES))
def test_actual_length_refresh_equals_the_torch_path(seed):
    _, window, lengths, rows, _ = case(seed, actual=True)
    for step in (1, 3):
        assert fused_check.compare_with_torch(window, rows, lengths, actual_step=step) == []


@pytest.mark.parametrize("seed", range(CASES))
def test_refreshes_with_a_threshold_equal_the_torch_path(seed):
    """Every variant with ``draft_window_min_context``: rows below it read whole, the
    others their window, bit for bit on both paths."""
    gen, window, lengths, rows, _ = case(seed, actual=True, threshold=True)
    assert fused_check.compare_with_torch(window, rows, lengths) == []
    for step in (1, 3):
        assert fused_check.compare_with_torch(window, rows, lengths, actual_step=step) == []
    chunk = torch.randint(1, 2 * window.spec.window_size, (rows,), generator=gen, dtype=torch.int32)
    query_lens = torch.minimum(chunk, lengths)
    qsl = torch.zeros(rows + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(query_lens, 0)
    assert fused_check.compare_with_torch(window, rows, lengths, query_start_loc=qsl) == []
    # Both sides of the threshold were exercised: a row just below it reads all of itself.
    window.refresh(rows, seq_lens=lengths)
    m = window.spec.min_context
    assert int(window.seq_lens[2]) == m - 1 and int(window.seq_lens[3]) < m
    assert fused_check.self_check(window) == []


def test_a_kernel_ignoring_the_threshold_is_caught_by_the_self_check(monkeypatch):
    _, window, _, _, _ = case(5, threshold=True)
    assert fused_check.self_check(window) == []
    real = fused.FusedRefresh.launch

    def without_threshold(self, *args, **kwargs):
        spec = self.spec
        self.spec = dataclasses.replace(spec, min_context=0)
        try:
            real(self, *args, **kwargs)
        finally:
            self.spec = spec

    monkeypatch.setattr(fused.FusedRefresh, "launch", without_threshold)
    assert "decode: seq_lens" in fused_check.self_check(window)


def test_a_wrong_kernel_is_caught_by_the_comparison_and_the_self_check(monkeypatch):
    """The comparison sees a one-column error, and the start-up self-check reports it."""
    _, window, lengths, rows, _ = case(1)
    real = fused.FusedRefresh.launch

    def off_by_one(self, n, source, *args, **kwargs):
        real(self, n, source, *args, **kwargs)
        self.cropped_tables[0][0, 0] += 1

    monkeypatch.setattr(fused.FusedRefresh, "launch", off_by_one)
    assert fused_check.compare_with_torch(window, rows, lengths) == ["group 0 table"]
    assert "decode: group 0 table" in fused_check.self_check(window)


def test_the_self_check_passes_on_every_variant_of_a_real_layout():
    _, window, _, _, _ = case(2)
    assert fused_check.self_check(window) == []


def test_trust_then_use_enables_the_kernel_only_when_its_self_check_agrees(monkeypatch):
    """At start-up on a device the kernel is used only after the self-check agrees; a wrong
    or failing kernel is reported once and the torch path stays."""
    import logging

    records = []
    logger = logging.getLogger("test.fused")
    logger.addHandler(type("H", (logging.Handler,), {"emit": lambda self, r: records.append(r)})())
    logger.setLevel(logging.INFO)

    _, window, _, _, _ = case(3)
    window.refresh_kernel = None
    # On CPU the interpreter's kernel is never chosen by itself.
    assert not fused_check.enable_if_trusted(window, logger, "draft_window_size")
    assert window.refresh_kernel is None and not records
    assert fused_check.enable_if_trusted(window, logger, "draft_window_size", allow_cpu=True)
    assert window.refresh_kernel is not None

    real = fused.FusedRefresh.launch

    def wrong(self, n, source, *args, **kwargs):
        real(self, n, source, *args, **kwargs)
        self.seq_lens_out[0] += 1

    def broken(self, *args, **kwargs):
        raise RuntimeError("no such intrinsic")

    for launch, said in ((wrong, "decode: seq_lens"), (broken, "the kernel did not run")):
        window.refresh_kernel = None
        records.clear()
        monkeypatch.setattr(fused.FusedRefresh, "launch", launch)
        assert not fused_check.enable_if_trusted(
            window, logger, "draft_window_size", allow_cpu=True
        )
        assert window.refresh_kernel is None
        (record,) = records
        assert record.levelno == logging.WARNING and said in record.getMessage()
        assert "the window refreshes with the torch path" in record.getMessage()


def test_the_self_check_covers_actual_lengths_where_the_window_uses_them(monkeypatch):
    _, window, _, _, _ = case(0, actual=True)
    assert fused_check.self_check(window) == []
    real = fused.FusedRefresh.launch

    def actual_off_by_one(self, n, source, *args, actual_source=None, **kwargs):
        real(self, n, source, *args, actual_source=actual_source, **kwargs)
        if actual_source is not None:
            self.actual_out[0] += 1

    monkeypatch.setattr(fused.FusedRefresh, "launch", actual_off_by_one)
    assert fused_check.self_check(window) == ["actual: actual_windowed"]


def test_tables_wider_than_one_column_block_equal_the_torch_path():
    """A draft prefill's chunk tables reach thousands of columns (16-token blocks, long
    chunks): the kernel's column loop runs several times."""
    gen = torch.Generator().manual_seed(7)
    rows, b = 5, 16
    table = torch.randint(1, 50_000, (rows, 2600), generator=gen, dtype=torch.int32)
    window = DraftWindow(
        plan_over(
            64,
            SimpleNamespace(input_block_tables=[table], block_sizes=[b]),
            [0],
            max_chunk_len=20_000,
        ),
        SimpleNamespace(seq_lens=torch.zeros(rows, dtype=torch.int32)),
        SimpleNamespace(input_block_tables=[table], block_sizes=[b]),
        rows,
        torch.device("cpu"),
    )
    fused.enable_fused(window)
    assert window.chunk_windows[0].block_table.shape[1] > 1024
    lengths = torch.tensor([41_000, 30_000, 20_100, 64, 0], dtype=torch.int32)
    query_lens = torch.tensor([20_000, 17_000, 20_100, 64, 0], dtype=torch.int32)
    qsl = torch.zeros(rows + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(query_lens, 0)
    assert fused_check.compare_with_torch(window, rows, lengths, query_start_loc=qsl) == []


def test_a_table_layout_the_kernel_cannot_take_keeps_the_torch_path(monkeypatch):
    import logging

    records = []
    logger = logging.getLogger("test.fused.layout")
    logger.addHandler(type("H", (logging.Handler,), {"emit": lambda self, r: records.append(r)})())
    _, window, _, _, _ = case(4)
    window.refresh_kernel = None
    real = fused.FusedRefresh.__init__

    def strided_tables(self, spec, tables, seq_lens_out, *args):
        if seq_lens_out is window.seq_lens:  # the real window's, not the self-check's own
            raise ValueError("the fused window refresh needs int32 row-major tables")
        real(self, spec, tables, seq_lens_out, *args)

    monkeypatch.setattr(fused.FusedRefresh, "__init__", strided_tables)
    assert not fused_check.enable_if_trusted(window, logger, "draft_window_size", allow_cpu=True)
    assert window.refresh_kernel is None
    (record,) = records
    assert "int32 row-major tables" in record.getMessage()
