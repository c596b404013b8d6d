# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The docs quote each fact from its home, and a test notices when a quote drifts.

Each kind of fact has one home and one check here:

- **Measured figures** (``3.58``, ``x1.078``, ``1.4x``, ``82-84%``, ``0.35 ms``, ``23 of 24``):
  their home is ``benchmarks/results/README.md`` or the rows beside it
  (``benchmarks/results/rows/*.json``), written by ``make bench``. Each quote in README.md and
  design/*.md is a phrase in ``QUOTES``, rendered from the very row and column (or sentence) of
  the home it quotes, so that a figure quoted in two docs is held to one home. A figure whose
  home is elsewhere in this checkout (a bound in the code, a published figure the study
  reports as its anchor) is a phrase in ``STATED`` with that home, and every number of the
  phrase must be the home's. A figure in a doc that neither covers fails.
- **Times and test counts**: the latest fresh-clone run, in one table of
  ``design/testing.md``; any other doc, the Makefile's help and comments, or the recipe's
  docstring that states a duration or a suite's count fails. The table names the suites in
  the Makefile's order, every one of them.
- **What the docs say of the code**: make demo's contexts (``tools/inspector/served.py``'s
  ``CONTEXTS``), the served part's sample output (what ``served.table`` prints), the number of
  committed models, the test modules each marker runs, the folders of the layout, and the
  offline example's keys (the plugin's own validation).
- **Pointers**: every markdown link's file and ``#anchor``, every quoted section name
  (``README's "Use"``, ``below, "The keys"``, ``design doc, section 4.1``) and every file a
  doc names in backticks resolve.

Each check has a test that feeds it a drifted text and shows it failing.
"""

from __future__ import annotations

import ast
import json
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
ROWS = ROOT / "benchmarks" / "results" / "rows"
TIMES_HOME = "design/testing.md"
TIMES_SECTION = "Times and test counts"
USAGE = "design/usage.md"
# The docs these checks read: the figures and times in README.md and design/; the pointers in
# every page a reader follows.
FIGURE_DOCS = ["README.md", *sorted(f"design/{p.name}" for p in (ROOT / "design").glob("*.md"))]
POINTER_DOCS = [*FIGURE_DOCS, "tests/README.md", "benchmarks/README.md"]


def read(doc: str) -> str:
    return (ROOT / doc).read_text()


def flat(text: str) -> str:
    """Whitespace folded, so that a phrase matches across the doc's line breaks."""
    return re.sub(r"\s+", " ", text)


def section(text: str, title: str) -> str:
    """The body of the ``## title`` section of a markdown text, up to the next ``##``."""
    found = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert found, f"no section {title!r}"
    return found.group(1)


def without_section(text: str, title: str) -> str:
    return re.sub(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", "", text, flags=re.S | re.M)


def numbers(text: str) -> list[str]:
    return re.findall(r"\d+(?:\.\d+)?", text)


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
    return and_list(demo_context_list())


def and_list(items: list) -> str:
    *first, last = [str(i) for i in items]
    return f"{', '.join(first)} and {last}" if first else last


# The home's tables, by section.
STUDY = "What the window is for"
GREEDY, SAMPLED, LOAD, DFLASH = 0, 1, 2, 3
LOAD_COLUMNS = ["c = 1", "c = 4", "c = 16", "c = 16, prefix 768 shared"]
E3, E3_W, E3_S = "EAGLE3, no window", "EAGLE3, W = 33", "EAGLE3, W = 33 + 32 sinks"
DM, DM_W = "draft model, no window", "draft model, W = 33"
DM_S, DM_64 = "draft model, W = 33 + 32 sinks", "draft model, W = 64"
DF, DF_W = "DFlash, no window", "DFlash, W = 33"
# The drafters' training context: the study's columns past it are past it.
TRAINED_AT = 64
COST = "Per-step window cost"
LAUNCHES = "Device launches"
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
V1_FLOOR = ("e2e/checks.py", r"if v2 < v1 - ([\d.]+):")
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


def past_training(h: Home) -> list[int]:
    """The study's contexts past the drafters' training context."""
    header = h.table(STUDY, GREEDY)[0]
    return [int(c) for c in header[1:] if int(c) > TRAINED_AT]


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


def sinks_effect(h: Home) -> str:
    """What 32 sinks did past the training context, the direction worded from the home's
    figures: the design doc once said they lowered acceptance where they raised it."""
    past = past_training(h)

    def versus(sinks: str, plain: str) -> tuple[str, str, list[float]]:
        pairs = [(greedy(h, sinks, c), greedy(h, plain, c)) for c in past]
        lower = [c for c, (s, p) in zip(past, pairs, strict=True) if float(s) < float(p)]
        higher = [c for c, (s, p) in zip(past, pairs, strict=True) if float(s) > float(p)]
        words = [f"lower at {and_list(lower)}"] if lower else []
        words += [f"higher at {and_list(higher)}"] if higher else []
        gains = [float(s) - float(p) for s, p in pairs if float(s) > float(p)]
        with_s, without = (", ".join(side) for side in zip(*pairs, strict=True))
        return ", ".join(words), f"({with_s} against {without}", gains

    dm_words, dm_figures, _ = versus(DM_S, DM_W)
    e3_words, e3_figures, e3_gains = versus(E3_S, E3_W)
    spread = h.prose(SPREAD)
    within = "within" if max(e3_gains, default=0) <= float(spread) else "more than"
    above = all(
        float(greedy(h, s, c)) > float(greedy(h, n, c))
        for s, n in ((DM_S, DM), (E3_S, E3))
        for c in past
    )
    return (
        f"with the sinks the draft model's mean acceptance length was {dm_words} tokens "
        f"{dm_figures} without them); the EAGLE3 head's {e3_words} {e3_figures}), where it "
        f"gained at most {max(e3_gains, default=0):.2f}, {within} the {spread} two runs of one "
        f"server differ by. Both stayed {'above' if above else 'not always above'} no window "
        f"at every context past the training context."
    )


def tuning(h: Home) -> str:
    """W = 33 against W = 64 for the draft model, and whether W = 33 led everywhere."""
    past = past_training(h)
    pairs = "; ".join(
        f"{c}: {greedy(h, DM_W, c)}{' against ' if c == past[0] else ', '}{greedy(h, DM_64, c)}"
        for c in past
    )
    ahead = all(float(greedy(h, DM_W, c)) > float(greedy(h, DM_64, c)) for c in past)
    return (
        f"({pairs}; `benchmarks/results/README.md`): W = 33 "
        f"{'ahead' if ahead else 'not ahead'} at every context past `C`."
    )


# ---- A second home: the rows make bench writes the README from.


def study_rows() -> dict:
    return json.loads((ROWS / "long_context.json").read_text())["rows"]["curves"]


def rate(rows: dict, drafter: str, run: str, context: int) -> str:
    """A run's acceptance rate (accepted over drafted tokens), as the docs write it."""
    return f"{rows[drafter]['runs'][run]['contexts'][str(context)]['acceptance_rate']:.1f}%"


def acceptance_rates(rows: dict) -> str:
    dm, e3 = (lambda run, c, d=d: rate(rows, d, run, c) for d in ("draft_model", "eagle3"))
    return (
        f"the draft model {dm('v2_no_window', 1024)} without the window, "
        f"{dm('v2_window', 1024)} with it ({dm('v2_window', 32)} inside its training "
        f"context); the EAGLE3 head {e3('v2_no_window', 1024)} and {e3('v2_window', 1024)} "
        f"({e3('v2_window', 32)} inside)"
    )


# ---- The quotes, per doc, rendered from the homes.


def quotes_readme(h: Home) -> list[str]:
    def pair(at, off, on):
        return f"| {at(h, off, 32)} / {at(h, off, 1024)} | {at(h, on, 32)} / {at(h, on, 1024)} |"

    return [
        f"falls from {greedy(h, E3, 32)} inside its training context to {greedy(h, E3, 1024)} at "
        f"16 times it without the window, and stays at {greedy(h, E3_W, 1024)} with it, the same "
        f"tokens every way; sampled at temperature 0.8 (seeded), {sampled(h, E3, 32)} inside, "
        f"{sampled(h, E3, 1024)} without the window and {sampled(h, E3_W, 1024)} with it",
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


def quotes_design(h: Home) -> list[str]:
    return [
        f"mean acceptance length is {greedy(h, E3, 32)} at 32 tokens; without the window "
        f"{greedy(h, E3, 1024)} at 1024, with W = 33 {greedy(h, E3_W, 1024)}.",
        f"median +{h.prose(SINKS_EXTRA)} us per build on this CPU, x{h.prose(SINKS_RATIO)} of "
        f"the plain window, worst x{h.prose(SINKS_WORST)}; x{h.prose(SINKS_WIDE)} of a plain "
        f"window of `W + S`",
        sinks_effect(h),
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
        f"(the committed draft model, {float(shape(h, 'cpu', GROUPS, 2)):.0f}% of the KV), "
        f"requests of 1024 tokens in KV bytes for one with the draft's whole KV: at most "
        f"{h.prose(ENGINE_HELD_OFF)} running at once without the key, "
        f"{h.prose(ENGINE_HELD_ON)} with it.",
        f"DFlash/DSpark launch {launches(h, 'dflash/dspark', 'fused launches')} kernel per "
        f"propose against MRV1's {launches(h, 'dflash/dspark', 'MRV1 launches')} "
        f"({launches(h, 'dflash/dspark', 'fused / MRV1')}x); an EAGLE propose launches K (its "
        f"prefill and K - 1 decode steps) against MRV1's "
        f"{launches(h, 'eagle', 'MRV1 launches', '3')}, "
        f"{launches(h, 'eagle', 'fused / MRV1', '3')}x-"
        f"{launches(h, 'eagle', 'fused / MRV1', '7')}x for K = 3-7",
        f"| 1.0 | {cost_ratios(h)} of MRV1",
        f"| {launches(h, 'dflash/dspark', 'MRV1 launches')} | torch path "
        f"{launches(h, 'dflash/dspark', 'torch launches')} (DFlash/DSpark); fused "
        f"{launches(h, 'dflash/dspark', 'fused launches')}, EAGLE K |",
        tuning(h),
        f"what two runs of one server differ by (up to about {h.prose(SPREAD)} at 1024 tokens, "
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
        f"`benchmarks/results/rows/long_context.json`): {acceptance_rates(study_rows())}.",
        f"`make bench`'s load: {under_load(h, 'draft model', True)} against "
        f"{under_load(h, 'draft model', False)}",
        f"the curves are the same in {h.prose(AVX2_SAME)} points, the last {h.prose(AVX2)} apart",
        f"at least `MIN_IDENTICAL`, {code(MIN_IDENTICAL, percent=True)} of prompts",
        f"at least V1 with the window minus {code(V1_FLOOR)}",
        f"V2 within {code(V1_MARGIN)} of V1 at every context",
        f"each context within {code(GOLDEN_TOLERANCE)} of `e2e/golden/study_`",
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
        if c >= 8 * TRAINED_AT
    )
    kept = [share(h, E3_W, 1024, E3), share(h, E3_W, 512, E3)]
    lost = [share(h, E3, 1024, E3), share(h, E3, 512, E3)]
    return [
        f"(at 1024 tokens: {greedy(h, DM_W, 1024)} against {greedy(h, DM_64, 1024)})",
        f"({shape(h, 'dspark', GROUPS, 0)} groups, {shape(h, 'dspark', GROUPS, 2)}% of the KV)",
        f"where the draft holds under {code(MIN_DRAFT_SHARE, percent=True)} of the KV (a "
        f"one-layer EAGLE head beside 36 target layers: {shape(h, 'eagle3', GROUPS, 2)}%)",
        f"keeps {lowhigh(kept)}% of its in-distribution acceptance at 8-16 times that context "
        f"with the window, {lowhigh(lost)}% without",
        f"1 to 16 requests at once: {speedups(h, 'draft model', of='no window')}x for the draft "
        f"model, {speedups(h, 'EAGLE3', of='no window')}x for the EAGLE3 head",
        f"acceptance repeats within about {h.prose(SPREAD)} run to run",
        f"at contexts of {demo_contexts()} tokens",
        rows,
        f"(without -> with, share of the {greedy(h, E3, 32)} at 32 tokens): {back}.",
        f"the last {code(HELD_OUT, percent=True)} is held out",
        f"the tolerance ({code(TOLERANCE)}, what two runs of one server differ by",
    ]


# Per doc: its quotes of the homes, as the doc words them, rendered from the homes.
QUOTES: dict[str, Callable[[Home], list[str]]] = {
    "README.md": quotes_readme,
    "design/speculative_kv_sliding_window.md": quotes_design,
    "design/testing.md": quotes_testing,
    "design/usage.md": quotes_usage,
}


# Per doc: the figures whose home is elsewhere in this checkout, as the doc words them.
@dataclass(frozen=True)
class Stated:
    """A figure whose home is not make bench's: a phrase of the doc and the file that holds
    it. With ``pattern`` (a regular expression whose group 1 is the figure, as written there
    or as a percentage) the phrase must state group 1; without, every number of the phrase
    must be one of the home's."""

    phrase: str
    home: str
    pattern: str | None = None

    def problem(self) -> str | None:
        if not (ROOT / self.home).is_file():
            return f"{self.phrase!r}: its home {self.home} is not in the checkout"
        if self.pattern is not None:
            value = code((self.home, self.pattern))
            percent = code((self.home, self.pattern), percent=True)
            if value not in self.phrase and percent not in self.phrase:
                return f"{self.home} says {value}, the doc: {self.phrase!r}"
            return None
        held = set(numbers(read(self.home)))
        stray = [n for n in numbers(self.phrase) if n not in held]
        if stray:
            return f"{self.phrase!r} states {stray}, which {self.home} does not"
        return None


# The published figures the study reports beside its own (e2e/study.py's ANCHORS).
ANCHORS = "e2e/study.py"
STATED: dict[str, list[Stated]] = {
    "design/speculative_kv_sliding_window.md": [
        Stated(
            "GLM-5.2 with an early DSpark drafter falls from a mean acceptance length of about "
            "5 to about 1 at 32k, and a 512-1024 token window brings it back to 4.7-5.5, up to "
            "+381% throughput",
            ANCHORS,
        ),
        Stated(
            "a DFlash draft on Qwen3.6-35B-A3B: mean acceptance length 1.11 -> 4.49 at 32K with "
            "W = 2048",
            ANCHORS,
        ),
    ],
    "design/usage.md": [
        Stated(
            "GLM-5.2's early DSpark drafter: 4.7-5.5 with a 512-1024 window, up to +381% "
            "throughput",
            ANCHORS,
        ),
    ],
}


# ---- Figures: each one in a doc is a quote of its home, or stated with its home.

# A figure: a number not inside a longer dotted one (0.33.0, 0.30.0rc2), with two or more
# decimals, or with one and a unit, or a ratio (1.4x, x1.4, 1.2-1.4x), or a percentage, or a
# count of a measured whole (``23 of 24``); an ``x`` before or after is the ratio's.
FIGURE = re.compile(
    r"(?<![\w.])x?(\d+\.\d{2,}|\d+(?:\.\d)?%|\d+\.\d(?=\s?(?:tok/s|MiB|GiB|ms|us)\b)"
    r"|(?<=x)\d+\.\d|\d+\.\d(?=x|-\d+(?:\.\d+)?x)|\d+ of \d+(?![\d.]))x?(?!\w|\.\w)"
)
# The releases the docs name, read as numbers by FIGURE: vLLM and vllm-ascend's, Python's
# and glibc's.
VERSIONS = {"0.26", "0.28", "0.29", "0.30", "0.31", "0.33", "0.34", "3.11", "2.34"}
# A duration, and a suite's count: design/testing.md's alone.
TIME = re.compile(
    r"\b\d+(?:\.\d+)? ?(?:min|minutes|hours?|seconds)\b|\b\d+(?:\.\d+)? s\b|\babout \d+ s\b"
)
COUNT = re.compile(
    r"\b\d[\d,]* (?:passed|deselected|skipped|failed|errors)\b|\bruns \d[\d,]* tests\b"
    r"|\b\d+ of (?:the )?\d+ cases\b"
)


def figures(text: str) -> list[re.Match]:
    """The figures of ``text``; a release's number is one only as a ratio (``0.33x``)."""
    return [m for m in FIGURE.finditer(text) if m.group(0) not in VERSIONS]


def spans(text: str, phrases: list[str]) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for p in phrases for m in re.finditer(re.escape(flat(p)), text)]


def figure_problems(doc: str, text: str, home: Home) -> list[str]:
    """What in ``text`` (the doc ``doc``) is not quoted as its home says."""
    if doc == TIMES_HOME:
        # The latest run's table is a home itself.
        text = without_section(text, TIMES_SECTION)
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
        text = without_section(text, TIMES_SECTION)
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


def recipe_docstring() -> str:
    return ast.get_docstring(ast.parse(read("trained_models/recipe.py"))) or ""


def test_the_makefile_and_the_recipe_state_no_times():
    # Their help, comments and docstrings are read as docs are: make bench's "about 18
    # minutes" stood in the Makefile while it took 26 min 54 s, and the recipe's "about 4
    # minutes" beside the 162 s a doc gave (its training times are in training.json).
    problems = time_and_count_problems("Makefile", read("Makefile"))
    problems += time_and_count_problems("trained_models/recipe.py", recipe_docstring())
    assert not problems, "\n".join(problems)


def test_every_doc_the_quotes_name_exists_and_holds_every_phrase(home: Home):
    """The registry against the files on disk, not against another of this test's tables:
    a doc merged away, or a phrase registered under a doc it is not in, fails."""
    problems = []
    for doc in sorted(set(QUOTES) | set(STATED)):
        if not (ROOT / doc).is_file():
            problems.append(f"QUOTES or STATED name {doc}, which is not in the checkout")
            continue
        text = flat(read(doc))
        phrases = [*(QUOTES[doc](home) if doc in QUOTES else []), *STATED.get(doc, [])]
        for phrase in phrases:
            phrase = flat(phrase.phrase if isinstance(phrase, Stated) else phrase)
            if phrase not in text:
                problems.append(f"{doc} does not hold {phrase!r}")
    assert not problems, "\n".join(problems)


def test_every_stated_figure_is_held_to_its_home():
    problems = [p for stated in STATED.values() for s in stated if (p := s.problem())]
    assert not problems, "\n".join(problems)


def test_the_figure_pattern_reads_figures_not_releases():
    text = (
        "3.58 at 32, x1.078 of it, 1.26-1.49x, 0.243 of the time, 7.7% of the KV, 82-84%, "
        "37.5 tok/s, 0.35 ms, 23 of 24 points, 1.4x, x1.4, 1.2-1.5x, 0.14x-0.33x; vLLM 0.33.0, "
        "0.30.0rc2, "
        "0.33.x, vLLM 0.34, Python 3.11, W = 33, 1.7 times, 3.5 GB, 13.13, 0x10."
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
        "1.4",
        "1.4",
        "1.2",
        "1.5",
        "0.14",
        "0.33",
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


def test_a_drifted_percentage_a_one_decimal_ratio_and_an_unquoted_figure_fail(home: Home):
    text = read(USAGE)
    assert "80-84%" in text and not figure_problems(USAGE, text, home)
    assert figure_problems(USAGE, text.replace("80-84%", "82-84%"), home)
    added = text + "\nThe window keeps 91% of it at 2048 tokens.\n"
    assert any("91%" in p for p in figure_problems(USAGE, added, home))
    ratio = text + "\nWith the window speculation is 1.4x faster.\n"
    assert any("1.4x" in p for p in figure_problems(USAGE, ratio, home))


def test_a_home_that_moves_fails_the_quote_until_the_doc_follows():
    text = HOME.read_text()
    assert "| EAGLE3, W = 33 | 3.58 | 3.85 | 3.76 | 3.45 | 3.02 | 2.88 |" in text
    moved = Home(text.replace("| 3.45 | 3.02 | 2.88 |", "| 3.45 | 3.02 | 2.97 |"))
    assert any("2.97" in p for p in figure_problems("README.md", read("README.md"), moved))


def test_the_sinks_are_said_to_do_what_the_home_measured(home: Home):
    # The design doc once said the sinks lowered acceptance past the training context, where
    # for the EAGLE3 head at 256 and 1024 tokens they raised it: the direction is rendered.
    doc = "design/speculative_kv_sliding_window.md"
    text = read(doc)
    said = "128 and 512, higher at 256 and 1024"
    assert said in flat(text) and not figure_problems(doc, text, home)
    drifted = flat(text).replace(said, "128, 256, 512 and 1024")
    assert any("sinks" in p for p in figure_problems(doc, drifted, home))
    lowered = HOME.read_text().replace(
        "| EAGLE3, W = 33 + 32 sinks | 3.58 | 3.85 | 3.22 | 3.53 |",
        "| EAGLE3, W = 33 + 32 sinks | 3.58 | 3.85 | 3.22 | 3.43 |",
    )
    assert figure_problems(doc, text, Home(lowered))


def test_a_quote_of_the_rows_file_fails_when_it_leaves_them(home: Home):
    # design/e2e.md once gave 67.3% and 68.4% at 1024 tokens where the rows say 66.1% and
    # 65.8%: the acceptance rates are rendered from benchmarks/results/rows/.
    text = read(TIMES_HOME)
    assert "66.1% with it" in text and not figure_problems(TIMES_HOME, text, home)
    drifted = text.replace("66.1% with it", "67.3% with it")
    assert any("67.3%" in p for p in figure_problems(TIMES_HOME, drifted, home))


def test_a_stated_figure_that_leaves_its_home_fails():
    assert Stated("at least 5% of the KV", *MIN_DRAFT_SHARE).problem() is None
    assert Stated("at least 6% of the KV", *MIN_DRAFT_SHARE).problem()
    assert Stated("up to +381% throughput", ANCHORS).problem() is None
    assert Stated("up to +318% throughput", ANCHORS).problem()
    assert Stated("up to +381% throughput", "e2e/anchors.md").problem()


def test_a_time_or_a_test_count_outside_its_table_fails():
    assert time_and_count_problems("README.md", "make bench (about 18 minutes)")
    assert time_and_count_problems(USAGE, "took 26 min 54 s")
    assert time_and_count_problems("design/upstream.md", "(make test-upstream): 119 passed")
    assert time_and_count_problems("design/usage.md", "87 of the 132 cases")
    assert time_and_count_problems("trained_models/recipe.py", "About 4 minutes on 2 cores.")
    table = f"## {TIMES_SECTION}\n\n87 of the 132 cases, 26 min 54 s\n"
    assert not time_and_count_problems(TIMES_HOME, table)
    assert time_and_count_problems(TIMES_HOME, f"## Make setup\n\nabout 80 s\n\n{table}")


# ---- The latest run: one table, the Makefile's suites in the Makefile's order.


def makefile_suites() -> list[str]:
    """The suites ``make test`` runs, in the order it names them."""
    rule = re.search(r"^test: .*\n(?:\t.*\n)+", read("Makefile"), re.M).group(0)
    return re.findall(r"\b(test-\w+)\b", rule.splitlines()[-1])


def latest_run(text: str) -> list[list[str]]:
    """The rows of the latest run's table, the one table of its section."""
    blocks = re.split(r"\n\s*\n", section(text, TIMES_SECTION))
    tables = [b.strip().splitlines() for b in blocks if b.strip().startswith("|")]
    assert len(tables) == 1, f"{len(tables)} tables in {TIMES_SECTION!r}: the latest run in one"
    return [[c.strip() for c in row.strip("|").split("|")] for row in tables[0][2:]]


def latest_run_problems(text: str) -> list[str]:
    rows = latest_run(text)
    suites = [m.group(1) for row in rows if (m := re.fullmatch(r"`make (test-\w+)`", row[0]))]
    problems = []
    if suites != makefile_suites():
        problems.append(f"the latest run names {suites}; make test runs {makefile_suites()}")
    intro = flat(section(text, TIMES_SECTION).split("|", 1)[0])
    if not re.search(r"at [0-9a-f]{7}", intro) or " on " not in intro:
        problems.append("the latest run names no commit or no machine")
    return problems


def test_the_latest_run_is_one_table_of_the_makefiles_suites_in_its_order():
    problems = latest_run_problems(read(TIMES_HOME))
    assert not problems, "\n".join(problems)


def test_a_latest_run_out_of_order_or_split_fails():
    text = read(TIMES_HOME)
    rows = [line for line in section(text, TIMES_SECTION).splitlines() if "`make test-" in line]
    swapped = text.replace(rows[3], "@@").replace(rows[5], rows[3]).replace("@@", rows[5])
    assert any("make test runs" in p for p in latest_run_problems(swapped))
    dropped = text.replace(rows[-1] + "\n", "")
    assert any("make test runs" in p for p in latest_run_problems(dropped))
    second = text.replace(rows[0], f"{rows[0]}\n\n| what | result |\n|---|---|\n| x | y |")
    with pytest.raises(AssertionError, match="tables"):
        latest_run_problems(second)


# ---- What the docs say of the code.


def marked(marker: str) -> set[str]:
    """The test modules whose ``pytestmark`` is ``marker``."""
    mark = f"pytestmark = pytest.mark.{marker}\n"
    return {p.stem for p in (ROOT / "tests").glob("test_*.py") if mark in p.read_text()}


def named_newest_line(text: str) -> set[str]:
    said = re.search(r"\(`make test-study`\): ([^.]*)\.", flat(section(text, "The suites")))
    return set(re.findall(r"`(test_\w+)`", said.group(1)))


def named_release_independent(text: str) -> set[str]:
    said = re.search(r"runs once, in `\.venv`: ([^.]*)\.", flat(section(text, "The suites")))
    return set(re.findall(r"`(test_\w+)`", said.group(1)))


def test_the_suites_name_every_newest_line_module_and_only_release_independent_ones():
    # design/testing.md's list of the newest line's modules once left test_dflash_free_kv out.
    text = read(TIMES_HOME)
    assert named_newest_line(text) == marked("newest_line")
    assert named_release_independent(text) <= marked("release_independent")


def test_a_newest_line_module_left_out_fails():
    text = read(TIMES_HOME)
    dropped = text.replace(" and `test_dflash_free_kv`", "")
    assert named_newest_line(dropped) != marked("newest_line")


def committed_models() -> list[str]:
    return sorted(p.parent.name for p in (ROOT / "trained_models").glob("*/config.json"))


COUNTS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}


