# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The window inside a real vLLM engine on CPU (vLLM's CPU worker, Model Runner V2), over
tiny models made here, with this project installed as on a host (its plugin loaded by vLLM
itself): offline ``LLM`` engines and ``vllm serve``.

Greedy speculative decoding is lossless: the draft only proposes, the target decides. So
every run, whatever its draft and window, must generate the tokens the target generates
alone. A draft model that is the target itself proposes exactly what the target verifies:
without the window every draft token is accepted, and a window that crops what the draft
reads shows as tokens rejected, while one that cannot crop (or is not engaged) changes
nothing. Acceptance is vLLM's own spec-decode metrics.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from testbed.engine.models import HEAD_METHODS, make_tiny_models
from testbed.engine.runs import NUM_SPEC, Run, Server, offline, served_counters

WINDOW = {"draft_window_size": 32}
# Sinks of one block, and a threshold one prompt (118 tokens) starts above, one (77) reaches
# during generation and two (9, 40) never reach.
SINKS_AND_THRESHOLD = {**WINDOW, "draft_attention_sinks": 32, "draft_window_min_context": 84}
# The heads accept nothing (random weights) and are slow on CPU: fewer tokens.
HEAD_TOKENS = 10
# The heads that are their speculator family's own architecture.
FAMILIES = ("eagle3", "dflash", "dspark")
RUNS = [
    Run("no speculation"),
    # A draft model: the target drafts for itself.
    Run("draft_model", "draft_model"),
    Run("draft_model with the window", "draft_model", WINDOW),
    Run("draft_model with sinks and a threshold", "draft_model", SINKS_AND_THRESHOLD),
    Run(
        "draft_model, threshold above every context",
        "draft_model",
        {**WINDOW, "draft_window_min_context": 512},
    ),
    Run("draft_model, window wider than every context", "draft_model", {"draft_window_size": 512}),
    # Each speculator family's heads (EAGLE3, DFlash, DSpark) with the window, and with sinks
    # and a threshold; the DFlash family's other architectures (XPress, DFlash2, LiLiCorr:
    # the DFlash speculator over another model class) with the window. Without the window a
    # head runs vLLM's own draft, nothing of the window's: the draft model's run above shows
    # the plugin silent there.
    *(
        Run(name, method, window, HEAD_TOKENS, draft=head)
        for head, method in HEAD_METHODS.items()
        for name, window in (
            (f"{head} with the window", WINDOW),
            (f"{head} with sinks and a threshold", SINKS_AND_THRESHOLD),
        )
        if head in FAMILIES or window is WINDOW
    ),
]
BY_NAME = {run.name: run for run in RUNS}
BASELINE = "no speculation"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return make_tiny_models(tmp_path_factory.mktemp("tiny-engine-models"))


@pytest.fixture(scope="module")
def engines(models, tmp_path_factory):
    """Every run of ``RUNS``, one engine after another in one engine process (which inspects
    the heads' model classes itself, where vLLM's cache lacks them: ``offline.py``)."""
    return offline(models, RUNS, tmp_path_factory.mktemp("offline"), inspect_in_process=True)


def first_difference(got: list[list[int]], expected: list[list[int]]) -> str | None:
    """Where two generations first differ: prompt, position and both tokens."""
    for prompt, (a, b) in enumerate(zip(got, expected, strict=True)):
        for position, (x, y) in enumerate(zip(a, b, strict=False)):
            if x != y:
                return f"prompt {prompt}, token {position}: {x} instead of {y}"
        if len(a) < len(b):
            return f"prompt {prompt}: {len(a)} tokens instead of {len(b)}"
    return None


def result(engines, name: str) -> dict:
    found = engines.results[name]
    assert "error" not in found, f"run {name!r} failed: {found['error']}\n{engines.logs[name]}"
    return found


@pytest.mark.parametrize("name", [run.name for run in RUNS[1:]])
def test_every_run_generates_the_tokens_the_target_generates_alone(name, engines):
    run = BY_NAME[name]
    got = result(engines, name)["token_ids"]
    alone = [ids[: run.max_tokens] for ids in result(engines, BASELINE)["token_ids"]]
    difference = first_difference(got, alone)
    assert difference is None, f"run {name!r} (method {run.method}): {difference}"


