# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""`make bench`, section 0: what the window is for, end to end in a real vLLM engine on CPU.

The long-context study of ``make e2e-ascend`` (``e2e/e2e.py STUDY=long DEVICE=cpu``, the
one harness, ``vllm serve`` through it) over the models ``make trained-models`` trained: a
draft model trained at 64 tokens and an EAGLE3 head trained at 64 tokens on the target's
hidden states, for a target sound to 1088. Contexts from inside the training context (32)
to 16 times it (1024), 8 prompts of held-out text per context, sent together, 16 new tokens
each, greedy, K = 3, KV blocks of 32. The curve: each drafter without the window, with it
(W = 33, the window ``"auto"`` picks for a drafter declaring 64), with it and 32 attention
sinks; the draft model also with W = 64 (its whole training context, so its reads reach
95); two servers at a time (acceptance does not depend on speed); and again, without the
window and with W = 33, on an AVX2-only CPU's path (vLLM's AVX2 ops, torch's AVX2 kernels),
to show how far another machine's curve moves. The throughput: at 1024
tokens, no speculation and each drafter without and with the window, one server at a time,
in interleaved rounds; output tokens/s at the client, prefill included, the median of the
rounds. On CPU every Triton kernel runs in Triton's interpreter, which takes most of each
engine step whatever the model does, so the ratios are this machine's, not an
accelerator's.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LONGEST = 1024
ROUNDS = 3
CURVES = {
    # scenario: the harness's environment beside DEVICE=cpu STUDY=long
    "draft_model": {"SINKS": "32", "MORE_WINDOWS": "64", "PARALLEL": "2"},
    "eagle3": {"SINKS": "32", "NO_SPECULATION": "0", "PARALLEL": "2"},
}
# The curves again on an AVX2-only CPU's path: without the window and with W = 33.
AVX2 = {"NO_SPECULATION": "0", "PARALLEL": "2"}
SPEEDS = {
    "draft_model": {"CONTEXTS": str(LONGEST)},
    "eagle3": {"CONTEXTS": str(LONGEST), "NO_SPECULATION": "0"},
}


