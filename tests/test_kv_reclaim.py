# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""``draft_window_free_kv`` against vLLM's own KV-cache planning and KV cache manager, on
each served line: the specs the draft's layers get, the groups vLLM forms from them (and the
shapes refused, where they would not pay), the blocks a request holds at long context, that
the window never reads a block vLLM freed, and prefix-cache hits."""

from __future__ import annotations

import pytest
import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

from tests.testbed import kv_manager
from tests.testbed.kv_manager import Shape
from tests.testbed.speculators import make_vllm_config, tiny_model_dir
from vllm_ascend.worker.v2.spec_decode.draft_window import kv_cache
from vllm_ascend.worker.v2.spec_decode.draft_window.config import DraftWindowConfig
from vllm_ascend.worker.v2.spec_decode.draft_window.window import WindowSpec, window_seq_lens

# The CPU engine's trained models: a target and a draft model of 2 layers each, 4 KV heads
# of 32, float32, blocks of 32; W = 33.
TOY = Shape("2 + 2", 2, 2, block_size=32, kv_heads=4, head_size=32, dtype=torch.float32)
W = 33


@pytest.fixture(scope="module")
def vllm_config(tmp_path_factory):
    model_dir = tiny_model_dir(tmp_path_factory.mktemp("kv"), max_position_embeddings=1 << 18)
    return make_vllm_config(model_dir, 131072, 4, {})


def free(vllm_config, shape: Shape, window: int = W):
    config = DraftWindowConfig.from_additional_config(
        {"draft_window_size": window, "draft_window_free_kv": True}
    )
    tokens = kv_cache.retained_tokens(config, shape.block_size)
    return kv_cache.free_draft_kv(vllm_config, shape.specs(), shape.draft_names, tokens)


def test_only_the_drafts_full_attention_layers_get_the_sliding_window(vllm_config):
    specs = TOY.specs()
    converted, reclaim = free(vllm_config, TOY)
    for name, spec in converted.items():
        if name in TOY.draft_names:
            # N = W + a - 1: the window's reads at the most (kv_cache.py).
            assert type(spec) is SlidingWindowSpec and spec.sliding_window == W + 32 - 1
            assert spec.is_draft and spec.block_size == 32 and spec.num_kv_heads == 4
        else:
            assert spec == specs[name] and type(spec) is FullAttentionSpec
    groups = kv_manager.groups(vllm_config, converted)
    layers = [sorted(g.layer_names) for g in groups]
    assert layers == [sorted(set(specs) - TOY.draft_names), sorted(TOY.draft_names)]
    assert (reclaim.groups, reclaim.draft_layers, reclaim.draft_share) == (2, 2, 0.5)
    assert reclaim.blocks == 3  # ceil(63 / 32) + 1


@pytest.mark.parametrize(
    ("shape", "refused"),
    [
        # Qwen3-8B-like targets (36 layers) and a Qwen3-32B-like one (64), bf16, blocks of 16.
        (Shape("EAGLE3", 36, 1), "hold 2.7% of each token's KV"),
        (Shape("DSpark", 36, 3), None),
        (Shape("DFlash", 36, 5), "in 9 KV-cache groups of equal size with 4 padding layers"),
        (Shape("draft model", 64, 28), "in 4 KV-cache groups of equal size with 20 padding"),
        # The CPU engine's: a draft model, and an EAGLE3 head (1 layer) on a 2-layer target.
        (TOY, None),
        (Shape("toy EAGLE3", 2, 1, 32, 4, 32, torch.float32), None),
    ],
    ids=lambda value: getattr(value, "name", None),
)
def test_it_is_served_where_vllms_grouping_pays_and_refused_by_name_elsewhere(
    vllm_config, shape, refused
):
    if refused is None:
        converted, reclaim = free(vllm_config, shape, 2048 if shape.block_size == 16 else W)
        groups = kv_manager.groups(vllm_config, converted)
        assert len(groups) == reclaim.groups
        # No padding: every group as large as the largest.
        assert len({len(g.layer_names) for g in groups}) == 1
    else:
        with pytest.raises(ValueError, match="draft_window_free_kv=true does not pay here") as info:
            free(vllm_config, shape, 2048)
        assert refused in str(info.value) and "Remove draft_window_free_kv" in str(info.value)


def run_request(vllm_config, specs, context, chunk, steps, k=3, accepted=2):
    """One request through vLLM's KV cache manager: prefilled in chunks, then decoded."""
    config = kv_manager.kv_cache_config(vllm_config, specs, 1 << 30)
    kv = kv_manager.manager(vllm_config, config, 131072)
    req = kv_manager.request("r", list(range(1, context + 1)), 32)
    assert kv_manager.prefill(kv, req, chunk, k)
    assert kv_manager.decode(kv, req, steps, k, accepted)
    return kv, req