def models_problems(text: str) -> list[str]:
    said = re.search(r"`trained_models/` holds (\w+) tiny models", flat(text))
    if said is None:
        return ["usage.md says nowhere how many tiny models trained_models/ holds"]
    models = committed_models()
    if said.group(1) != COUNTS[len(models)]:
        return [f"usage.md says {said.group(1)} tiny models; trained_models/ holds {models}"]
    return []


def test_the_number_of_committed_models_is_the_checkouts():
    assert not models_problems(read(USAGE))
    assert models_problems(read(USAGE).replace("holds four tiny", "holds three tiny"))


def demo_sample(text: str) -> list[str]:
    """The served part's sample output in design/usage.md."""
    block = re.search(r"\*\*The served part\*\*.*?```\n(.*?)```", text, re.S).group(1)
    return block.splitlines()


def demo_report(h: Home) -> dict:
    """A study report as ``served.table`` reads it, from the home's figures: the sample's
    acceptance is make bench's, its tokens/s left out."""

    def run(name: str) -> dict:
        found = {"contexts": {}, "lossless": {"identical": 1, "total": 1}}
        for c in demo_context_list():
            mean = None if name is None else float(greedy(h, name, c))
            found["contexts"][str(c)] = {"mean_length": mean, "output_tokens_per_s": 0.0}
        return found

    settings = h.prose(r"(\d+ prompts of held-out text per context sent together, \d+ new)")
    prompts, tokens = (int(n) for n in numbers(settings))
    return {
        "runs": {
            "v2_no_window": run(E3),
            "v2_window": run(E3_W),
            "v2_auto": run(E3_W),
        },
        "window": TRAINED_AT - 32 + 1,
        "alignment": 32,
        "contexts": demo_context_list(),
        "draft_training_context": TRAINED_AT,
        "prompts_per_context": prompts,
        "output_tokens": tokens,
        "num_spec": int(h.prose(r"greedy, K = (\d+)")),
        "failures": [],
    }


