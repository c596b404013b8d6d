# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The window under the load a server sees, in a real vLLM engine on CPU with the drafters
trained here (``make trained-models``): more requests than ``max_num_seqs`` (requests join
and leave a running batch), of lengths from inside the drafters' training context to 16
times it; chunked prefill with a small token budget; prompts that share a prefix
(prefix-cache hits); a KV cache too small for the batch (preemption); and a request aborted
mid-generation, as by a client that disconnects. ``LLMEngine`` is driven step by step, as a
server drives it (``testbed/engine/load.py``); what happened is vLLM's own counters.

Every finished request must generate the tokens a roomy engine without speculation
generates for it, and the window must stay engaged and bring acceptance back as the study
test requires (``test_engine_study.py``: at least ``GAIN`` above the run without it).

With ``draft_window_free_kv`` (``kv_cache.py``) the draft model's KV before the window is
freed: under the same load and KV bytes the tokens stay the same and vLLM preempts less; at
1024 tokens of context the same KV bytes run twice the requests at once; with room for
everything, the drafts and acceptances are exactly the window's without the key.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import trained_models as trained
from testbed.engine.load_plan import (
    ABORT,
    ABORT_AFTER,
    ADMISSION,
    FREE_KV,
    KV_BYTES,
    MAX_TOKENS,
    ROOMY,
    ROOMY_UNCACHED,
    SHARED,
    UNDER_LOAD,
    WINDOW,
    long_requests,
    requests,
    speculative,
)
from testbed.engine.offline import mean_length
from testbed.engine.runs import LOAD, engine_script

# What it measures is the trained models' (the window's hooks serve every line the same
# tokens: test_engine.py, on both): once, on the newest line.
pytestmark = pytest.mark.newest_line

GAIN = 0.6
USAGE = Path(__file__).resolve().parent.parent / "design" / "usage.md"


def documented_example(models: trained.TrainedModels) -> tuple[dict, dict]:
    """The offline ``LLM(...)`` example of design/usage.md: its ``speculative_config`` (the
    draft the committed EAGLE3 head) and ``additional_config``, for the EAGLE3 run (its
    target and ``max_model_len`` are the plan's; tests/test_docs.py holds the example to
    these four arguments)."""
    block = re.search(r"```python\n(.*?)```", USAGE.read_text(), re.S).group(1)
    (call,) = [
        node
        for node in ast.walk(ast.parse(block))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "LLM"
    ]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    return {**kwargs["speculative_config"], "model": models.eagle3}, kwargs["additional_config"]


@pytest.fixture(scope="module")
def load(tmp_path_factory):
    models = trained.committed()
    draft_model = speculative("draft_model", models.draft_model)
    eagle3, eagle3_window = documented_example(models)
    draft_model_load = {**UNDER_LOAD, "kv_cache_memory_bytes": KV_BYTES["draft_model"]}
    eagle3_load = {**UNDER_LOAD, "kv_cache_memory_bytes": KV_BYTES["eagle3"]}
    runs = [
        ("no speculation, roomy", None, {}, ROOMY),
        ("draft model, no window", draft_model, {}, draft_model_load),
        ("draft model, window", draft_model, WINDOW, draft_model_load),
        ("EAGLE3, window", eagle3, eagle3_window, eagle3_load),
        ("draft model, window, KV freed", draft_model, FREE_KV, draft_model_load),
        ("draft model, window, roomy", draft_model, WINDOW, ROOMY_UNCACHED),
        ("draft model, window, KV freed, roomy", draft_model, FREE_KV, ROOMY_UNCACHED),
    ]
    long = {f"1024 tokens ({k})": ids for k, ids in enumerate(long_requests(models))}
    admission = [
        ("draft model, window, 1024 tokens", draft_model, WINDOW, ADMISSION),
        ("draft model, window, KV freed, 1024 tokens", draft_model, FREE_KV, ADMISSION),
    ]
    plan = {
        "target": models.target,
        "max_model_len": trained.TARGET_CONTEXT,
        "block_size": 32,
        "requests": requests(models),
        "abort": ABORT,
        "abort_after": ABORT_AFTER,
        "max_tokens": MAX_TOKENS,
        "runs": [
            {"name": n, "speculative_config": s, "additional_config": w, "engine": e}
            for n, s, w, e in runs
        ]
        + [
            {
                "name": n,
                "speculative_config": s,
                "additional_config": w,
                "engine": e,
                "requests": long,
            }
            for n, s, w, e in admission
        ],
    }
    return plan, engine_script(LOAD, plan, tmp_path_factory.mktemp("load"))


def test_every_finished_request_generates_the_tokens_of_no_speculation(load):
    plan, done = load
    reference = done.results["no speculation, roomy"]["tokens"]
    assert set(reference) == set(plan["requests"]) - {ABORT}
    for name, found in done.results.items():
        if "1024 tokens" in name:
            continue
        assert found["aborted"]["request"] == ABORT, name
        assert found["aborted"]["after_tokens"] >= ABORT_AFTER, name
        assert set(found["tokens"]) == set(reference), name
        for request, tokens in reference.items():
            assert found["tokens"][request] == tokens, f"{name}: {request}"
            assert len(tokens) == MAX_TOKENS


