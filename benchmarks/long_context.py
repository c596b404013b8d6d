# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""`make bench`, section 0: what the window is for, end to end in a real vLLM engine on CPU.

The long-context study of ``make e2e-ascend`` (``python -m e2e --study long --device cpu``: vLLM's
own ``vllm bench sweep serve`` and ``vllm bench serve``, prompts cut by its
``create_txt_slices_dataset``) over the committed tiny models (``trained_models/``): a draft
model trained at 64 tokens and an EAGLE3 head trained at 64 tokens on the target's hidden
states, for a target sound to 1088. The curve: contexts from inside the training context
(32) to 16 times it (1024), 8 prompts of held-out text per context, sent together, 16 new
tokens each, greedy, K = 3, KV blocks of 32; each drafter without the window, with it (W =
33, the window ``"auto"`` picks for a drafter declaring 64), with it and 32 attention sinks;
the draft model also with W = 64 (its whole training context, so its reads reach 95); two
servers at a time (acceptance does not depend on speed); and again, without the window and
with W = 33, on an AVX2-only CPU's path (vLLM's AVX2 ops, torch's AVX2 kernels), to show
how far another machine's curve moves; and sampled as users serve (temperature 0.8, each
request with vLLM's seed 0), each drafter without the window and with W = 33, the draft
model's twice (how far a rerun moves). Under load: at 1024 tokens, 16 prompts at
concurrency 1, 4 and 16, and 16 prompts that share their first 768 tokens (prefix-cache
hits) at concurrency 16, against no speculation and each drafter without and with the
window, one server at a time; output tokens/s as ``vllm bench serve`` measures them
(prefill included). On CPU every Triton kernel runs in Triton's interpreter, which takes
most of each engine step whatever the model does, so the throughput ratios are this
machine's, not an accelerator's; acceptance and tokens are the same on every machine.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks.measure import markdown_table
from e2e import cpu_study

ROOT = Path(__file__).resolve().parent.parent
LONGEST = 1024
CURVES = {
    # scenario: the study's settings beside DEVICE=cpu STUDY=long
    "draft_model": {"SINKS": "32", "MORE_WINDOWS": "64", "PARALLEL": "2"},
    "eagle3": {"SINKS": "32", "NO_SPECULATION": "0", "PARALLEL": "2"},
}
# The curves again on an AVX2-only CPU's path: without the window and with W = 33.
AVX2 = {"NO_SPECULATION": "0", "PARALLEL": "2"}
# The curves again sampled as users serve: temperature 0.8, every request with vLLM's seed 0
# (the harness's SEED), without the window and with W = 33; the draft model's twice, to show
# how far a rerun of a seeded sampled curve moves (which requests share an engine step).
SAMPLED = {"TEMPERATURE": "0.8", "NO_SPECULATION": "0", "PARALLEL": "2"}
# Under load, one server at a time (the runs without speculation: once, with the draft model).
LOAD = {"CONTEXTS": str(LONGEST), "PROMPTS_PER_CONTEXT": "16", "CONCURRENCY": "1,4,16"}
LOAD_SCENARIOS = {
    "draft_model": {**LOAD, "SHARED_PREFIX": "768"},
    "eagle3": {**LOAD, "SHARED_PREFIX": "768", "NO_SPECULATION": "0"},
}
LABELS = {"draft_model": "draft model", "eagle3": "EAGLE3"}


def study(
    scenario: str, out: Path, settings: dict[str, str], env: dict[str, str] | None = None
) -> dict:
    """One CPU study of ``scenario`` (``e2e.cpu_study``) with ``settings``, ``env`` (the
    engine's own variables: an AVX2 path) over this process's environment; its report,
    failed checks included (the report's verdicts say them: ``long_context_lines``), its
    acceptance lines printed."""
    report, printed = cpu_study.run(scenario, out, settings, env)
    print("\n".join(f"  {line}" for line in printed.splitlines() if ": mean" in line), flush=True)
    return report


def avx2_path(root: Path) -> dict[str, str]:
    """What an engine runs on an AVX2-only CPU, on this one: the installed vLLM with its
    AVX2 ops (``tools/cpu_ops.py``), and torch's kernels at AVX2."""
    import vllm

    from tools import cpu_ops

    wheel = cpu_ops.fetched_wheel(ROOT)
    cpu_ops.package_with_build(wheel, Path(vllm.__file__).parent, root, "avx2")
    return {"PYTHONPATH": str(root), "ATEN_CPU_CAPABILITY": "avx2"}


