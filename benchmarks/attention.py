# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Section 4: the draft's attention with and without the window (the reference paged
attention), next to the ideal ratio (W + a) / L, and with sinks added to the window."""

from __future__ import annotations

import torch

from benchmarks.measure import BLOCK_SIZE, CONTEXTS, interleaved, kib, markdown_table, windows
from testbed.reference import PagedKVCache


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
        *markdown_table(
            [
                *("context", "windowed length", "window ms", "full ms", "ratio"),
                *("ideal (windowed / L)", "with sinks / window", "ideal"),
            ],
            [
                [
                    kib(r["context"]),
                    str(r["windowed_len"]),
                    *(f"{r[k]:.2f}" for k in ("windowed_ms", "full_ms")),
                    *(f"{r[k]:.3f}" for k in ("ratio", "ideal", "sinks_ratio", "sinks_ideal")),
                ]
                for r in rows
            ],
        ),
        "",
    ]
    return lines