def demo_sample_problems(text: str, h: Home) -> list[str]:
    """The sample and what ``served.table`` prints, line for line both ways (a sample line
    that ends in ``...`` stands for every printed line it begins); the lines it copies from
    the servers' logs are the engine tests'."""
    from tools.inspector import served

    printed = served.table(demo_report(h), Path(".../e2e/results/study_eagle3")).splitlines()
    sample = [line for line in demo_sample(text) if "the server said:" not in line]

    def matches(line: str, printed_line: str) -> bool:
        if line.endswith("..."):
            return printed_line.startswith(line[:-3].rstrip())
        return printed_line == line

    problems = [
        f"make demo prints no line like {line!r}"
        for line in sample
        if line.strip() and not any(matches(line, p) for p in printed)
    ]
    problems += [
        f"the sample leaves out {p!r}"
        for p in printed
        if p.strip() and not any(matches(line, p) for line in sample)
    ]
    return problems


def test_the_demo_sample_is_what_the_served_part_prints(home: Home):
    problems = demo_sample_problems(read(USAGE), home)
    assert not problems, "\n".join(problems)


def test_a_demo_sample_that_leaves_the_code_fails(home: Home):
    # The sample once said "output tokens/s at the client" where the code measures them as
    # vllm bench serve does.
    text = read(USAGE)
    measured = "output tokens/s as vllm bench serve measures them"
    assert measured in text
    drifted = text.replace(measured, "output tokens/s at the client")
    assert any("at the client" in p for p in demo_sample_problems(drifted, home))


