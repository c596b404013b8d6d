# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What the window is for, in a real vLLM engine on CPU: a drafter trained at a short
context collapses past it, and the window brings it back.

The long-context study of ``make e2e-ascend`` (``python -m e2e --study long --device cpu``),
as ``make demo`` serves it, over the committed tiny models (``trained_models/``) with
``vllm serve``: an EAGLE3 head trained at C = 64
tokens on the hidden states of a target sound to 1088. At each context (C/2, inside the
training context; 16 C) 8 prompts of held-out text generate 16 tokens each, greedy, K = 3;
acceptance is vLLM's own spec-decode metrics. The draft model trained at 64 tokens is held
to the same margin under serving load (``test_engine_load.py``); ``make bench`` draws both
drafters' curves. (A window that cannot crop changes nothing: ``test_engine.py``, where a
draft model that is the target accepts every token with it.) The margins below were
set from what the study measured (design/testing.md): they hold with room, and fail where the
window stops bringing acceptance back, where the drafter no longer collapses without it
(then the test shows nothing), or where the tokens change.

The DFlash drafter trained at C (``trained_models/dflash``, vLLM's ``dflash`` method: a
block of K + 1 queries drafted in one pass over the context's keys and values) is held to a
stated share of its in-distribution acceptance in vLLM's offline engine
(``testbed/engine/study.py``, the same contexts, prompts and generation): ``make bench``
draws its curve beside the others.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
from vllm.utils.network_utils import get_open_port

import trained_models as trained
from testbed.engine.study import StudyRun, mean_lengths, run_study

# What it measures is the trained models' (the window's hooks serve every line the same
# tokens: test_engine.py, on both): once, on the newest line.
pytestmark = pytest.mark.newest_line

ROOT = Path(__file__).resolve().parent.parent
C = trained.DRAFT_CONTEXT
CONTEXTS = (C // 2, 16 * C)
# The window "auto" picks for a head declaring C, the study's window on CPU: C - a + 1.
WINDOW = C - 32 + 1
# At 16 C: with the window, acceptance at least this far above without it, and at least
# this share of the in-distribution level (C/2); without it, at most that share.
GAIN = 0.6
SHARE = 0.7
# Two runs of one server: the prompts of a context arrive together, and which of them share an
# engine step moves a draft's rounding (one W served twice took 37 to 40 drafts at 1024
# tokens: mean length 2.95 to 3.19).
REPEAT = 0.25


@pytest.fixture(scope="module")
def eagle3(tmp_path_factory):
    """What ``make demo`` serves after its tables (``tools/inspector/served.py``): the study
    of the EAGLE3 head without the window, with it and with "auto" (one server at a time
    here, beside the other suites); its printed table beside its report."""
    from tools.inspector import served

    out, printed = tmp_path_factory.mktemp("demo"), io.StringIO()
    with contextlib.redirect_stdout(printed):
        contexts = ",".join(map(str, CONTEXTS))
        ok = served.serve_study(out, parallel=1, contexts=contexts, port=get_open_port())
    report = out / "study_eagle3" / "report.json"
    assert report.exists(), printed.getvalue()
    return ok, json.loads(report.read_text()), printed.getvalue()


def lengths(report: dict, run: str) -> dict[int, float]:
    return {int(c): m["mean_length"] for c, m in report["runs"][run]["contexts"].items()}


def test_the_window_changes_no_token_of_the_head_served_without_it(eagle3):
    """Greedy, the target decides every token: with the window and with "auto" the head's
    server generates what it generates without the window (and that, what the target
    generates alone: test_engine_load.py, the same head under load)."""
    ok, head, _ = eagle3
    assert ok and head["failures"] == [], head["failures"]
    assert set(head["runs"]) == {"v2_no_window", "v2_window", "v2_auto"}
    without = head["runs"]["v2_no_window"]["outputs"]
    assert without and all(without.values()), without
    for run, found in head["runs"].items():
        assert found["outputs"] == without, run


@pytest.mark.parametrize("run", ["v2_window", "v2_auto"])
def test_at_sixteen_times_its_training_context_the_drafter_collapses_and_the_window_restores_it(
    run, eagle3
):
    """``v2_auto`` is the head served with ``draft_window_size="auto"``."""
    report = eagle3[1]
    on, off = lengths(report, run), lengths(report, "v2_no_window")
    inside = on[C // 2]
    assert abs(on[C // 2] - off[C // 2]) <= REPEAT, "inside the training context it changes nothing"
    for ctx in CONTEXTS[1:]:
        summary = f"eagle3 at {ctx}: {on[ctx]:.2f} with {run}, {off[ctx]:.2f} without, "
        summary += f"{inside:.2f} inside the training context"
        assert off[ctx] <= SHARE * inside, f"no collapse to recover from: {summary}"
        assert on[ctx] >= off[ctx] + GAIN, summary
        assert on[ctx] >= SHARE * inside, summary


def test_make_demo_shows_the_curve_the_start_up_lines_and_where_the_plot_is(eagle3):
    _, _, printed = eagle3
    assert "mean acceptance length" in printed and "output tokens/s" in printed
    for ctx in CONTEXTS:
        assert any(line.split()[:1] == [str(ctx)] for line in printed.splitlines()), ctx
    assert "Tokens: the same in every run" in printed
    said = f"window, the server said: Draft KV window on for eagle3: draft_window_size={WINDOW},"
    assert said in printed
    plot = Path(printed.split("Plot:")[1].split()[0])
    assert plot.name == "study.png" and plot.stat().st_size > 0


def test_auto_sizes_the_window_from_the_heads_declared_context_and_says_so(eagle3):
    """The head's checkpoint declares 64 tokens (its training context), which vLLM raised to
    the target's max_model_len at start-up: "auto" reads the checkpoint's own number and the
    server says it serves W = 64 - 32 + 1, the explicit window's, with its tokens (the
    harness's check); its acceptance meets the explicit window's margins (the test above).
    Equal acceptance is not asserted: the 8 prompts of a context arrive together, which of
    them share an engine step moves a draft's rounding (REPEAT)."""
    _, report, printed = eagle3
    auto = report["runs"]["v2_auto"]
    became = [line for line in auto["window_lines"] if line.startswith("draft_window_size=auto")]
    assert became and became[0].startswith(f"draft_window_size=auto became W={WINDOW}:"), auto
    assert "declares max_position_embeddings=64 (its training context)" in became[0]
    assert any(
        line.startswith(f"Draft KV window on for eagle3: draft_window_size={WINDOW},")
        for line in auto["window_lines"]
    )
    assert f"auto, the server said: draft_window_size=auto became W={WINDOW}" in printed


# The DFlash drafter trained at C (trained_models/dflash: one block of K + 1 queries per
# draft, the context's keys and values from the target's hidden states), in vLLM's offline
# engine (testbed/engine/study.py: 8 prompts of held-out text per context, 16 tokens each,
# greedy, K = 3): its share of the in-distribution acceptance (C/2, no window) at 16 C,
# at least DFLASH_SHARE with the window (measured on 0.33: 2.93 of 3.07, 95%), at most
# DFLASH_COLLAPSE without it (1.37 of 3.07, 45%). The prompts of another seed moved the
# share with the window to 77% (2.49 of 3.22): the bound holds these prompts' share, not
# every prompt set's.
DFLASH_SHARE = 0.8
DFLASH_COLLAPSE = 0.6
# Well above one accepted token per draft in distribution (measured: 3.07 of at most 4).
DFLASH_INSIDE = 2.5
DFLASH_RUNS = [
    StudyRun("no_speculation"),
    StudyRun("v2_no_window", "dflash"),
    StudyRun("v2_window", "dflash", {"draft_window_size": WINDOW}),
    StudyRun("v2_auto", "dflash", {"draft_window_size": "auto"}),
]


@pytest.fixture(scope="module")
def dflash(tmp_path_factory):
    """The DFlash drafter's study: the target alone, the drafter without the window, with
    W and with "auto", one engine after another in one process."""
    models = trained.committed()
    found = run_study(
        models, models.dflash, DFLASH_RUNS, CONTEXTS, tmp_path_factory.mktemp("dflash-study")
    )
    for name, result in found.results.items():
        assert "error" not in result, (
            f"{name}: {result['error']}\n{found.logs.get(name, '')[-4000:]}"
        )
    return found


def test_the_dflash_drafter_generates_the_tokens_the_target_generates_alone(dflash):
    alone = dflash.results["no_speculation"]["contexts"]["greedy"]
    for run, result in dflash.results.items():
        found = result["contexts"]["greedy"]
        for ctx in CONTEXTS:
            assert found[str(ctx)]["token_ids"] == alone[str(ctx)]["token_ids"], (run, ctx)


@pytest.mark.parametrize("run", ["v2_window", "v2_auto"])
def test_the_dflash_drafter_collapses_at_sixteen_times_its_training_context_and_recovers(
    run, dflash
):
    on = mean_lengths(dflash.results[run])
    off = mean_lengths(dflash.results["v2_no_window"])
    inside = off[C // 2]
    assert inside >= DFLASH_INSIDE, f"in distribution the drafter accepts {inside:.2f} per draft"
    assert abs(on[C // 2] - inside) <= REPEAT, "inside the training context it changes nothing"
    ctx = CONTEXTS[-1]
    summary = f"dflash at {ctx}: {on[ctx]:.2f} with {run}, {off[ctx]:.2f} without, "
    summary += f"{inside:.2f} inside the training context"
    assert off[ctx] <= DFLASH_COLLAPSE * inside, f"no collapse to recover from: {summary}"
    assert on[ctx] >= DFLASH_SHARE * inside, summary


def test_the_dflash_engines_say_the_window_they_serve(dflash):
    window = f"Draft KV window on for dflash: draft_window_size={WINDOW},"
    assert window in dflash.logs["v2_window"]
    auto = dflash.logs["v2_auto"]
    assert f"draft_window_size=auto became W={WINDOW}:" in auto and window in auto
    assert "declares max_position_embeddings=64 (its training context)" in auto
    assert "Draft KV window" not in dflash.logs["v2_no_window"]