def study(scenario: str, out: Path, extra: dict[str, str]) -> dict:
    """One run of the harness; its report."""
    env = {**os.environ, "DEVICE": "cpu", "STUDY": "long", "E2E_SCENARIO": scenario, **extra}
    command = [sys.executable, str(ROOT / "e2e" / "e2e.py"), "--out", str(out)]
    done = subprocess.run(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    print(
        "\n".join(f"  {line}" for line in done.stdout.splitlines() if ": mean" in line),
        flush=True,
    )
    report = out / f"study_{scenario}" / "report.json"
    if done.returncode != 0 or not report.exists():
        raise RuntimeError(f"the {scenario} study failed:\n{done.stdout[-4000:]}")
    return json.loads(report.read_text())


def avx2_path(root: Path) -> dict[str, str]:
    """What an engine runs on an AVX2-only CPU, on this one: the installed vLLM with its
    AVX2 ops (``tools/cpu_ops.py``), and torch's kernels at AVX2."""
    import vllm

    from tools import cpu_ops

    wheel = cpu_ops.fetched_wheel(ROOT)
    cpu_ops.package_with_build(wheel, Path(vllm.__file__).parent, root, "avx2")
    return {"PYTHONPATH": str(root), "ATEN_CPU_CAPABILITY": "avx2"}


def bench_long_context(out: Path) -> dict:
    """The curve of each family, again on an AVX2-only CPU's path, and the output tokens/s
    of each run at the longest context, round by round."""
    curves = {s: study(s, out / "study", extra) for s, extra in CURVES.items()}
    with tempfile.TemporaryDirectory() as tmp:
        path = avx2_path(Path(tmp))
        avx2 = {s: study(s, out / "study" / "avx2", {**AVX2, **path}) for s in CURVES}
    speeds: dict[str, list[float]] = {}
    outputs: dict[str, list] = {}
    for r in range(ROUNDS):
        for scenario, extra in SPEEDS.items():
            report = study(scenario, out / "study" / f"speed_{r}", extra)
            for run, found in report["runs"].items():
                key = "no_speculation" if run == "no_speculation" else f"{scenario}/{run}"
                speeds.setdefault(key, []).append(
                    found["contexts"][str(LONGEST)]["client_tokens_per_s"]
                )
                outputs[f"{r}/{key}"] = found["outputs"]
    return {"curves": curves, "avx2": avx2, "speeds": speeds, "outputs": outputs}


def _by_context(report: dict, run: str, field: str) -> dict[int, float | None]:
    return {int(c): m[field] for c, m in report["runs"][run]["contexts"].items()}


def long_context_lines(studies: dict) -> list[str]:
    reports, speeds = studies["curves"], studies["speeds"]
    base = reports["draft_model"]
    contexts = base["contexts"]
    runs = [
        ("draft_model", "v2_no_window", "draft model, no window"),
        ("draft_model", "v2_window", "draft model, W = 33"),
        ("draft_model", "v2_window_sinks", "draft model, W = 33 + 32 sinks"),
        ("draft_model", "v2_window_64", "draft model, W = 64"),
        ("eagle3", "v2_no_window", "EAGLE3, no window"),
        ("eagle3", "v2_window", "EAGLE3, W = 33"),
        ("eagle3", "v2_window_sinks", "EAGLE3, W = 33 + 32 sinks"),
    ]
    lines = [
        "## What the window is for: a drafter trained short, served long (real engine, CPU)",
        "",
        __doc__.split("\n\n", 1)[1].strip().replace("\n", " "),
        "",
        "Mean acceptance length (vLLM's spec-decode metrics, bonus token included, at most "
        "4) by context (tokens of prompt):",
        "",
        "| run | " + " | ".join(str(c) for c in contexts) + " |",
        "|---|" + "---:|" * len(contexts),
    ]
    for scenario, run, label in runs:
        means = _by_context(reports[scenario], run, "mean_length")
        lines.append(f"| {label} | " + " | ".join(f"{means[c]:.2f}" for c in contexts) + " |")
    alone = statistics.median(speeds["no_speculation"])
    lines += [
        "",
        f"Output tokens/s at {LONGEST} tokens of context, side by side: one server at a time, "
        f"the same prompts, {ROUNDS} interleaved rounds, the median (and the rounds' range), "
        "and the medians as ratios:",
        "",
        "| run | output tok/s | rounds | / no speculation | / the same drafter without the "
        "window |",
        "|---|---:|---|---:|---:|",
        f"| no speculation | {alone:.1f} | {_range(speeds['no_speculation'])} | 1.00 | - |",
    ]
    for scenario, run, label in runs:
        if f"{scenario}/{run}" not in speeds:
            continue
        speed = statistics.median(speeds[f"{scenario}/{run}"])
        off = statistics.median(speeds[f"{scenario}/v2_no_window"])
        vs_off = "-" if run == "v2_no_window" else f"{speed / off:.2f}"
        lines.append(
            f"| {label} | {speed:.1f} | {_range(speeds[f'{scenario}/{run}'])} | "
            f"{speed / alone:.2f} | {vs_off} |"
        )
    lines += ["", *_avx2_lines(studies)]
    reference = base["runs"]["no_speculation"]["outputs"]
    longest = reference[-base["prompts_per_context"] :]
    same = (
        all(not r["failures"] for r in reports.values())
        and all(
            run["outputs"] == reference
            for report in reports.values()
            for run in report["runs"].values()
        )
        and all(
            run["outputs"] == reference
            for report in studies["avx2"].values()
            for run in report["runs"].values()
        )
        and all(found == longest for found in studies["outputs"].values())
    )
    lines += [
        "",
        f"Tokens: {'the same in every run' if same else 'DIFFERENT'} (the target's greedy "
        "tokens; each run's start-up lines are in its report, "
        "`benchmarks/results/study/`, not kept).",
        "",
        "![acceptance by context](long_context.png)",
        "",
    ]
    return lines


def _avx2_lines(studies: dict) -> list[str]:
    """How far the curve moves on an AVX2-only CPU's path, against this machine's."""
    diffs = []
    for scenario, report in studies["avx2"].items():
        for run in ("v2_no_window", "v2_window"):
            here = _by_context(studies["curves"][scenario], run, "mean_length")
            there = _by_context(report, run, "mean_length")
            diffs += [(abs(there[c] - here[c]), scenario, run, c) for c in here]
    worst, scenario, run, context = max(diffs)
    same = sum(d == 0 for d, *_ in diffs)
    return [
        "The same curves (each drafter without the window and with W = 33) on an AVX2-only "
        "CPU's path, run on this machine: vLLM's AVX2 ops (`tools/cpu_ops.py`) and torch's "
        f"kernels at AVX2. {same} of {len(diffs)} mean acceptance lengths are the same; the "
        f"farthest apart is {scenario} {run} at {context} tokens, by {worst:.2f} (two runs "
        "of one server differ by up to about 0.07: which requests share an engine step). "
        "The weights are the same on every x86-64 CPU (`design/testing.md`), so this is how "
        "far another machine's curve moves."
    ]


def _range(values: list[float]) -> str:
    return f"{min(values):.1f}-{max(values):.1f}"


def plot(path: Path, studies: dict) -> None:
    reports = studies["curves"]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, (scenario, title) in zip(
        axes, (("draft_model", "draft model"), ("eagle3", "EAGLE3 head")), strict=True
    ):
        report = reports[scenario]
        for run, label in (
            ("v2_no_window", "no window"),
            ("v2_window", "W = 33"),
            ("v2_window_sinks", "W = 33 + 32 sinks"),
            ("v2_window_64", "W = 64"),
        ):
            if run not in report["runs"]:
                continue
            means = _by_context(report, run, "mean_length")
            ax.plot(list(means), list(means.values()), marker="o", label=label)
        ax.axvline(64, color="grey", linestyle=":", label="training context")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.set_title(f"{title}, trained at 64 tokens")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("mean acceptance length (K = 3)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
