# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""A prompt near ``max_model_len`` that fits only because the draft's KV is windowed
(``draft_window_free_kv``), in a real vLLM engine on CPU on each supported line: the trained
DFlash drafter (``trained_models/dflash``, one layer) beside the two-layer target, a request
of 1024 tokens and 48 more (``max_model_len`` 1088) and a KV pool of 28 blocks of 32 tokens
of the three layers, where vLLM wants 34 for one request's whole context.

With the key and chunked prefill (96 tokens a step) the draft's group holds only what the
window reads, and vLLM admits and serves the request, its tokens those of a roomy engine
without speculation. Without the key vLLM refuses at start-up (its check that one request of
``max_model_len`` fits the pool). With the key but the whole prompt in one step (chunked
prefill off) vLLM refuses as well: it sizes a sliding-window group for the tokens of a whole
step (W - 1 + ``max_num_batched_tokens``, at most ``max_model_len``), so the key frees
nothing there."""

from __future__ import annotations

import pytest

import trained_models as trained
from testbed.engine.load_plan import FREE_KV, WINDOW, long_requests, speculative
from testbed.engine.runs import LOAD, engine_script

POOL = {"max_num_seqs": 1, "kv_cache_memory_bytes": 28 * 32 * 3 * 1024}
NO_PREFIX_CACHE = {"enable_prefix_caching": False}
CHUNKED = {**POOL, **NO_PREFIX_CACHE, "max_num_batched_tokens": 96, "enable_chunked_prefill": True}
WHOLE_PROMPT = {
    **POOL,
    **NO_PREFIX_CACHE,
    "max_num_batched_tokens": trained.TARGET_CONTEXT,
    "enable_chunked_prefill": False,
}
ROOMY = {"max_num_seqs": 1, "kv_cache_memory_bytes": 64 * 1024 * 1024, **NO_PREFIX_CACHE}
REFUSAL = "To serve at least one request with the model's max seq len (1088)"
RUNS = {
    "no speculation, roomy": (None, {}, ROOMY),
    "key, chunked prefill": ("dflash", FREE_KV, CHUNKED),
    "no key, chunked prefill": ("dflash", WINDOW, CHUNKED),
    "key, whole prompt": ("dflash", FREE_KV, WHOLE_PROMPT),
}


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """Each run's results, or the error its engine's start-up raised (the runs one engine
    after another in one process, a refused one released before the next)."""
    models = trained.committed()
    plan = {
        "target": models.target,
        "max_model_len": trained.TARGET_CONTEXT,
        "block_size": 32,
        "requests": {"1024 tokens": long_requests(models)[0]},
        "abort": None,
        "abort_after": 1,
        "max_tokens": 48,
        "keep_going": True,
        "runs": [
            {
                "name": name,
                "speculative_config": method and speculative(method, models.dflash),
                "additional_config": window,
                "engine": engine,
            }
            for name, (method, window, engine) in RUNS.items()
        ],
    }
    results = engine_script(LOAD, plan, tmp_path_factory.mktemp("admission")).results
    return {name: result.get("error", result) for name, result in results.items()}


def test_with_the_key_the_long_prompt_is_admitted_and_served(engines):
    served = engines["key, chunked prefill"]
    assert isinstance(served, dict), served
    assert served["tokens"] == engines["no speculation, roomy"]["tokens"]
    assert len(served["tokens"]["1024 tokens"]) == 48
    *target, draft = served["most_held"]
    assert min(target) >= -(-(1024 + 48) // 32) > 28 > draft


@pytest.mark.parametrize("run", ["no key, chunked prefill", "key, whole prompt"])
def test_without_what_the_key_frees_vllm_refuses_at_start_up(engines, run):
    refused = engines[run]
    assert isinstance(refused, str), f"{run} was served: {refused}"
    assert REFUSAL in refused and "estimated maximum model length is" in refused
