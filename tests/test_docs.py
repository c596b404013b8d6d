# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Every measured figure the docs quote has one home, and the quote is still what the home
says.

A figure is a number with two or more decimals (``3.58``, ``x1.078``, ``0.243``) or with
one and a percent sign or a unit (``7.7%``, ``37.5 tok/s``, ``0.35 ms``). Each one in
README.md and design/*.md must appear, as a whole number, in its home:
``benchmarks/results/README.md`` (written by ``make bench``), or in ``ELSEWHERE`` below, a
short list of figures whose home is outside this repository (each with its source) or that
are stated bounds rather than measurements. A quote that drifts from its home, or a figure
measured once and written only into the prose, fails here: quote the home's figure, add the
figure to the home (``make bench``), or cut it.

Release numbers (``vLLM 0.33``) look like figures and are skipped (``VERSIONS``); a ratio
that happens to read 0.33 escapes the check.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

# The docs are the same on every line: once, in .venv.
pytestmark = pytest.mark.release_independent

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / "benchmarks" / "results" / "README.md"
DOCS = [ROOT / "README.md", *sorted((ROOT / "design").glob("*.md"))]

# A number not inside a longer dotted one (0.33.0, 0.30.0rc2), with two or more decimals, or
# with one and a percent sign or a unit; an ``x`` before or after (x1.45, 0.74x) is a ratio's.
FIGURE = re.compile(
    r"(?<![\w.])x?(\d+\.\d{2,}|\d+\.\d%|\d+\.\d(?=\s?(?:tok/s|MiB|GiB|ms|us)\b))x?(?!\w|\.\w)"
)
# The releases the docs name, read as numbers by FIGURE: vLLM and vllm-ascend's, Python's
# and glibc's.
VERSIONS = {"0.26", "0.28", "0.29", "0.30", "0.31", "0.33", "0.34", "3.11", "2.34"}
# Figures whose home is not benchmarks/results, with it.
ELSEWHERE = {
    # vllm-ascend's released measurements of its Model Runner V1 window (design section 1, 7).
    "1.11": "vllm-ascend: Qwen3.6 with a DFlash draft, K = 7, at 32k without the window",
    "4.49": "vllm-ascend: the same with W = 2048",
    "4.5%": "vllm-ascend: a 1024 window on a 2048-native-SWA DSpark draft at 32k",
    "0.878": "vllm-ascend: throughput of its V1 window against none at 32k",
    "1.026": "vllm-ascend: the same, engaged only from 3W",
    "42.8%": "others' EAGLE3 draft with a sliding window: acceptance length gained at 16K",
    # make demo's inspector: KV MiB computed from W = 2048 and blocks of 128, not measured.
    "4.00": "the inspector: KV MiB one 1024-token request reads",
    "8.00": "the inspector: KV MiB the window reads",
    "512.00": "the inspector: KV MiB a 128k request reads without the window",
    "60.0": "the inspector: KV MiB the batch reads with the window",
    "1020.0": "the inspector: KV MiB the batch reads without it",
    # make bench's study reports (benchmarks/results/study, not kept; 2026-12-05), quoted by
    # design/e2e.md: acceptance rates at 1024.
    "16.6%": "the study's report: the draft model's acceptance rate without the window",
    "67.3%": "the study's report: the draft model's with it",
    "92.2%": "the study's report: the draft model's inside its training context",
    "33.1%": "the study's report: the EAGLE3 head's without the window",
    "68.4%": "the study's report: the EAGLE3 head's with it",
    "86.1%": "the study's report: the EAGLE3 head's inside its training context",
    # design/e2e.md's bf16 run of the CPU study (measured once, issue 58): within 0.12 of
    # float32's, the points that differ from make bench's.
    "0.12": "design/e2e.md: the bf16 study's largest distance from float32's",
    "3.88": "design/e2e.md: the bf16 study, EAGLE3 with the window at 128",
    "2.28": "design/e2e.md: the bf16 study, EAGLE3 without the window at 256",
    "3.47": "design/e2e.md: the bf16 study, EAGLE3 with the window at 256",
    "3.03": "design/e2e.md: the bf16 study, EAGLE3 with the window at 1024",
    # Stated bounds, not measurements.
    "0.15": "design/e2e.md: the golden check's tolerance per context",
    "0.66": "vLLM's own spec-decode e2e threshold of identical outputs (MIN_IDENTICAL)",
    # One W served twice (tests/test_engine_study.py in CI, commit 0692f84).
    "2.95": "one W served twice at 1024 tokens: the lower run",
    "3.19": "one W served twice at 1024 tokens: the higher run",
}


def figures(text: str) -> set[str]:
    return {m.group(1) for m in FIGURE.finditer(text)} - VERSIONS


def test_the_figure_pattern_reads_figures_not_releases():
    text = (
        "3.58 at 32, x1.078 of it, 1.26-1.49x, 0.243 of the time, 7.7% of the KV, "
        "37.5 tok/s, 0.35 ms; vLLM 0.33.0, 0.30.0rc2, 0.33.x, vLLM 0.34, Python 3.11, "
        "W = 33, 1.7 times, 3.5 GB, 13.13."
    )
    assert figures(text) == {
        "3.58",
        "1.078",
        "1.26",
        "1.49",
        "0.243",
        "7.7%",
        "37.5",
        "0.35",
        "13.13",
    }


def test_a_figure_missing_from_its_home_is_caught():
    home = figures(HOME.read_text())
    assert "3.58" in home and "3.13" not in home and "3.1" not in home
    # A whole number only: 13.13 in the home does not hold 3.13.
    assert figures("13.13") == {"13.13"}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_quoted_figure_is_in_its_home(doc: Path):
    home = figures(HOME.read_text())
    missing = sorted(figures(doc.read_text()) - home - ELSEWHERE.keys())
    assert not missing, (
        f"{doc.relative_to(ROOT)} quotes figures that are not in {HOME.relative_to(ROOT)} "
        f"nor in tests/test_docs.py's ELSEWHERE: {missing}"
    )


def test_elsewhere_lists_only_figures_the_docs_quote():
    quoted = set().union(*(figures(doc.read_text()) for doc in DOCS))
    assert not ELSEWHERE.keys() - quoted, "ELSEWHERE lists figures no doc quotes any more"