def test_demo_contexts_named_in_a_doc_but_not_served_fail(home: Home):
    # Every quote of them is rendered from served.CONTEXTS, as the sample output once named
    # a 128 the demo no longer serves.
    assert demo_contexts() == "32, 512 and 1024"
    text = read(USAGE)
    drifted = flat(text).replace(demo_contexts(), "32, 128, 512 and 1024")
    assert any("at contexts of" in p for p in figure_problems(USAGE, drifted, home))
    sample = text.replace(
        "      512       2.07",
        "      128       3.02       3.76       3.76 ...\n      512       2.07",
    )
    assert figure_problems(USAGE, sample, home)


def test_a_context_the_demo_adds_fails_the_docs_until_they_follow(home: Home, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "demo_context_list", lambda: [32, 256, 512, 1024])
    assert figure_problems(USAGE, read(USAGE), home)
    assert demo_sample_problems(read(USAGE), home)


def offline_example(text: str) -> dict:
    """The keyword arguments of the ``LLM(...)`` call in usage.md's offline example, as
    literals (tests/test_engine_load.py runs them)."""
    block = re.search(r"```python\n(.*?)```", section(text, "Serve it"), re.S).group(1)
    calls = [
        node
        for node in ast.walk(ast.parse(block))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "LLM"
    ]
    assert len(calls) == 1, f"{len(calls)} LLM(...) calls in the offline example"
    return {k.arg: ast.literal_eval(k.value) for k in calls[0].keywords}


