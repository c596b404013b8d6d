# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The long-context study: acceptance and throughput by context length, window on and off.

    STUDY=long make e2e-ascend               # the scenario's target and draft, 4k .. model limit
    STUDY=long DRY_RUN=1 make e2e-ascend     # every server and request, per context
    STUDY=long DEVICE=cuda E2E_SCENARIO=dspark make e2e-ascend
    STUDY=long MIN_CONTEXT=8192 make e2e-ascend   # the window engaged from 8k contexts on
    make study-cpu                           # here: the trained tiny models, vllm serve on CPU

Drafters trained on 4k-8k contexts lose acceptance at 32k and beyond; the window is there to
bring it back. For each run (V2 with the window, V2 without, V1 with the window on Ascend)
one server serves every context; for each context it sends PROMPTS_PER_CONTEXT natural long
prompts, greedy, OUTPUT_TOKENS tokens each, and reads vLLM's metrics around them. With
MIN_CONTEXT (``draft_window_min_context`` of the V2 run with the window) the report marks
which contexts engage the window, beside the runs with the window on and off, so that a
threshold can be picked from the acceptance curve of one's own hardware and drafter.

The text needs no model hub: it is the documentation CPython ships with itself (the Python
Language Reference topics of ``pydoc_data.topics``, then the standard library's own module
documentation), under the Python Software Foundation License. Each prompt is a different
stretch of it, cut to the context's token count, with a question about it at the end so the
model has something to write. Token counts come from the target's tokenizer when it is a
local directory transformers can read; otherwise from an estimate of 4 characters per
token (English prose and code documentation under the BPE tokenizers of current targets run
3.5 to 4.5) in a dry run, and from the served target's own tokenizer (vLLM's ``/tokenize``)
in a real one; the report states which.

On CPU (``DEVICE=cpu``: vLLM's CPU worker, this project's test bed) the models are the tiny
ones trained here (``tests/testbed/engine/trained.py``) and the text is their held-out
source (``STUDY_TEXT``): each prompt is a stretch of it cut to the context exactly, sent as
a plain completion (the tiny tokenizer has no chat template), with no question after it.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CHARS_PER_TOKEN = 4
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
# Room for the chat template and the question around the text.
TEMPLATE_MARGIN = 96
QUESTIONS = (
    "Explain in your own words what the last section above describes.",
    "Summarize the main rules stated in the text above.",
    "Which statement or feature does the last part of the text define, and how is it used?",
    "Write a short example that follows the last section of the documentation above.",
)
# Published anchors for the report, as their sources state them.
ANCHORS = (
    "GLM-5.2 + early DSpark drafter (seed article): mean acceptance length ~5 falls to ~1 at "
    "32k; a 512-1024 window brings 4.7-5.5, up to +381% throughput",
    "vllm-ascend #12103, DFlash on Qwen3.6-35B-A3B, W = 2048: mean acceptance length 1.11 -> "
    "4.49 at 32K and 1.05 -> 4.46 at 128K; output throughput x2.15 / x1.71",
    "vllm-ascend #10023, EAGLE3 on LongBench: 1.336 -> 1.881, GSM8K unchanged",
)


def corpus() -> str:
    """The shipped documentation of this Python, as one text (about 1.2M characters)."""
    import pydoc
    import pydoc_data.topics

    parts = [pydoc_data.topics.topics[name] for name in sorted(pydoc_data.topics.topics)]
    for module in DOCUMENTED_MODULES:
        parts.append(pydoc.render_doc(module, renderer=pydoc.plaintext))
    return "\n\n".join(parts)


@dataclass
class TokenCounter:
    """Counts tokens with the target's tokenizer, or estimates them."""

    encode: Callable[[str], list] | None = None
    source: str = f"estimate: {CHARS_PER_TOKEN} characters per token"

    def count(self, text: str) -> int:
        if self.encode is None:
            return math.ceil(len(text) / CHARS_PER_TOKEN)
        return len(self.encode(text))

    @classmethod
    def for_target(cls, target: str) -> TokenCounter:
        if not Path(target).is_dir():
            return cls()
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(target, local_files_only=True)
        except Exception:
            return cls()
        return cls(
            lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
            f"the target's tokenizer ({target})",
        )

    @classmethod
    def remote(cls, http: Callable, base: str, model: str) -> TokenCounter:
        """The served target's tokenizer, through vLLM's ``/tokenize``."""

        def encode(text: str) -> list:
            body = {"model": model, "prompt": text, "add_special_tokens": False}
            return json.loads(http(f"{base}/tokenize", body))["tokens"]

        return cls(encode, f"the served target's tokenizer ({base}/tokenize)")


@dataclass
class Prompt:
    context: int  # the context length it was cut for
    text: str
    tokens: int  # text and question, as counted