def bench_dflash(out: Path) -> dict:
    """The DFlash drafter's curve (``trained_models/dflash``) in vLLM's offline engine
    (``testbed/engine/study.py``): the contexts of the CPU study, 8 prompts of held-out text
    each, 16 tokens, K = 3, greedy and sampled (temperature 0.8, every request seeded),
    without the window, with W = 33 and with ``"auto"``, against the target alone; mean
    acceptance length by run, sampling and context, and the greedy tokens' verdict."""
    import trained_models as trained
    from e2e.scenarios import cpu_study_defaults
    from testbed.engine.study import GREEDY, SAMPLED, StudyRun, mean_lengths, run_study

    models = trained.committed()
    contexts = tuple(int(c) for c in cpu_study_defaults()["CONTEXTS"].split(","))
    window = trained.DRAFT_CONTEXT - 32 + 1
    runs = [
        StudyRun("no_speculation"),
        *(StudyRun(name, "dflash", config) for name, config in dflash_runs(window).items()),
    ]
    found = run_study(models, models.dflash, runs, contexts, out, (GREEDY, SAMPLED))
    failures = [f"{n}: {r['error']}" for n, r in found.results.items() if "error" in r]
    if failures:
        raise RuntimeError(f"the DFlash study failed: {failures}\n{(out / 'engine.log')}")
    alone = found.results["no_speculation"]["contexts"]["greedy"]
    counted = [
        found.results[run]["contexts"]["greedy"][c]["token_ids"][i] == alone[c]["token_ids"][i]
        for run in dflash_runs(window)
        for c in alone
        for i in range(len(alone[c]["token_ids"]))
    ]
    return {
        "contexts": list(contexts),
        "window": window,
        "sampling": SAMPLED,
        "training_context": trained.DRAFT_CONTEXT,
        "num_spec": trained.NUM_SPEC,
        "means": {
            sampling: {
                run: mean_lengths(found.results[run], sampling) for run in dflash_runs(window)
            }
            for sampling in ("greedy", f"t{SAMPLED['temperature']}")
        },
        "identical": sum(counted),
        "total": len(counted),
        "wall_s": round(found.wall_s, 1),
    }


def dflash_runs(window: int) -> dict[str, dict]:
    """The DFlash curve's runs and their window keys."""
    return {
        "v2_no_window": {},
        "v2_window": {"draft_window_size": window},
        "v2_auto": {"draft_window_size": "auto"},
    }


def dflash_lines(dflash: dict) -> list[str]:
    """The DFlash drafter's curve, greedy and sampled, its share of the in-distribution
    acceptance at the longest context and the tokens' verdict."""
    contexts = dflash["contexts"]
    sampled = f"t{dflash['sampling']['temperature']}"
    rows = [
        (f"DFlash, {run_label(dflash, run)}{suffix}", [f"{found[c]:.2f}" for c in contexts])
        for sampling, suffix in (("greedy", ""), (sampled, ", sampled"))
        for run, found in dflash["means"][sampling].items()
    ]
    lines = [
        f"The DFlash drafter (`trained_models/dflash`: one layer, a block of "
        f"{dflash['num_spec'] + 1} drafted in one pass, trained at {dflash['training_context']} "
        "tokens on the target's hidden states) in vLLM's offline engine (`testbed/engine/"
        "study.py`: the same contexts, 8 prompts of held-out text each, 16 new tokens, K = "
        f"{dflash['num_spec']}): mean acceptance length, greedy and sampled (temperature "
        f"{dflash['sampling']['temperature']}, every request seeded):",
        "",
        *run_table(contexts, rows),
    ]
    longest, inside = max(contexts), min(contexts)

    def share(sampling: str, run: str) -> float:
        by_run = dflash["means"][sampling]
        return by_run[run][longest] / by_run["v2_no_window"][inside]

    shares = [
        f"{run_label(dflash, run)} {share(s, run):.0%}{suffix}"
        for s, suffix in (("greedy", " greedy"), (sampled, " sampled"))
        for run in dflash["means"][s]
    ]
    same = dflash["identical"] == dflash["total"]
    verdict = "the same as" if same else "DIFFERENT from"
    lines += [
        "",
        f"At {longest} tokens the DFlash drafter keeps this share of its in-distribution "
        f"acceptance (no window at {inside} tokens): {'; '.join(shares)}. Greedy tokens: "
        f"{verdict} the target alone's ({dflash['identical']} of {dflash['total']} texts).",
    ]
    return lines


