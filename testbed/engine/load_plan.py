# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The serving load of the CPU engine's load runs (``load.py``): the requests, the engine
settings that load it and the window's keys, shared by tests/test_engine_load.py and make
bench's admission runs (benchmarks/kv_reclaim.py)."""

from __future__ import annotations

import trained_models as trained

C = trained.DRAFT_CONTEXT
WINDOW = {"draft_window_size": C - 32 + 1}
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
FREE_KV = {**WINDOW, "draft_window_free_kv": True}
# Four requests of 1024 tokens, at most four at once, 96 tokens a step, in KV bytes that hold
# one of them with its draft's whole KV (52 blocks of 32 tokens of the 4 layers; one needs
# 33). With the draft's KV freed the pool holds 104 blocks of the target's 2 layers or the
# draft's, and vLLM admits a request for 33 of the target's and, for the draft's sliding
# window, its reads plus the tokens in flight (two steps of 96): two run at once.
ADMISSION = {
    "max_num_seqs": 4,
    "max_num_batched_tokens": 96,
    "enable_chunked_prefill": True,
    "kv_cache_memory_bytes": 52 * 32 * 4096,
}
# Room for everything, and no prefix cache: the key then changes no step's batch (its
# sliding-window group caches fewer prefix blocks, which would change which prefills run).
ROOMY_UNCACHED = {**ROOMY, "enable_prefix_caching": False}


def requests(models: trained.TrainedModels) -> dict[str, list[int]]:
    """Stretches of the held-out text, spread over it, by name."""
    step = models.heldout_tokens // (len(LENGTHS) + 5)
    own = [(f"{n} tokens", models.prompt(k * step, n)) for k, n in enumerate(LENGTHS)]
    prefix = models.prompt(len(LENGTHS) * step, SHARED)
    shared = [
        (f"shared prefix {k}", prefix + models.prompt((len(LENGTHS) + 1 + k) * step, SUFFIX))
        for k in range(4)
    ]
    order = [*own[:3], shared[0], own[3], *shared[1:3], *own[4:], shared[3]]
    # Two requests share a length: the second gets a name of its own.
    return {
        (f"{name} (2)" if name in dict(order[:i]) else name): p for i, (name, p) in enumerate(order)
    }


def long_requests(models: trained.TrainedModels) -> list[list[int]]:
    """Four stretches of 1024 tokens of the held-out text, from its second half."""
    return [models.prompt(models.heldout_tokens // 2 + k * 4096, 1024) for k in range(4)]


def speculative(method: str, model: str) -> dict:
    return {"method": method, "model": model, "num_speculative_tokens": trained.NUM_SPEC}
