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

from benchmarks.measure import markdown_table
from testbed.engine.models import NUM_SPEC, make_tiny_models
from testbed.engine.runs import PROMPT_LENS, Run, offline

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 5
METHOD = "draft_model"
# draft_window_size of the window that never crops (longer than every context) and of the
# one that crops.
NEVER, CROPS = 512, 32


def bench_engine() -> dict:
    models = make_tiny_models(ROOT / ".cache" / "tiny-engine-models")
    runs = []
    for r in range(ROUNDS):
        runs += [
            Run(f"no window {r}", METHOD),
            Run(f"never crops {r}", METHOD, {"draft_window_size": NEVER}),
        ]
    runs.append(Run("crops", METHOD, {"draft_window_size": CROPS}))
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
            label: (
                rows[0]["counters"]["vllm:spec_decode_num_accepted_tokens"],
                rows[0]["counters"]["vllm:spec_decode_num_draft_tokens"],
            )
            for label, rows in (("plain", plain), ("never", never), ("crops", [crops]))
        },
        # Each run's tokens against the first engine's without the window.
        "same_tokens": {
            label: all(r["token_ids"] == reference for r in rows)
            for label, rows in (("plain", plain), ("never", never), ("crops", [crops]))
        },
        "construct_s": statistics.median(r["construct_s"] for r in [*plain, *never]),
        # What the engines ran, for the report's labels.
        "config": {
            "method": METHOD,
            "num_spec": NUM_SPEC,
            "prompt_lens": list(PROMPT_LENS),
            "max_tokens": runs[0].max_tokens,
            "windows": {"never": NEVER, "crops": CROPS},
        },
    }


def _against_plain(acceptance: dict, label: str) -> str:
    """The run's acceptance against the engine's without the window; where its drafts
    differ, that its time is not the window's cost alone."""
    if acceptance[label] == acceptance["plain"]:
        return "the same acceptance as without it"

    def rate(name: str) -> float:
        accepted, drafted = acceptance[name]
        return accepted / drafted if drafted else 0.0

    if rate(label) == rate("plain"):
        said = "the same acceptance rate as without it"
    else:
        said = f"acceptance {'lower' if rate(label) < rate('plain') else 'higher'} than without it"
    return f"{said}: other drafts, so its time is not the window's cost alone"


def engine_lines(row: dict) -> list[str]:
    acceptance, config = row["acceptance"], row["config"]
    windows, lens = config["windows"], config["prompt_lens"]
    # The longest context a draft reads: the longest prompt, its new tokens and K drafts.
    longest = max(lens) + config["max_tokens"] + config["num_spec"]

    def share(label: str) -> str:
        accepted, drafted = acceptance[label]
        return f"{accepted} / {drafted}"

    def crops(label: str) -> str:
        return "crops" if windows[label] < longest else "never crops"

    def tokens(label: str) -> str:
        return "the same" if row["same_tokens"][label] else "DIFFERENT"

    ratio, ratios = row["never_s"] / row["plain_s"], row["ratios"]
    never = f"draft_window_size={windows['never']} ({crops('never')})"
    cropping = f"draft_window_size={windows['crops']} ({crops('crops')})"
    return [
        "## End to end in a real vLLM engine (CPU)",
        "",
        f"A tiny random model drafting for itself (method ``{config['method']}``, K = "
        f"{config['num_spec']}) in vLLM's offline engine, ``LLM.generate`` of {len(lens)} "
        f"prompts ({min(lens)} to {max(lens)} tokens, {config['max_tokens']} new tokens each, "
        f"greedy; a draft reads at most {longest} tokens), with no window and with "
        f"``{never}`` ({_against_plain(acceptance, 'never')}), engines interleaved "
        "in one process; median "
        f"generate time of each, as a ratio. ``{cropping}`` is shown beside them "
        f"({_against_plain(acceptance, 'crops')}). On CPU every device op of the "
        "window and vLLM's Triton kernels (interpreted) run on the host: a ratio, not an "
        "accelerator's time.",
        "",
        *markdown_table(
            ["run", "generate s (median)", "accepted / drafted", "tokens"],
            [
                [
                    "no window",
                    f"{row['plain_s']:.2f}",
                    share("plain"),
                    f"reference ({tokens('plain')} in every round)",
                ],
                [never, f"{row['never_s']:.2f}", share("never"), tokens("never")],
                [cropping, f"{row['crops_s']:.2f}", share("crops"), tokens("crops")],
            ],
            "lrrl",
        ),
        "",
        f"The window's end-to-end cost with ``{never}``: "
        f"{ratio:.2f}x the generate time without it (medians of {ROUNDS} engines each, "
        f"interleaved; round by round from {min(ratios):.2f}x to {max(ratios):.2f}x, the "
        f"spread of a shared CPU; an engine's construction, about "
        f"{row['construct_s']:.1f} s, is not in it).",
        "",
    ]
