# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""``draft_window_free_kv`` against vLLM's own KV-cache planning and KV cache manager, on
each served line: the specs the draft's layers get, the groups vLLM forms from them (and the
shapes refused, where they would not pay or cannot be served), the blocks a request holds,
that the window never reads a block vLLM freed or nulled, and prefix-cache hits; and that
without the key vLLM's runner gets its own specs back."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

from testbed import kv_manager
from testbed.kv_manager import Shape
from testbed.speculators import make_vllm_config, tiny_model_dir
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import (
    free_kv,
    install,
    kv_reclaim,
    plugin,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.window import WindowSpec, window_seq_lens

# The CPU engine's trained models: a target and a draft model of 2 layers each, 4 KV heads
# of 32, float32, blocks of 32; W = 33.
TOY = Shape("2 + 2", 2, 2, block_size=32, kv_heads=4, head_size=32, dtype=torch.float32)
W = 33
K = 3
# The same with a draft of half the KV heads: its page is half the target's, so vLLM's
# grouping doubles its block size (32 -> 64) to unify the page sizes.
SMALL_PAGE = dataclasses.replace(TOY, name="smaller draft page", draft_kv_heads=2)
# The same with two target layers that have a sliding window of their own (256 tokens).
NATIVE_SLIDING = dataclasses.replace(
    TOY, name="target sliding layers", target_sliding_layers=2, target_sliding_window=256
)


@pytest.fixture(scope="module")
def vllm_config(tmp_path_factory):
    model_dir = tiny_model_dir(tmp_path_factory.mktemp("kv"), max_position_embeddings=1 << 18)
    return make_vllm_config(model_dir, 131072, 4, {})


def free(vllm_config, shape: Shape, window: int = W, refuse: bool = True):
    return free_kv.free_draft_kv(
        vllm_config, shape.specs(), shape.draft_names, window, refuse=refuse
    )


def test_only_the_drafts_full_attention_layers_get_the_sliding_window(vllm_config):
    specs = TOY.specs()
    converted, reclaim = free(vllm_config, TOY)
    for name, spec in converted.items():
        if name in TOY.draft_names:
            # N = W + a - b, with a = b = 32: W.
            assert type(spec) is SlidingWindowSpec and spec.sliding_window == W
            assert spec.is_draft and spec.block_size == 32 and spec.num_kv_heads == 4
        else:
            assert spec == specs[name] and type(spec) is FullAttentionSpec
    groups = kv_manager.groups(vllm_config, converted)
    layers = [sorted(g.layer_names) for g in groups]
    assert layers == [sorted(set(specs) - TOY.draft_names), sorted(TOY.draft_names)]
    assert (reclaim.groups, reclaim.groups_without, reclaim.draft_share) == (2, 1, 0.5)
    assert reclaim.freed == kv_reclaim.Freed(W, frozenset(TOY.draft_names))


@pytest.mark.parametrize(
    ("shape", "refused"),
    [
        # Qwen3-8B-like targets (36 layers) and a Qwen3-32B-like one (64), bf16, blocks of 16.
        (Shape("EAGLE3", 36, 1), "does not pay here: the draft's 1 layer(s) hold 2.7% of"),
        (Shape("DSpark", 36, 3), None),
        (
            Shape("DFlash", 36, 5),
            "adds padding here: vLLM groups the 5 draft layers apart from the target's in 9 "
            "KV-cache groups of equal size with 4 padding layers, against 0 padding layers in "
            "the 1 group(s) it forms without the key, for a draft that holds 12.2% of each "
            "token's KV",
        ),
        (
            Shape("draft model", 64, 28),
            "adds padding here: vLLM groups the 28 draft layers apart from the target's in 4 "
            "KV-cache groups of equal size with 20 padding layers, against 0 padding layers in "
            "the 1 group(s) it forms without the key, for a draft that holds 30.4% of each "
            "token's KV",
        ),
        # The CPU engine's: a draft model, and an EAGLE3 head (1 layer) on a 2-layer target.
        (TOY, None),
        (Shape("toy EAGLE3", 2, 1, 32, 4, 32, torch.float32), None),
    ],
    ids=lambda value: getattr(value, "name", None),
)
def test_it_is_served_where_vllms_grouping_pays_and_refused_by_name_elsewhere(
    vllm_config, shape, refused
):
    window = 2048 if shape.block_size == 16 else W
    if refused is None:
        converted, reclaim = free(vllm_config, shape, window)
        groups = kv_manager.groups(vllm_config, converted)
        assert len(groups) == reclaim.groups
        # No padding: every group as large as the largest.
        assert len({len(g.layer_names) for g in groups}) == 1
        # The extra groups' tables cost far less than the draft KV freed per request.
        assert 0 < reclaim.table_bytes < reclaim.kv_bytes_freed
    else:
        with pytest.raises(ValueError) as info:
            free(vllm_config, shape, window)
        message = str(info.value)
        assert message.startswith(f"draft_window_free_kv=true {refused}"), message
        assert "Remove draft_window_free_kv" in message


def test_a_target_vllm_pads_anyway_is_served_where_the_key_adds_no_padding(vllm_config):
    """A target of 52 sliding-window and 10 full-attention layers (a Gemma-like 5:1 mix)
    with a 10-layer draft: vLLM's own grouping pads 8 layers with the key and 8 without it
    (groups of 10 against groups of 20), the draft holds 10 / 72 of each token's KV: the
    key adds no padding and is served."""
    shape = Shape("52 sliding + 10 full, 10-layer draft", 10, 10, target_sliding_layers=52)
    converted, reclaim = free(vllm_config, shape, 2048)
    with_key = sorted(len(g.layer_names) for g in kv_manager.groups(vllm_config, converted))
    without = sorted(len(g.layer_names) for g in kv_manager.groups(vllm_config, shape.specs()))
    assert with_key == [8, 8, 9, 9, 9, 9, 10, 10] and without == [17, 17, 18, 20]
    assert 8 * 10 - 72 == 8 == reclaim.padding_layers
    assert 4 * 20 - 72 == 8 == reclaim.padding_layers_without
    assert (reclaim.groups, reclaim.groups_without) == (8, 4)
    assert f"{reclaim.draft_share:.1%}" == "13.9%" and reclaim.refusal() is None


def test_a_window_that_keeps_max_model_len_frees_nothing_and_gives_its_figures(
    vllm_config, window_log
):
    """``N = W + a - b`` not below ``max_model_len``: nothing to free, said with the figures."""
    assert free(vllm_config, TOY, 131072) is None
    assert window_log == [
        (
            "info",
            "draft_window_free_kv: with draft_window_size=131072 the draft's KV-cache groups "
            "would keep N = W + a - b = 131072 + 32 - 32 = 131072 tokens per request, not below "
            "max_model_len=131072, so draft_window_free_kv frees nothing: the draft's KV stays "
            "whole.",
        )
    ]


def test_the_extra_groups_cost_what_vllms_block_tables_allocate(vllm_config):
    """``Reclaim.table_bytes`` against vLLM's own ``BlockTables`` (MRV2): the device bytes
    of a DSpark shape's 13 groups less those of the one group it has without the key."""
    from vllm.v1.worker.gpu.block_table import BlockTables

    from testbed.vllm_line import get_block_table_width

    shape = Shape("DSpark", 36, 3)
    scheduler = vllm_config.scheduler_config
    width = get_block_table_width(-(-vllm_config.model_config.max_model_len // 16), 16)

    def device_bytes(groups: int) -> int:
        tables = BlockTables(
            block_sizes=[16] * groups,
            max_num_reqs=scheduler.max_num_seqs,
            max_num_batched_tokens=scheduler.max_num_batched_tokens,
            max_num_blocks_per_group=[width] * groups,
            device=torch.device("cpu"),
        )
        found = [t.gpu for t in tables.block_tables] + list(tables.input_block_tables)
        found.append(tables.slot_mappings)
        return sum(t.numel() * t.element_size() for t in found)

    _, reclaim = free_kv.free_draft_kv(
        vllm_config, shape.specs(), shape.draft_names, 2048, table_width=get_block_table_width
    )
    assert (reclaim.groups, reclaim.groups_without) == (13, 1)
    assert reclaim.table_bytes == device_bytes(13) - device_bytes(1)


def test_a_draft_with_a_smaller_page_keeps_the_window_in_the_block_size_vllm_gives_it(
    vllm_config,
):
    """vLLM doubles the block size of a draft whose page is half the target's; N is counted
    in the grouped blocks (W + 64 - 64), not refused at set_attn as a bound in the
    layer's 32-token blocks would be (W + 32 - 1 < W + 64 - 1)."""
    converted, reclaim = free(vllm_config, SMALL_PAGE, 512)
    (draft,) = [g for g in kv_manager.groups(vllm_config, converted) if g.kv_cache_spec.is_draft]
    assert draft.kv_cache_spec.block_size == 64 == reclaim.block_size
    assert draft.kv_cache_spec.sliding_window == 512


def test_an_mla_target_with_a_gqa_draft_is_refused_by_name_and_serves_without_the_key(
    vllm_config,
):
    """vLLM cannot unify an MLA target's pages with a GQA draft's; with the key it turns the
    draft's sliding window back into full attention in one group (nothing freed): refused
    by name. Without it vLLM groups them as it always does."""
    shape = Shape("MLA target", 4, 1, mla_head_size=576)
    assert len(kv_manager.groups(vllm_config, shape.specs())) == 1
    with pytest.raises(ValueError, match="vLLM cannot unify the KV cache page sizes") as info:
        free(vllm_config, shape, 2048)
    assert "Remove draft_window_free_kv" in str(info.value)


def test_a_draft_without_kv_of_its_own_is_refused_by_name():
    """A Gemma4-style MTP draft reads the target's KV: vLLM gives its layers no spec. The
    runner is a stand-in of what the hook reads: its config's keys and the speculator's
    draft layer names."""
    additional = {"draft_window_size": W, "draft_window_free_kv": True}
    speculator = SimpleNamespace(draft_attn_layer_names={"draft_model.layers.0.self_attn.attn"})
    shared = SimpleNamespace(
        vllm_config=SimpleNamespace(additional_config=additional), speculator=speculator
    )
    assert free_kv.asks_free_kv(shared)
    with pytest.raises(ValueError, match="keep no KV cache of their own") as info:
        free_kv.draft_kv_cache_spec(shared, {"model.layers.0.self_attn.attn": None}, None)
    assert "Remove draft_window_free_kv" in str(info.value)


@pytest.mark.parametrize("draft_dcp_size", [1, 4])
def test_vllms_own_runner_without_a_config_gets_vllms_specs(monkeypatch, draft_dcp_size):
    """The shape of vLLM 0.33.0's own test
    ``tests/v1/worker/test_dspark_utils.py::test_runner_marks_only_replicated_draft_caches``:
    a runner with ``vllm_config = None`` and a DFlash speculator; with the plugin installed
    and no key, the hooked ``get_kv_cache_spec`` returns what vLLM's returns without it."""
    from vllm.v1.worker.gpu import model_runner
    from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator

    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.bfloat16)
    monkeypatch.setattr(
        model_runner, "get_kv_cache_spec", lambda _: {"target": spec, "draft": spec}
    )
    made = object.__new__(model_runner.GPUModelRunner)
    made.vllm_config = None
    made.dcp_size = 4
    made.speculator = object.__new__(DFlashSpeculator)
    made.speculator.dcp_size = draft_dcp_size
    made.speculator.draft_attn_layer_names = {"draft"}
    without = made.get_kv_cache_spec()
    plugin.register()
    try:
        assert install.status().installed
        assert model_runner.GPUModelRunner.get_kv_cache_spec.__wrapped__
        assert made.get_kv_cache_spec() == without
    finally:
        plugin.unregister()


def test_at_long_context_the_draft_holds_the_window_and_the_target_the_whole_context(
    vllm_config,
):
    converted, _ = free(vllm_config, TOY)
    config = kv_manager.kv_cache_config(vllm_config, converted, 1 << 30)
    kv = kv_manager.manager(vllm_config, config, 131072)
    req = kv_manager.request("r", list(range(1, 4097)), 32)
    most = [0, 0]
    for _ in kv_manager.serve(
        kv, req, chunk=512, k=K, decode_steps=8, accepted=lambda i: 2, overlap=False
    ):
        most = [max(m, h) for m, h in zip(most, kv_manager.held(kv, "r"), strict=True)]
    target, draft = kv_manager.held(kv, "r")
    assert target > 4096 // 32
    # What the start-up line says the draft holds at most: here 3 blocks decoding, 19 while
    # prefilling chunks of 512.
    steady = kv_reclaim.held_blocks(W, 32, 1 + K, K, 0, 0)
    prefill = kv_reclaim.held_blocks(W, 32, 512, K, 0, 0)
    assert draft <= steady < prefill and most[1] <= prefill
    whole_config = kv_manager.kv_cache_config(vllm_config, TOY.specs(), 1 << 30)
    kv = kv_manager.manager(vllm_config, whole_config, 131072)
    req = kv_manager.request("r", list(range(1, 4097)), 32)
    for _ in kv_manager.serve(
        kv, req, chunk=512, k=K, decode_steps=8, accepted=lambda i: 2, overlap=False
    ):
        pass
    (whole,) = kv_manager.held(kv, "r")
    assert whole == target  # without the key one group, every block held


@pytest.mark.parametrize(
    ("scheduled", "by_hand"),
    [
        # Steady decode: N - 1 = 32 tokens kept before the step, 1 + K = 4 scheduled, K = 3
        # lookahead: 39 slots; from a block's last token, 1 + 32 + 6 of them: 3 blocks.
        (1 + K, 3),
        # A prefill chunk of 511 tokens (the second starts at 511, its kept tokens at 479,
        # a block's last): 32 + 511 + 3 = 546 slots, 1 + 17 * 32 + 1 of them: 19 blocks.
        (511, 19),
    ],
    ids=["steady decode", "prefill chunk of 511"],
)
def test_the_draft_holds_the_blocks_counted_by_hand_and_never_more(vllm_config, scheduled, by_hand):
    """``held_blocks`` (the start-up line's counts) against a count by hand from the block
    size (32), ``N`` (33) and the step, and against vLLM's own KV cache manager, which holds
    exactly that many at its worst step (the accepted drafts cycle through 0..K, so the
    decode steps' first positions take every residue of the block size)."""
    assert kv_reclaim.held_blocks(W, 32, scheduled, K, 0, 0) == by_hand
    converted, _ = free(vllm_config, TOY)
    config = kv_manager.kv_cache_config(vllm_config, converted, 1 << 30)
    kv = kv_manager.manager(vllm_config, config, 131072)
    req = kv_manager.request("r", list(range(1, 2045)), 32)
    group = draft_group(config)
    most = {"prefill": 0, "decode": 0}
    for running in kv_manager.serve(
        kv, req, chunk=511, k=K, decode_steps=64, accepted=lambda i: i % (K + 1), overlap=False
    ):
        (step,) = running
        kind = "prefill" if step.accepted is None else "decode"
        most[kind] = max(most[kind], kv_manager.held(kv, "r")[group])
    assert most["decode" if scheduled == 1 + K else "prefill"] == by_hand


def reads(step: kv_manager.Step, k: int) -> list[tuple[int, int]]:
    """What the draft reads in a step, as (L, q): the length its pass reads to and its
    query tokens. Always the tightest, a one-token query at the step's first position
    (EAGLE's draft prefill when no draft was accepted). A prefill chunk: the draft's
    prefill over the chunk. A decode step: the padded prefill over all 1 + K tokens, the
    prefill over the accepted ones and the bonus, the K - 1 one-token steps after it (EAGLE
    and draft models), and a query of K + 1 past the accepted (DFlash/DSpark)."""
    c = step.first
    found = [(c + 1, 1)]
    if step.accepted is None:
        return [*found, (c + step.scheduled, step.scheduled)]
    r = step.accepted
    found += [(c + 1 + k, 1 + k), (c + r + 1, r + 1), (c + r + 1 + k, k + 1)]
    return found + [(c + r + 1 + i, 1) for i in range(1, k)]


def draft_group(config) -> int:
    (found,) = [g for g, group in enumerate(config.kv_cache_groups) if group.kv_cache_spec.is_draft]
    return found


def freed_or_nulled(kv, config, request_id: str, spec: WindowSpec, steps, k: int) -> list[str]:
    """Every position a step's window reads (``window_seq_lens``) that vLLM's manager freed
    in the draft's group, or that MRV2's gathered table nulls for the step:
    ``BlockTables.gather_block_tables`` nulls a sliding-window group's columns wholly below
    its first position less the spec's ``num_retained_tokens``."""
    group = draft_group(config)
    draft = config.kv_cache_groups[group].kv_cache_spec
    block = draft.block_size
    table = kv_manager.block_ids(kv, request_id)[group]
    found = []
    for step in steps:
        nulled = max(step.first - draft.num_retained_tokens, 0) // block
        for length, query in reads(step, k):
            lengths = torch.tensor([length], dtype=torch.int32)
            read = torch.empty_like(lengths)
            window_seq_lens(
                lengths,
                spec,
                skip_out=torch.empty_like(lengths),
                out=read,
                query_lens=torch.tensor([query], dtype=torch.int32),
            )
            start = length - int(read)
            for column in range(start // block, -(-length // block)):
                if column < nulled or table[column] is None:
                    what = "nulled" if column < nulled else "freed"
                    found.append(f"block {column} {what} at L={length} from C={step.first}")
                    break
    return found


def drive(
    vllm_config,
    specs,
    window: int,
    *,
    overlap: bool,
    use_eagle: bool = False,
    extra: int = 0,
    shared_prefix: bool = False,
) -> list[str]:
    """A request through vLLM's manager as its scheduler drives it (``kv_manager.serve``):
    prefill chunks of 96, then 130 decode steps of 1 + K whose accepted drafts cycle through
    0..K (the first positions take every residue of the block size), every read checked
    (``freed_or_nulled``). With ``shared_prefix`` an earlier request shares its first 512
    tokens, and a third, sent after a second, takes the prefix-cache hit."""
    config = kv_manager.with_extra_retained(
        kv_manager.kv_cache_config(vllm_config, specs, 1 << 30), extra
    )
    kv = kv_manager.manager(vllm_config, config, 131072, use_eagle=use_eagle)
    spec = WindowSpec.derive(
        window, [config.kv_cache_groups[draft_group(config)].kv_cache_spec.block_size]
    )
    block = kv_manager.hash_block_size(vllm_config, config)
    hit = None
    prompt = list(range(1, 1025))
    if shared_prefix:
        for rid, tail in (("first", 9), ("second", 8)):
            earlier = kv_manager.request(rid, [*prompt[:512], *[tail] * 300], block, use_eagle)
            # Its prefill stops at the shared prefix's end, which vLLM then caches.
            assert kv_manager.prefill(kv, earlier, 96, K)
            kv.free(earlier)
    req = kv_manager.request("r", prompt, block, use_eagle)
    if shared_prefix:
        blocks, tokens, boundary = kv.get_computed_blocks(req)
        req.shared_prefix_boundary = boundary
        assert tokens >= 512 - 2 * block, tokens
        hit = (blocks, tokens)
    found = []
    for running in kv_manager.serve(
        kv,
        req,
        chunk=96,
        k=K,
        decode_steps=130,
        accepted=lambda i: i % (K + 1),
        overlap=overlap,
        hit=hit,
    ):
        found += freed_or_nulled(kv, config, "r", spec, running, K)
    return found


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async scheduling"])
@pytest.mark.parametrize("window", [33, 100, 257])
@pytest.mark.parametrize("shape", [TOY, SMALL_PAGE, NATIVE_SLIDING], ids=lambda s: s.name)
def test_the_window_never_reads_a_block_vllm_freed_or_nulled(vllm_config, shape, window, overlap):
    converted, _ = free(vllm_config, shape, window, refuse=False)
    assert drive(vllm_config, converted, window, overlap=overlap) == []


@pytest.mark.parametrize("extra", [0, 2])
@pytest.mark.parametrize("use_eagle", [False, True], ids=["", "EAGLE's prefix path"])
def test_a_prefix_hit_and_retained_tokens_never_hand_the_window_a_freed_block(
    vllm_config, use_eagle, extra
):
    converted, _ = free(vllm_config, TOY, 100)
    found = drive(
        vllm_config,
        converted,
        100,
        overlap=True,
        use_eagle=use_eagle,
        extra=extra,
        shared_prefix=True,
    )
    assert found == []


def shorter(specs: dict, draft_names: set[str], tokens: int) -> dict:
    """``specs`` with the draft's sliding window ``tokens`` long."""
    return {
        name: dataclasses.replace(spec, sliding_window=tokens) if name in draft_names else spec
        for name, spec in specs.items()
    }


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async scheduling"])
@pytest.mark.parametrize("short", [32, 1], ids=["one block short", "one token short"])
@pytest.mark.parametrize("shape", [TOY, SMALL_PAGE], ids=lambda s: s.name)
def test_a_bound_shorter_than_n_is_caught_reading_freed_blocks(vllm_config, shape, short, overlap):
    """The checks above can fail, and would for a bound one block (``N - b``) or one token
    (``W + a - b - 1``) short of the ``N`` served: at the tightest read, ``L = C + 1``."""
    converted, reclaim = free(vllm_config, shape, 100, refuse=False)
    tokens = reclaim.freed.tokens - (reclaim.block_size if short == 32 else 1)
    found = drive(vllm_config, shorter(converted, shape.draft_names, tokens), 100, overlap=overlap)
    assert found, "a short bound went unnoticed"


def test_prefix_hits_with_the_key_and_without(vllm_config):
    """vLLM's prefix cache with the draft's sliding window. A request sent again hits its
    prompt but its last block, with the key as without it. The first request that shares
    only the first 512 tokens of an earlier one hits nothing with the key (vLLM keeps a
    sliding-window group's blocks cached near each prompt's end only, by default), so the
    target recomputes the prefix too; its prefill stops at the shared prefix's end, which
    vLLM then caches, and the next such request hits all 512 (the trade-off the start-up
    line and the README state)."""
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
            _, tokens, _ = kv.get_computed_blocks(req)
            hits[name, rid] = tokens
            assert kv_manager.prefill(kv, req, 96, 3)
            kv.free(req)
    assert hits["whole", "again"] == hits["freed", "again"] == 992
    assert hits["whole", "first sibling"] == hits["whole", "second sibling"] == 512
    assert (hits["freed", "first sibling"], hits["freed", "second sibling"]) == (0, 512)


@pytest.mark.parametrize(
    "declares", [64, None, 8], ids=["declares 64", "declares none", "declares 8"]
)
def test_auto_keeps_the_declared_context_less_a_block_or_frees_nothing_and_says_so(
    model_dir, tmp_path, window_log, declares
):
    """With ``"auto"`` the window is ``C - a + 1``, so the draft keeps ``N = C - b + 1``:
    at most the context its checkpoint declares. A checkpoint that declares none leaves the
    window off, and one that declares less than a block sizes no window (``W < 1``): the key
    frees nothing, in one line that says which. (The runner is a stand-in of what the hook
    reads: a real vLLM config over a DSpark checkpoint, and the draft's layer names.)"""
    from testbed.configs import speculative_vllm_config
    from testbed.tiny_models import write_draft_dir

    draft = write_draft_dir(tmp_path / "dspark", "dspark", declares)
    additional = {"draft_window_size": "auto", "draft_window_free_kv": True}
    config = speculative_vllm_config(model_dir, 1024, 3, "dspark", additional, draft=draft)
    shape = dataclasses.replace(TOY, block_size=16)
    speculator = SimpleNamespace(draft_attn_layer_names=shape.draft_names)
    made = SimpleNamespace(vllm_config=config, speculator=speculator)
    specs, freed = free_kv.draft_kv_cache_spec(made, shape.specs(), None)
    if declares is None:
        assert specs == shape.specs() and freed is None
        (said,) = [message for _, message in window_log]
        assert said.startswith(
            "draft_window_free_kv: draft_window_size=auto and the draft checkpoint "
        ) and said.endswith(
            "so the draft window stays off and draft_window_free_kv frees "
            "nothing: the draft's KV stays whole."
        )
        return
    if declares == 8:
        assert specs == shape.specs() and freed is None
        assert window_log == [
            (
                "info",
                "draft_window_free_kv: draft_window_size=auto sizes no window over the draft's "
                f"KV-cache groups: the draft checkpoint {draft} declares "
                "max_position_embeddings=8, so W = 8 - 16 + 1 = -7 (alignment 16) is below 1 "
                "token, and draft_window_free_kv frees nothing: the draft's KV stays whole.",
            )
        ]
        return
    draft_specs = {specs[name] for name in shape.draft_names}
    assert {s.sliding_window for s in draft_specs} == {64 - 16 + 1}
    assert freed.tokens == 49


def test_a_target_sliding_window_of_n_tokens_keeps_the_drafts_groups_apart(vllm_config, window_log):
    """A target whose own sliding window is exactly the ``N`` the key would give the draft
    (W + a - b = 33): vLLM groups layers of equal specs together (``is_draft`` is not part of
    the equality), so at 33 tokens it puts the draft's layers in the target's sliding-window
    groups; the key keeps one token more, the draft's groups its own, and the window's reads
    covered."""
    shape = dataclasses.replace(
        TOY, name="target sliding window of N", target_sliding_layers=2, target_sliding_window=W
    )
    specs = shape.specs()
    sliding = {n for n, s in specs.items() if type(s) is SlidingWindowSpec}
    # What vLLM's own grouping does with the draft at N = 33: mixed with the target's.
    at_n = free_kv.sliding_draft_specs(specs, shape.draft_names, W)
    assert any(
        set(g.layer_names) & shape.draft_names and set(g.layer_names) & sliding
        for g in kv_manager.groups(vllm_config, at_n)
    )
    converted, found = free(vllm_config, shape)
    assert found.freed.tokens == W + 1
    assert {converted[n].sliding_window for n in shape.draft_names} == {W + 1}
    for group in kv_manager.groups(vllm_config, converted):
        names = set(group.layer_names)
        assert names <= shape.draft_names or not names & shape.draft_names
    assert WindowSpec.derive(W, [32]).retained_tokens(32) <= found.freed.tokens
    assert (
        "info",
        "draft_window_free_kv: the draft keeps 34 tokens per request, not 33: a layer outside "
        "the draft has a sliding window of 33 tokens and the same KV layout, and vLLM would "
        "group the two together.",
    ) in window_log


# ---- the key frees the draft's KV exactly where the window engages at set_attn ----


@pytest.mark.usefixtures("window_hooks")
@pytest.mark.parametrize(
    ("window", "declares"),
    [
        # startup.py's max_model_len 1024, blocks of 16: W + a = 1024 crops its longest
        # request, 1025 none (N = W stays below max_model_len in both).
        (1008, None),
        (1009, None),
        # "auto": a declared context below max_model_len windows (W = C - a + 1), one at it
        # leaves the window off (N = C - b + 1 would still be below max_model_len).
        ("auto", 1023),
        ("auto", 1024),
    ],
    ids=["W + a = max_model_len", "W + a above it", "auto below it", "auto at it"],
)
def test_the_key_frees_the_drafts_kv_exactly_where_the_window_engages(
    model_dir, tmp_path, monkeypatch, window, declares
):
    """Both decisions, the key's (the runner's KV-cache specs, before the KV cache exists) and
    the window's (a real speculator's set_attn), over the same config: where the window stays
    off the key frees nothing, so nothing is refused after the KV cache is allocated."""
    from vllm.config.compilation import CUDAGraphMode

    from testbed.tiny_models import write_draft_dir
    from tests.cpu_testbed.startup import started
    from vllm_ascend.worker.v2.spec_decode.draft_window.declared import declared_context

    method, draft = "eagle3", None
    if declares is not None:
        method, draft = "dspark", write_draft_dir(tmp_path / "dspark", "dspark", declares)
    additional = {"draft_window_size": window}
    st = started(model_dir, method, 3, CUDAGraphMode.NONE, additional, monkeypatch, draft=draft)
    shape = dataclasses.replace(TOY, block_size=16)
    config = st.s.vllm_config
    declared = declared_context(config) if window == "auto" else None
    freed = free_kv.free_draft_kv(
        config,
        shape.specs(),
        shape.draft_names,
        None if window == "auto" else window,
        declared,
    )
    assert (freed is not None) == (st.s.draft_window is not None)
    assert (st.s.draft_window is not None) == (window == 1008 or declares == 1023)
