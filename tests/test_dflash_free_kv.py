# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""``draft_window_free_kv`` with a trained DFlash drafter, the shape where vLLM's grouping
pays: a one-layer draft (``trained_models/dflash``) beside the two-layer target, which vLLM
groups without padding (three groups of one layer with the key, one of three without). In a
real vLLM engine on CPU driven as a server drives it (``testbed/engine/decode_held.py``): four
requests of 1024 tokens (16 times the drafter's training context), 48 tokens each, greedy,
chunked prefill of 96 tokens a step, in KV bytes that hold one of them with the draft's
whole KV. With the key the draft's group holds only what the window reads, so vLLM runs
two at once; the tokens and the drafts' acceptance are the window's without the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import trained_models as trained
from testbed.engine.load_plan import ADMISSION, FREE_KV, WINDOW, long_requests, speculative
from testbed.engine.runs import engine_script

DECODE_HELD = Path(__file__).resolve().parent.parent / "testbed" / "engine" / "decode_held.py"

pytestmark = pytest.mark.newest_line

# 52 blocks of 32 tokens of the three layers (the target's two, the draft's one): one
# request of 1024 tokens and its 48 needs 34 of them.
KV_BYTES = 52 * 32 * 3 * 1024
# Two runs of one engine differ by up to this in mean acceptance length (which requests
# share an engine step moves a draft's rounding: test_engine_study.py).
REPEAT = 0.25
RUNS = {"window": WINDOW, "window, KV freed": FREE_KV}


@pytest.fixture(scope="module")
def admitted(tmp_path_factory):
    models = trained.committed()
    plan = {
        "target": models.target,
        "max_model_len": trained.TARGET_CONTEXT,
        "block_size": 32,
        "requests": {f"1024 tokens ({k})": ids for k, ids in enumerate(long_requests(models))},
        "max_tokens": 48,
        "runs": [
            {
                "name": name,
                "speculative_config": speculative("dflash", models.dflash),
                "additional_config": window,
                "engine": {**ADMISSION, "kv_cache_memory_bytes": KV_BYTES},
            }
            for name, window in RUNS.items()
        ],
    }
    return engine_script(DECODE_HELD, plan, tmp_path_factory.mktemp("dflash-free-kv"))


def mean_length(counters: dict) -> float:
    drafts = counters["vllm:spec_decode_num_drafts"]
    return 1 + counters["vllm:spec_decode_num_accepted_tokens"] / drafts


def concurrency(log: str) -> float:
    """vLLM's own figure: its maximum concurrency at max_model_len, from its start-up log."""
    (found,) = re.findall(r"Maximum concurrency for 1,088 tokens per request: ([\d.]+)x", log)
    return float(found)


def test_the_key_runs_twice_the_requests_with_the_same_tokens_and_acceptance(admitted):
    freed, whole = admitted.results["window, KV freed"], admitted.results["window"]
    assert (whole["most_running"], freed["most_running"]) == (1, 2)
    assert len(freed["tokens"]) == 4 and freed["tokens"] == whole["tokens"]
    on, off = mean_length(freed["counters"]), mean_length(whole["counters"])
    assert abs(on - off) <= REPEAT, f"{on:.2f} with the key, {off:.2f} without"
    assert off >= 2.5, f"the window at 1024 tokens accepts {off:.2f} per draft"
    assert freed["counters"]["vllm:num_preemptions"] == 0
    said = concurrency(admitted.logs["window, KV freed"]), concurrency(admitted.logs["window"])
    assert said[0] > 1.3 * said[1], said


def test_the_drafts_group_holds_what_the_start_up_line_says(admitted):
    """The start-up line's blocks per request against what vLLM's KV cache manager held:
    the draft's group (the third) never more than the line's prefill chunk, and in steady
    decode never more than the line's steady figure nor less than the window's own blocks;
    the target's two the whole context, as the one group without the key."""
    log = admitted.logs["window, KV freed"]
    said = re.search(
        r"draft_window_free_kv: the draft's 1 layer\(s\) \(33\.3% of each token's KV\) keep a "
        r"sliding window of 33 tokens per request instead of the whole context, in blocks of "
        r"32: at most (\d+) blocks per request in steady decode \(1 \+ 3 tokens a step, \d "
        r"lookahead(?:, a step in flight)?\), (\d+) during a prefill chunk of 96 tokens; vLLM "
        r"frees the rest \(KV-cache groups: 3, 1 without the key\)\.",
        log,
    )
    assert said, log
    steady, prefill = int(said[1]), int(said[2])
    assert "draft_window_free_kv" not in admitted.logs["window"]
    *target, draft = admitted.results["window, KV freed"]["most_held"]
    (whole,) = admitted.results["window"]["most_held"]
    assert steady < prefill and draft <= prefill, (draft, steady, prefill)
    assert min(*target, whole) >= -(-(1024 + 48) // 32)
    assert draft < whole // 4
    found = admitted.results["window, KV freed"]
    *_, decoding = found["decode_held"]
    assert found["decode_steps"] > 0
    assert -(-WINDOW["draft_window_size"] // 32) <= decoding <= steady, (decoding, steady)
