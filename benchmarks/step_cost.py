# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Sections 1 to 3: the per-build window work against one released MRV1 apply, its
allocations, and the extra work of attention sinks, of ``draft_window_min_context`` and of
decode context parallelism against the plain window."""

from __future__ import annotations

import statistics
from types import SimpleNamespace

import torch

from benchmarks.measure import (
    BATCH_SIZES,
    BLOCK_SIZE,
    CONTEXTS,
    SINKS_WINDOW,
    WINDOWS,
    allocations,
    counted,
    inputs_against_plain,
    interleaved,
    kib,
    launches,
    make_inputs,
    markdown_table,
    measured,
    mrv1_step,
    mrv2_step,
    step_of,
    window_over,
    windows,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.dcp import dcp_local_lengths
from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import DraftWindow

# draft_attention_sinks for section 3: 64 (one block once rounded up) and 4 blocks.
SINKS = [64, 512]


# draft_window_min_context for section 3: 4 and 16 windows of 2048.
MIN_CONTEXTS = [8192, 32768]


# decode_context_parallel_size for section 3 (interleave 1).
DCP_SIZES = [2, 4, 8]


def bench_step_cost(mrv1, rounds: int, iters: int) -> list[dict]:
    rows = []
    for context in CONTEXTS:
        for batch in BATCH_SIZES:
            seq_lens, table = make_inputs(batch, context)
            bound = seq_lens.clone()
            for w in WINDOWS:
                window = window_over(seq_lens, table, w)
                adapter = mrv1.SlidingWindowAdapter(w, BLOCK_SIZE, batch, 0, torch.device("cpu"))

                def ours(window=window, bound=bound, batch=batch):
                    mrv2_step(window, bound, batch)

                def theirs(adapter=adapter, seq_lens=seq_lens, table=table, bound=bound):
                    mrv1_step(adapter, seq_lens, table, bound)

                ours()
                theirs()
                t_ours, t_theirs = interleaved(ours, theirs, rounds, iters)
                row = {
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
                said = f"MRV2 {t_ours:7.1f} us  MRV1 {t_theirs:7.1f} us  ratio {row['ratio']:.2f}"
                measured(rows, row, f"W {w:>4}: {said}")
    return rows


def step_lines(steps: list[dict]) -> list[str]:
    """Section 1 and 2: the per-build window work against MRV1's apply, and allocations."""
    heads = ["context", "table width", "batch", "W", "MRV2 us", "MRV1 us", "ratio"]
    cells = [
        [
            kib(r["context"]),
            *(str(r[k]) for k in ("width", "batch", "window")),
            *(f"{r[k]:.1f}" for k in ("mrv2_us", "mrv1_us")),
            f"{r['ratio']:.2f}",
            *(counted(r[k]) for k in ("mrv2_allocs", "mrv1_allocs")),
        ]
        for r in steps
    ]
    worst = max(r["ratio"] for r in steps)
    big = [r["ratio"] for r in steps if r["batch"] >= 256]
    return [
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
        *markdown_table([*heads, "MRV2 allocs", "MRV1 allocs"], cells),
        "",
        f"Ratio MRV2 / MRV1: worst {worst:.2f}; at batch >= 256 median "
        f"{statistics.median(big):.2f}, worst {max(big):.2f}.",
        "",
    ]


def bench_sinks_cost(rounds: int, iters: int) -> list[dict]:
    """Per-build window work with sinks against the plain window, same inputs."""
    rows = []
    for context, batch, seq_lens, table, bound, plain in inputs_against_plain(CONTEXTS[1:]):
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
            row = {"context": context, "batch": batch, "window": plain.spec.window_size}
            row |= {"sinks": sinks, "sink_size": size, "sinks_us": t_sinks, "plain_us": t_plain}
            row |= {"extra_us": t_sinks - t_plain, "ratio": t_sinks / t_plain}
            row |= {"allocs": allocations(a), "wide_ratio": t_sinks2 / t_wide}
            said = f"{t_sinks:7.1f} us vs plain {t_plain:7.1f} us, ratio {row['ratio']:.2f}"
            measured(rows, row, f"sinks {sinks:>3}: {said}; vs plain W + S {row['wide_ratio']:.2f}")
    return rows


