# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The docs quote each fact from its home, and a test notices when a quote drifts.

Each kind of fact that has drifted has one home and one check here:

- **Measured figures** (``3.58``, ``x1.078``, ``82-84%``, ``0.35 ms``, ``23 of 24``): their home is
  ``benchmarks/results/README.md``, written by ``make bench``. Each quote in README.md and
  design/*.md is a phrase in ``QUOTES``, rendered from the very row and column (or sentence) of
  the home it quotes, and must stand in the doc as rendered; a figure whose home is outside this
  repository, or a stated bound, is a literal phrase in ``STATED`` with its source. A figure in a
  doc that neither covers fails: a quote drifted, or was written only into the prose.
- **Times and test counts**: ``design/testing.md`` holds them, each with the commit or date it was
  measured at; any other doc, or the Makefile's help and comments, that states a duration or a
  suite's count fails.
- **make demo's contexts**: ``tools/inspector/served.py``'s ``CONTEXTS``; the docs' quotes of
  them are rendered from it.
- **The layout** in ``design/usage.md``: every path it names exists, and every Python module of
  a folder it lists file by file is named.
- **Pointers**: every markdown link's file and ``#anchor``, every quoted section name
  (``README's "Use"``, ``below, "The keys"``, ``design doc, section 4.1``) and every file a
  doc names in backticks resolve.

Each check has a test that feeds it a drifted text and shows it failing.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

# The docs are the same on every line: once, in .venv.
pytestmark = pytest.mark.release_independent

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / "benchmarks" / "results" / "README.md"
TIMES_HOME = "design/testing.md"
TIMES_SECTION = "Times and test counts"
# The docs these checks read: the figures and times in README.md and design/; the pointers in
# every page a reader follows.
FIGURE_DOCS = ["README.md", *sorted(f"design/{p.name}" for p in (ROOT / "design").glob("*.md"))]
POINTER_DOCS = [*FIGURE_DOCS, "tests/README.md", "benchmarks/README.md"]


def read(doc: str) -> str:
    return (ROOT / doc).read_text()


def flat(text: str) -> str:
    """Whitespace folded, so that a phrase matches across the doc's line breaks."""
    return re.sub(r"\s+", " ", text)


# ---- The home of the measured figures, read as tables and sentences.


Row = str | dict[str, str]


def lowhigh(cells: list[str]) -> str:
    return f"{min(cells, key=float)}-{max(cells, key=float)}"


class Home:
    """benchmarks/results/README.md: each table under its ``##`` section, rows by their first
    cells, columns by their headers; and its sentences, for the figures it states in prose."""

    def __init__(self, text: str):
        self.text = flat(text)
        self.tables: dict[str, list[list[list[str]]]] = {}
        section = ""
        lines = text.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            if line.startswith("#"):
                section = line.lstrip("#").strip()
            if line.startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
                rows = []
                while i < len(lines) and lines[i].startswith("|"):
                    if not lines[i].startswith("|---"):
                        rows.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
                    i += 1
                self.tables.setdefault(section, []).append(rows)
                continue
            i += 1

    def table(self, section: str, index: int = 0) -> list[list[str]]:
        found = [t for name, ts in self.tables.items() if section in name for t in ts]
        assert found, f"{HOME.name} has no table under a section named like {section!r}"
        return found[index]

    def cell(self, section: str, row: Row, column: str | int, index: int = 0) -> str:
        """The cell of ``row`` (its first cell, or {header: cell, ...}) in the column headed
        ``column``."""
        header, *body = self.table(section, index)
        key = {header[0]: row} if isinstance(row, str) else row
        rows = [r for r in body if all(r[header.index(h)] == v for h, v in key.items())]
        assert len(rows) == 1, f"{len(rows)} rows {key} under {section!r} ({index})"
        return rows[0][header.index(str(column))]

    def column(self, section: str, column: str, index: int = 0) -> list[str]:
        header, *body = self.table(section, index)
        return [r[header.index(column)] for r in body]

    def num(self, section: str, row: Row, column: str | int, nth: int = 0, index: int = 0) -> str:
        """The nth figure of a cell that holds several (``3.08 -> 3.33 (x1.082)``)."""
        return re.findall(r"\d+(?:\.\d+)?", self.cell(section, row, column, index))[nth]

    def span(self, section: str, rows: list | None, columns: list, index: int = 0) -> str:
        """``low-high`` over the cells of ``rows`` (None: every row) x ``columns``, as the
        home prints them."""
        if rows is None:
            cells = [c for col in columns for c in self.column(section, col, index)]
        else:
            cells = [self.cell(section, r, c, index) for r in rows for c in columns]
        return lowhigh(cells)

    def pct(self, part: str, whole: str) -> str:
        """``part`` as a share of ``whole``, in whole percent (``82``)."""
        return f"{float(part) / float(whole):.0%}".rstrip("%")

    def prose(self, pattern: str) -> str:
        """The figure a sentence of the home states: group 1 of its one match."""
        found = re.findall(pattern, self.text)
        assert len(found) == 1, f"{len(found)} sentences of {HOME.name} match {pattern!r}"
        return found[0]


def code(held: tuple[str, str], percent: bool = False) -> str:
    """A figure this checkout's code holds: group 1 of ``pattern`` in ``path``."""
    path, pattern = held
    value = re.search(pattern, read(path), re.M).group(1)
    return f"{float(value):.0%}" if percent else value


def demo_context_list() -> list[int]:
    """make demo's contexts: ``tools/inspector/served.py``'s ``CONTEXTS``."""
    source = read("tools/inspector/served.py")
    return [int(c) for c in re.search(r'^CONTEXTS = "([\d,]+)"', source, re.M).group(1).split(",")]


def demo_contexts() -> str:
    """make demo's contexts, as the docs write them: ``32, 512 and 1024``."""
    *first, last = demo_context_list()
    return f"{', '.join(map(str, first))} and {last}"


# The home's tables, by section.
STUDY = "What the window is for"
GREEDY, SAMPLED, LOAD, DFLASH = 0, 1, 2, 3
LOAD_COLUMNS = ["c = 1", "c = 4", "c = 16", "c = 16, prefix 768 shared"]
E3, E3_W, E3_S = "EAGLE3, no window", "EAGLE3, W = 33", "EAGLE3, W = 33 + 32 sinks"
DM, DM_W = "draft model, no window", "draft model, W = 33"
DM_S, DM_64 = "draft model, W = 33 + 32 sinks", "draft model, W = 64"
DF, DF_W = "DFlash, no window", "DFlash, W = 33"
COST = "Per-step window cost"
LAUNCHES = "Device launches"
ATTENTION = "Draft attention with and without"
FREE_KV = "freed (`draft_window_free_kv`)"
STEADY = "steady concurrency, today -> freed (x)"
GROUPS = "with the key: groups (padding layers), draft share"
TABLES = "extra groups' block tables / draft KV freed per request at max_model_len, MiB"
SHAPES = {
    "eagle3": "36-layer target + EAGLE3 (1 layer)",
    "dspark": "36-layer target + DSpark (3 layers)",
    "dflash": "36-layer target + DFlash (5 layers)",
    "draft": "64-layer target + draft model (28 layers)",
    "cpu": "CPU engine: 2-layer target + draft model (2 layers)",
}
# The home's sentences, each stating one figure.
SPREAD = r"two runs of one server differ by up to about (\d+\.\d+)"
AVX2 = r"the farthest apart is .{0,40}, by (\d+\.\d+)"
AVX2_SAME = r"(\d+ of \d+) mean acceptance lengths are the same"
RERUN = r"moves it by at most (\d+\.\d+)"
ENGINE_HELD_OFF = r"at most (\d+) running at once without the key"
ENGINE_HELD_ON = r"running at once without the key, (\d+) with it"
SINKS_EXTRA = r"Extra per build with sinks: median ([\d.]+) us"
SINKS_RATIO = r"ratio to the plain window median ([\d.]+)"
SINKS_WORST = r"ratio to the plain window median [\d.]+, worst ([\d.]+)"
SINKS_WIDE = r"to a plain window of W \+ S median ([\d.]+)"
M_8K = r"M = 8192: median ([\d.]+)"
M_32K = r"M = 32768: median ([\d.]+)"
DCP_RATIO = r"Ratio to the window without DCP: median ([\d.]+)"
DCP_PREFILL = r"with the DCP-local lengths \(a draft prefill\) median ([\d.]+)"
# Figures the code holds: (file, pattern).
MIN_DRAFT_SHARE = (
    "vllm_ascend/worker/v2/spec_decode/draft_window/overlay/kv_reclaim.py",
    r"^MIN_DRAFT_SHARE = ([\d.]+)",
)
MIN_IDENTICAL = ("e2e/lossless.py", r"^MIN_IDENTICAL = ([\d.]+)")
HELD_OUT = ("trained_models/recipe.py", r"^HELD_OUT = ([\d.]+)")
TOLERANCE = ("tools/compare_trained.py", r"^TOLERANCE = ([\d.]+)")
STUDY_SHARE = ("tests/test_engine_study.py", r"^SHARE = ([\d.]+)")
V1_MARGIN = ("e2e/study.py", r"abs\(mean - v1_mean\) > ([\d.]+)")
GOLDEN_TOLERANCE = (
    "e2e/checks.py",
    r'\["mean_length"\], float\(data\.get\("tolerance", ([\d.]+)\)',
)


def greedy(h: Home, run: str, context: int) -> str:
    return h.cell(STUDY, run, context, GREEDY)


def sampled(h: Home, run: str, context: int) -> str:
    return h.cell(STUDY, run, context, SAMPLED)


def dflash(h: Home, run: str, context: int) -> str:
    return h.cell(STUDY, run, context, DFLASH)


def dflash_sampled(h: Home, run: str, context: int) -> str:
    return h.cell(STUDY, f"{run}, sampled", context, DFLASH)


def share(h: Home, run: str, context: int, of: str) -> str:
    """A run's acceptance at ``context`` as a share of ``of``'s at 32 tokens (greedy)."""
    return h.pct(greedy(h, run, context), greedy(h, of, 32))


def under_load(h: Home, drafter: str, window: bool) -> str:
    """A drafter's acceptance under load, ``low-high`` over the concurrencies."""
    run = f"{drafter}, {'W = 33' if window else 'no window'}, acceptance length"
    return h.span(STUDY, [run], LOAD_COLUMNS, LOAD)


def speedups(h: Home, *drafters: str, of: str) -> str:
    """Tokens/s with the window over ``of`` (no window, no speculation), ``low-high``."""
    return h.span(STUDY, [f"{d}, W = 33 / {of}" for d in drafters], LOAD_COLUMNS, LOAD)


def cost_ratios(h: Home) -> str:
    return h.span(COST, None, ["ratio"])


def shape(h: Home, name: str, column: str, nth: int, context: int | None = None) -> str:
    """The nth figure of a free-KV shape's cell (``13 (0), 7.7%``: 13, 0, 7.7)."""
    context = context or (1024 if name == "cpu" else 32768)
    row = {"shape": SHAPES[name], "context": str(context)}
    return h.num(FREE_KV, row, column, nth)


def gain(h: Home, name: str) -> str:
    """``x1.026 / x1.027``: the steady concurrency gained at 32k and 128k."""
    return f"x{shape(h, name, STEADY, 2)} / x{shape(h, name, STEADY, 2, 131072)}"


def launches(h: Home, method: str, column: str, k: str = "-") -> str:
    return h.cell(LAUNCHES, {"method": method, "K": k, "batch": "1"}, column)


def quotes_readme(h: Home) -> list[str]:
    def pair(at, off, on):
        return f"| {at(h, off, 32)} / {at(h, off, 1024)} | {at(h, on, 32)} / {at(h, on, 1024)} |"

    return [
        f"falls from {greedy(h, E3, 32)} inside its training context to {greedy(h, E3, 1024)} at "
        f"16 times it without the window, and stays at {greedy(h, E3_W, 1024)} with it, the same "
        f"tokens every way; sampled at temperature 0.8 (seeded), {sampled(h, E3, 32)} inside, "
        f"{sampled(h, E3, 1024)} without the window and {sampled(h, E3_W, 1024)} with it",
        f"(at 1024 tokens: {greedy(h, DM_W, 1024)} against {greedy(h, DM_64, 1024)})",
        pair(greedy, E3, E3_W),
        pair(greedy, DM, DM_W),
        pair(sampled, E3, E3_W),
        pair(sampled, DM, DM_W),
        pair(dflash, DF, DF_W),
        pair(dflash_sampled, DF, DF_W),
        f"| {under_load(h, 'EAGLE3', False)} | {under_load(h, 'EAGLE3', True)} |",
        f"`apply` | 1.0 | {cost_ratios(h)} |",
        f"DSpark at 128k | {shape(h, 'dspark', STEADY, 0, 131072)} | "
        f"{shape(h, 'dspark', STEADY, 1, 131072)} |",
        f"(draft model, W = 33) | {h.prose(ENGINE_HELD_OFF)} | {h.prose(ENGINE_HELD_ON)} |",
        f"gives the same curve within {h.prose(AVX2)}; two runs of one server differ by up to "
        f"about {h.prose(SPREAD)} at 1024 tokens (a seeded sampled rerun by up to "
        f"{h.prose(RERUN)})",
        f"(with the window {speedups(h, 'draft model', 'EAGLE3', of='no speculation')}x the "
        f"tokens/s of no speculation, without it less), while the window makes speculation "
        f"{speedups(h, 'draft model', 'EAGLE3', of='no window')}x faster",
    ]


def quotes_e2e(h: Home) -> list[str]:
    return [
        f"`make bench`'s rerun of its sampled curve moved acceptance by at most {h.prose(RERUN)}",
        f"The same runs repeat within about {h.prose(SPREAD)}",
        f"concurrency: {under_load(h, 'draft model', True)} with the window against "
        f"{under_load(h, 'draft model', False)} without for the draft model, "
        f"{under_load(h, 'EAGLE3', True)} against {under_load(h, 'EAGLE3', False)} for the "
        f"EAGLE3 head",
        f"at 1024 tokens, {speedups(h, 'draft model', of='no window')}x for the draft model and "
        f"{speedups(h, 'EAGLE3', of='no window')}x for the EAGLE3 head",
        f"`make demo` runs it for the EAGLE3 head at {demo_contexts()} with `AUTO=1`",
        f"V2 within {code(V1_MARGIN)} of V1 at every context",
        f"each context within {code(GOLDEN_TOLERANCE)} of `e2e/golden/study_",
        f"fails below `MIN_IDENTICAL` ({code(MIN_IDENTICAL)}, vLLM's own",
        f"(the last {code(HELD_OUT, percent=True)} of the corpus",
    ]


def quotes_design(h: Home) -> list[str]:
    def sinks(run_sinks, run_plain, context):
        return f"{greedy(h, run_sinks, context)} against {greedy(h, run_plain, context)}"

    tuning = "; ".join(
        f"{c}: {greedy(h, DM_W, c)}{' against ' if c == 128 else ', '}{greedy(h, DM_64, c)}"
        for c in (128, 256, 512, 1024)
    )
    return [
        f"mean acceptance length is {greedy(h, E3, 32)} at 32 tokens; without the window "
        f"{greedy(h, E3, 1024)} at 1024, with W = 33 {greedy(h, E3_W, 1024)}.",
        f"median +{h.prose(SINKS_EXTRA)} us per build on this CPU (x{h.prose(SINKS_RATIO)} of "
        f"the plain window, worst x{h.prose(SINKS_WORST)}; x{h.prose(SINKS_WIDE)} of a plain "
        f"window of `W + S`",
        f"the draft model's mean acceptance length at 128 tokens was {greedy(h, DM_S, 128)} with "
        f"the sinks against {greedy(h, DM_W, 128)} without them ({sinks(DM_S, DM_W, 1024)} at "
        f"1024), the EAGLE3 head's {sinks(E3_S, E3_W, 128)} at 128 ({sinks(E3_S, E3_W, 1024)} at "
        f"1024); both stayed above no window ({greedy(h, DM, 128)} and {greedy(h, E3, 128)} at "
        f"128)",
        f"x{h.prose(M_8K)} of the plain window's per-build work at M = 8192, x{h.prose(M_32K)} "
        f"at M = 32768",
        f"DCP is x{h.prose(DCP_RATIO)} of the same window without DCP, median, because the "
        f"cropped tables are narrower in columns; x{h.prose(DCP_PREFILL)} with the draft "
        f"prefill's DCP-local lengths",
        f"where the draft holds less than {code(MIN_DRAFT_SHARE, percent=True)} of each token's KV",
        f"a 36-layer target with a 3-layer DSpark draft {shape(h, 'dspark', STEADY, 0)} -> "
        f"{shape(h, 'dspark', STEADY, 1)} / {shape(h, 'dspark', STEADY, 0, 131072)} -> "
        f"{shape(h, 'dspark', STEADY, 1, 131072)} ({gain(h, 'dspark')}; "
        f"{shape(h, 'dspark', GROUPS, 0)} groups, whose block tables take "
        f"{shape(h, 'dspark', TABLES, 0)} MiB at 256 sequences against "
        f"{shape(h, 'dspark', TABLES, 1)} MiB of draft KV freed per request; served); a one-layer "
        f"EAGLE3 head {gain(h, 'eagle3')} over {shape(h, 'eagle3', GROUPS, 0)} groups (refused: "
        f"{shape(h, 'eagle3', GROUPS, 2)}% of the KV; its tables, {shape(h, 'eagle3', TABLES, 0)} "
        f"MiB, would also outweigh one request's {shape(h, 'eagle3', TABLES, 1)} MiB); a 5-layer "
        f"DFlash draft {gain(h, 'dflash')} (refused: {shape(h, 'dflash', GROUPS, 1)} padding "
        f"layers); a 64-layer target with a 28-layer draft model {gain(h, 'draft')} (refused: "
        f"{shape(h, 'draft', GROUPS, 1)} padding layers)",
        f"(the committed draft model, {float(shape(h, 'cpu', GROUPS, 2)):.0f}% of the KV",
        f"propose against MRV1's {launches(h, 'dflash/dspark', 'MRV1 launches')} "
        f"({launches(h, 'dflash/dspark', 'fused / MRV1')}x); an EAGLE propose launches K (its "
        f"prefill and K - 1 decode steps) against MRV1's "
        f"{launches(h, 'eagle', 'MRV1 launches', '3')}, "
        f"{launches(h, 'eagle', 'fused / MRV1', '3')}x-"
        f"{launches(h, 'eagle', 'fused / MRV1', '7')}x for K = 3-7",
        f"| 1.0 | {cost_ratios(h)} of MRV1",
        f"({tuning};",
        f"two runs of one server differ by up to about {h.prose(SPREAD)} at 1024 tokens, "
        f"`benchmarks/results/README.md`",
    ]


def quotes_testing(h: Home) -> list[str]:
    with_window = [share(h, DM_W, 1024, DM), share(h, E3_W, 1024, E3)]
    without = [share(h, DM, 1024, DM), share(h, E3, 1024, E3)]
    return [
        f"at least {code(STUDY_SHARE, percent=True)} of the in-distribution level",
        f"does not collapse below {code(STUDY_SHARE, percent=True)}",
        f"measured by `make bench` at 1024 tokens: {lowhigh(with_window)}% with it, "
        f"{lowhigh(without)}% without",
        f"two runs of one server differ by up to about {h.prose(SPREAD)} at 1024 tokens",
        f"(up to about {h.prose(SPREAD)}, which requests share an engine step)",
        f"`make bench`'s load: {under_load(h, 'draft model', True)} against "
        f"{under_load(h, 'draft model', False)}",
        f"the same in {h.prose(AVX2_SAME)} points, the last {h.prose(AVX2)} apart",
    ]


def quotes_upstream(h: Home) -> list[str]:
    ratios = [h.cell(ATTENTION, c, "ratio") for c in ("8k", "32k", "128k")]
    return [
        f"The window's per-build work is {cost_ratios(h)} of one V1 adapter `apply`",
        f"draft attention costs {ratios[0]}, {ratios[1]} and {ratios[2]} of the full-context "
        f"time at 8k, 32k and 128k",
        f"The torch path makes {launches(h, 'eagle', 'torch launches', '5')} device ops (one "
        f"refresh per draft step), against {launches(h, 'eagle', 'MRV1 launches', '5')} for "
        f"V1's one apply; the plugin form's one-launch refresh makes "
        f"{launches(h, 'eagle', 'fused launches', '5')}.",
    ]


def quotes_usage(h: Home) -> list[str]:
    contexts = demo_context_list()
    # The sample's rows: one per context make demo serves (the "auto" column serves W = 33).
    rows = " ".join(
        f"{c} {greedy(h, E3, c)} {greedy(h, E3_W, c)} {greedy(h, E3_W, c)} ..." for c in contexts
    )
    back = ", ".join(
        f"{c}: {greedy(h, E3, c)} -> {greedy(h, E3_W, c)} "
        f"({share(h, E3, c, E3)}% -> {share(h, E3_W, c, E3)}%)"
        for c in contexts
        if c >= 512
    )
    kept = [share(h, E3_W, 1024, E3), share(h, E3_W, 512, E3)]
    lost = [share(h, E3, 1024, E3), share(h, E3, 512, E3)]
    return [
        f"({shape(h, 'dspark', GROUPS, 0)} groups, {shape(h, 'dspark', GROUPS, 2)}% of the KV)",
        f"where the draft holds under {code(MIN_DRAFT_SHARE, percent=True)} of the KV (a "
        f"one-layer EAGLE head beside 36 target layers: {shape(h, 'eagle3', GROUPS, 2)}%)",
        f"keeps {lowhigh(kept)}% of its in-distribution acceptance at 8-16 times that context "
        f"with the window, {lowhigh(lost)}% without",
        f"1 to 16 requests at once: {speedups(h, 'draft model', of='no window')}x for the draft "
        f"model, {speedups(h, 'EAGLE3', of='no window')}x for the EAGLE3 head",
        f"(acceptance repeats within about {h.prose(SPREAD)} run to run",
        f"at contexts of {demo_contexts()} tokens",
        rows,
        f"(without -> with, share of the {greedy(h, E3, 32)} at 32 tokens): {back}.",
        f"the last {code(HELD_OUT, percent=True)} is held out",
        f"the tolerance ({code(TOLERANCE)}, what two runs of one server differ by",
    ]


# Per doc: its quotes of benchmarks/results, as the doc words them, rendered from the home.
QUOTES: dict[str, Callable[[Home], list[str]]] = {
    "README.md": quotes_readme,
    "design/e2e.md": quotes_e2e,
    "design/speculative_kv_sliding_window.md": quotes_design,
    "design/testing.md": quotes_testing,
    "design/upstream.md": quotes_upstream,
    "design/usage.md": quotes_usage,
}


# Per doc: the figures whose home is elsewhere, as the doc words them.
@dataclass(frozen=True)
class Stated:
    """A figure whose home is not benchmarks/results: a phrase of the doc, and its source;
    where the source is this checkout's code, ``code`` (a file, and a pattern whose group 1
    is the figure, as written there or as a percentage) holds the phrase to it."""

    phrase: str
    source: str
    code: tuple[str, str] | None = None

    def problem(self) -> str | None:
        if self.code is None:
            return None
        value = code(self.code)
        if value not in self.phrase and code(self.code, percent=True) not in self.phrase:
            return f"{self.code[0]} says {value}, the doc: {self.phrase!r}"
        return None


SEED = "the seed: GLM-5.2 with an early DSpark drafter"
STUDY_REPORTS = "make bench's study reports (benchmarks/results/study/, not kept), 2026-12-05"
BF16 = "the bf16 run of make study-cpu, 2026-12-05 (issue 58), measured once"
STATED: dict[str, list[Stated]] = {
    "README.md": [
        Stated("the draft holds at least 5% of the KV", "kv_cost.py", MIN_DRAFT_SHARE),
        Stated("`MIN_IDENTICAL`, 66% of prompts", "e2e/lossless.py", MIN_IDENTICAL),
    ],
    "design/e2e.md": [
        Stated("at least V1 with the window minus 0.05", "the scenario's V1 floor (e2e/checks.py)"),
        Stated(
            "gave 31 of 32 texts identical",
            "a rerun of the draft model's sampled study, measured once",
        ),
        Stated(
            "the draft model 16.6% without the window, 67.3% with it (92.2% inside its training "
            "context); the EAGLE3 head 33.1% and 68.4% (86.1% inside)",
            STUDY_REPORTS,
        ),
        Stated(
            "took 37 to 40 drafts in four runs of the demo (2.95 to 3.19)", "four runs of make demo"
        ),
        Stated("48 of 48 texts identical to no speculation's", BF16),
        Stated(
            "(acceptance within 0.12 of float32's at every context: 3.58, 3.85, 3.88, 3.47, 3.02, "
            "3.03 with the window, 3.58, 3.85, 3.02, 2.28, 2.07, 1.92 without: that run's report; "
            "again through `python -m e2e`, 48 of 48 each, 2.88 with the window at 1024)",
            BF16,
        ),
        Stated("24 of 24 for each of the window", "make demo's run, 2026-12-05"),
        Stated(
            "(93% of engine time in a py-spy profile, the rejection sampler alone 54%)",
            "a py-spy profile",
        ),
    ],
    "design/speculative_kv_sliding_window.md": [
        Stated("brings it back to 4.7-5.5, up to +381% end-to-end throughput", SEED),
        Stated(
            "mean acceptance 1.11 -> 4.49 at 32k with W = 2048",
            "vllm-ascend's released measurements",
        ),
        Stated("gained 42.8% acceptance length at 16K and lost 31% at 2K", "others' EAGLE3 draft"),
        Stated(
            "turned 0.878x into 1.026x of the unwindowed throughput",
            "vllm-ascend's DSpark window from 3W",
        ),
        Stated("measured -4.5% mean acceptance for a 1024 window", "vllm-ascend's DSpark draft"),
    ],
    "design/upstream.md": [
        Stated("brings it back to 4.7-5.5, up to +381% throughput", SEED),
    ],
    "design/usage.md": [
        Stated("4.7-5.5 with a 512-1024 window, up to +381% throughput", SEED),
        # make demo's inspector: KV MiB computed from W = 2048 and blocks of 128, not measured.
        Stated("9/9 4.00/4.00 1.0x", "the inspector's arithmetic"),
        Stated("17/1025 8.00/512.00 64.0x", "the inspector's arithmetic"),
        Stated(
            "the draft reads 60.0 MiB of KV instead of 1020.0 MiB", "the inspector's arithmetic"
        ),
    ],
}


# ---- Figures: each one in a doc is a quote of its home, or stated with its source.

# A figure: a number not inside a longer dotted one (0.33.0, 0.30.0rc2), with two or more
# decimals, or with one and a unit, or a percentage, or a count of a measured whole (``23 of
# 24``); an ``x`` before or after (x1.45, 0.74x) is a ratio's.
FIGURE = re.compile(
    r"(?<![\w.])x?(\d+\.\d{2,}|\d+(?:\.\d)?%|\d+\.\d(?=\s?(?:tok/s|MiB|GiB|ms|us)\b)"
    r"|\d+ of \d+(?![\d.]))x?(?!\w|\.\w)"
)
# The releases the docs name, read as numbers by FIGURE: vLLM and vllm-ascend's, Python's
# and glibc's.
VERSIONS = {"0.26", "0.28", "0.29", "0.30", "0.31", "0.33", "0.34", "3.11", "2.34"}
# A duration, and a suite's count: design/testing.md's alone.
TIME = re.compile(r"\b\d+(?:\.\d+)? ?(?:min|minutes|hours?|seconds)\b|\b\d+(?:\.\d+)? s\b")
COUNT = re.compile(
    r"\b\d[\d,]* (?:passed|deselected|skipped|failed|errors)\b|\bruns \d[\d,]* tests\b"
    r"|\b\d+ of (?:the )?\d+ cases\b"
)


def figures(text: str) -> list[re.Match]:
    return [m for m in FIGURE.finditer(text) if m.group(1) not in VERSIONS]


def spans(text: str, phrases: list[str]) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for p in phrases for m in re.finditer(re.escape(flat(p)), text)]


def figure_problems(doc: str, text: str, home: Home) -> list[str]:
    """What in ``text`` (the doc ``doc``) is not quoted as its home says."""
    text = flat(text)
    quoted = [flat(q) for q in QUOTES[doc](home)] if doc in QUOTES else []
    stated = [flat(s.phrase) for s in STATED.get(doc, [])]
    problems = [
        f"not in {doc} as {HOME.relative_to(ROOT)} renders it: {q!r}"
        for q in quoted
        if q not in text
    ]
    problems += [f"no longer in {doc} (STATED): {s!r}" for s in stated if s not in text]
    problems += [p for s in STATED.get(doc, []) if (p := s.problem())]
    covered = spans(text, quoted + stated)
    for m in figures(text):
        if not any(a <= m.start() and m.end() <= b for a, b in covered):
            context = text[max(0, m.start() - 60) : m.end() + 20]
            problems.append(f"{doc} states {m.group(0)!r} unquoted from a home: ...{context}...")
    return problems


def time_and_count_problems(doc: str, text: str) -> list[str]:
    if doc == TIMES_HOME:
        # Its own section, and nowhere else on that page either.
        text = re.sub(rf"^## {TIMES_SECTION}\n.*?(?=^## |\Z)", "", text, flags=re.S | re.M)
    text = flat(text)
    found = [*TIME.finditer(text), *COUNT.finditer(text)]
    return [
        f"{doc} states {m.group(0)!r} (times and test counts live in {TIMES_HOME}): "
        f"...{text[max(0, m.start() - 60) : m.end() + 20]}..."
        for m in found
    ]


@pytest.fixture(scope="module")
def home() -> Home:
    return Home(HOME.read_text())


@pytest.mark.parametrize("doc", FIGURE_DOCS)
def test_every_figure_is_quoted_from_its_home(doc: str, home: Home):
    problems = figure_problems(doc, read(doc), home)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", POINTER_DOCS)
def test_times_and_test_counts_only_in_testing_md(doc: str):
    problems = time_and_count_problems(doc, read(doc))
    assert not problems, "\n".join(problems)


def test_the_makefile_states_no_times():
    # Its help and comments are read as docs are: make bench's "about 18 minutes" stood there
    # while it took 26 min 54 s.
    problems = time_and_count_problems("Makefile", read("Makefile"))
    assert not problems, "\n".join(problems)


def test_quotes_and_stated_phrases_name_docs_that_exist():
    assert set(QUOTES) | set(STATED) <= set(FIGURE_DOCS)


def test_the_figure_pattern_reads_figures_not_releases():
    text = (
        "3.58 at 32, x1.078 of it, 1.26-1.49x, 0.243 of the time, 7.7% of the KV, 82-84%, "
        "37.5 tok/s, 0.35 ms, 23 of 24 points; vLLM 0.33.0, 0.30.0rc2, 0.33.x, vLLM 0.34, "
        "Python 3.11, W = 33, 1.7 times, 3.5 GB, 13.13."
    )
    expected = [
        "3.58",
        "1.078",
        "1.26",
        "1.49",
        "0.243",
        "7.7%",
        "84%",
        "37.5",
        "0.35",
        "23 of 24",
        "13.13",
    ]
    assert [m.group(1) for m in figures(text)] == expected


def test_a_figure_drifted_to_a_value_found_elsewhere_in_the_home_fails(home: Home):
    # README's EAGLE3 head with the window at 1024 tokens: 3.02 stands in the home too (its
    # 512 column), so only the quote's own row and column can catch it.
    text = read("README.md")
    assert not figure_problems("README.md", text, home)
    assert "stays at 2.88 with it" in text and "3.02" in home.text
    drifted = text.replace("stays at 2.88 with it", "stays at 3.02 with it")
    assert any("3.02" in p for p in figure_problems("README.md", drifted, home))


def test_a_drifted_percentage_and_an_unquoted_figure_fail(home: Home):
    text = read("design/usage.md")
    assert "80-84%" in text and not figure_problems("design/usage.md", text, home)
    assert figure_problems("design/usage.md", text.replace("80-84%", "82-84%"), home)
    added = text + "\nThe window keeps 91% of it at 2048 tokens.\n"
    assert any("91%" in p for p in figure_problems("design/usage.md", added, home))


def test_a_home_that_moves_fails_the_quote_until_the_doc_follows():
    text = HOME.read_text()
    assert "| EAGLE3, W = 33 | 3.58 | 3.85 | 3.76 | 3.45 | 3.02 | 2.88 |" in text
    moved = Home(text.replace("| 3.45 | 3.02 | 2.88 |", "| 3.45 | 3.02 | 2.97 |"))
    assert any("2.97" in p for p in figure_problems("README.md", read("README.md"), moved))


def test_a_time_or_a_test_count_outside_testing_md_fails():
    assert time_and_count_problems("README.md", "make bench (about 18 minutes)")
    assert time_and_count_problems("design/usage.md", "took 26 min 54 s")
    assert time_and_count_problems("design/upstream.md", "(make test-upstream): 119 passed")
    assert time_and_count_problems("design/e2e.md", "87 of the 132 cases")
    home = f"## {TIMES_SECTION}\n\n87 of the 132 cases, 26 min 54 s\n"
    assert not time_and_count_problems(TIMES_HOME, home)
    assert time_and_count_problems(TIMES_HOME, f"## Make setup\n\nabout 80 s\n\n{home}")


# ---- make demo's contexts: tools/inspector/served.py.


def test_demo_contexts_named_in_a_doc_but_not_served_fail(home: Home):
    # Every quote of them is rendered from served.CONTEXTS (QUOTES), as design/e2e.md's and
    # design/usage.md's sample output once named a 128 the demo no longer serves.
    assert demo_contexts() == "32, 512 and 1024"
    text = read("design/e2e.md")
    drifted = text.replace(demo_contexts(), "32, 128, 512 and 1024")
    assert any("make demo" in p for p in figure_problems("design/e2e.md", drifted, home))
    sample = read("design/usage.md").replace(
        "      512         2.07",
        "      128         3.02       3.76       3.76\n      512         2.07",
    )
    assert figure_problems("design/usage.md", sample, home)


def test_a_context_the_demo_adds_fails_the_docs_until_they_follow(home: Home, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "demo_context_list", lambda: [32, 256, 512, 1024])
    assert figure_problems("design/e2e.md", read("design/e2e.md"), home)
    assert figure_problems("design/usage.md", read("design/usage.md"), home)


def test_a_stated_bound_that_leaves_its_code_fails():
    assert Stated("at least 5% of the KV", "kv_cost.py", MIN_DRAFT_SHARE).problem() is None
    assert Stated("at least 6% of the KV", "kv_cost.py", MIN_DRAFT_SHARE).problem()


# ---- The layout: design/usage.md's tree of the checkout.


def layout_block(text: str) -> str:
    return re.search(r"## Layout\n\n```\n(.*?)```", text, re.S).group(1)


def layout_paths(block: str) -> list[str]:
    """The paths the tree names: an entry is indented two spaces a level under its folder,
    then its description; a line indented as deep as the descriptions continues one."""
    paths, stack = [], []  # stack: (indent, folder)
    column = min(m.start(2) for m in re.finditer(r"^( *)\S+( {2,})\S", block, re.M)) + 2
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        if not line.strip() or indent >= column - 2:
            continue
        name = line.split()[0]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "/".join([*(f for _, f in stack), name.rstrip("/")])
        paths.append(path + ("/" if name.endswith("/") else ""))
        if name.endswith("/"):
            stack.append((indent, name.rstrip("/")))
    return paths


def layout_problems(text: str) -> list[str]:
    paths = layout_paths(layout_block(text))
    problems = [
        f"the layout names {p}, which is not in the checkout"
        for p in paths
        if not (ROOT / p).exists()
    ]
    # A folder whose modules the tree names one by one names all of them.
    listed = {p for p in paths if p.endswith(".py")}
    for folder in {str(Path(p).parent) for p in listed}:
        for module in sorted((ROOT / folder).glob("*.py")):
            name = str(module.relative_to(ROOT))
            if name not in listed and module.name != "__init__.py":
                problems.append(f"the layout lists {folder}/ module by module but not {name}")
    return problems


def test_the_layout_names_what_is_in_the_checkout():
    problems = layout_problems(read("design/usage.md"))
    assert not problems, "\n".join(problems)


def test_a_layout_that_drifts_fails():
    text = read("design/usage.md")
    assert "testbed/" in layout_paths(layout_block(text))
    # testbed/ put under tests/ (as it once was), and a module left out.
    moved = text.replace("\ntestbed/ ", "\ntests/testbed/ ", 1)
    assert any("tests/testbed" in p for p in layout_problems(moved))
    dropped = re.sub(r"\n *plan\.py .*", "", text, count=1)
    assert any("plan.py" in p for p in layout_problems(dropped))


# ---- Pointers: links, anchors, section names and file names resolve.

SKIP_DIRS = {".git", ".cache", "__pycache__", "build", "dist"}


def checkout_files() -> list[str]:
    found = []
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".venv")]
        found += [str((Path(folder) / n).relative_to(ROOT)) for n in names]
    return found


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but - and _ dropped, spaces -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(doc: str) -> list[str]:
    text = re.sub(r"```.*?```", "", read(doc), flags=re.S)
    return [h.replace("`", "").strip() for h in re.findall(r"^#+ (.*)$", text, re.M)]


# Files the docs name that are vLLM's, vllm-ascend's or a run's output, not this checkout's.
EXTERNAL = {
    "input_batch.py",
    "block_table.py",
    "attn_utils.py",
    "cudagraph_utils.py",
    "dp_utils.py",
    "prepare_dflash_inputs.py",
    "ascend_config.py",
    "_build_info.py",
    "tests/ut/conftest.py",
    "tests/ut/spec_decode/test_draft_window.py",
    "worker/v2/test_spec_decode.py",
    "test_speculator.py",
    "test_aclgraph.py",
    "attention/test_gqa_dcp_split.py",
    "test_ascend_config.py",
    "test_v2_sparse_offload_config.py",
    "model_loader/rfork/test_identity_validation.py",
    "worker/v2/spec_decode/autoregressive/speculator.py",
    "worker/v2/spec_decode/dflash/speculator.py",
    "worker/v2/spec_decode/dspark/speculator.py",
    "worker/v2/spec_decode/pcp_utils.py",
    "worker/v2/attn_utils.py",
    "aclgraph.py",
    "report.json",
    "report.md",
    "run.json",
    "summary.csv",
    "study_text.txt",
    "acceptance.png",
    "study.png",
    "gpu.md",
    "gpu.png",
    "run=0.json",
    "serve_params.json",
    "bench_params.json",
    "docs.txt",
    "context_32768.jsonl",
    "test_dspark_utils.py",
    "spec_decode/__init__.py",
    "worker/v2/spec_decode/__init__.py",
    "qwen3_xpress.py",
    "qwen3_dflash2.py",
    "lilicorr.py",
    "_version.py",
    "vllm_ascend/ops/triton/triton_utils.py",
    "benchmarks/results/gpu.md",
    ".cache/heldout.txt",
}
# vLLM's own files, by their path in its package.
EXTERNAL_PREFIXES = ("vllm/",)
SECTION_NAME = re.compile(
    r"(README|[\w./-]+\.md)(?:'s)? \"([^\"]+)\"|(?:above|below), \"([^\"]+)\""
)
DESIGN_SECTION = re.compile(r"design doc,? sections? ([\d.]+(?:(?:, | and )[\d.]+)*)")
BENCH_SECTION = re.compile(r"`make bench`(?:'s)? sections? (\d+)")
FILE_NAME = re.compile(r"`([\w./=-]+\.(?:py|md|sh|txt|json|diff|png|toml|csv|jsonl))`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def resolve(doc: str, target: str) -> str:
    """A doc's relative path, from the checkout's root."""
    parts = []
    for part in (Path(doc).parent / target).as_posix().split("/"):
        if part == ".." and parts:
            parts.pop()
        elif part not in (".", ""):
            parts.append(part)
    return "/".join(parts)


def pointer_problems(doc: str, text: str, files: list[str]) -> list[str]:
    problems = []
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://")):
            continue
        path, _, fragment = target.partition("#")
        path = resolve(doc, path) if path else doc
        if not (ROOT / path).exists():
            problems.append(f"{doc} links to {target}: no {path}")
        elif fragment and fragment not in {anchor(h) for h in headings(path)}:
            problems.append(f"{doc} links to {target}: {path} has no section #{fragment}")
    for m in SECTION_NAME.finditer(flat(text)):
        named, title = m.group(1), m.group(2) or m.group(3)
        path = doc if not named else "README.md" if named == "README" else named
        if named and not (ROOT / path).exists():
            path = resolve(doc, named)
        title = title.replace("`", "")
        if (ROOT / path).exists() and not any(
            h == title or h.startswith(title + ":") for h in headings(path)
        ):
            problems.append(f"{doc} names the section {title!r} of {path}, which has none")
    numbered = {
        h.split()[0].rstrip(".") for h in headings("design/speculative_kv_sliding_window.md")
    }
    for m in DESIGN_SECTION.finditer(flat(text)):
        for number in re.split(r", | and ", m.group(1)):
            if number.rstrip(".") not in numbered:
                problems.append(
                    f"{doc} points to design doc section {number}, which it does not have"
                )
    items = set(re.findall(r"^(\d+)\. ", read("benchmarks/README.md"), re.M))
    for number in BENCH_SECTION.findall(flat(text)):
        if number not in items:
            problems.append(
                f"{doc} points to make bench's section {number}: benchmarks/README.md has none"
            )
    for name in FILE_NAME.findall(text):
        if name in EXTERNAL or name.startswith(EXTERNAL_PREFIXES) or "<" in name or "..." in name:
            continue
        if not any(f == name or f.endswith("/" + name) or f == resolve(doc, name) for f in files):
            problems.append(f"{doc} names `{name}`, which is nowhere in the checkout")
    return problems


@pytest.fixture(scope="module")
def files() -> list[str]:
    return checkout_files()


@pytest.mark.parametrize("doc", POINTER_DOCS)
def test_every_pointer_resolves(doc: str, files: list[str]):
    problems = pointer_problems(doc, read(doc), files)
    assert not problems, "\n".join(problems)


def test_pointers_that_lead_nowhere_fail(files: list[str]):
    doc = "design/e2e.md"
    assert not pointer_problems(doc, read(doc), files)
    assert pointer_problems(doc, 'README "The trained models"', files)
    assert pointer_problems(doc, "[x](usage.md#the-trained-models)", files)
    assert pointer_problems(doc, "[x](../tests/README.md#nothing-here)", files)
    assert pointer_problems(doc, "design doc, section 4.7", files)
    assert pointer_problems(doc, "`make bench` section 9", files)
    assert pointer_problems("tests/README.md", "the path check's tests, `test_proof.py`", files)
    assert not pointer_problems(doc, "[x](usage.md#the-committed-tiny-models), `fused.py`", files)
