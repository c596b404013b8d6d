# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""`make bench`, section 7: what the window costs end to end in a real vLLM engine on CPU.

A tiny random model drafting for itself (method ``draft_model``, K = 3) in vLLM's offline
engine, ``LLM.generate`` of 4 prompts (9 to 118 tokens, 24 new tokens each, greedy), with
no window and with a window that never crops (``draft_window_size`` 512, longer than every
context: the same drafts, so the same acceptance), engines interleaved in one process;
median generate time of each, as a ratio. A window that crops (32) is shown beside them:
its acceptance falls, so its time is not a cost of the window. On CPU every device op of
the window and vLLM's Triton kernels (interpreted) run on the host: a ratio, not an
accelerator's time.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from testbed.engine.models import make_tiny_models
from testbed.engine.runs import Run, offline

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 5


def bench_engine() -> dict:
    models = make_tiny_models(ROOT / ".cache" / "tiny-engine-models")
    runs = []
    for r in range(ROUNDS):
        runs += [
            Run(f"no window {r}", "draft_model"),
            Run(f"never crops {r}", "draft_model", {"draft_window_size": 512}),
        ]
    runs.append(Run("crops", "draft_model", {"draft_window_size": 32}))
    with tempfile.TemporaryDirectory() as tmp:
        done = offline(models, runs, Path(tmp))
    results = done.results
    for name, found in results.items():
        if "error" in found:
            raise RuntimeError(f"engine run {name!r} failed: {found['error']}")

    def of(prefix: str) -> list[dict]:
        return [found for name, found in results.items() if name.startswith(prefix)]

    plain, never, crops = of("no window"), of("never crops"), results["crops"]
    reference = plain[0]["token_ids"]
    ratios = [b["generate_s"] / a["generate_s"] for a, b in zip(plain, never, strict=True)]
    return {
        "ratios": ratios,
        "plain_s": statistics.median(r["generate_s"] for r in plain),
        "never_s": statistics.median(r["generate_s"] for r in never),
        "crops_s": crops["generate_s"],
        "acceptance": {
            label: (rows[0]["num_accepted_tokens"], rows[0]["num_draft_tokens"])
            for label, rows in (("plain", plain), ("never", never), ("crops", [crops]))
        },
        "same_tokens": all(r["token_ids"] == reference for r in [*plain, *never, crops]),
        "construct_s": statistics.median(r["construct_s"] for r in [*plain, *never]),
    }


def engine_lines(row: dict) -> list[str]:
    acceptance = row["acceptance"]

    def share(label: str) -> str:
        accepted, drafted = acceptance[label]
        return f"{accepted} / {drafted}"

    ratio, ratios = row["never_s"] / row["plain_s"], row["ratios"]
    return [
        "## End to end in a real vLLM engine (CPU)",
        "",
        __doc__.split("\n\n", 1)[1].strip().replace("\n", " "),
        "",
        "| run | generate s (median) | accepted / drafted | tokens |",
        "|---|---:|---:|---|",
        f"| no window | {row['plain_s']:.2f} | {share('plain')} | reference |",
        f"| draft_window_size=512 (never crops) | {row['never_s']:.2f} | {share('never')} | "
        f"{'the same' if row['same_tokens'] else 'DIFFERENT'} |",
        f"| draft_window_size=32 (crops) | {row['crops_s']:.2f} | {share('crops')} | "
        f"{'the same' if row['same_tokens'] else 'DIFFERENT'} |",
        "",
        f"The window's end-to-end cost where it changes nothing the draft reads: "
        f"{ratio:.2f}x the generate time without it (medians of {ROUNDS} engines each, "
        f"interleaved; round by round from {min(ratios):.2f}x to {max(ratios):.2f}x, the "
        f"spread of a shared CPU; an engine's construction, about "
        f"{row['construct_s']:.1f} s, is not in it).",
        "",
    ]
