# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""`make bench`: what the draft window buys and what it costs, measured side by side in one run.

0. What it is for, end to end in a real vLLM engine on CPU: a draft model and an EAGLE3 head
   trained at 64 tokens, served at contexts up to 16 times it, without the window and with
   it: acceptance by context and output tokens/s as ratios (``benchmarks/long_context.py``).
1. Window cost per build: the device and host work the MRV2 hook adds to one metadata build
   (`DraftWindow.refresh` plus the host bound) against one released MRV1
   `SlidingWindowAdapter.apply`, on identical inputs, interleaved, as a ratio, for batch
   sizes x windows x block-table widths. Not in it: the wrapper's Python overhead per build
   (a signature bind and three attribute swaps), and how often each runs: DFlash/DSpark build
   once per propose on both runners, while an EAGLE propose on MRV2 refreshes once per draft
   step (and for its prefill) where MRV1 applies once.
2. Allocations per step after warm-up (torch profiler memory events).
3. Attention sinks: the same per-build work with ``draft_attention_sinks`` against the plain
   window, on identical inputs, interleaved: the extra per-step cost of the sinks. The same
   for ``draft_window_min_context``: the threshold against the plain window, with device
   op counts; and for decode context parallelism: one rank's window (cp 2, 4, 8, interleave
   1) against the same window without DCP, with and without the DCP-local lengths a draft
   prefill adds.
4. The draft's attention cost with and without the window (the reference paged attention),
   next to the ideal ratio (W + a) / L, and with sinks added to the window.
5. The whole draft metadata build through vLLM's real path (a DSpark speculator, vLLM's
   `_build_uniform_attn_metadata` and Triton attention builder), windowed (wrapper, refresh,
   host bound, path check) against vLLM's own build; and the path check's share of it, against
   the same windowed build with the path check's builder watchers removed.
6. Device kernel launches and CPU time per propose: MRV1's apply, the MRV2 torch path and
   the fused refresh (one launch per refresh), for DFlash/DSpark and EAGLE at K = 3, 5, 7,
   batch 1 to 1024, against the issue's goals.
7. End to end in a real vLLM engine on CPU: generate time with a window that never crops
   against none, same acceptance (``benchmarks/engine.py``).
8. ``draft_window_free_kv``: the groups vLLM forms, the blocks a request holds and the
   concurrency, with the key and without, for four target/drafter shapes, with vLLM's own
   functions; and the requests of 1024 tokens the CPU engine runs at once in the same KV
   bytes (``benchmarks/kv_reclaim.py``).

Results go to benchmarks/results/ as markdown and PNG plots. Timings here are CPU timings
of device-agnostic torch; on an accelerator the same ops launch kernels instead. The run
fixes glibc's mmap threshold (it re-executes itself with ``MALLOC_MMAP_THRESHOLD_`` set):
with the default dynamic threshold, a freed buffer of one size makes the next slightly
larger allocation a fresh mmap with page faults, which timed a read of 2,176 tokens at
twice one of 2,048.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

ROOT = Path(__file__).resolve().parent.parent

from testbed import use_triton_interpreter  # noqa: E402

use_triton_interpreter()  # before vLLM's first import

from benchmarks import long_context  # noqa: E402
from benchmarks.engine import bench_engine, engine_lines  # noqa: E402
from benchmarks.kv_reclaim import bench_kv_reclaim, kv_reclaim_lines  # noqa: E402
from testbed.mrv1_adapter import load_mrv1_adapter_module  # noqa: E402
from testbed.reference import PagedKVCache  # noqa: E402
from vllm_ascend.worker.v2.spec_decode.draft_window.dcp import dcp_local_lengths  # noqa: E402
from vllm_ascend.worker.v2.spec_decode.draft_window.plan import Plan  # noqa: E402
from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import DraftWindow  # noqa: E402

BLOCK_SIZE = 128
BATCH_SIZES = [1, 64, 256, 1024]
WINDOWS = [512, 2048, 8192]
CONTEXTS = [8 * 1024, 32 * 1024, 128 * 1024]
# draft_attention_sinks for section 3: 64 (one block once rounded up) and 4 blocks.
SINKS = [64, 512]
SINKS_WINDOW = 2048
# draft_window_min_context for section 3: 4 and 16 windows of 2048.
MIN_CONTEXTS = [8192, 32768]
# decode_context_parallel_size for section 3 (interleave 1).
DCP_SIZES = [2, 4, 8]


