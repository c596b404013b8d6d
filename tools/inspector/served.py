# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""After the inspector's tables (``make demo``; ``--no-serve`` skips it): what the window is
for, in a real vLLM engine. The long-context study of ``make e2e-ascend``
(``e2e/study.py``), run here on CPU (``make study-cpu``): ``vllm serve`` of the committed
tiny models (``trained_models/``), an EAGLE3 head trained at 64 tokens on
the hidden states of a target sound to 1088, at contexts from inside the head's training
context to 16 times it. Acceptance and output throughput by context, without the window,
with it and with ``draft_window_size`` "auto" (the head declares its training context): the
same tokens every way. (``make study-cpu`` and ``make bench`` add the target served without
speculation; the engine tests hold every run's tokens to the target alone's.)
"""

from __future__ import annotations

from pathlib import Path

import trained_models as trained
from e2e.cpu_study import CpuStudy
from tools.inspector.common import text_table

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "e2e" / "results"
SCENARIO = "eagle3"
# The study's runs, as its report names them, and how the table heads them.
RUNS = {
    "v2_no_window": "no window",
    "v2_window": "window",
    "v2_auto": "auto",
    "no_speculation": "no spec",
}


# Inside the head's training context, 8 and 16 times it: a context a server's client costs
# about 10 s of CPU to start (it imports vLLM), so the demo serves three (make study-cpu and
# make bench run 32 to 1024 by powers of two).
CONTEXTS = "32,512,1024"
# One server per run, side by side on the CPU's cores.
PARALLEL = 3


def serve_study(
    out: Path = OUT, parallel: int = PARALLEL, contexts: str = CONTEXTS, port: int | None = None
) -> bool:
    """Runs the study (``parallel`` servers at a time, one core each) at ``contexts`` into
    ``out`` (the servers from ``port`` on; None: the first free) and prints what it
    measured; False when it failed (a server did not start, or the tokens differ)."""
    return finish_study(start_study(out, parallel, contexts, port))


def start_study(
    out: Path = OUT, parallel: int = PARALLEL, contexts: str = CONTEXTS, port: int | None = None
) -> CpuStudy:
    """The study, started (``serve_study``'s arguments); ``finish_study`` prints what it
    measured. Its first seconds are checks and vLLM's dataset cutter on one core, so the
    inspector starts it before its own tables."""
    settings = {"AUTO": "1", "NO_SPECULATION": "0", "PARALLEL": str(parallel)}
    settings["CONTEXTS"] = contexts
    return CpuStudy.start(SCENARIO, out, {**settings, "PORT": str(port or "")})


def finish_study(study: CpuStudy) -> bool:
    """Waits for the study and prints what it measured (never an earlier run's report);
    False when it failed."""
    print(
        "\nWhat the window is for, in a real vLLM engine: the long-context study of make "
        "e2e-ascend, here on CPU (vllm serve, Model Runner V2) with an EAGLE3 head trained "
        f"at {trained.DRAFT_CONTEXT} tokens for a target sound to {trained.TARGET_CONTEXT} "
        f"(both committed: trained_models/), greedy, {trained.NUM_SPEC} speculative tokens.",
        flush=True,
    )
    report, printed = study.finish()
    for line in printed.splitlines():
        if line.startswith("[e2e] study ") and ": mean acceptance length" not in line:
            continue  # the serve commands: in the report's folder, one log per run
        print(f"  {line}", flush=True)
    if report is None:
        return False
    parallel = int(study.settings["PARALLEL"])
    print(table(report, study.report_path.parent, parallel), flush=True)
    return study.process.returncode == 0


def table(report: dict, folder: Path, parallel: int = PARALLEL) -> str:
    """Acceptance and output tokens/s by context, one column per run; what the window buys
    past the head's training context and where it changes nothing; the start-up lines and
    where the report is."""
    runs = {name: report["runs"][name] for name in RUNS if name in report["runs"]}
    speculating = [name for name in runs if name != "no_speculation"]
    window, contexts = report["window"], report["contexts"]
    trained_at = report["draft_training_context"]
    columns = [
        ("context", 7),
        *((RUNS[n], 10) for n in speculating),
        *((RUNS[n], 10) for n in runs),
    ]
    groups = (("", 1), ("mean acceptance length", len(speculating)), ("output tokens/s", len(runs)))
    cells = []
    for ctx in contexts:
        row = {n: r["contexts"][str(ctx)] for n, r in runs.items()}
        cells.append(
            [
                str(ctx),
                *(f"{row[n]['mean_length']:.2f}" for n in speculating),
                *(f"{row[n]['output_tokens_per_s']:.1f}" for n in runs),
            ]
        )
    lines = [
        "",
        f"{report['prompts_per_context']} prompts of held-out text per context (the head "
        f"trained at {trained_at} tokens), {report['output_tokens']} new tokens each; mean "
        f"acceptance length from vLLM's spec-decode metrics (bonus token included, at most "
        f"{1 + report['num_spec']}); output tokens/s as vllm bench serve measures them, "
        "prefill included" + (" (no spec: the target alone):" if "no_speculation" in runs else ":"),
        "",
        *(f"  {line}" for line in text_table(columns, cells, groups)),
        "",
        *summary(report, parallel),
    ]
    compared = [run["lossless"] for run in runs.values() if "lossless" in run]
    identical = sum(c["identical"] for c in compared)
    total = sum(c["total"] for c in compared)
    same = bool(compared) and identical == total
    tokens = "the same in every run" if same else f"DIFFERENT ({identical} of {total} identical)"
    lines += [
        f"Tokens: {tokens} (greedy: the target "
        f"decides every token). draft_window_size={window}: the draft reads {window} to "
        f"{window + report['alignment'] - 1} tokens (its start aligned down to a block of "
        f"{report['alignment']}).",
    ]
    for name in ("v2_window", "v2_auto"):
        for line in runs.get(name, {}).get("window_lines", []):
            lines.append(f"  {RUNS[name]}, the server said: {line}")
    lines += [
        f"Report: {folder / 'report.md'}",
        f"Plot:   {folder / 'study.png'}",
    ]
    if report["failures"]:
        lines.append("FAILED: " + "; ".join(report["failures"]))
    return "\n".join(lines)


def summary(report: dict, parallel: int = PARALLEL) -> list[str]:
    """What the window buys from 8 times the head's training context on, against the
    in-distribution level (the first context, inside it), and what the throughput shows."""
    on, off = (
        {int(c): m["mean_length"] for c, m in report["runs"][n]["contexts"].items()}
        for n in ("v2_window", "v2_no_window")
    )
    inside, first = on[min(on)], min(on)
    far = [c for c in sorted(on) if c >= 8 * report["draft_training_context"]]
    lines = []
    if far:
        pairs = ", ".join(
            f"{c}: {off[c]:.2f} -> {on[c]:.2f} ({off[c] / inside:.0%} -> {on[c] / inside:.0%})"
            for c in far
        )
        lines.append(
            f"From 8x its training context on, the window brings acceptance back (without -> "
            f"with, share of the {inside:.2f} at {first} tokens): {pairs}. Inside the training "
            f"context it crops little or nothing: set draft_window_size where served contexts "
            f"run past what the drafter was trained on, leave it off where they do not."
        )
    lines.append(
        f"Output tokens/s: {parallel} server{'s' * (parallel > 1)} at a time on this CPU, so "
        "indicative. On CPU speculation itself costs more than it saves (vLLM's rejection "
        "sampler runs in Triton's interpreter); compare the window with no window (make bench "
        "measures them one server at a time, and without speculation)."
    )
    return lines