def bench_long_context(out: Path) -> dict:
    """The curve of each family, again on an AVX2-only CPU's path, and each family under
    load at the longest context; the DFlash drafter's curve."""
    dflash = bench_dflash(out / "study" / "dflash")
    curves = {s: study(s, out / "study", extra) for s, extra in CURVES.items()}
    with tempfile.TemporaryDirectory() as tmp:
        path = avx2_path(Path(tmp))
        avx2 = {s: study(s, out / "study" / "avx2", AVX2, path) for s in CURVES}
    sampled = {s: study(s, out / "study" / "sampled", SAMPLED) for s in CURVES}
    rerun = study("draft_model", out / "study" / "sampled_rerun", SAMPLED)
    load = {s: study(s, out / "study" / "load", extra) for s, extra in LOAD_SCENARIOS.items()}
    return {
        "curves": curves,
        "avx2": avx2,
        "sampled": sampled,
        "rerun": rerun,
        "load": load,
        "dflash": dflash,
    }


def run_label(report: dict, run: str) -> str:
    """A run as its report's config names it (a study's, or the DFlash curve's): the window
    and sinks it was served with."""
    window, sinks = report["window"], report.get("sinks", 0)
    if run == "v2_no_window":
        return "no window"
    if run == "v2_window":
        return f"W = {window}"
    if run == "v2_window_sinks":
        return f"W = {window} + {sinks} sinks"
    if run == "v2_auto":
        return "auto"
    if run.startswith("v2_window_"):
        return f"W = {run.removeprefix('v2_window_')}"
    return run


def trained_at(reports: dict) -> int:
    """The drafters' training context, from their reports (the models' training record);
    the same for every drafter the curves compare, else a ValueError."""
    (context,) = {r["draft_training_context"] for r in reports.values()}
    return context


def setup_line(reports: dict) -> str:
    """What the curves served, from their reports (the module's docstring says why)."""
    base = reports["draft_model"]
    runs = sorted({run_label(r, n) for r in reports.values() for n in r["runs"]} - {"no window"})
    return (
        "The long-context study of `make e2e-ascend` (`DEVICE=cpu STUDY=long`: `vllm bench "
        "sweep serve` and `vllm bench serve`, prompts cut by `create_txt_slices_dataset`) over "
        f"the committed tiny models, the draft model and the EAGLE3 head trained at "
        f"{trained_at(reports)} tokens: contexts {', '.join(map(str, base['contexts']))}, "
        f"{base['prompts_per_context']} prompts of held-out text per context sent together, "
        f"{base['output_tokens']} new tokens each, greedy, K = {base['num_spec']}; each drafter "
        f"without the window and with {', '.join(r for r in runs if r != 'no_speculation')}."
    )


def mean_cells(report: dict, run: str, contexts: list[int]) -> list[str]:
    """A run's mean acceptance length at each of ``contexts``, as its table cells."""
    found = _by_context(report, run, "mean_length")
    return [f"{found[c]:.2f}" for c in contexts]


def run_table(heads: list, rows: list[tuple[str, list[str]]]) -> list[str]:
    """A markdown table of runs by ``heads`` (contexts, workloads): each row a run's name and
    its cells."""
    return markdown_table(
        ["run", *(str(head) for head in heads)], [[name, *cells] for name, cells in rows], "l"
    )


def _by_context(report: dict, run: str, field: str) -> dict[int, float | None]:
    return {int(c): m[field] for c, m in report["runs"][run]["contexts"].items()}


def long_context_lines(studies: dict) -> list[str]:
    reports = studies["curves"]
    base = reports["draft_model"]
    contexts = base["contexts"]
    rows = [
        (f"{LABELS[scenario]}, {run_label(report, run)}", mean_cells(report, run, contexts))
        for scenario, report in reports.items()
        for run in report["runs"]
        if run != "no_speculation"
    ]
    lines = [
        "## What the window is for: a drafter trained short, served long (real engine, CPU)",
        "",
        setup_line(reports),
        "",
        "Mean acceptance length (vLLM's spec-decode metrics, bonus token included, at most "
        f"{1 + base['num_spec']}) by context (tokens of prompt; the drafters trained at "
        f"{trained_at(reports)}):",
        "",
        *run_table(contexts, rows),
        "",
        *_sampled_lines(studies),
        "",
        *_avx2_lines(studies),
    ]
    lines += ["", *_load_lines(studies["load"])]
    lines += ["", *dflash_lines(studies["dflash"])]
    greedy, sampled = greedy_reports(studies), sampled_reports(studies)
    lines += [
        "",
        f"Tokens: {tokens_verdict(greedy)} (every run's texts, workload by workload, against "
        "its study's reference run: the harness's lossless counts); the greedy runs' checks "
        f"(the texts, acceptance within the run, the window's start-up lines): "
        f"{checks_verdict(greedy)}; the sampled runs' checks (acceptance within the run, the "
        f"window's start-up lines): {checks_verdict(sampled)}. Each run's report is in "
        "`benchmarks/results/study/`, not kept.",
        "",
        "![acceptance by context](long_context.png)",
        "",
    ]
    return lines