def make_inputs(batch: int, context: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    width = -(-context // BLOCK_SIZE)
    # Lengths spread over the whole context, so every window start case is hit.
    seq_lens = torch.randint(1, context + 1, (batch,), generator=gen, dtype=torch.int32)
    table = torch.randint(1, 1 << 20, (batch, width), generator=gen, dtype=torch.int32)
    return seq_lens, table


def mrv2_step(window: DraftWindow, bound: torch.Tensor, n: int) -> None:
    window.refresh(n)
    window.host_upper_bound(bound, n, 0)


def window_over(
    seq_lens: torch.Tensor,
    table: torch.Tensor,
    window_size: int = 0,
    block_tables: SimpleNamespace | None = None,
    **plan: int,
) -> DraftWindow:
    """A window over these lengths and one group's table (``block_tables``: a layout of its
    own, such as one DCP rank's), W = SINKS_WINDOW unless given; ``plan``: ``Plan.of``'s
    ``sink_tokens`` or ``min_context``."""
    tables = block_tables or SimpleNamespace(block_sizes=[BLOCK_SIZE], input_block_tables=[table])
    lengths = SimpleNamespace(seq_lens=seq_lens)
    return DraftWindow(
        Plan.of(window_size or SINKS_WINDOW, tables, [0], **plan),
        lengths,
        tables,
        seq_lens.shape[0],
        torch.device("cpu"),
    )


def step_of(window: DraftWindow, bound: torch.Tensor):
    """One build's window work (``mrv2_step``) over the window's whole batch, as a call."""
    n = bound.shape[0]
    return lambda: mrv2_step(window, bound, n)


def mrv1_step(adapter, seq_lens, table, bound) -> None:
    cam = SimpleNamespace(
        block_table_tensor=table, seq_lens=seq_lens, seq_lens_cpu_upper_bound=bound
    )
    adapter.apply(cam)


def timed(fn, iters: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(iters):
        fn()
    return (time.perf_counter_ns() - start) / iters / 1000.0


def interleaved(fn_a, fn_b, rounds: int, iters: int) -> tuple[float, float]:
    """Median microseconds per call of each, alternating which goes first every round."""
    a, b = [], []
    for r in range(rounds):
        if r % 2:
            b.append(timed(fn_b, iters))
            a.append(timed(fn_a, iters))
        else:
            a.append(timed(fn_a, iters))
            b.append(timed(fn_b, iters))
    return statistics.median(a), statistics.median(b)


@contextlib.contextmanager
def quiet_profiler():
    """The profiler's own lines (its start and stop markers, and torch's note on memory
    allocated before it started) go to the process's standard error from C++, one pair per
    measurement: kept out of the tables."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def allocations(fn) -> tuple[int, int]:
    """(allocations above 8 bytes, their bytes) in one call; smaller ones are Python scalar
    operands wrapped as 0-dim tensors, which on an accelerator stay on the host."""
    fn()
    with (
        quiet_profiler(),
        torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
        ) as prof,
    ):
        fn()
    sizes = [e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 8]
    return len(sizes), sum(sizes)


class LaunchCounter(TorchDispatchMode):
    """Counts the ops that would launch a device kernel: every aten op but views, and but
    ops on host tensors only (``host``: the host bound and its mirror, which stay on the
    host on an accelerator)."""

    def __init__(self, host: tuple[torch.Tensor, ...] = ()) -> None:
        super().__init__()
        self.host = {t.untyped_storage().data_ptr() for t in host}
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        on_host = bool(tensors) and all(
            t.untyped_storage().data_ptr() in self.host or t.dim() == 0 for t in tensors
        )
        if not func.is_view and not on_host:
            self.count += 1
        out = func(*args, **kwargs)
        if on_host:  # host temporaries stay on the host too
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.host.add(t.untyped_storage().data_ptr())
        return out


def launches(fn, host: tuple[torch.Tensor, ...] = ()) -> int:
    fn()  # warm-up: first-call allocations are not per-step launches
    with LaunchCounter(host) as counter:
        fn()
    return counter.count


def bench_launches(mrv1, rounds: int, iters: int) -> list[dict]:
    """Device kernel launches and CPU time per propose: MRV1's one apply, the MRV2 torch
    path (one refresh per build), and the fused refresh (one launch per refresh by
    construction). DFlash/DSpark build once per propose; an EAGLE or draft-model propose
    refreshes for its prefill (a query chunk per request; a draft model's has one correction
    token more) and once per later draft step (K - 1)."""
    w, context = 2048, 32 * 1024
    rows = []
    for batch in [1, 64, 256, 1024]:
        seq_lens, table = make_inputs(batch, context)
        bound = seq_lens.clone()
        qsl = torch.arange(batch + 1, dtype=torch.int32) * 4
        methods = (
            ("dflash/dspark", 0),
            ("eagle", 3),
            ("eagle", 5),
            ("eagle", 7),
            ("draft_model", 5),
        )
        for method, k in methods:
            base_ib = SimpleNamespace(seq_lens=seq_lens)
            base_bt = SimpleNamespace(block_sizes=[BLOCK_SIZE], input_block_tables=[table])
            # A draft model's prefill: the verify chunk and one correction token per request.
            chunk = k + 2 if method == "draft_model" else 4
            window = DraftWindow(
                Plan.of(w, base_bt, [0], max_chunk_len=chunk if k else None),
                base_ib,
                base_bt,
                batch,
                torch.device("cpu"),
            )
            # MRV1 has no draft-model window: its EAGLE apply (future offset K) stands beside.
            adapter = mrv1.SlidingWindowAdapter(w, BLOCK_SIZE, batch, k, torch.device("cpu"))
            chunks = torch.arange(batch + 1, dtype=torch.int32) * chunk

            def ours(window=window, k=k, batch=batch, bound=bound, qsl=chunks):
                if k:  # the draft prefill over the verify chunk, then K - 1 decode steps
                    window.refresh(
                        batch, seq_lens=window.input_buffers.base.seq_lens, query_start_loc=qsl
                    )
                for _ in range(max(k - 1, 1)):
                    mrv2_step(window, bound, batch)

            def theirs(adapter=adapter, seq_lens=seq_lens, table=table, bound=bound):
                mrv1_step(adapter, seq_lens, table, bound)

            refreshes = k if k else 1
            t_ours, t_theirs = interleaved(ours, theirs, rounds, iters)
            mrv1_launches = launches(theirs, host=(bound,))
            torch_launches = launches(ours, host=(bound, window.seq_lens_cpu_upper_bound))
            row = {
                "method": method,
                "k": k,
                "batch": batch,
                "window": w,
                "context": context,
                "mrv1": mrv1_launches,
                "torch": torch_launches,
                "fused": refreshes,
                "mrv1_us": t_theirs,
                "torch_us": t_ours,
            }
            if method == "eagle":
                row.update(
                    fixed_start_cost(k, batch, w, seq_lens, table, bound, qsl, ours, rounds, iters)
                )
            rows.append(row)
            print(
                f"  {method:>13} K {k or '-':>1} batch {batch:>4}: launches MRV1 {mrv1_launches}"
                f"  torch {torch_launches}  fused {refreshes};  CPU us MRV1 {t_theirs:7.1f}"
                f"  torch {t_ours:7.1f}"
                + (
                    f";  fixed start: torch {row['fixed_torch']} launches {row['fixed_us']:7.1f}"
                    f" us, fused {row['fixed_fused']}"
                    if method == "eagle"
                    else ""
                ),
                flush=True,
            )
    return rows


def fixed_start_cost(k, batch, w, seq_lens, table, bound, qsl, per_step, rounds, iters):
    """The alternative for EAGLE: one window start per propose. The first decode step
    windows the length of the last step (``L + K - 2``: one ``add``, then the refresh, whose
    table then covers the later steps' tokens) and sets the draft's own length from that
    start (one ``sub``); each later step only advances the windowed length by what vLLM's
    ``update_draft_inputs`` added to the draft's own (one ``sub``: the window's length
    buffer is its own, not vLLM's); the earlier steps read up to K - 2 tokens less than
    their window. Torch path counted and timed beside the per-step refresh (``per_step``);
    the fused launches are by construction."""
    base_ib = SimpleNamespace(seq_lens=seq_lens)
    base_bt = SimpleNamespace(block_sizes=[BLOCK_SIZE], input_block_tables=[table])
    cpu = torch.device("cpu")
    # The draft prefill is windowed for itself, as in the per-step path.
    prefill = DraftWindow(Plan.of(w, base_bt, [0], max_chunk_len=4), base_ib, base_bt, batch, cpu)
    window = DraftWindow(Plan.of(w, base_bt, [0]), base_ib, base_bt, batch, cpu)
    # [batch] int32: the last step's lengths, a persistent buffer.
    last = torch.empty_like(seq_lens)

    def fixed(window=window):
        prefill.refresh(batch, seq_lens=seq_lens, query_start_loc=qsl)
        torch.add(seq_lens, max(k - 2, 0), out=last)
        window.refresh(batch, seq_lens=last)
        torch.sub(seq_lens, window.window_skip[:batch], out=window.seq_lens[:batch])
        window.host_upper_bound(bound, batch, 0, extra_steps=max(k - 2, 0))
        for _ in range(k - 2):
            torch.sub(seq_lens, window.window_skip[:batch], out=window.seq_lens[:batch])
            window.host_upper_bound(bound, batch, 0)

    t_fixed, _ = interleaved(fixed, per_step, rounds, iters)
    return {
        "fixed_torch": launches(
            fixed, host=(bound, window.seq_lens_cpu_upper_bound, prefill.seq_lens_cpu_upper_bound)
        ),
        # The prefill's and the first decode step's refreshes, then one launch per step.
        "fixed_fused": 2 + (k - 2),
        "fixed_us": t_fixed,
    }


def bench_step_cost(mrv1, rounds: int, iters: int) -> list[dict]:
    rows = []
    for context in CONTEXTS:
        for batch in BATCH_SIZES:
            seq_lens, table = make_inputs(batch, context)
            bound = seq_lens.clone()
            for w in WINDOWS:
                base_ib = SimpleNamespace(seq_lens=seq_lens)
                base_bt = SimpleNamespace(block_sizes=[BLOCK_SIZE], input_block_tables=[table])
                window = DraftWindow(
                    Plan.of(w, base_bt, [0]), base_ib, base_bt, batch, torch.device("cpu")
                )
                adapter = mrv1.SlidingWindowAdapter(w, BLOCK_SIZE, batch, 0, torch.device("cpu"))

                def ours(window=window, bound=bound, batch=batch):
                    mrv2_step(window, bound, batch)

                def theirs(adapter=adapter, seq_lens=seq_lens, table=table, bound=bound):
                    mrv1_step(adapter, seq_lens, table, bound)

                ours()
                theirs()
                t_ours, t_theirs = interleaved(ours, theirs, rounds, iters)
                rows.append(
                    {
                        "context": context,
                        "batch": batch,
                        "window": w,
                        "width": table.shape[1],
                        "mrv2_us": t_ours,
                        "mrv1_us": t_theirs,
                        "ratio": t_ours / t_theirs,
                        "mrv2_allocs": allocations(ours),
                        "mrv1_allocs": allocations(theirs),
                    }
                )
                print(
                    f"  context {context:>6} batch {batch:>4} W {w:>4}: MRV2 {t_ours:7.1f} us"
                    f"  MRV1 {t_theirs:7.1f} us  ratio {t_ours / t_theirs:.2f}",
                    flush=True,
                )
    return rows


def bench_sinks_cost(rounds: int, iters: int) -> list[dict]:
    """Per-build window work with sinks against the plain window, same inputs."""
    rows = []
    for context in CONTEXTS[1:]:
        for batch in BATCH_SIZES:
            seq_lens, table = make_inputs(batch, context)
            bound = seq_lens.clone()
            plain = window_over(seq_lens, table)
            for sinks in SINKS:
                with_sinks = window_over(seq_lens, table, sink_tokens=sinks)
                # A plain window as wide as sinks + window: same table width, no sink op.
                size = with_sinks.spec.sink_size
                wide = window_over(seq_lens, table, SINKS_WINDOW + size)
                a, b, c = (step_of(w, bound) for w in (with_sinks, plain, wide))
                a()
                b()
                c()
                t_sinks, t_plain = interleaved(a, b, rounds, iters)
                t_sinks2, t_wide = interleaved(a, c, rounds, iters)
                rows.append(
                    {
                        "context": context,
                        "batch": batch,
                        "window": plain.spec.window_size,
                        "sinks": sinks,
                        "sink_size": size,
                        "sinks_us": t_sinks,
                        "plain_us": t_plain,
                        "extra_us": t_sinks - t_plain,
                        "ratio": t_sinks / t_plain,
                        "allocs": allocations(a),
                        "wide_ratio": t_sinks2 / t_wide,
                    }
                )
                print(
                    f"  context {context:>6} batch {batch:>4} sinks {sinks:>3}: "
                    f"{t_sinks:7.1f} us vs plain {t_plain:7.1f} us, ratio "
                    f"{t_sinks / t_plain:.2f}; vs plain W + S {t_sinks2 / t_wide:.2f}",
                    flush=True,
                )
    return rows


def bench_threshold_cost(rounds: int, iters: int) -> list[dict]:
    """Per-build window work with draft_window_min_context against the plain window, same
    inputs (lengths spread over the context: rows on both sides of the threshold)."""
    rows = []
    for context in CONTEXTS[1:]:
        for batch in BATCH_SIZES:
            seq_lens, table = make_inputs(batch, context)
            bound = seq_lens.clone()
            plain = window_over(seq_lens, table)
            for min_context in MIN_CONTEXTS:
                engaged = window_over(seq_lens, table, min_context=min_context)
                a, b = step_of(engaged, bound), step_of(plain, bound)
                a()
                b()
                t_on, t_plain = interleaved(a, b, rounds, iters)
                rows.append(
                    {
                        "context": context,
                        "batch": batch,
                        "window": plain.spec.window_size,
                        "min_context": min_context,
                        "below": int((seq_lens < min_context).sum()),
                        "width": engaged.windows[0].max_window_blocks,
                        "plain_width": plain.windows[0].max_window_blocks,
                        "on_us": t_on,
                        "plain_us": t_plain,
                        "ratio": t_on / t_plain,
                        "allocs": allocations(a),
                        "launches": launches(a, (bound, engaged.seq_lens_cpu_upper_bound)),
                        "plain_launches": launches(b, (bound, plain.seq_lens_cpu_upper_bound)),
                    }
                )
                print(
                    f"  context {context:>6} batch {batch:>4} min_context {min_context:>5}: "
                    f"{t_on:7.1f} us vs plain {t_plain:7.1f} us, ratio "
                    f"{t_on / t_plain:.2f}",
                    flush=True,
                )
    return rows


def threshold_lines(rows: list[dict]) -> list[str]:
    lines = [
        "## Engaging the window by context length: extra per-step cost",
        "",
        f"The same MRV2 per-build work (`refresh` + host bound) with "
        f"`draft_window_min_context` M against the plain window, W = {windows(rows)}, same "
        f"inputs (lengths spread over the context, so rows fall on both sides of M), "
        f"interleaved; median microseconds per build. The threshold adds three small device "
        f"ops to the lengths (the engaged mask, folded into the skip), none to the host bound "
        f"or the fused kernel's one launch; the cropped tables must hold a whole context "
        f"below M, ceil((M - 1) / b) columns instead of ceil((W + a - 1) / b), which every "
        f"per-column op pays. Device ops: torch-path ops that launch a kernel on a device "
        f"(host-bound ops excluded).",
        "",
        "| context | batch | M | rows below M | table columns (plain) | with M us | plain us "
        "| ratio | allocs | device ops (plain) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['context'] // 1024}k | {r['batch']} | {r['min_context']} | {r['below']} | "
            f"{r['width']} ({r['plain_width']}) | {r['on_us']:.1f} | {r['plain_us']:.1f} | "
            f"{r['ratio']:.2f} | {r['allocs'][0]} / {r['allocs'][1]} | "
            f"{r['launches']} ({r['plain_launches']}) |"
        )
    by_m = {}
    for r in rows:
        by_m.setdefault(r["min_context"], []).append(r["ratio"])
    summary = [
        f"M = {m}: median {statistics.median(v):.2f}, worst {max(v):.2f}" for m, v in by_m.items()
    ]
    lines += ["", f"Ratio to the plain window: {'; '.join(summary)}.", ""]
    return lines


def bench_dcp_cost(rounds: int, iters: int) -> list[dict]:
    """Per-build window work under decode context parallelism against the same window
    without it, same lengths: rank 0's table (one column per cp * b tokens, the window
    aligned to cp * b), and with the DCP-local lengths the window computes for a draft
    prefill (a decode step's come from vLLM's own kernel, which runs with or without the
    window)."""
    rows = []
    context = CONTEXTS[1]
    for batch in BATCH_SIZES:
        seq_lens, table = make_inputs(batch, context)
        bound = seq_lens.clone()
        plain = window_over(seq_lens, table)
        for cp in DCP_SIZES:
            # As vLLM builds rank 0's BlockTables: cp_size, cp_rank, cp_interleave, and a
            # sharded table as wide as the context's virtual blocks.
            sharded = SimpleNamespace(
                block_sizes=[BLOCK_SIZE],
                cp_size=cp,
                cp_rank=0,
                cp_interleave=1,
                dcp_sharded=torch.tensor([True]),
                input_block_tables=[table[:, : -(-table.shape[1] // cp)].contiguous()],
            )
            dcp = window_over(seq_lens, table, block_tables=sharded)
            a, b = step_of(dcp, bound), step_of(plain, bound)

            def a_local(window=dcp, bound=bound, batch=batch):
                mrv2_step(window, bound, batch)
                # As the draft prefill's hook writes them (padded rows zero).
                dcp_local_lengths(
                    window.seq_lens[:batch],
                    window.dcp,
                    scratch=window.dcp_scratch[:batch],
                    out=window.dcp_local_seq_lens[:batch],
                )
                window.dcp_local_seq_lens[batch:].zero_()

            a_local()
            b()
            t_dcp, t_plain = interleaved(a, b, rounds, iters)
            t_local, t_plain2 = interleaved(a_local, b, rounds, iters)
            rows.append(
                {
                    "context": context,
                    "batch": batch,
                    "window": plain.spec.window_size,
                    "cp": cp,
                    "alignment": dcp.spec.alignment,
                    "width": dcp.windows[0].max_window_blocks,
                    "plain_width": plain.windows[0].max_window_blocks,
                    "dcp_us": t_dcp,
                    "local_us": t_local,
                    "plain_us": t_plain,
                    "ratio": t_dcp / t_plain,
                    "local_ratio": t_local / t_plain2,
                    "allocs": allocations(a_local),
                    "launches": launches(a, (bound, dcp.seq_lens_cpu_upper_bound)),
                    "local_launches": launches(a_local, (bound, dcp.seq_lens_cpu_upper_bound)),
                    "plain_launches": launches(b, (bound, plain.seq_lens_cpu_upper_bound)),
                }
            )
            print(
                f"  batch {batch:>4} cp {cp}: {t_dcp:7.1f} us ({t_local:7.1f} us with the "
                f"DCP-local lengths) vs no DCP {t_plain:7.1f} us, ratio "
                f"{t_dcp / t_plain:.2f} ({t_local / t_plain2:.2f})",
                flush=True,
            )
    return rows


def dcp_lines(rows: list[dict]) -> list[str]:
    lines = [
        "## Decode context parallelism: per-step cost against the same window without it",
        "",
        f"The same MRV2 per-build work (`refresh` + host bound) on one rank of "
        f"`decode_context_parallel_size` cp (interleave 1, rank 0) against the window without "
        f"DCP, W = {windows(rows)}, {rows[0]['context'] // 1024}k contexts, same lengths, "
        f"interleaved; median microseconds per build. Under DCP a table column spans cp "
        f"blocks of a request (one on each rank), so the window's alignment is cp x "
        f"{BLOCK_SIZE} and its cropped table counts virtual blocks: fewer columns (a rank's "
        f"table is 1 / cp as wide), the same device ops; each request reads up to "
        f"W + cp x {BLOCK_SIZE} - 1 tokens, about 1 / cp of them on each rank. The DCP-local "
        f"lengths ({rows[0]['local_launches'] - rows[0]['launches']} small device ops) are "
        f"the window's only in a draft prefill, whose rebuild would otherwise hand the "
        f"builders the target's; a decode step's come from vLLM's own kernel, with or "
        f"without the window, and are not counted. Allocations: per build with the "
        f"DCP-local lengths, after warm-up, above 8 bytes (count / bytes). Device ops: "
        f"torch-path ops that launch a kernel on a device (host-bound ops excluded); the "
        f"fused refresh stays one launch under DCP (the DCP-local lengths of a draft prefill "
        f"come after it).",
        "",
        "| batch | cp | alignment | table columns (no DCP) | DCP us | + DCP-local lengths us "
        "| no DCP us | ratio | ratio with DCP-local lengths | allocs | device ops "
        "(+ lengths; no DCP) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['cp']} | {r['alignment']} | {r['width']} ({r['plain_width']}) "
            f"| {r['dcp_us']:.1f} | {r['local_us']:.1f} | {r['plain_us']:.1f} | "
            f"{r['ratio']:.2f} | {r['local_ratio']:.2f} | {r['allocs'][0]} / {r['allocs'][1]} "
            f"| {r['launches']} ({r['local_launches']}; {r['plain_launches']}) |"
        )
    ratios = [r["ratio"] for r in rows]
    local = [r["local_ratio"] for r in rows]
    lines += [
        "",
        f"Ratio to the window without DCP: median {statistics.median(ratios):.2f}, worst "
        f"{max(ratios):.2f}; with the DCP-local lengths (a draft prefill) median "
        f"{statistics.median(local):.2f}, worst {max(local):.2f}.",
        "",
    ]
    return lines


def bench_attention(rounds: int) -> list[dict]:
    rows = []
    window_size, heads, head_dim = 2048, 8, 128
    gen = torch.Generator().manual_seed(0)
    for context in CONTEXTS:
        blocks = -(-context // BLOCK_SIZE)
        cache = PagedKVCache(blocks + 1, BLOCK_SIZE, heads, head_dim)
        cache.k = cache.k.float()
        cache.v = cache.v.float()
        row = torch.randperm(blocks, generator=gen).to(torch.int32) + 1
        positions = torch.arange(context)
        cache.write(
            row,
            positions,
            torch.randn(context, heads, head_dim, generator=gen),
            torch.randn(context, heads, head_dim, generator=gen),
        )
        q = torch.randn(1, heads, head_dim, generator=gen)
        start = (context - window_size) // BLOCK_SIZE * BLOCK_SIZE
        cropped = row[start // BLOCK_SIZE :].contiguous()
        windowed = context - start
        # One block of sinks (draft_attention_sinks = 64, rounded up) ahead of the window.
        with_sinks = torch.cat([row[:1], cropped])

        def full(cache=cache, row=row, context=context, q=q):
            cache.read(q, row, context, track_blocks=False)

        def win(cache=cache, cropped=cropped, windowed=windowed, q=q):
            cache.read(q, cropped, windowed, track_blocks=False)

        def sinks(cache=cache, table=with_sinks, length=windowed + BLOCK_SIZE, q=q):
            cache.read(q, table, length, track_blocks=False)

        t_win, t_full = interleaved(win, full, rounds, 3)
        # Two reads of about 2k tokens: noisy on a shared CPU, so more rounds.
        sinks_rounds = 5 * rounds
        t_sinks, t_win2 = interleaved(sinks, win, sinks_rounds, 5)
        rows.append(
            {
                "context": context,
                "window": window_size,
                "heads": heads,
                "head_dim": head_dim,
                "windowed_len": windowed,
                "windowed_ms": t_win / 1000,
                "full_ms": t_full / 1000,
                "ratio": t_win / t_full,
                "ideal": windowed / context,
                "sinks_ratio": t_sinks / t_win2,
                "sinks_ideal": (windowed + BLOCK_SIZE) / windowed,
                "sinks_rounds": sinks_rounds,
            }
        )
        print(
            f"  attention context {context:>6}: window {t_win / 1000:.2f} ms, full "
            f"{t_full / 1000:.2f} ms, ratio {t_win / t_full:.3f}; with one block of sinks "
            f"{t_sinks / t_win2:.3f} of the window alone",
            flush=True,
        )
    return rows


def bench_whole_build(rounds: int, iters: int) -> list[dict]:
    import tempfile

    from testbed.shims import apply_cpu_shims
    from testbed.speculators import tiny_model_dir

    apply_cpu_shims()
    context = 32 * 1024
    model_dir = tiny_model_dir(Path(tempfile.mkdtemp()) / "tiny", context + 1024)
    rows = []
    for batch in (1, 64, 256):
        row = whole_build_row(model_dir, batch, context, 2048, rounds, iters)
        rows.append(row)
        print(
            f"  batch {batch:>4}: vLLM {row['plain']:.1f} us, windowed {row['ours']:.1f} us "
            f"(x{row['ours'] / row['plain']:.2f}); path check "
            f"{row['watched'] - row['unwatched']:+.1f} us"
        )
    return rows


def whole_build_row(
    model_dir, batch: int, context: int, window: int, rounds: int, iters: int
) -> dict:
    """vLLM's own DSpark build, the windowed one, and the windowed one without the path check's
    builder watchers, on the same batch."""
    import numpy as np
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor

    from testbed.buffers import make_mrv2_batch
    from testbed.speculators import (
        SPECULATOR_CLASSES,
        GroupLayout,
        make_vllm_config,
        wire_speculator,
    )
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import plugin

    num_spec, q = 3, 4  # K, and the tokens of each request's query
    data = make_mrv2_batch(
        [BLOCK_SIZE],
        [context - 7 * i for i in range(batch)],
        q,
        batch,
        batch,
        context,
        np.random.default_rng(0),
    )

    def wired(additional_config):
        config = make_vllm_config(model_dir, context, batch, additional_config)
        return wire_speculator(
            SPECULATOR_CLASSES["dspark"],
            data,
            [GroupLayout(BLOCK_SIZE)],
            config,
            "dspark",
            num_spec,
            record=False,
        ).speculator

    plugin.unregister()
    plain = wired({})
    plugin.register()
    ours, unwatched = wired({"draft_window_size": window}), wired({"draft_window_size": window})
    for group in unwatched.attn_groups[0]:
        for builder in group.metadata_builders:
            for name in ("build", "build_for_cudagraph_capture", "update_draft_decode_metadata"):
                builder.__dict__.pop(name, None)
    desc = BatchExecutionDescriptor(cg_mode=CUDAGraphMode.NONE, num_tokens=batch * q, num_reqs=None)
    bound = torch.from_numpy(data.seq_lens.astype(np.int32) - q)

    def build(speculator):
        return lambda: speculator._build_uniform_attn_metadata(
            batch_desc=desc,
            num_reqs=batch,
            num_query_per_req=q,
            seq_lens_cpu_upper_bound=bound,
            step=q,
        )

    try:
        for speculator in (plain, ours, unwatched):  # first builds: the path check's one check
            timed(build(speculator), iters)
        t_plain, t_ours = interleaved(build(plain), build(ours), rounds, iters)
        t_watched, t_unwatched = interleaved(build(ours), build(unwatched), rounds, iters)
    finally:
        plugin.unregister()
    return {
        "batch": batch,
        "context": context,
        "window": window,
        "num_spec": num_spec,
        "plain": t_plain,
        "ours": t_ours,
        "watched": t_watched,
        "unwatched": t_unwatched,
    }


def machine() -> str:
    import vllm

    from tools import cpu_ops

    package = Path(vllm.__file__).parent
    return (
        f"{cpu_ops.cpu_model()} ({platform.machine()}, {os.cpu_count()} cores; torch's CPU "
        f"capability {torch.backends.cpu.get_cpu_capability()}, vLLM's CPU ops "
        f"{cpu_ops.installed_build(package)}), {torch.get_num_threads()} torch threads, "
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"torch {torch.__version__}, vLLM {vllm.__version__}, "
        f"released MRV1 adapter: vllm-ascend 0.26.0rc1, "
        f"MALLOC_MMAP_THRESHOLD_={os.environ.get('MALLOC_MMAP_THRESHOLD_')}"
    )


# The goals of a propose against MRV1's: launches (fused) and torch-path CPU time at batch
# >= 256, as fractions of MRV1's.
LAUNCH_GOAL = 0.1
CPU_TIME_GOAL = 0.5


def listed(values) -> str:
    """Distinct values, in order, as the reports name them: ``2048`` or ``512, 2048``."""
    return ", ".join(str(v) for v in sorted(set(values)))


def windows(rows: list[dict]) -> str:
    """The windows W the rows were measured with."""
    return listed(r["window"] for r in rows)


def verdict(worst: float, goal: float) -> str:
    """ "met" where the worst measured ratio is within the goal, else "not met"."""
    return "met" if worst <= goal else "not met"


def big_ratio(big: list[dict], eagle: bool) -> str:
    """The torch path's CPU time against MRV1's at batch >= 256, for EAGLE or for the
    parallel drafters (DFlash/DSpark: no K)."""
    ratios = [
        r["torch_us"] / r["mrv1_us"]
        for r in big
        if (r["method"] == "eagle" if eagle else not r["k"])
    ]
    return f"{min(ratios):.2f}x to {max(ratios):.2f}x" if ratios else "not measured"


def launch_lines(rows: list[dict]) -> list[str]:
    big = [r for r in rows if r["batch"] >= 256]
    parallel = [r for r in rows if not r["k"]]
    eagle = [r for r in rows if r["method"] == "eagle"]
    draft_model = [r for r in rows if r["method"] == "draft_model"]
    cpu_ratios = [r["torch_us"] / r["mrv1_us"] for r in big]
    parallel_worst = max(r["fused"] / r["mrv1"] for r in parallel)
    eagle_ratios = [r["fused"] / r["mrv1"] for r in eagle]
    eagle_ks = sorted({r["k"] for r in eagle})
    lines = [
        "## Device launches and CPU time per propose",
        "",
        "Counted on CPU with a torch dispatch mode: every aten op but views and but ops on "
        "host tensors only, i.e. what would launch a device kernel (after a warm-up call). "
        "MRV1: the released `SlidingWindowAdapter.apply`, once per propose (future offset K "
        "for EAGLE, 0 for DFlash/DSpark). MRV2 torch path: `DraftWindow.refresh` and the "
        "host bound per build; an EAGLE propose builds for its prefill (a 4-token verify chunk "
        "per request) and for each of its K - 1 later steps, a draft model's (`draft_model`) "
        "the same with K + 2 tokens per request in its prefill (MRV1 has no draft-model "
        "window: its EAGLE apply stands beside it). Fused: the window's Triton "
        "kernel, one launch per refresh by construction, not counted (`fused.py`; used on a "
        "device after its "
        f"start-up self-check). One KV-cache group of {BLOCK_SIZE}-token blocks, W = "
        f"{windows(rows)}, contexts up to {max(r['context'] for r in rows) // 1024}k. CPU "
        "microseconds: median per propose, interleaved (the fused kernel is not "
        "timed: on CPU it runs only under Triton's interpreter, whose timings mean nothing).",
        "",
        "| method | K | batch | MRV1 launches | torch launches | fused launches "
        "| fused / MRV1 | MRV1 us | torch us | torch / MRV1 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *[
            f"| {r['method']} | {r['k'] or '-'} | {r['batch']} | {r['mrv1']} | {r['torch']} | "
            f"{r['fused']} | {r['fused'] / r['mrv1']:.2f} | {r['mrv1_us']:.1f} | "
            f"{r['torch_us']:.1f} | {r['torch_us'] / r['mrv1_us']:.2f} |"
            for r in rows
        ],
        "",
        f"Goals: launches per propose at most {LAUNCH_GOAL}x MRV1's; torch-path CPU time at "
        f"most {CPU_TIME_GOAL}x MRV1's at batch >= 256.",
        f"- DFlash/DSpark launches: fused {parallel_worst:.2f}x MRV1 at most: "
        f"{verdict(parallel_worst, LAUNCH_GOAL)}.",
        f"- EAGLE launches: fused {min(eagle_ratios):.2f}x to {max(eagle_ratios):.2f}x MRV1 "
        f"(K = {eagle_ks[0]} to {eagle_ks[-1]}): {verdict(max(eagle_ratios), LAUNCH_GOAL)}."
        + (
            " An EAGLE propose refreshes once per draft step (its prefill and K - 1 decode "
            "steps), one launch each, where MRV1 applies once: each step is windowed on its "
            "own, which is what keeps every step's table and length describing the same tokens "
            "(MRV1's needed-columns defect) and what vllm-ascend's FULL graphs record per step. "
            f"Below {LAUNCH_GOAL}x would need the refresh fused into vLLM's own per-step kernels."
            if max(eagle_ratios) > LAUNCH_GOAL
            else ""
        ),
        f"- Draft-model launches: fused {max(r['fused'] / r['mrv1'] for r in draft_model):.2f}x "
        f"MRV1's EAGLE apply (K = {listed(r['k'] for r in draft_model)}): "
        "the same shape as an EAGLE propose, one refresh per build (its prefill and K - 1 "
        "decode steps).",
        "",
        "EAGLE, one window start per propose instead of one per step (the first decode step "
        "windows the last step's length, `L + K - 2`, so that its table covers the later "
        "steps' tokens; each later step only writes the window's length, `own - skip`, one "
        "launch; the earlier steps read up to K - 2 tokens less than their window), beside "
        "the per-step refresh: torch path counted and timed, fused launches by construction:",
        "",
        "| K | batch | torch launches per step / fixed | fused launches per step / fixed "
        "| torch us per step / fixed |",
        "|---:|---:|---:|---:|---:|",
        *[
            f"| {r['k']} | {r['batch']} | {r['torch']} / {r['fixed_torch']} | "
            f"{r['fused']} / {r['fixed_fused']} | {r['torch_us']:.1f} / {r['fixed_us']:.1f} |"
            for r in eagle
        ],
        "",
        "- A fixed start is not offered: on a device the window runs the fused kernel, where "
        "it costs the same K launches (every later step still has to write the window's own "
        "length buffer, which vLLM's `update_draft_inputs` does not advance) while the "
        "earlier steps lose up to K - 2 tokens of their window, and vllm-ascend's FULL graphs "
        "record every step anyway. Only the torch path, the fallback where the kernel is not "
        "trusted, would gain (the launches above). Fewer than K launches would need every "
        "step's window computed ahead in one launch into per-step buffers: eager builds "
        "could take per-step views, but a FULL decode graph replayed for every step reads "
        "the same addresses and still needs a per-step write. Not built.",
        f"- Torch-path CPU time at batch >= 256: {min(cpu_ratios):.2f}x "
        f"to {max(cpu_ratios):.2f}x MRV1 per propose: {verdict(max(cpu_ratios), CPU_TIME_GOAL)} "
        f"(DFlash/DSpark {big_ratio(big, False)} with fewer launches than MRV1; EAGLE "
        f"{big_ratio(big, True)}: it pays K refreshes against one apply). On CPU each op "
        "costs about 10-15 us of dispatch whatever the "
        "batch, so the torch path's CPU time follows its op count; the fused kernel is the "
        "path on a device.",
        "",
    ]
    return lines


def attention_lines(rows: list[dict]) -> list[str]:
    """Section 4: the draft's attention with and without the window."""
    first = rows[0]
    lines = [
        "## Draft attention with and without the window (reference paged attention)",
        "",
        f"One query token, {first['heads']} heads of {first['head_dim']}, fp32, "
        f"W = {windows(rows)}: the time of the reference read "
        "(gather of K/V through the table, then attention) through the cropped table against "
        "the read of the whole context. The gather of the full context dominates at long "
        "contexts, which is why the measured ratio can fall below the ideal one.",
        "",
        f"The last two columns read one block of sinks ({BLOCK_SIZE} tokens) ahead of the "
        "window: its time against the window alone, and the ideal ratio (windowed + "
        f"{BLOCK_SIZE}) / windowed. "
        f"Reads of about 2k tokens are noisy on a shared CPU; the ratio is a median of "
        f"{first['sinks_rounds']} interleaved rounds.",
        "",
        "| context | windowed length | window ms | full ms | ratio | ideal (windowed / L) "
        "| with sinks / window | ideal |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['context'] // 1024}k | {r['windowed_len']} | {r['windowed_ms']:.2f} | "
            f"{r['full_ms']:.2f} | {r['ratio']:.3f} | {r['ideal']:.3f} | "
            f"{r['sinks_ratio']:.3f} | {r['sinks_ideal']:.3f} |"
        )
    return [*lines, ""]


def whole_build_lines(rows: list[dict]) -> list[str]:
    """Section 5: the whole draft metadata build, and the path check's share."""
    return [
        "## The whole draft metadata build, and the path check's share",
        "",
        "A DSpark speculator's `_build_uniform_attn_metadata` through vLLM's real path and "
        f"Triton attention metadata builder (one KV-cache group of {BLOCK_SIZE}-token blocks, "
        f"W = {windows(rows)}, K = {listed(r['num_spec'] for r in rows)}, "
        f"contexts near {rows[0]['context'] // 1024}k), median microseconds per build, "
        "interleaved. Windowed: the "
        "wrapper (signature bind, view swaps, path name), the refresh, the host bound, and "
        "the path check's builder watchers after their one check; against vLLM's own "
        "build without the plugin. Path check: the same windowed build with the watchers "
        "removed from the builders. On CPU every device op of the refresh runs eagerly "
        "(section 1 measures it alone); the rest of the difference is the wrapper's Python.",
        "",
        "| batch | vLLM build us | windowed build us | ratio | path check's share us |",
        "|---:|---:|---:|---:|---:|",
        *[
            f"| {r['batch']} | {r['plain']:.1f} | {r['ours']:.1f} | {r['ours'] / r['plain']:.2f} "
            f"| {r['watched'] - r['unwatched']:+.1f} |"
            for r in rows
        ],
        "",
    ]


def write_results(
    out: Path,
    steps: list[dict],
    sinks: list[dict],
    attention: list[dict],
    info: str,
    whole: list[dict],
    launch_rows: list[dict],
    threshold: list[dict],
    dcp: list[dict],
    engine: dict,
    studies: dict,
    reclaim: dict,
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Draft window benchmarks",
        "",
        f"Machine: {info}. Written by `make bench` ({time.strftime('%Y-%m-%d')}).",
        "",
        *long_context.long_context_lines(studies),
        f"Sections below: block size {BLOCK_SIZE}.",
        "",
        "## Per-step window cost: MRV2 hook vs the released MRV1 adapter",
        "",
        "Same seq_lens and block table for both; median microseconds per build, interleaved. "
        "MRV2: `DraftWindow.refresh` + host bound (persistent buffers), without the "
        "wrapper's Python overhead (a signature bind and three attribute swaps); MRV1: "
        "`SlidingWindowAdapter.apply` (windows the device lengths, the table and a host "
        "mirror). DFlash/DSpark build once per propose on both; an EAGLE propose refreshes "
        "once per draft step on MRV2, where MRV1 applies once. Allocations: per build after "
        "warm-up, above 8 bytes (count / bytes).",
        "",
        "| context | table width | batch | W | MRV2 us | MRV1 us | ratio | MRV2 allocs "
        "| MRV1 allocs |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in steps:
        lines.append(
            f"| {r['context'] // 1024}k | {r['width']} | {r['batch']} | {r['window']} | "
            f"{r['mrv2_us']:.1f} | {r['mrv1_us']:.1f} | {r['ratio']:.2f} | "
            f"{r['mrv2_allocs'][0]} / {r['mrv2_allocs'][1]} | "
            f"{r['mrv1_allocs'][0]} / {r['mrv1_allocs'][1]} |"
        )
    worst = max(r["ratio"] for r in steps)
    big = [r["ratio"] for r in steps if r["batch"] >= 256]
    lines += [
        "",
        f"Ratio MRV2 / MRV1: worst {worst:.2f}; at batch >= 256 median "
        f"{statistics.median(big):.2f}, worst {max(big):.2f}.",
        "",
        "## Attention sinks: extra per-step cost",
        "",
        f"The same MRV2 per-build work (`refresh` + host bound) with `draft_attention_sinks` "
        f"against the plain window, W = {windows(sinks)}, same inputs, interleaved; median "
        f"microseconds per build. Sinks add one small device op per KV-cache group and "
        f"build (it writes the sink columns of the cropped table's gather index), none to "
        f"the lengths or the host bound; the cropped tables are S / b columns wider, which "
        f"every per-column op pays. "
        f"The last column separates the two: the sinks against a plain window of W + S "
        f"tokens, whose tables are as wide. "
        f"Allocations: per build after warm-up, above 8 bytes (count / bytes).",
        "",
        "| context | batch | sinks (rounded) | with sinks us | plain us | extra us | ratio "
        "| allocs | ratio to a plain W + S |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sinks:
        lines.append(
            f"| {r['context'] // 1024}k | {r['batch']} | {r['sinks']} ({r['sink_size']}) | "
            f"{r['sinks_us']:.1f} | {r['plain_us']:.1f} | {r['extra_us']:.1f} | "
            f"{r['ratio']:.2f} | {r['allocs'][0]} / {r['allocs'][1]} | {r['wide_ratio']:.2f} |"
        )
    extra = [r["extra_us"] for r in sinks]
    ratios = [r["ratio"] for r in sinks]
    wide = [r["wide_ratio"] for r in sinks]
    lines += [
        "",
        f"Extra per build with sinks: median {statistics.median(extra):.1f} us (from "
        f"{min(extra):.1f} to {max(extra):.1f} us); ratio to the plain window median "
        f"{statistics.median(ratios):.2f}, worst {max(ratios):.2f}; to a plain window of "
        f"W + S median {statistics.median(wide):.2f}, worst {max(wide):.2f}.",
        "",
        *threshold_lines(threshold),
        *dcp_lines(dcp),
        *attention_lines(attention),
        *whole_build_lines(whole),
        *launch_lines(launch_rows),
        *engine_lines(engine),
        *kv_reclaim_lines(reclaim),
        "Not measured here: device allocations and host syncs on an accelerator (no GPU or "
        "NPU was available; on CUDA, `torch.cuda.memory_stats` and "
        "`torch.cuda.set_sync_debug_mode` would count them), and the cost of running the "
        "EAGLE draft prefill without FULL graphs when the window is on (graphs need an "
        "accelerator).",
        "",
        "![per-step cost](window_cost.png)",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines))
    plot(out / "window_cost.png", steps, attention)
    long_context.plot(out / "long_context.png", studies)


def plot(path: Path, steps: list[dict], attention: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for context in sorted({r["context"] for r in steps}):
        for w in sorted({r["window"] for r in steps}):
            rs = [r for r in steps if r["context"] == context and r["window"] == w]
            left.plot(
                [r["batch"] for r in rs],
                [r["ratio"] for r in rs],
                marker="o",
                label=f"{context // 1024}k, W={w}",
            )
    left.axhline(1.0, color="gray", linestyle="--")
    left.set_xscale("log", base=2)
    left.set_xlabel("batch size")
    left.set_ylabel("per-step cost, MRV2 / MRV1")
    left.set_title("Window cost per step (lower is better)")
    left.legend(fontsize=7, ncol=3)
    xs = [r["context"] // 1024 for r in attention]
    right.plot(xs, [r["ratio"] for r in attention], marker="o", label="measured")
    right.plot(xs, [r["ideal"] for r in attention], marker="x", linestyle="--", label="(W + a) / L")
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xlabel("context (k tokens)")
    right.set_ylabel("draft attention time, window / full")
    right.set_title(f"Draft attention with W = {windows(attention)}")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# 1 GiB: every buffer here comes from the heap, none from a per-call mmap.
MMAP_THRESHOLD = str(1 << 30)


def main() -> None:
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") != MMAP_THRESHOLD:
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD}
        # Run again as this module (python -m benchmarks.bench_window, from the checkout).
        os.chdir(ROOT)
        os.execve(sys.executable, [sys.executable, "-m", __spec__.name, *sys.argv[1:]], env)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds per point")
    parser.add_argument("--iters", type=int, default=30, help="calls per round")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"What the window is for: drafters trained short, served to {long_context.LONGEST}:")
    studies = long_context.bench_long_context(args.out)
    mrv1 = load_mrv1_adapter_module()
    print("Per-step window cost (MRV2 hook vs released MRV1 adapter):")
    steps = bench_step_cost(mrv1, args.rounds, args.iters)
    print("Attention sinks against the plain window, per build:")
    sinks = bench_sinks_cost(args.rounds, args.iters)
    print("draft_window_min_context against the plain window, per build:")
    threshold = bench_threshold_cost(args.rounds, args.iters)
    print("Decode context parallelism against the same window without it, per build:")
    dcp = bench_dcp_cost(args.rounds, args.iters)
    print("Draft attention with and without the window:")
    attention = bench_attention(max(args.rounds // 2, 3))
    print("Whole draft metadata build through vLLM's real path:")
    whole = bench_whole_build(args.rounds, args.iters)
    print("Device launches and CPU time per propose (MRV1, torch path, fused):")
    launch_rows = bench_launches(mrv1, args.rounds, args.iters)
    print("A real vLLM engine, a window that never crops against none:")
    engine = bench_engine()
    print("draft_window_free_kv: groups, blocks held and concurrency (vLLM's own functions):")
    reclaim = bench_kv_reclaim()
    write_results(
        args.out,
        steps,
        sinks,
        attention,
        machine(),
        whole,
        launch_rows,
        threshold,
        dcp,
        engine,
        studies,
        reclaim,
    )
    print(
        f"Wrote {args.out / 'README.md'}, {args.out / 'long_context.png'} and "
        f"{args.out / 'window_cost.png'}"
    )
    # The report says each failed check where it measured it; the run fails on any.
    reports = {**long_context.greedy_reports(studies), **long_context.sampled_reports(studies)}
    failed = long_context.failed_checks(reports)
    dflash = studies["dflash"]
    if dflash["identical"] < dflash["total"]:
        failed.append(
            f"DFlash: {dflash['identical']} of {dflash['total']} greedy texts the target's alone"
        )
    if failed:
        raise SystemExit("make bench: the studies' checks failed:\n" + "\n".join(failed))


if __name__ == "__main__":
    main()