def build_prompts(
    context: int, count: int, counter: TokenCounter, text: str, with_question: bool = True
) -> list[Prompt]:
    """``count`` prompts of at most ``context - TEMPLATE_MARGIN`` tokens, each a different
    stretch of ``text`` (starts spread over it) ending in a question; without a question,
    plain stretches of at most ``context`` tokens (a completion has no template around it)."""
    budget = context - TEMPLATE_MARGIN if with_question else context
    out = []
    for k in range(count):
        question = "\n\n" + QUESTIONS[k % len(QUESTIONS)] if with_question else ""
        room = budget - counter.count(question)
        start = (k * len(text)) // max(count, 1)
        # The longest stretch from `start` (wrapping round) that fits: bisection on length.
        doubled = text[start:] + "\n\n" + text
        lo, hi = 0, min(len(doubled), room * (CHARS_PER_TOKEN + 4))
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if counter.count(doubled[:mid]) <= room:
                lo = mid
            else:
                hi = mid - 1
        body = doubled[:lo]
        out.append(Prompt(context, body + question, counter.count(body + question)))
    return out


def contexts_up_to(limit: int, output_tokens: int) -> list[int]:
    """The study's contexts that fit a model of ``limit`` tokens with the output."""
    return [c for c in CONTEXTS if c + output_tokens <= limit]


def counters(text: str) -> dict[str, float]:
    """Every sample of a Prometheus text, summed over labels; acceptance counters by
    position under ``...per_pos_total@<position>``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name = name_labels.split("{", 1)[0]
        if name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
            name += "@" + re.search(r'position="(\d+)"', name_labels).group(1)
        out[name] = out.get(name, 0.0) + float(value)
    return out


def context_metrics(before: str, after: str, num_spec: int, speculative: bool = True) -> dict:
    """Acceptance, decode speed and time per output token between two scrapes; a run
    without speculation (``speculative`` False) has no acceptance (None)."""
    a, b = counters(before), counters(after)

    def delta(name: str) -> float:
        return b.get(name, 0.0) - a.get(name, 0.0)

    drafts = delta("vllm:spec_decode_num_drafts_total")
    if speculative and drafts <= 0:
        raise RuntimeError("no speculative drafts were counted: is speculative decoding on?")
    per_pos = None
    if speculative:
        per_pos = [
            delta(f"vllm:spec_decode_num_accepted_tokens_per_pos_total@{i}") / drafts
            for i in range(num_spec)
        ]
    tokens = delta("vllm:generation_tokens_total")
    # Each request's first output token comes from its prefill, not from decode.
    decoded = tokens - delta("vllm:request_decode_time_seconds_count")
    decode_s = delta("vllm:request_decode_time_seconds_sum")
    tpot_n = delta("vllm:request_time_per_output_token_seconds_count")
    return {
        "drafts": drafts,
        "per_position": per_pos,
        "mean_length": None if per_pos is None else 1 + sum(per_pos),
        "output_tokens": tokens,
        "decode_tokens_per_s": decoded / decode_s if decode_s > 0 else None,
        "tpot_ms": (
            1000 * delta("vllm:request_time_per_output_token_seconds_sum") / tpot_n
            if tpot_n > 0
            else None
        ),
    }


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


def check(
    results: dict[str, dict],
    golden: dict[str, float] | None,
    tolerance: float,
    min_context: int = 0,
    long_from: int = LONG_CONTEXT,
    short_to: int = SHORT_CONTEXT,
) -> list[str]:
    """The study's assertions; returns the failures. Every run's greedy outputs equal the
    run without speculation's (or, without one, the V2 window run's). Below ``min_context``
    the V2 run with the window reads what the run without it reads (the whole context), and
    is not compared with V1, which windows every context."""
    failures = []
    on, off, v1 = results["v2_window"], results["v2_no_window"], results.get("v1_window")
    reference = "no_speculation" if "no_speculation" in results else "v2_window"
    for name, run in results.items():
        if run["outputs"] != results[reference]["outputs"]:
            failures.append(f"greedy outputs of {name} differ from {reference}")
    for ctx, got in on["contexts"].items():
        mean, without = got["mean_length"], off["contexts"][ctx]["mean_length"]
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
                f"{ctx}: V2 with the window {mean:.3f} is not within 0.05 of V1 "
                f"{v1['contexts'][ctx]['mean_length']:.3f}"
            )
        if golden is not None and ctx in golden and abs(mean - golden[ctx]) > tolerance:
            failures.append(
                f"{ctx}: mean acceptance length {mean:.3f}, golden {golden[ctx]:.3f} "
                f"(+-{tolerance})"
            )
    return failures


def write_report(out_dir: Path, meta: dict, results: dict[str, dict], failures: list[str]) -> None:
    """report.json, report.md (one row per context and run, anchors beside) and study.png."""
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
        f"Token counts: {meta['token_counts']}. {meta['prompts_per_context']} prompts per "
        f"context, sent together, {meta['output_tokens']} output tokens each, greedy. Window "
        f"engaged: whether the threshold ({MIN_CONTEXT_KEY}: {min_context or 'every context'}) "
        "lets the V2 run with the window crop this context. Acceptance rate: accepted over "
        "drafted tokens, the mean of acceptance by position. Output tok/s: every output "
        "token of the context's prompts over their time at the client, prefill included.",
        "",
        "| context | window engaged | run | mean acceptance length | acceptance rate "
        "| acceptance by position | decode tok/s | TPOT ms | output tok/s "
        "| draft KV read per step |",
        "|---:|---|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for ctx in meta["contexts"]:
        engaged = "yes" if ctx >= min_context else "no"
        for name, run in results.items():
            m = run["contexts"][str(ctx)]
            mean = "-" if m["mean_length"] is None else f"{m['mean_length']:.3f}"
            per_position = rate = "-"
            if m["per_position"] is not None:
                per_position = ", ".join(f"{x:.2f}" for x in m["per_position"])
                rate = f"{sum(m['per_position']) / len(m['per_position']):.1%}"
            decode = "-" if m["decode_tokens_per_s"] is None else f"{m['decode_tokens_per_s']:.1f}"
            tpot = "-" if m["tpot_ms"] is None else f"{m['tpot_ms']:.2f}"
            client = m.get("client_tokens_per_s")
            output = "-" if client is None else f"{client:.1f}"
            read = "-" if m["draft_kv_read"] is None else str(m["draft_kv_read"])
            lines.append(
                f"| {ctx} | {engaged} | {name} | {mean} | {rate} | {per_position} | {decode} | "
                f"{tpot} | {output} | {read} |"
            )
    lines += [
        "",
        "Anchors (published, other setups):",
        *[f"- {a}" for a in ANCHORS],
        "",
        "Failures: " + ("none" if not failures else "; ".join(failures)),
        "",
        "![acceptance and throughput by context](study.png)",
        "",
    ]
    (out_dir / "report.md").write_text("\n".join(lines))
    plot(out_dir / "study.png", meta, results)


def plot(path: Path, meta: dict, results: dict[str, dict]) -> bool:
    """Acceptance and output throughput against context, one line per run; False where
    matplotlib is not installed."""
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
        speeds = [_tokens_per_s(m) for m in run["contexts"].values()]
        right.plot(xs, speeds, **style)
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


def _tokens_per_s(m: dict) -> float:
    """Output tokens/s at the client, else vLLM's decode tokens/s, else 0."""
    return m.get("client_tokens_per_s") or m.get("decode_tokens_per_s") or 0.0


