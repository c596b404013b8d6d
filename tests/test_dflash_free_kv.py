# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""``draft_window_free_kv`` with a trained DFlash drafter, the shape where vLLM's grouping
pays: a one-layer draft (``trained_models/dflash``) beside the two-layer target, which vLLM
groups without padding (three groups of one layer with the key, one of three without). In a
real vLLM engine on CPU driven as a server drives it (``testbed/engine/load.py``): four
requests of 1024 tokens (16 times the drafter's training context), 48 tokens each, greedy,
chunked prefill of 96 tokens a step, in KV bytes that hold one of them with the draft's
whole KV. With the key the draft's group holds only what the window reads, so vLLM runs
two at once; the tokens and the drafts' acceptance are the window's without the key."""

from __future__ import annotations

import re

import pytest

import trained_models as trained
from testbed.engine.load_plan import ADMISSION, FREE_KV, WINDOW, long_requests, speculative
from testbed.engine.offline import mean_length
from testbed.engine.runs import LOAD, engine_script

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
    return engine_script(LOAD, plan, tmp_path_factory.mktemp("dflash-free-kv"))


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


def vllm_holds(group: dict, lookahead: int, chunk: int, k: int, max_model_len: int) -> dict:
    """The most blocks vLLM's own KV cache manager holds for one request in a sliding-window
    group of ``group``'s spec, driven as its scheduler drives it: prompts whose chunks of
    ``chunk`` tokens start at every residue of the block size (after a first chunk of that
    many tokens), then decode steps of 1 + ``k`` tokens keeping 0..``k`` drafts in turn (their
    first positions take every residue too), every allocation asking ``lookahead`` slots."""
    import torch
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import init_none_hash
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

    from testbed import kv_manager

    block = group["block_size"]
    spec = SlidingWindowSpec(
        block_size=block,
        num_kv_heads=1,
        head_size=32,
        dtype=torch.float32,
        sliding_window=group["sliding_window"],
        extra_retained_tokens=group["extra_retained_tokens"],
    )
    config = KVCacheConfig(1024, [], [KVCacheGroupSpec(["draft"], spec)])
    init_none_hash(sha256)
    most = {"prefill": 0, "decode": 0}
    for offset in range(block):
        kv = KVCacheManager(
            config, max_model_len, scheduler_block_size=block, hash_block_size=block
        )
        prompt = offset + 2 * chunk
        req = kv_manager.request(f"r{offset}", list(range(1, prompt + 1)), block)
        for new in [offset] * bool(offset) + [chunk] * 2:
            assert kv.allocate_slots(req, new, num_lookahead_tokens=lookahead) is not None
            req.num_computed_tokens += new
            if new == chunk:
                most["prefill"] = max(most["prefill"], *kv_manager.held(kv, req.request_id))
        req.append_output_token_ids(7)
        for step in range(2 * block):
            if req.num_tokens + 1 + k + lookahead > max_model_len:
                break
            assert kv.allocate_slots(req, 1 + k, num_lookahead_tokens=lookahead) is not None
            most["decode"] = max(most["decode"], *kv_manager.held(kv, req.request_id))
            kept = step % (k + 1)
            req.num_computed_tokens += kept + 1
            req.append_output_token_ids([7] * (kept + 1))
    return most


def test_the_drafts_group_holds_what_the_start_up_line_says(admitted):
    """The start-up line's blocks per request are the most vLLM's own KV cache manager holds
    in the draft's group (the engine's spec of it) at its worst step, in steady decode and in
    a prefill chunk; in the engine itself the draft's group (the third) never held more, and
    in steady decode no less than the window's own blocks; the target's two the whole
    context, as the one group without the key."""
    log = admitted.logs["window, KV freed"]
    said = re.search(
        r"draft_window_free_kv: the draft's 1 layer\(s\) \(33\.3% of each token's KV\) keep a "
        r"sliding window of 33 tokens per request instead of the whole context, in blocks of "
        r"32: at most (\d+) blocks per request in steady decode \(1 \+ 3 tokens a step, (\d+) "
        r"lookahead\), (\d+) during a prefill chunk of 96 tokens; vLLM frees the rest "
        r"\(KV-cache groups: 3, 1 without the key\)\.",
        log,
    )
    assert said, log
    steady, lookahead, prefill = map(int, said.groups())
    found = admitted.results["window, KV freed"]
    assert lookahead == found["lookahead"], (lookahead, found["lookahead"])
    *_, group = found["kv_groups"]
    assert group["sliding_window"] == WINDOW["draft_window_size"], group
    worst = vllm_holds(group, lookahead, 96, 3, trained.TARGET_CONTEXT)
    assert (steady, prefill) == (worst["decode"], worst["prefill"]), worst
    assert "draft_window_free_kv" not in admitted.logs["window"]
    *target, draft = found["most_held"]
    (whole,) = admitted.results["window"]["most_held"]
    assert draft <= prefill, (draft, prefill)
    assert min(*target, whole) >= -(-(1024 + 48) // 32)
    assert draft < whole // 4
    *_, decoding = found["decode_held"]
    assert found["decode_steps"] > 0
    assert -(-WINDOW["draft_window_size"] // 32) <= decoding <= steady, (decoding, steady)