def where(row: dict) -> list[str]:
    """A row's context and batch, as its table's first cells."""
    return [kib(row["context"]), str(row["batch"])]


def cost(row: dict) -> list[str]:
    """A row's ratio to the plain window and its allocations, as its table's cells."""
    return [f"{row['ratio']:.2f}", counted(row["allocs"])]


def sinks_lines(sinks: list[dict]) -> list[str]:
    """Section 3: the extra per-build work of attention sinks."""
    heads = ["context", "batch", "sinks (rounded)", "with sinks us", "plain us", "extra us"]
    cells = [
        [
            *where(r),
            f"{r['sinks']} ({r['sink_size']})",
            *(f"{r[k]:.1f}" for k in ("sinks_us", "plain_us", "extra_us")),
            *cost(r),
            f"{r['wide_ratio']:.2f}",
        ]
        for r in sinks
    ]
    extra = [r["extra_us"] for r in sinks]
    ratios = [r["ratio"] for r in sinks]
    wide = [r["wide_ratio"] for r in sinks]
    return [
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
        *markdown_table([*heads, "ratio", "allocs", "ratio to a plain W + S"], cells),
        "",
        f"Extra per build with sinks: median {statistics.median(extra):.1f} us (from "
        f"{min(extra):.1f} to {max(extra):.1f} us); ratio to the plain window median "
        f"{statistics.median(ratios):.2f}, worst {max(ratios):.2f}; to a plain window of "
        f"W + S median {statistics.median(wide):.2f}, worst {max(wide):.2f}.",
        "",
    ]


def bench_threshold_cost(rounds: int, iters: int) -> list[dict]:
    """Per-build window work with draft_window_min_context against the plain window, same
    inputs (lengths spread over the context: rows on both sides of the threshold)."""
    rows = []
    for context, batch, seq_lens, table, bound, plain in inputs_against_plain(CONTEXTS[1:]):
        for min_context in MIN_CONTEXTS:
            engaged = window_over(seq_lens, table, min_context=min_context)
            a, b = step_of(engaged, bound), step_of(plain, bound)
            a()
            b()
            t_on, t_plain = interleaved(a, b, rounds, iters)
            row = {"context": context, "batch": batch, "window": plain.spec.window_size}
            row |= {"min_context": min_context, "below": int((seq_lens < min_context).sum())}
            row |= widths(engaged, plain) | {"on_us": t_on, "plain_us": t_plain}
            row |= {"ratio": t_on / t_plain, "allocs": allocations(a)}
            row |= device_ops(bound, launches=(a, engaged), plain_launches=(b, plain))
            said = f"{t_on:7.1f} us vs plain {t_plain:7.1f} us, ratio {row['ratio']:.2f}"
            measured(rows, row, f"min_context {min_context:>5}: {said}")
    return rows


def widths(window: DraftWindow, plain: DraftWindow) -> dict[str, int]:
    """The cropped table's columns of ``window`` and of the plain window."""
    return {
        "width": window.windows[0].max_window_blocks,
        "plain_width": plain.windows[0].max_window_blocks,
    }


def device_ops(bound: torch.Tensor, **builds) -> dict[str, int]:
    """The device launches of each named build (its call and its window), the host bound
    and the window's host mirror left out."""
    return {
        name: launches(step, (bound, window.seq_lens_cpu_upper_bound))
        for name, (step, window) in builds.items()
    }


def threshold_lines(rows: list[dict]) -> list[str]:
    """Section 3: the extra per-build work of ``draft_window_min_context``, by threshold."""
    by_m = {}
    for r in rows:
        by_m.setdefault(r["min_context"], []).append(r["ratio"])
    summary = [
        f"M = {m}: median {statistics.median(v):.2f}, worst {max(v):.2f}" for m, v in by_m.items()
    ]
    heads = ["context", "batch", "M", "rows below M", "table columns (plain)", "with M us"]
    cells = [
        [
            *where(r),
            *(str(r[k]) for k in ("min_context", "below")),
            f"{r['width']} ({r['plain_width']})",
            *(f"{r[k]:.1f}" for k in ("on_us", "plain_us")),
            *cost(r),
            f"{r['launches']} ({r['plain_launches']})",
        ]
        for r in rows
    ]
    return [
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
        *markdown_table([*heads, "plain us", "ratio", "allocs", "device ops (plain)"], cells),
        "",
        f"Ratio to the plain window: {'; '.join(summary)}.",
        "",
    ]