def pyplot():
    """matplotlib's pyplot without a display, or None where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def timed_completion(
    http: Callable, base: str, model: str, prompt: str, max_tokens: int, chat: bool = True
) -> tuple[str, int, float]:
    """One greedy completion, a chat one (the server applies the chat template) or a plain
    one: (text, completion tokens, seconds at the client)."""
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    start = time.monotonic()
    reply = json.loads(http(f"{base}/v1/{'chat/completions' if chat else 'completions'}", body))
    seconds = time.monotonic() - start
    choice = reply["choices"][0]
    text = choice["message"]["content"] if chat else choice["text"]
    return text, reply["usage"]["completion_tokens"], seconds


@dataclass
class Settings:
    """What the study runs, from the environment (``defaults``: a device's own, which the
    environment overrides)."""

    contexts: list[int]
    prompts_per_context: int
    output_tokens: int
    # The window's alignment on the host (its block size), for the draft KV read.
    alignment: int
    # The text the prompts are cut from (None: this Python's documentation, ``corpus``),
    # and whether each prompt is a chat turn ending in a question (else a plain completion).
    text_path: str | None = None
    chat: bool = True
    long_from: int = LONG_CONTEXT
    short_to: int = SHORT_CONTEXT
    # How many runs' servers run at once (CPU: one core each).
    parallel: int = 1
    # --max-model-len of every server (0: the longest context and its output).
    max_model_len: int = 0

    @classmethod
    def from_env(
        cls, env: dict[str, str], target: str, device: str, defaults: dict | None = None
    ) -> Settings:
        env = {**(defaults or {}), **env}
        output_tokens = int(env.get("OUTPUT_TOKENS", 256))
        if env.get("CONTEXTS"):
            contexts = sorted({int(c) for c in env["CONTEXTS"].split(",")})
        else:
            limit = int(env.get("MAX_CONTEXT", 0)) or model_limit(target)
            contexts = contexts_up_to(limit, output_tokens)
        default_block = 128 if device == "ascend" else 16
        text_path = env.get("STUDY_TEXT") or None
        return cls(
            contexts,
            int(env.get("PROMPTS_PER_CONTEXT", 3)),
            output_tokens,
            int(env.get("BLOCK_SIZE", default_block)),
            text_path,
            chat=text_path is None,
            long_from=int(env.get("LONG_CONTEXT", LONG_CONTEXT)),
            short_to=int(env.get("SHORT_CONTEXT", SHORT_CONTEXT)),
            parallel=int(env.get("PARALLEL", 1)),
            max_model_len=int(env.get("MAX_MODEL_LEN", 0)),
        )

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


def golden_path(root: Path, scenario: str, window: int, min_context: int = 0) -> Path:
    """The golden file of the V2 run with the window (sinks are a run of their own)."""
    suffix = f"_m{min_context}" if min_context else ""
    return root / "e2e" / "golden" / f"study_{scenario}_w{window}{suffix}.json"