def greedy_reports(studies: dict) -> dict[str, dict]:
    """The greedy studies' reports by name: the curves, on the AVX2 path, under load."""
    return {
        **{LABELS[s]: r for s, r in studies["curves"].items()},
        **{f"{LABELS[s]} (AVX2 path)": r for s, r in studies["avx2"].items()},
        **{f"{LABELS[s]} under load": r for s, r in studies["load"].items()},
    }


def sampled_reports(studies: dict) -> dict[str, dict]:
    """The sampled studies' reports by name, the rerun's included."""
    found = {f"{LABELS[s]} sampled": r for s, r in studies["sampled"].items()}
    return {**found, f"{LABELS['draft_model']} sampled, rerun": studies["rerun"]}


def tokens_verdict(reports: dict[str, dict]) -> str:
    """Whether every run's texts are its reference run's, from the reports' lossless counts
    (``runs[run]["lossless"]``: identical of total; the reference run has none)."""
    counted = [
        (f"{study} {run}", found["lossless"])
        for study, report in reports.items()
        for run, found in report["runs"].items()
        if "lossless" in found
    ]
    identical = sum(c["identical"] for _, c in counted)
    total = sum(c["total"] for _, c in counted)
    if total == 0:
        return "NOT COMPARED (no run's texts were counted)"
    if identical == total:
        return f"the same in every greedy run ({identical} of {total} texts, {len(counted)} runs)"
    differ = [
        f"{name} {c['identical']} of {c['total']}"
        for name, c in counted
        if c["identical"] < c["total"]
    ]
    return f"DIFFERENT ({identical} of {total} texts the same; {'; '.join(differ)})"


def failed_checks(reports: dict[str, dict]) -> list[str]:
    """The harness's failed checks in these reports, by study (``make bench`` fails on any)."""
    return [f"{study}: {f}" for study, report in reports.items() for f in report["failures"]]


def checks_verdict(reports: dict[str, dict]) -> str:
    """The harness's checks over these reports: passed, or each failure by its study."""
    failed = failed_checks(reports)
    return "passed" if not failed else f"FAILED ({'; '.join(failed)})"


def _load_lines(load: dict) -> list[str]:
    """Each workload under load: acceptance, output tokens/s, and the ratios."""
    base = load["draft_model"]
    workloads = base["workloads"]
    alone = base["runs"]["no_speculation"]["workloads"]

    def head(m: dict) -> str:
        shared = f", prefix {m['shared_prefix']} shared" if m["shared_prefix"] else ""
        return f"c = {m['concurrency']}{shared}"

    heads = [head(alone[w]) for w in workloads]

    def cells(found: dict, field: str, digits: int) -> list[str]:
        return [f"{found[w][field]:.{digits}f}" for w in workloads]

    def ratios(found: dict, to: dict) -> list[str]:
        return [
            f"{found[w]['output_tokens_per_s'] / to[w]['output_tokens_per_s']:.2f}"
            for w in workloads
        ]

    rows = [("no speculation, tok/s", cells(alone, "output_tokens_per_s", 1))]
    for scenario, report in load.items():
        on, off = (report["runs"][run]["workloads"] for run in ("v2_window", "v2_no_window"))
        drafter, window = LABELS[scenario], run_label(report, "v2_window")
        both = ((f"{drafter}, no window", off), (f"{drafter}, {window}", on))
        rows += [(f"{name}, acceptance length", cells(f, "mean_length", 2)) for name, f in both]
        rows += [(f"{name}, tok/s", cells(f, "output_tokens_per_s", 1)) for name, f in both]
        rows += [
            (f"{drafter}, {window} / no window", ratios(on, off)),
            (f"{drafter}, {window} / no speculation", ratios(on, alone)),
        ]
    return [
        f"Under load, at {LONGEST} tokens of context (16 prompts per workload, c prompts in "
        "flight; one server at a time): mean acceptance length, and output tokens/s of this "
        "machine (`vllm bench serve`'s output throughput) with the ratios to the same drafter "
        "without the window and to no speculation:",
        "",
        *run_table(heads, rows),
    ]


def _share(report: dict, run: str, longest: int) -> float:
    """How much of the in-distribution acceptance (the shortest context, no window) ``run``
    keeps at ``longest``."""
    inside = _by_context(report, "v2_no_window", "mean_length")
    return _by_context(report, run, "mean_length")[longest] / inside[min(inside)]