def test_at_long_context_the_draft_holds_the_window_and_the_target_the_whole_context(
    vllm_config,
):
    converted, reclaim = free(vllm_config, TOY)
    kv, req = run_request(vllm_config, converted, 4096, 512, 8)
    target, draft = kv_manager.held(kv, "r")
    assert target == -(-(req.num_tokens + 3) // 32)
    assert draft <= reclaim.blocks + 1  # and the step's lookahead
    kv, req = run_request(vllm_config, TOY.specs(), 4096, 512, 8)
    (whole,) = kv_manager.held(kv, "r")
    assert whole == target  # without the key one group, every block held


def freed_reads(vllm_config, specs, window: int, q_of_step) -> list[str]:
    """Drives a request to 1024 tokens (prefill chunks of 96, then decode steps of 1 + 3)
    and, at each step, takes the draft's reads from the window's arithmetic (its lengths
    for the step's query of ``q`` tokens) against the draft group's table vLLM's manager
    left: every column read that vLLM freed."""
    config = kv_manager.kv_cache_config(vllm_config, specs, 1 << 30)
    kv = kv_manager.manager(vllm_config, config, 131072)
    req = kv_manager.request("r", list(range(1, 1025)), 32)
    spec = WindowSpec(window, 32)
    found = []
    steps = [(96, None)] * 10 + [(64, None)] + [(4, 2)] * 40
    for q, accepted in steps:
        if accepted is not None:
            for _ in range(accepted + 1):
                req.append_output_token_ids(5)
            q = req.num_tokens - req.num_computed_tokens
        assert kv.allocate_slots(req, q, num_lookahead_tokens=3) is not None
        first = req.num_computed_tokens
        length = torch.tensor([first + q_of_step(q)], dtype=torch.int32)
        read = torch.empty_like(length)
        query = torch.tensor([q_of_step(q)], dtype=torch.int32)
        window_seq_lens(length, spec, skip_out=torch.empty_like(length), out=read, query_lens=query)
        start, end = int(length) - int(read), int(length)
        table = kv_manager.block_ids(kv, "r")[-1]
        found += [
            f"position {p} at a step from {first}"
            for p in range(start, end)
            if p // 32 < len(table) and table[p // 32] is None
        ]
        req.num_computed_tokens += q
    return found


@pytest.mark.parametrize("window", [33, 100, 257])
@pytest.mark.parametrize("stretch", [0, 3], ids=["one token a step", "K + 1 tokens a step"])
def test_the_window_never_reads_a_block_vllm_freed(vllm_config, window, stretch):
    """A query of the step's tokens (an EAGLE or draft-model prefill over the target's
    chunk, then one token a step), or of them and K more (DFlash/DSpark's query stretch)."""
    converted, _ = free(vllm_config, TOY, window)
    assert freed_reads(vllm_config, converted, window, lambda q: q + stretch) == []


def test_a_sliding_window_shorter_than_the_reads_would_read_freed_blocks(vllm_config):
    """The check above can fail: a draft keeping W - 32 tokens (less than N = W + a - 1)."""
    converted, _ = free(vllm_config, TOY, 100)
    short = {
        name: SlidingWindowSpec(**{**kv_manager.spec_fields(spec), "sliding_window": 100 - 32})
        if name in TOY.draft_names
        else spec
        for name, spec in converted.items()
    }
    assert freed_reads(vllm_config, short, 100, lambda q: q)


def test_a_prefix_hit_never_hands_the_window_a_freed_block(vllm_config):
    """vLLM's prefix cache with the draft's sliding window. A request sent again hits its
    prompt but its last block, with the key as without it. The first request that shares
    only the first 512 tokens of an earlier one hits nothing with the key (vLLM keeps a
    sliding-window group's blocks cached near each prompt's end only, by default), so the
    target recomputes the prefix too; its prefill stops at the shared prefix's end, which
    vLLM then caches, and the next such request hits all 512 (the trade-off the start-up
    line and the README state). Every draft block the window reads after a hit is held."""
    converted, _ = free(vllm_config, TOY)
    hits = {}
    prompts = {
        "again": list(range(1, 1001)),
        "first sibling": [*range(1, 513), *[9] * 488],
        "second sibling": [*range(1, 513), *[8] * 488],
    }
    for name, specs in (("whole", TOY.specs()), ("freed", converted)):
        config = kv_manager.kv_cache_config(vllm_config, specs, 1 << 30)
        kv = kv_manager.manager(vllm_config, config, 131072)
        first = kv_manager.request("a", list(range(1, 1001)), 32)
        assert kv_manager.prefill(kv, first, 96, 3)
        kv.free(first)
        for rid, prompt in prompts.items():
            req = kv_manager.request(rid, prompt, 32)
            blocks, tokens, _ = kv.get_computed_blocks(req)
            hits[name, rid] = tokens
            if name == "freed" and tokens:
                draft = [None if b.is_null else b.block_id for b in blocks.blocks[-1]]
                start = tokens - (W + 32 - 1)
                assert all(draft[p // 32] is not None for p in range(max(0, start), tokens))
            assert kv_manager.prefill(kv, req, 96, 3)
            kv.free(req)
    assert hits["whole", "again"] == hits["freed", "again"] == 992
    assert hits["whole", "first sibling"] == hits["whole", "second sibling"] == 512
    assert (hits["freed", "first sibling"], hits["freed", "second sibling"]) == (0, 512)