def bench_dcp_cost(rounds: int, iters: int) -> list[dict]:
    """Per-build window work under decode context parallelism against the same window
    without it, same lengths: rank 0's table (one column per cp * b tokens, the window
    aligned to cp * b), and with the DCP-local lengths the window computes for a draft
    prefill (a decode step's come from vLLM's own kernel, which runs with or without the
    window)."""
    rows = []
    for context, batch, seq_lens, table, bound, plain in inputs_against_plain(CONTEXTS[1:2]):
        for cp in DCP_SIZES:
            dcp = _rank_zero_window(seq_lens, table, cp)
            a, b = step_of(dcp, bound), step_of(plain, bound)
            a_local = _with_dcp_local_lengths(dcp, bound, batch)
            a_local()
            b()
            t_dcp, t_plain = interleaved(a, b, rounds, iters)
            t_local, t_plain2 = interleaved(a_local, b, rounds, iters)
            row = {"context": context, "batch": batch, "window": plain.spec.window_size}
            row |= {"cp": cp, "alignment": dcp.spec.alignment, **widths(dcp, plain)}
            row |= {"dcp_us": t_dcp, "local_us": t_local, "plain_us": t_plain}
            row |= {"ratio": t_dcp / t_plain, "local_ratio": t_local / t_plain2}
            row |= {"allocs": allocations(a_local)}
            ops = {"launches": (a, dcp), "local_launches": (a_local, dcp)}
            row |= device_ops(bound, **ops, plain_launches=(b, plain))
            said = f"{t_dcp:7.1f} us ({t_local:7.1f} us with the DCP-local lengths) vs no DCP"
            ratios = f"{row['ratio']:.2f} ({row['local_ratio']:.2f})"
            measured(rows, row, f"cp {cp}: {said} {t_plain:7.1f} us, ratio {ratios}")
    return rows


def _rank_zero_window(seq_lens: torch.Tensor, table: torch.Tensor, cp: int) -> DraftWindow:
    """The window of rank 0 as vLLM builds its BlockTables: cp_size, cp_rank, cp_interleave,
    and a sharded table as wide as the context's virtual blocks."""
    sharded = SimpleNamespace(
        block_sizes=[BLOCK_SIZE],
        cp_size=cp,
        cp_rank=0,
        cp_interleave=1,
        dcp_sharded=torch.tensor([True]),
        input_block_tables=[table[:, : -(-table.shape[1] // cp)].contiguous()],
    )
    return window_over(seq_lens, table, block_tables=sharded)


def _with_dcp_local_lengths(window: DraftWindow, bound: torch.Tensor, batch: int):
    """One build's window work and the DCP-local lengths, as the draft prefill's hook writes
    them (padded rows zero)."""

    def step() -> None:
        mrv2_step(window, bound, batch)
        dcp_local_lengths(
            window.seq_lens[:batch],
            window.dcp,
            scratch=window.dcp_scratch[:batch],
            out=window.dcp_local_seq_lens[:batch],
        )
        window.dcp_local_seq_lens[batch:].zero_()

    return step


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
        *markdown_table(
            [
                *("batch", "cp", "alignment", "table columns (no DCP)", "DCP us"),
                *("+ DCP-local lengths us", "no DCP us", "ratio", "ratio with DCP-local lengths"),
                *("allocs", "device ops (+ lengths; no DCP)"),
            ],
            [
                [
                    *(str(r[k]) for k in ("batch", "cp", "alignment")),
                    f"{r['width']} ({r['plain_width']})",
                    *(f"{r[k]:.1f}" for k in ("dcp_us", "local_us", "plain_us")),
                    *(f"{r[k]:.2f}" for k in ("ratio", "local_ratio")),
                    counted(r["allocs"]),
                    f"{r['launches']} ({r['local_launches']}; {r['plain_launches']})",
                ]
                for r in rows
            ],
        ),
    ]
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