def offline_example_problems(kwargs: dict) -> list[str]:
    from vllm_ascend.worker.v2.spec_decode.draft_window.config import DraftWindowConfig
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import plugin, supported

    problems = []
    extra = set(kwargs) - {"model", "max_model_len", "speculative_config", "additional_config"}
    if extra:
        problems.append(f"the example sets {sorted(extra)}, which the engine test does not run")
    additional = kwargs.get("additional_config", {})
    if unknown := plugin.unknown_keys(additional):
        problems.append(f"the plugin refuses the example's keys {unknown}")
    try:
        window = DraftWindowConfig.from_additional_config(additional)
        if not window.enabled:
            problems.append("the example sets no draft_window_size")
    except ValueError as error:
        problems.append(f"the plugin refuses the example's additional_config: {error}")
    method = kwargs.get("speculative_config", {}).get("method")
    for release in supported.RELEASES:
        if "vllm-ascend" not in release.name and method not in release.methods:
            problems.append(f"{release} does not serve the example's method {method!r}")
    return problems


def test_the_offline_example_is_one_the_plugin_serves_on_cuda():
    kwargs = offline_example(read(USAGE))
    assert kwargs["speculative_config"]["method"] == "eagle3"
    problems = offline_example_problems(kwargs)
    assert not problems, "\n".join(problems)


