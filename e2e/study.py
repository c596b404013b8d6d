# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The long-context study: acceptance and throughput by context length, window on and off.

    STUDY=long make e2e-ascend               # the scenario's target and draft, 4k .. model limit
    STUDY=long DRY_RUN=1 make e2e-ascend     # the vllm bench commands, written out to paste
    STUDY=long DEVICE=cuda E2E_SCENARIO=dspark make e2e-ascend
    STUDY=long MIN_CONTEXT=8192 make e2e-ascend   # the window engaged from 8k contexts on
    STUDY=long CONCURRENCY=1,4,16 make e2e-ascend # each context at each concurrency
    make study-cpu                           # here: the trained tiny models, vllm serve on CPU

Drafters trained on 4k-8k contexts lose acceptance at 32k and beyond; the window is there to
bring it back. It is vLLM's own benchmark, run as a vLLM user runs it (``sweep_plan.py``): for
each context vLLM's text cutter writes PROMPTS_PER_CONTEXT prompts of exactly that many
tokens of one text (``create_txt_slices_dataset``, the target's tokenizer), and ``vllm bench
sweep serve`` serves each run (no speculation, V2 without the window, with it, with sinks,
with ``"auto"``, V1 with the window on Ascend) and sends every context's prompts to it
(``vllm bench serve``, greedy, OUTPUT_TOKENS each, CONCURRENCY at once: all of them by
default), reading the spec-decode counters of ``/metrics`` around each. With SHARED_PREFIX=P
the longest context is also served as prompts that share their first P tokens (prefix-cache
hits). With MIN_CONTEXT (``draft_window_min_context`` of the V2 run with the window) the
report marks which contexts engage the window, beside the runs with the window on and off,
so that a threshold can be picked from the acceptance curve of one's own hardware and
drafter.

The text needs no model hub: by default the documentation CPython ships with itself (the
Python Language Reference topics of ``pydoc_data.topics``, then the standard library's own
module documentation), under the Python Software Foundation License; ``STUDY_TEXT``
(``--study-text``, a setting the study's own code passes: the CPU study's held-out text)
names another. Prompts are plain stretches of it, sent as completions (no chat template: the
context is exactly the prompt).

On CPU (``DEVICE=cpu``: vLLM's CPU worker, this project's test bed) the models are the
committed tiny ones (``trained_models/``) and the text is their held-out source (rebuilt from
.venv's vLLM 0.33.0: ``make heldout``).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from e2e import lossless

MIN_CONTEXT_KEY = "draft_window_min_context"
# Standard library modules whose own documentation follows the language reference.
DOCUMENTED_MODULES = (
    "argparse",
    "asyncio",
    "collections",
    "dataclasses",
    "email",
    "functools",
    "inspect",
    "itertools",
    "json",
    "logging",
    "os",
    "pathlib",
    "re",
    "socket",
    "subprocess",
    "threading",
    "typing",
    "unittest",
    "urllib.request",
    "zipfile",
)
CONTEXTS = (4096, 8192, 16384, 32768, 65536, 131072)
# Published anchors for the report, as their sources state them.
ANCHORS = (
    "GLM-5.2 + early DSpark drafter (seed article): mean acceptance length ~5 falls to ~1 at "
    "32k; a 512-1024 window brings 4.7-5.5, up to +381% throughput",
    "vllm-ascend #12103, DFlash on Qwen3.6-35B-A3B, W = 2048: mean acceptance length 1.11 -> "
    "4.49 at 32K and 1.05 -> 4.46 at 128K; output throughput x2.15 / x1.71",
    "vllm-ascend #10023, EAGLE3 on LongBench: 1.336 -> 1.881, GSM8K unchanged",
)


@functools.cache
def corpus() -> str:
    """The shipped documentation of this Python, as one text (about 1.2M characters;
    rendered once a process, in seconds)."""
    import pydoc
    import pydoc_data.topics

    parts = [pydoc_data.topics.topics[name] for name in sorted(pydoc_data.topics.topics)]
    for module in DOCUMENTED_MODULES:
        parts.append(pydoc.render_doc(module, renderer=pydoc.plaintext))
    return "\n\n".join(parts)


def contexts_up_to(limit: int, output_tokens: int) -> list[int]:
    """The study's contexts that fit a model of ``limit`` tokens with the output."""
    return [c for c in CONTEXTS if c + output_tokens <= limit]


def draft_kv_read(
    context: int, window: int | None, sinks: int, alignment: int, min_context: int = 0
) -> int:
    """The most KV tokens one draft step reads at ``context`` (window.py's bound): all of it
    below the threshold ``min_context``, at most ``S + W + a - 1`` from it on."""
    if window is None:
        return context
    from vllm_ascend.worker.v2.spec_decode.draft_window.window import (
        WindowSpec,
        align_sinks,
        effective_min_context,
    )

    sink_size = align_sinks(sinks, alignment)
    if context < effective_min_context(min_context, window, alignment, sink_size):
        return context
    return min(context, WindowSpec(window, alignment, sink_size).max_read_len)


# Where the study expects the window to help (a drafter trained at 4k-8k collapses at 32k)
# and where it must change little (within the drafter's training context), on hardware;
# the CPU study sets them for its drafter trained at 64 tokens (Settings).
LONG_CONTEXT = 32768
SHORT_CONTEXT = 4096


def unmeasured_drafts(results: dict[str, dict], num_spec: int | None) -> list[str]:
    """Each speculating workload that measured no drafts, or acceptance by position of
    another length than ``num_spec``."""
    failures = []
    for name, run in results.items():
        for workload, m in run.get("workloads", {}).items():
            per_position = m.get("per_position")
            if per_position is None:
                continue  # no speculation
            if not m.get("drafts") or m.get("mean_length") is None:
                failures.append(f"{name} {workload}: no drafts measured")
            elif num_spec is not None and len(per_position) != num_spec:
                failures.append(
                    f"{name} {workload}: acceptance by position has {len(per_position)} "
                    f"entries, num_speculative_tokens is {num_spec}"
                )
    return failures


def check(
    results: dict[str, dict],
    golden: dict[str, float] | None,
    tolerance: float,
    min_context: int = 0,
    long_from: int = LONG_CONTEXT,
    short_to: int = SHORT_CONTEXT,
    *,
    policy: lossless.Policy | None = None,
    num_spec: int | None = None,
) -> list[str]:
    """The study's assertions; returns the failures. Every run's texts, workload by workload,
    against the run without speculation's (or, without one, the V2 window run's) under
    ``policy`` (``lossless.py``: exact unless it says otherwise); each run's result under
    ``results[run]["lossless"]``. Every speculating run's acceptance by position has
    ``num_spec`` entries. The acceptance check is derived within the run: from ``long_from``
    on the window at least what no window accepts, up to ``short_to`` within 0.1 of it (and
    the golden, where one was recorded); a study that reaches neither checks nothing and
    fails. Below ``min_context`` the V2 run with the window reads what the run without it
    reads (the whole context), and is not compared with V1, which windows every context."""
    on, off, v1 = results["v2_window"], results["v2_no_window"], results.get("v1_window")
    reference = "no_speculation" if "no_speculation" in results else "v2_window"
    found, failures = lossless.check(results, reference, policy or lossless.Policy())
    for name, compared in found.items():
        results[name]["lossless"] = compared
    failures += unmeasured_drafts(results, num_spec)
    contexts = [int(c) for c in on["contexts"]]
    if golden is None and not any(c >= long_from or min_context <= c <= short_to for c in contexts):
        failures.append(
            f"no context of {contexts} is at least {long_from} (LONG_CONTEXT) or at most "
            f"{short_to} (SHORT_CONTEXT), and no golden: the acceptance is checked nowhere"
        )
    for ctx, got in on["contexts"].items():
        mean, without = got["mean_length"], off["contexts"][ctx]["mean_length"]
        if mean is None or without is None:
            continue  # no drafts: failed above
        if int(ctx) < min_context and abs(mean - without) > 0.1:
            failures.append(
                f"{ctx}: below {MIN_CONTEXT_KEY}={min_context}, acceptance with "
                f"the window {mean:.3f} is not within 0.1 of without "
                f"{without:.3f}"
            )
        elif int(ctx) >= long_from and mean < without:
            failures.append(f"{ctx}: acceptance with the window {mean:.3f} < without {without:.3f}")
        if min_context <= int(ctx) <= short_to and abs(mean - without) > 0.1:
            failures.append(
                f"{ctx}: acceptance with the window {mean:.3f} is not within 0.1 of "
                f"without {without:.3f}"
            )
        # V1 windows every context: comparable from the threshold on.
        v1_mean = None if v1 is None else v1["contexts"][ctx]["mean_length"]
        if v1_mean is not None and int(ctx) >= min_context and abs(mean - v1_mean) > 0.05:
            failures.append(
                f"{ctx}: V2 with the window {mean:.3f} is not within 0.05 of V1 {v1_mean:.3f}"
            )
        if golden is not None and ctx in golden and abs(mean - golden[ctx]) > tolerance:
            failures.append(
                f"{ctx}: mean acceptance length {mean:.3f}, golden {golden[ctx]:.3f} "
                f"(+-{tolerance})"
            )
    return failures


def write_report(out_dir: Path, meta: dict, results: dict[str, dict], failures: list[str]) -> None:
    """report.json, report.md (one row per workload and run, anchors beside) and study.png."""
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {**meta, "runs": results, "failures": failures, "anchors": list(ANCHORS)}
    (out_dir / "report.json").write_text(json.dumps(report, indent=2, default=str))
    min_context = meta.get("min_context", 0)
    threshold = f", {MIN_CONTEXT_KEY} {min_context}" if min_context else ""
    sinks = f", sinks {meta['sinks']} (run v2_window_sinks)" if meta["sinks"] else ""
    lines = [
        f"# Long-context study: {meta['scenario']} on {meta['device']}, W = {meta['window']}"
        f"{sinks}{threshold}",
        "",
        f"`vllm bench serve` of {meta['prompts_per_context']} prompts per workload, cut from "
        f"{meta['text']} to their context exactly with the target's tokenizer "
        f"(`create_txt_slices_dataset`), {meta['output_tokens']} output tokens each, "
        f"{sampled(meta.get('sampling'))}, "
        "at the workload's concurrency (shared prefix: every prompt begins with the same that "
        f"many tokens). Window engaged: whether the threshold ({MIN_CONTEXT_KEY}: "
        f"{min_context or 'every context'}) lets the V2 run with the window crop this context. "
        "Every figure from the sweeps' own `summary.csv` (`vllm bench sweep serve`). "
        "Acceptance from vLLM's spec-decode counters around the workload; output tok/s: its "
        "output tokens over its duration, prefill included (`vllm bench serve`'s output "
        "throughput).",
        "",
        "| context | concurrency | shared prefix | window engaged | run | mean acceptance length "
        "| acceptance rate | acceptance by position | output tok/s | TPOT ms "
        "| draft KV read per step |",
        "|---:|---:|---:|---|---|---:|---:|---|---:|---:|---:|",
    ]
    for workload in meta["workloads"]:
        for name, run in results.items():
            m = run["workloads"][workload]
            engaged = "yes" if m["context"] >= min_context else "no"
            mean = "-" if m["mean_length"] is None else f"{m['mean_length']:.3f}"
            per_position = rate = "-"
            if m["per_position"] is not None:
                per_position = ", ".join(f"{x:.2f}" for x in m["per_position"])
                rate = f"{m['acceptance_rate']:.1f}%"
            read = "-" if m["draft_kv_read"] is None else str(m["draft_kv_read"])
            lines.append(
                f"| {m['context']} | {m['concurrency']} | {m['shared_prefix'] or '-'} | "
                f"{engaged} | {name} | {mean} | {rate} | {per_position} | "
                f"{m['output_tokens_per_s']:.1f} | {m['tpot_ms']:.2f} | {read} |"
            )
    if meta.get("golden"):
        lines += ["", f"Golden mean acceptance length by context: {meta['golden']}."]
    lines += ["", *lossless_lines(meta.get("lossless", ""), results)]
    lines += [
        "",
        "Anchors (published, other setups):",
        *[f"- {a}" for a in ANCHORS],
        "",
        *report_end(
            meta.get("produced_by"), failures, "study.png", "acceptance and throughput by context"
        ),
    ]
    (out_dir / "report.md").write_text("\n".join(lines))
    plot(out_dir / "study.png", meta, results)


def report_end(produced: dict | None, failures: list[str], image: str, plotted: str) -> list[str]:
    """A report's last lines (the scenario's and the study's): what produced it, its
    failures, and its plot ``image``, described as ``plotted``."""
    return [
        *produced_by_lines(produced),
        "",
        "Failures: " + ("none" if not failures else "; ".join(failures)),
        "",
        f"![{plotted}]({image})",
        "",
    ]


def sampled(sampling: dict | None) -> str:
    """How the requests sampled: greedy, or the user's sampling."""
    if not sampling or float(sampling.get("temperature", 0)) == 0:
        return "greedy"
    return "sampled (" + ", ".join(f"{k} {v}" for k, v in sampling.items()) + ")"


def lossless_lines(policy: str, results: dict[str, dict]) -> list[str]:
    """Each run's texts against the reference's, as measured (``lossless.py``)."""
    lines = [f"Texts against the reference run (lossless check, {policy}):", ""]
    for name, run in results.items():
        found = run.get("lossless")
        if found is None:
            continue
        where = lossless.describe_divergences(found["divergences"]) or "none"
        lines.append(
            f"- {name}: {found['identical']} of {found['total']} identical to "
            f"{found['reference']}'s; divergences: {where}"
        )
    return lines


def produced_by_lines(produced: dict | None) -> list[str]:
    """What produced a report: the time, the versions, the models, the settings."""
    if not produced:
        return []
    versions = ", ".join(f"{k} {v or 'not installed'}" for k, v in produced["versions"].items())
    models = ", ".join(f"{k} {v}" for k, v in produced["models"].items())
    settings = " ".join(f"{k}={v}" for k, v in produced["settings"].items()) or "(defaults)"
    return [
        f"Produced by: `{produced['command']}` from {produced['started']} to "
        f"{produced.get('finished', '-')} on {produced['device']}; {versions}; checkout "
        f"{produced.get('commit') or 'unknown'}; models: {models}; settings: {settings}."
    ]


def plot(path: Path, meta: dict, results: dict[str, dict]) -> bool:
    """Acceptance and output throughput against context, one line per run; False where
    matplotlib is not installed."""
    # Drawn here: `vllm bench sweep plot` cannot curve by run (its --curve-by cannot sort the
    # dict-valued --speculative-config / --additional-config: TypeError, vLLM 0.33.0).
    plt = pyplot()
    if plt is None:
        return False
    min_context = meta.get("min_context", 0)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for i, (name, run) in enumerate(results.items()):
        # One colour per run in both panels; "auto" dashed, over the window it equals.
        style = {"color": f"C{i}", "marker": "o", "label": name}
        if name == "v2_auto":
            style.update(linestyle="--", marker="x")
        xs = [int(c) for c in run["contexts"]]
        means = [m["mean_length"] for m in run["contexts"].values()]
        if None not in means:
            left.plot(xs, means, **style)
        right.plot(xs, [m["output_tokens_per_s"] for m in run["contexts"].values()], **style)
    for ax, label in ((left, "mean acceptance length"), (right, "output tokens/s")):
        if min_context:
            ax.axvline(min_context, color="grey", linestyle="--", label=MIN_CONTEXT_KEY)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel(label)
        ax.legend()
    threshold = f", {MIN_CONTEXT_KEY} {min_context}" if min_context else ""
    fig.suptitle(f"{meta['scenario']} on {meta['device']}: window {meta['window']}{threshold}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def pyplot():
    """matplotlib's pyplot without a display, or None where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


@dataclass
class Settings:
    """What the study runs, from the settings given (``defaults``: a device's own, which
    the settings given override)."""

    contexts: list[int]
    prompts_per_context: int
    output_tokens: int
    # The window's alignment on the host (its block size), for the draft KV read.
    alignment: int
    # The text the prompts are cut from (None: this Python's documentation, ``corpus``).
    text_path: str | None = None
    long_from: int = LONG_CONTEXT
    short_to: int = SHORT_CONTEXT
    # How many runs' servers run at once (CPU: one core each).
    parallel: int = 1
    # --max-model-len of every server (0: the longest context and its output).
    max_model_len: int = 0
    # The prompts of a workload in flight at once, each context at each (None: all of them).
    concurrency: list[int] | None = None
    # A workload of the longest context whose prompts share their first this many tokens.
    shared_prefix: int = 0

    @classmethod
    def given(
        cls, given: dict[str, str], target: str, device: str, defaults: dict | None = None
    ) -> Settings:
        env = {**(defaults or {}), **given}
        output_tokens = int(env.get("OUTPUT_TOKENS", 256))
        if env.get("CONTEXTS"):
            contexts = sorted({int(c) for c in env["CONTEXTS"].split(",")})
        else:
            limit = int(env.get("MAX_CONTEXT", 0)) or model_limit(target)
            contexts = contexts_up_to(limit, output_tokens)
        default_block = 128 if device == "ascend" else 16
        concurrency = [int(c) for c in env.get("CONCURRENCY", "").split(",") if c.strip()]
        return cls(
            contexts,
            int(env.get("PROMPTS_PER_CONTEXT", 3)),
            output_tokens,
            int(env.get("BLOCK_SIZE", default_block)),
            env.get("STUDY_TEXT") or None,
            long_from=int(env.get("LONG_CONTEXT", LONG_CONTEXT)),
            short_to=int(env.get("SHORT_CONTEXT", SHORT_CONTEXT)),
            parallel=int(env.get("PARALLEL", 1)),
            max_model_len=int(env.get("MAX_MODEL_LEN", 0)),
            concurrency=concurrency or None,
            shared_prefix=int(env.get("SHARED_PREFIX", 0)),
        )

    @property
    def concurrencies(self) -> list[int]:
        return self.concurrency or [self.prompts_per_context]

    @property
    def served_len(self) -> int:
        """The servers' --max-model-len."""
        return self.max_model_len or max(self.contexts) + self.output_tokens

    def text(self) -> str:
        if self.text_path is None:
            return corpus()
        return Path(self.text_path).read_text(encoding="utf-8")


def model_limit(target: str) -> int:
    """The target's context limit from its local config.json, else 40960 (the default
    target Qwen3-8B's ``max_position_embeddings``; set MAX_CONTEXT for a longer one)."""
    config = Path(target) / "config.json"
    if config.is_file():
        value = json.loads(config.read_text()).get("max_position_embeddings")
        if isinstance(value, int) and value > 0:
            return value
    return 40960


def training_context(model: str) -> int | None:
    """The context a drafter was trained at: its training record where it was trained here
    (``training.json`` beside it, its recipe's stage of that name), else what its
    ``config.json`` declares (``max_position_embeddings``: a head declares its training
    context there, which vLLM raises to the target's at start-up); None where neither says."""
    path = Path(model)
    record = path.parent / "training.json"
    if record.is_file():
        stage = json.loads(record.read_text()).get("recipe", {}).get(path.name, {})
        if isinstance(stage, dict) and isinstance(stage.get("context"), int):
            return stage["context"]
    config = path / "config.json"
    if config.is_file():
        value = json.loads(config.read_text()).get("max_position_embeddings")
        if isinstance(value, int) and value > 0:
            return value
    return None


def golden_path(root: Path, scenario: str, window: int, min_context: int = 0) -> Path:
    """The golden file of the V2 run with the window (sinks are a run of their own)."""
    suffix = f"_m{min_context}" if min_context else ""
    return root / "e2e" / "golden" / f"study_{scenario}_w{window}{suffix}.json"