@pytest.mark.parametrize("name", [run.name for run in RUNS if run.window])
def test_the_window_says_it_is_on_and_serves_the_drafts_builds(name, engines):
    """The plugin loaded in the engine, made the speculator's window at start-up and built
    the draft's metadata through it: its two lines in the engine's log."""
    run, log = BY_NAME[name], engines.logs[name]
    result(engines, name)
    assert re.search(rf"Draft KV window on for {run.method}: draft_window_size=\d+", log), log
    assert "Draft KV window active: the first draft metadata build is windowed." in log, log


@pytest.mark.parametrize("name", [run.name for run in RUNS if not run.window])
def test_without_the_key_the_plugin_says_nothing(name, engines):
    result(engines, name)
    assert "Draft KV window" not in engines.logs[name]


@pytest.mark.parametrize(
    ("name", "crops"),
    [
        ("draft_model", False),
        ("draft_model with the window", True),
        ("draft_model with sinks and a threshold", True),
        ("draft_model, threshold above every context", False),
        ("draft_model, window wider than every context", False),
    ],
)
def test_a_draft_that_is_the_target_loses_acceptance_only_where_the_window_crops(
    name, crops, engines
):
    found = result(engines, name)["counters"]
    drafted = found["vllm:spec_decode_num_draft_tokens"]
    accepted = found["vllm:spec_decode_num_accepted_tokens"]
    assert drafted > 0 and drafted == NUM_SPEC * found["vllm:spec_decode_num_drafts"], found
    if crops:
        assert accepted < drafted, f"run {name!r}: every draft token accepted ({drafted})"
    else:
        assert accepted == drafted, f"run {name!r}: {accepted} of {drafted} accepted"


@pytest.mark.parametrize("head", HEAD_METHODS)
def test_every_head_drafts_inside_the_engine(head, engines, models):
    """The heads ran as drafts (vLLM counted their proposals) with the window, each as its own
    architecture (which picks the DFlash family's speculator)."""
    (architecture,) = json.loads(Path(models.draft(head), "config.json").read_text())[
        "architectures"
    ]
    names = [run.name for run in RUNS if run.draft == head]
    assert names, head
    for name in names:
        found = result(engines, name)["counters"]
        assert found["vllm:spec_decode_num_drafts"] > 0, (name, found)
        assert found["vllm:spec_decode_num_draft_tokens"] > 0, (name, found)
        assert f"Resolved architecture: {architecture}" in engines.logs[name], name


@pytest.fixture(scope="module")
def served(models, engines, tmp_path_factory):
    """`vllm serve` of the draft model with the window, its completions and /metrics."""
    run = BY_NAME["draft_model with the window"]
    with Server(models, run, tmp_path_factory.mktemp("serve")) as server:
        assert server.wait(), f"vllm serve exited ({server.process.returncode}):\n{server.log}"
        token_ids = server.completions(models, run.max_tokens)
        metrics = server.get("/metrics")
    return run, token_ids, metrics, server


def test_vllm_serve_answers_what_the_offline_engine_generates(served, engines):
    run, token_ids, _, server = served
    difference = first_difference(token_ids, result(engines, run.name)["token_ids"])
    assert difference is None, f"vllm serve, run {run.name!r}: {difference}"
    assert "Draft KV window on for draft_model: draft_window_size=32" in server.log


def test_vllm_serves_metrics_count_the_drafts_the_window_crops(served, engines):
    run, _, metrics, _ = served
    offline_run = result(engines, run.name)
    counted = served_counters(metrics)
    assert counted == offline_run["counters"], counted
    drafted = counted["vllm:spec_decode_num_draft_tokens"]
    assert drafted > 0 and counted["vllm:spec_decode_num_accepted_tokens"] < drafted


def test_a_bad_key_stops_vllm_serve_before_it_listens(models, tmp_path_factory):
    """One error naming the key, the value and the fix; a non-zero exit; nothing left."""
    import os

    bad = Run("bad key", "draft_model", {"draft_window_size": -4})
    with Server(models, bad, tmp_path_factory.mktemp("serve-bad")) as server:
        assert not server.wait(), "vllm serve started with draft_window_size=-4"
        code = server.process.returncode
    assert code != 0 and not server.answered
    assert (
        'additional_config["draft_window_size"] must be a positive integer number of tokens'
    ) in server.log
    assert "got -4 (int)" in server.log
    with pytest.raises(ProcessLookupError):
        os.killpg(server.process.pid, 0)