def test_an_offline_example_the_plugin_would_refuse_fails():
    kwargs = offline_example(read(USAGE))
    misspelled = {**kwargs, "additional_config": {"draft_window_sise": 2048}}
    assert any("draft_window_sise" in p for p in offline_example_problems(misspelled))
    worded = {**kwargs, "additional_config": {"draft_window_size": "whole"}}
    assert any("refuses" in p for p in offline_example_problems(worded))
    ngram = {**kwargs, "speculative_config": {"method": "ngram"}}
    assert any("ngram" in p for p in offline_example_problems(ngram))


# ---- The layout: design/usage.md's table of the checkout's folders.


def layout_paths(text: str) -> list[str]:
    """The folders the layout's table names, one a row."""
    body = section(text, "Layout")
    return re.findall(r"^\| `([^`]+/)` \|", body, re.M)


def tracked_top_folders() -> set[str]:
    """The checkout's top-level folders that git tracks files in."""
    import subprocess

    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return {f"{path.split('/')[0]}/" for path in files.splitlines() if "/" in path}


def layout_problems(text: str, top: set[str]) -> list[str]:
    """Every folder the layout names is one; every top-level folder git tracks is named,
    or a folder inside it is."""
    paths = layout_paths(text)
    problems = [
        f"the layout names {p}, which is not a folder of the checkout"
        for p in paths
        if not (ROOT / p).is_dir()
    ]
    problems += [
        f"the layout leaves out {f}"
        for f in sorted(top)
        if not any(p == f or p.startswith(f) for p in paths)
    ]
    return problems