@pytest.mark.parametrize(
    "run",
    [
        "draft model, no window",
        "draft model, window",
        "EAGLE3, window",
        "draft model, window, KV freed",
    ],
)
def test_the_load_preempts_hits_the_prefix_cache_and_batches_more_than_it_runs(load, run):
    plan, done = load
    counters = done.results[run]["counters"]
    if "KV freed" not in run:
        # With the draft's KV freed the same KV bytes preempt less (the test below).
        assert counters["vllm:num_preemptions"] >= 1, counters
    # At least two later sharers' prefix, in tokens, but its last block (an EAGLE3 request's
    # block hashes look one token ahead, so its cached prefix ends a block earlier). With the
    # draft's KV freed the first sharers after the first miss (vLLM caches the shared
    # prefix's end for the draft's sliding window once one of them has reached it): one
    # later sharer's.
    sharers = 1 if "KV freed" in run else 2
    assert counters["vllm:prefix_cache_hits"] >= sharers * (SHARED - 32), counters
    assert len(plan["requests"]) > UNDER_LOAD["max_num_seqs"]


def test_the_window_stays_engaged_and_brings_acceptance_back_under_load(load):
    plan, done = load
    for name in ("draft model, window", "EAGLE3, window"):
        log = done.logs[name]
        assert "Draft KV window on for" in log and "Draft KV window active" in log, name
    # The EAGLE3 run is usage.md's offline example: the window it asks for is the one served.
    (example,) = [run for run in plan["runs"] if run["name"] == "EAGLE3, window"]
    window = example["additional_config"]["draft_window_size"]
    said = f"draft_window_size={window}" + (" became W=" if window == "auto" else ",")
    assert said in done.logs["EAGLE3, window"]
    assert "Draft KV window" not in done.logs["draft model, no window"]
    on = mean_length(done.results["draft model, window"]["counters"])
    off = mean_length(done.results["draft model, no window"]["counters"])
    assert on >= off + GAIN, f"{on:.2f} with the window, {off:.2f} without"


def test_with_the_drafts_kv_freed_the_same_kv_bytes_preempt_less_and_run_more_at_once(load):
    """``draft_window_free_kv``: vLLM's own counters, the draft model with the window with
    the key and without it, at the same KV bytes."""
    _, done = load
    freed, whole = (done.results[f"draft model, window{k}"] for k in (", KV freed", ""))
    preempted = [r["counters"]["vllm:num_preemptions"] for r in (freed, whole)]
    assert preempted[0] < preempted[1], preempted
    freed, whole = (
        done.results[f"draft model, window{k}, 1024 tokens"] for k in (", KV freed", "")
    )
    assert (whole["most_running"], freed["most_running"]) == (1, 2)
    assert freed["tokens"] == whole["tokens"] and len(freed["tokens"]) == 4


def test_with_room_for_everything_freeing_the_drafts_kv_changes_no_draft(load):
    """Where no KV runs short the key changes what the draft holds, never what it reads:
    the same drafts, the same acceptances, the same tokens."""
    _, done = load
    freed, whole = (done.results[f"draft model, window{k}, roomy"] for k in (", KV freed", ""))
    assert freed["counters"] == whole["counters"] and freed["tokens"] == whole["tokens"]


def test_the_key_says_what_the_draft_now_holds_and_vllm_frees_the_rest(load):
    """The start-up line's blocks per request against what vLLM's KV cache manager held:
    the draft's group (the second) never more than the line says, the target's the whole
    context, as every group without the key."""
    _, done = load
    log = done.logs["draft model, window, KV freed"]
    said = re.search(
        r"draft_window_free_kv: the draft's 2 layer\(s\) \(50\.0% of each token's KV\) keep a "
        r"sliding window of 33 tokens per request instead of the whole context, in blocks of "
        r"32: at most (\d+) blocks per request in steady decode \(1 \+ 3 tokens a step, 3 "
        r"lookahead(?:, a step in flight)?\), (\d+) during a prefill chunk of 96 tokens; vLLM "
        r"frees the rest \(KV-cache groups: 2, 1 without the key\)\.",
        log,
    )
    assert said, log
    steady, prefill = int(said[1]), int(said[2])
    assert "Prefix caching: a hit now needs" in log and "Draft KV window active" in log
    assert "draft_window_free_kv" not in done.logs["draft model, window"]
    target, draft = done.results["draft model, window, KV freed"]["most_held"]
    (whole,) = done.results["draft model, window"]["most_held"]
    assert steady < prefill and draft <= prefill, (draft, steady, prefill)
    # The longest request (1024 tokens and 48 more) held its whole context in both runs'
    # full-attention groups: the target's with the key, every layer's without it.
    assert min(target, whole) >= -(-(1024 + 48) // 32)
    assert draft < whole // 4
