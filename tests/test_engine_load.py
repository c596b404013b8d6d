# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The window under the load a server sees, in a real vLLM engine on CPU with the drafters
trained here (``make trained-models``): more requests than ``max_num_seqs`` (requests join
and leave a running batch), of lengths from inside the drafters' training context to 16
times it; chunked prefill with a small token budget; prompts that share a prefix
(prefix-cache hits); a KV cache too small for the batch (preemption); and a request aborted
mid-generation, as by a client that disconnects. ``LLMEngine`` is driven step by step, as a
server drives it (``tests/testbed/engine/load.py``); what happened is vLLM's own counters.

Every finished request must generate the tokens a roomy engine without speculation
generates for it, and the window must stay engaged and bring acceptance back as the study
test requires (``test_engine_study.py``: at least ``GAIN`` above the run without it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.testbed.engine import trained
from tests.testbed.engine.runs import LOAD, engine_script

# What it measures is the trained models' (the window's hooks serve every line the same
# tokens: test_engine.py, on both): once, on the newest line.
pytestmark = pytest.mark.newest_line

ROOT = Path(__file__).resolve().parent.parent
C = trained.DRAFT_CONTEXT
WINDOW = {"draft_window_size": C - 32 + 1}
GAIN = 0.6
# 12 requests of their own length, from inside the training context to 16 times it, and 4
# that share their first 640 tokens (three once the first has cached it). The first three
# fill the KV cache (below) and must grow as they decode: vLLM preempts one.
LENGTHS = (512, 512, 64, 40, 1024, 96, 640, 256, 896, 128, 768, 384)
SHARED, SUFFIX = 640, 128
ABORT, ABORT_AFTER = "640 tokens", 4
MAX_TOKENS = 48
# The load: 4 running at most, 96 tokens a step (chunked prefill), prefix caching, and a KV
# cache of 35 blocks of 32 tokens, as few as vLLM starts with for one request of the longest
# (1088 tokens): two requests of 512 tokens and one of 64 fill 34, and each needs a block
# more for its first decoded token. A block holds 32 tokens of the target's KV (2 layers)
# and the drafter's (the draft model's 2 layers; the EAGLE3 head's 1).
BLOCKS = 35
UNDER_LOAD = {
    "max_num_seqs": 4,
    "max_num_batched_tokens": 96,
    "enable_chunked_prefill": True,
    "enable_prefix_caching": True,
}
KV_BYTES = {"draft_model": BLOCKS * 32 * 4096, "eagle3": BLOCKS * 32 * 3072}
ROOMY = {"max_num_seqs": 16, "kv_cache_memory_bytes": 64 * 1024 * 1024}


def requests(models: trained.TrainedModels) -> dict[str, list[int]]:
    """Stretches of the held-out text (a byte a token), spread over it, by name."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(models.target)
    text = models.heldout.read_text(encoding="utf-8")
    ids = tokenizer(text, add_special_tokens=False).input_ids
    step = len(ids) // (len(LENGTHS) + 5)
    own = [(f"{n} tokens", ids[k * step :][:n]) for k, n in enumerate(LENGTHS)]
    prefix = ids[len(LENGTHS) * step :][:SHARED]
    shared = [
        (f"shared prefix {k}", prefix + ids[(len(LENGTHS) + 1 + k) * step :][:SUFFIX])
        for k in range(4)
    ]
    order = [*own[:3], shared[0], own[3], *shared[1:3], *own[4:], shared[3]]
    # Two requests share a length: the second gets a name of its own.
    return {
        (f"{name} (2)" if name in dict(order[:i]) else name): p for i, (name, p) in enumerate(order)
    }


def speculative(method: str, model: str) -> dict:
    return {"method": method, "model": model, "num_speculative_tokens": trained.NUM_SPEC}


@pytest.fixture(scope="module")
def load(tmp_path_factory):
    models = trained.trained_models(ROOT / ".cache" / "trained-models")
    draft_model = speculative("draft_model", models.draft_model)
    eagle3 = speculative("eagle3", models.eagle3)
    draft_model_load = {**UNDER_LOAD, "kv_cache_memory_bytes": KV_BYTES["draft_model"]}
    runs = [
        ("no speculation, roomy", None, {}, ROOMY),
        ("draft model, no window", draft_model, {}, draft_model_load),
        ("draft model, window", draft_model, WINDOW, draft_model_load),
        (
            "EAGLE3, window",
            eagle3,
            WINDOW,
            {**UNDER_LOAD, "kv_cache_memory_bytes": KV_BYTES["eagle3"]},
        ),
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
        ],
    }
    return plan, engine_script(LOAD, plan, tmp_path_factory.mktemp("load"))


def mean_length(counters: dict) -> float:
    drafts = counters["vllm:spec_decode_num_drafts"]
    return 1 + counters["vllm:spec_decode_num_accepted_tokens"] / drafts


def test_every_finished_request_generates_the_tokens_of_no_speculation(load):
    plan, done = load
    reference = done.results["no speculation, roomy"]["tokens"]
    assert set(reference) == set(plan["requests"]) - {ABORT}
    for name, found in done.results.items():
        assert found["aborted"]["request"] == ABORT, name
        assert found["aborted"]["after_tokens"] >= ABORT_AFTER, name
        assert set(found["tokens"]) == set(reference), name
        for request, tokens in reference.items():
            assert found["tokens"][request] == tokens, f"{name}: {request}"
            assert len(tokens) == MAX_TOKENS


@pytest.mark.parametrize("run", ["draft model, no window", "draft model, window", "EAGLE3, window"])
def test_the_load_preempts_hits_the_prefix_cache_and_batches_more_than_it_runs(load, run):
    plan, done = load
    counters = done.results[run]["counters"]
    assert counters["vllm:num_preemptions"] >= 1, counters
    # At least two later sharers' prefix, in tokens, but its last block (an EAGLE3 request's
    # block hashes look one token ahead, so its cached prefix ends a block earlier).
    assert counters["vllm:prefix_cache_hits"] >= 2 * (SHARED - 32), counters
    assert len(plan["requests"]) > UNDER_LOAD["max_num_seqs"]


def test_the_window_stays_engaged_and_brings_acceptance_back_under_load(load):
    _, done = load
    for name in ("draft model, window", "EAGLE3, window"):
        log = done.logs[name]
        assert "Draft KV window on for" in log and "Draft KV window active" in log, name
    assert "Draft KV window" not in done.logs["draft model, no window"]
    on = mean_length(done.results["draft model, window"]["counters"])
    off = mean_length(done.results["draft model, no window"]["counters"])
    assert on >= off + GAIN, f"{on:.2f} with the window, {off:.2f} without"