def test_the_layout_names_every_folder_and_only_folders_that_exist():
    problems = layout_problems(read(USAGE), tracked_top_folders())
    assert not problems, "\n".join(problems)


def test_a_layout_that_drifts_fails():
    text, top = read(USAGE), tracked_top_folders()
    assert "testbed/" in layout_paths(text)
    # testbed/ put under tests/ (as it once was), and a folder left out.
    moved = text.replace("| `testbed/` |", "| `tests/testbed/` |", 1)
    assert any("names tests/testbed/" in p for p in layout_problems(moved, top))
    dropped = re.sub(r"\n\| `e2e/` \|.*", "", text, count=1)
    assert any("leaves out e2e/" in p for p in layout_problems(dropped, top))


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
    ".github/workflows/scripts/coverage.py",
    "tests/ut/conftest.py",
    "tests/ut/worker/v2/spec_decode/draft_window/test_draft_window.py",
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
    doc = TIMES_HOME
    assert not pointer_problems(doc, read(doc), files)
    assert pointer_problems(doc, 'README "The trained models"', files)
    assert pointer_problems(doc, "[x](usage.md#the-trained-models)", files)
    assert pointer_problems(doc, "[x](../tests/README.md#nothing-here)", files)
    assert pointer_problems(doc, "design doc, section 4.7", files)
    assert pointer_problems(doc, "`make bench` section 9", files)
    assert pointer_problems("tests/README.md", "the path check's tests, `test_proof.py`", files)
    assert not pointer_problems(doc, "[x](usage.md#the-committed-tiny-models), `fused.py`", files)