def _sampled_lines(studies: dict) -> list[str]:
    """The curves sampled as users serve, beside the greedy ones, and a rerun's distance."""
    sampled, greedy = studies["sampled"], studies["curves"]
    contexts = sampled["draft_model"]["contexts"]
    longest = max(contexts)
    sampling = ", ".join(f"{k} {v}" for k, v in sampled["draft_model"]["sampling"].items())
    lines = [
        f"Sampled as users serve ({sampling}: every request seeded): mean acceptance length "
        "by context, the same prompts and servers as above; sampled runs are checked on "
        "acceptance only (their tokens are not expected to match across runs):",
        "",
        *run_table(
            contexts,
            [
                (f"{LABELS[scenario]}, {run_label(report, run)}", mean_cells(report, run, contexts))
                for scenario, report in sampled.items()
                for run in ("v2_no_window", "v2_window")
            ],
        ),
    ]
    shares = [
        f"{LABELS[s]} {_share(greedy[s], 'v2_window', longest):.0%} greedy, "
        f"{_share(r, 'v2_window', longest):.0%} sampled"
        for s, r in sampled.items()
    ]
    here = _by_context(sampled["draft_model"], "v2_window", "mean_length")
    there = _by_context(studies["rerun"], "v2_window", "mean_length")
    moved = max(abs(there[c] - here[c]) for c in contexts)
    return [
        *lines,
        "",
        f"At {longest} tokens the window keeps this share of the in-distribution acceptance "
        f"(no window at {min(contexts)} tokens): {'; '.join(shares)}. A rerun of the draft "
        f"model's sampled curve with the window, the same seed, moves it by at most "
        f"{moved:.2f}.",
    ]


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
    windows = sorted({run_label(r, "v2_window") for r in studies["avx2"].values()})
    return [
        f"The same curves (each drafter without the window and with {', '.join(windows)}) on "
        "an AVX2-only "
        "CPU's path, run on this machine: vLLM's AVX2 ops (`tools/cpu_ops.py`) and torch's "
        f"kernels at AVX2. {same} of {len(diffs)} mean acceptance lengths are the same; the "
        f"farthest apart is {scenario} {run} at {context} tokens, by {worst:.2f} (two runs "
        "of one server differ by up to about 0.25: which requests share an engine step). "
        "The weights are committed, the same on every machine (`trained_models/`), so this "
        "is how far another machine's curve moves."
    ]


def plot(path: Path, studies: dict) -> None:
    # Drawn here: `vllm bench sweep plot` cannot tell the runs apart (their dict-valued
    # configs; tests/test_bench.py runs it on a sweep's results).
    reports = studies["curves"]
    context = trained_at(reports)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2), sharey=True)
    for ax, (scenario, title) in zip(
        axes[:2], (("draft_model", "draft model"), ("eagle3", "EAGLE3 head")), strict=True
    ):
        report = reports[scenario]
        for run in report["runs"]:
            if run == "no_speculation":
                continue
            means = _by_context(report, run, "mean_length")
            ax.plot(list(means), list(means.values()), marker="o", label=run_label(report, run))
        sampled = studies["sampled"][scenario]
        for run in ("v2_no_window", "v2_window"):
            means = _by_context(sampled, run, "mean_length")
            label = f"{run_label(sampled, run)}, temperature {sampled['sampling']['temperature']}"
            ax.plot(list(means), list(means.values()), marker="x", linestyle="--", label=label)
        ax.axvline(context, color="grey", linestyle=":", label="training context")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.set_title(f"{title}, trained at {context} tokens")
        ax.legend(fontsize=8)
    _plot_dflash(axes[2], studies["dflash"])
    axes[0].set_ylabel(f"mean acceptance length (K = {reports['eagle3']['num_spec']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_dflash(ax, dflash: dict) -> None:
    temperature = dflash["sampling"]["temperature"]
    for sampling, style in (("greedy", ("o", "-")), (f"t{temperature}", ("x", "--"))):
        for run, found in dflash["means"][sampling].items():
            label = run_label(dflash, run)
            if sampling != "greedy":
                label += f", temperature {temperature}"
            contexts = sorted(found)
            ax.plot(
                contexts,
                [found[c] for c in contexts],
                marker=style[0],
                linestyle=style[1],
                label=label,
            )
    ax.axvline(dflash["training_context"], color="grey", linestyle=":", label="training context")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context (tokens)")
    ax.set_title(f"DFlash drafter, trained at {dflash['training_context']} tokens")
    ax.legend(fontsize=8)
