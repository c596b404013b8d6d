# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The window serves only the draft's KV-cache groups it applies to: full attention, one
token per slot. Every other group gets exactly what vLLM gives it without the window, and
takes no part in the alignment or the sinks. Real vLLM spec classes, real speculators and
builders."""

from types import SimpleNamespace

import pytest
import torch
from vllm.config.compilation import CUDAGraphMode
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    EncoderOnlyAttentionSpec,
    FullAttentionSpec,
    HiddenStateCacheSpec,
    HiSparseHotSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    RSWASpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    SparseCacheRole,
    UniformTypeKVCacheSpecs,
)

from testbed.buffers import (
    fill_input_block_tables,
    fill_query_inputs,
    fill_slot_mappings,
)
from testbed.speculators import (
    HEAD_SIZE,
    NUM_KV_HEADS,
    GroupLayout,
    full_attention_spec,
)
from tests.cpu_testbed.dflash import (
    MAX_NUM_REQS,
    assert_reads_exactly_the_window,
    build,
    capture_on_cpu,
    compare_cams,
    make_batch,
    wire,
)
from vllm_ascend.worker.v2.spec_decode.draft_window import groups

pytestmark = pytest.mark.usefixtures("window_hooks")
KV = {"num_kv_heads": NUM_KV_HEADS, "head_size": HEAD_SIZE, "dtype": torch.float32}
MLA = {"num_kv_heads": 1, "head_size": 64, "dtype": torch.bfloat16}


def sliding_window(block_size, window=128):
    return SlidingWindowSpec(block_size=block_size, sliding_window=window, **KV)


def dsv4_dspark_swa(layer_name="draft.layer"):
    """The one KV-cache layer each DeepSeek-V4 DSpark draft layer has on vLLM 0.33
    (`DeepseekV4SWACache`: compress ratio 1, 64-token blocks), grouped per layer type."""
    layer = SlidingWindowMLASpec(
        block_size=64,
        sliding_window=128,
        model_version="deepseek_v4",
        num_kv_heads=1,
        head_size=512,
        dtype=torch.bfloat16,
    )
    return UniformTypeKVCacheSpecs(block_size=64, kv_cache_specs={layer_name: layer})


class NewAttentionSpec(FullAttentionSpec):
    """A full-attention subclass this project has never seen (as vllm-ascend's
    ``AscendMLAAttentionSpec`` is one of ``MLAAttentionSpec``)."""


class NewCacheSpec(KVCacheSpec):
    """A spec class of no attention kind this project knows."""


POLICY = [
    (full_attention_spec(16), True, "full attention over the whole context"),
    (MLAAttentionSpec(block_size=64, **MLA), True, "full attention over the whole context"),
    (
        UniformTypeKVCacheSpecs(
            block_size=16,
            kv_cache_specs={"a": full_attention_spec(16), "b": full_attention_spec(16)},
        ),
        True,
        "every layer attends over the whole context",
    ),
    (sliding_window(32), False, "a sliding window the layer reads by itself"),
    (
        dsv4_dspark_swa(),
        False,
        "layer draft.layer is not windowed: a sliding window",
    ),
    (
        FullAttentionSpec(block_size=16, sliding_window=256, **KV),
        False,
        "a sliding window of 256 tokens computed in the layer",
    ),
    (
        ChunkedLocalAttentionSpec(block_size=16, attention_chunk_size=64, **KV),
        False,
        "chunked local attention",
    ),
    (CircularBufferSpec(block_size=64, **KV), False, "a ring buffer"),
    (
        MLAAttentionSpec(block_size=64, tokens_per_state=4, **MLA),
        False,
        "compressed: one state per 4 tokens",
    ),
    (MLAAttentionSpec(block_size=64, topk_buffer_width=2048, **MLA), False, "sparse MLA"),
    (
        MLAAttentionSpec(block_size=64, cache_role=SparseCacheRole.INDEXER, **MLA),
        False,
        "a sparse-attention indexer cache",
    ),
    (
        SinkFullAttentionSpec(block_size=16, sink_len=4, **KV),
        False,
        "attention sinks the model declares itself",
    ),
    (RSWASpec(block_size=16, rswa_window=64, **KV), False, "restricted sliding window"),
    (FullAttentionSpec(block_size=16, non_causal=True, **KV), False, "non-causal"),
    (
        MambaSpec(block_size=16, shapes=((2, 3),), dtypes=(torch.float32,)),
        False,
        "recurrent (mamba/SSM) state",
    ),
    (HiddenStateCacheSpec(block_size=16, **MLA), False, "a hidden-state cache"),
    (EncoderOnlyAttentionSpec(block_size=16, **KV), False, "encoder attention"),
    (CrossAttentionSpec(block_size=16, **KV), False, "cross attention"),
    (
        HiSparseHotSpec(block_size=16, page_size=1024, blocks_per_request=4),
        False,
        "a sparse (HiSparse) cache",
    ),
]


@pytest.mark.parametrize(
    ("spec", "windowed", "reason"), POLICY, ids=[type(p[0]).__name__ for p in POLICY]
)
def test_each_kv_cache_spec_gets_a_decision_and_its_reason(spec, windowed, reason):
    decision, why = groups.classify(spec)
    assert decision is windowed
    assert why.startswith(reason)


def test_the_groups_free_kv_converted_are_known_by_their_layers_not_their_window():
    """``draft_window_free_kv`` gives the draft's full-attention layers a sliding window
    (``kv_cache.py``) and records which layers: their group is windowed; a target's own
    sliding window of the very same size is not; a converted layer vLLM grouped back into
    full attention stops start-up by name."""
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec

    from vllm_ascend.worker.v2.spec_decode.draft_window.groups import Freed

    freed = Freed(64, frozenset({"draft.0", "draft.1"}))
    config = SimpleNamespace(
        kv_cache_groups=[
            KVCacheGroupSpec(["target.0"], sliding_window(32, 64)),
            KVCacheGroupSpec(["draft.0", "draft.1"], sliding_window(32, 64)),
        ]
    )
    target, draft = groups.decide_groups(config, [["attn"], ["attn"]], freed)
    assert (draft.windowed, draft.reason) == (
        True,
        "full attention, its KV before the last 64 tokens freed",
    )
    assert not target.windowed and target.reason.startswith("a sliding window the layer reads")
    assert not groups.decide_groups(config, [["attn"], ["attn"]])[1].windowed
    merged = SimpleNamespace(
        kv_cache_groups=[
            KVCacheGroupSpec(["target.0", "draft.0", "draft.1"], full_attention_spec(32))
        ]
    )
    with pytest.raises(ValueError, match="vLLM grouped the draft layers it converted"):
        groups.decide_groups(merged, [["attn"]], freed)


def test_a_full_attention_subclass_is_decided_by_its_fields_not_its_name():
    assert groups.classify(NewAttentionSpec(block_size=16, **KV)) == (
        True,
        "full attention over the whole context, one token per slot",
    )
    assert groups.classify(NewAttentionSpec(block_size=16, sliding_window=64, **KV)) == (
        False,
        "a sliding window of 64 tokens computed in the layer",
    )
    assert groups.classify(NewCacheSpec(block_size=16)) == (
        False,
        "a KV-cache spec the draft window does not know (NewCacheSpec)",
    )


def test_a_uniform_group_is_decided_by_the_drafts_own_layers():
    """vLLM puts same-kind layers of the target and the draft in one uniform-type group; the
    draft reads only its own, so the target's layers in it do not decide the draft's window."""
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec

    spec = UniformTypeKVCacheSpecs(
        block_size=16,
        kv_cache_specs={
            "target.0": FullAttentionSpec(block_size=16, sliding_window=64, **KV),
            "draft.0": full_attention_spec(16),
        },
    )
    config = SimpleNamespace(kv_cache_groups=[KVCacheGroupSpec(["target.0", "draft.0"], spec)])
    (decision,) = groups.decide_groups(config, [[SimpleNamespace(layer_names=["draft.0"])]])
    assert (decision.windowed, decision.reason) == (
        True,
        "every layer attends over the whole context, one token per slot",
    )
    (decision,) = groups.decide_groups(config, [[SimpleNamespace(layer_names=["target.0"])]])
    assert (decision.windowed, decision.reason) == (
        False,
        "layer target.0 is not windowed: a sliding window of 64 tokens computed in the layer",
    )


# Full attention of 16-token blocks, a sliding window of 128-token blocks, full attention of
# 64-token blocks in 32-token kernel blocks: the alignment is 64 (not 128).
HYBRID = [
    GroupLayout(16),
    GroupLayout(128, spec=sliding_window(128, window=256)),
    GroupLayout(64, kernel_block_size=32),
]
RING_AND_COMPRESSED = [
    GroupLayout(16),
    GroupLayout(64, spec=CircularBufferSpec(block_size=64, **KV)),
    GroupLayout(16, spec=FullAttentionSpec(block_size=16, tokens_per_state=4, **KV)),
]


def plain_and_windowed(layouts, model_dir, monkeypatch, cg_mode, sinks=None, seed=0):
    """The same batch built by a speculator without the window and by one with it."""
    batch = make_batch(layouts, num_reqs_padded=MAX_NUM_REQS, seed=seed)
    plain = wire("dflash", layouts, batch, model_dir, monkeypatch, additional_config={})
    build(plain, cg_mode)
    ours = wire("dflash", layouts, batch, model_dir, monkeypatch, sinks=sinks)
    metadata = build(ours, cg_mode)
    return plain, ours, metadata


@pytest.mark.parametrize("layouts", [HYBRID, RING_AND_COMPRESSED], ids=["hybrid", "ring"])
@pytest.mark.parametrize("cg_mode", [CUDAGraphMode.NONE, CUDAGraphMode.FULL], ids=str)
@pytest.mark.parametrize("sinks", [None, 20])
def test_full_groups_read_the_window_and_the_others_what_vllm_gives_them(
    layouts, cg_mode, sinks, model_dir, monkeypatch
):
    plain, ours, metadata = plain_and_windowed(layouts, model_dir, monkeypatch, cg_mode, sinks)
    window = ours.speculator.draft_window
    assert sorted(window.windows) == [0] + ([2] if layouts is HYBRID else [])
    # The alignment and the sinks come from the windowed groups alone.
    assert window.spec.alignment == (64 if layouts is HYBRID else 16)
    assert window.spec.sink_size == (0 if sinks is None else (64 if layouts is HYBRID else 32))
    assert_reads_exactly_the_window(ours, layouts, metadata)
    for g, layout in enumerate(layouts):
        if not layout.full_attention:
            (theirs,), (mine,) = plain.received[g], ours.received[g]
            compare_cams(theirs, mine)


def test_a_capture_hands_the_groups_not_windowed_vllms_own_buffers(model_dir, monkeypatch):
    layouts = HYBRID
    batch = make_batch(layouts, num_reqs_padded=MAX_NUM_REQS)
    plain = wire("dflash", layouts, batch, model_dir, monkeypatch, additional_config={})
    vllms = capture_on_cpu(plain.speculator, monkeypatch)
    plain.speculator.capture()
    wired = wire("dflash", layouts, batch, model_dir, monkeypatch)
    captured = capture_on_cpu(wired.speculator, monkeypatch)
    wired.speculator.capture()
    sliding = captured["draft.1"]
    assert sliding.seq_lens.data_ptr() == batch.input_buffers.seq_lens.data_ptr()
    assert sliding.block_table.data_ptr() == batch.block_tables.input_block_tables[1].data_ptr()
    for name in ("seq_lens", "block_table", "slot_mapping", "query_start_loc"):
        ours, theirs = getattr(sliding, name), getattr(vllms["draft.1"], name)
        assert (ours.data_ptr(), ours.shape) == (theirs.data_ptr(), theirs.shape), name
    # Replay: the kernels write the real batch, the recorded update runs.
    fill_input_block_tables(batch)
    fill_query_inputs(batch)
    fill_slot_mappings(batch)
    wired.speculator._update_draft_decode_metadata(captured, MAX_NUM_REQS)
    assert_reads_exactly_the_window(wired, layouts, captured)
    assert torch.equal(
        sliding.seq_lens[: batch.num_reqs], torch.from_numpy(batch.seq_lens).to(torch.int32)
    )


@pytest.fixture
def warnings(window_log):
    return window_log


def test_no_windowable_group_stops_start_up_naming_the_groups(model_dir, monkeypatch):
    layouts = [GroupLayout(16, draft=False), GroupLayout(32, spec=sliding_window(32))]
    with pytest.raises(ValueError) as refused:
        wire("dflash", layouts, make_batch(layouts), model_dir, monkeypatch)
    assert str(refused.value) == (
        "draft_window_size=64 cannot window the draft: none of its KV-cache groups is dense, "
        "causal attention over the whole context (not windowed: group 1 (SlidingWindowSpec, "
        "block size 32): a sliding window the layer reads by itself (and was trained with)). "
        "Use a draft whose attention layers are, or remove draft_window_size."
    )


def test_the_start_up_line_lists_the_groups_windowed_and_not_windowed(
    model_dir, monkeypatch, warnings
):
    wire("dflash", RING_AND_COMPRESSED, make_batch(RING_AND_COMPRESSED), model_dir, monkeypatch)
    ((level, line),) = warnings
    assert level == "info"
    assert line.endswith(
        "block sizes per KV-cache group {0: 16}, alignment 16; windowed: "
        "group 0 (FullAttentionSpec, block size 16); not windowed: group 1 (CircularBufferSpec, "
        "block size 64): a ring buffer, one block per request: its columns are no range of "
        "positions; group 2 (FullAttentionSpec, block size 16): compressed: one state per 4 "
        "tokens."
    )


def test_a_group_of_a_full_attention_subclass_reads_the_window(model_dir, monkeypatch):
    subclass = NewAttentionSpec(block_size=16, **KV)
    layouts = [GroupLayout(16), GroupLayout(16, spec=subclass, windowed=True)]
    batch = make_batch(layouts, num_reqs_padded=MAX_NUM_REQS)
    wired = wire("dflash", layouts, batch, model_dir, monkeypatch)
    assert sorted(wired.speculator.draft_window.windows) == [0, 1]
    assert_reads_exactly_the_window(wired, layouts, build(wired, CUDAGraphMode.NONE))


def deepseek_v4(wired_config):
    wired_config.model_config.hf_config.model_type = "deepseek_v4"


def test_a_deepseek_v4_dspark_draft_has_no_group_to_window(model_dir, monkeypatch):
    """On vLLM 0.33 each DSV4 DSpark draft layer caches only its sliding-window MLA state:
    the draft never reads past its own window, and the draft window has nothing to crop:
    the key stops start-up."""
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    from testbed.speculators import (
        make_vllm_config,
        wire_speculator,
    )
    from tests.cpu_testbed.dflash import MAX_MODEL_LEN, NUM_SPEC, W

    layouts = [GroupLayout(64, draft=False), GroupLayout(64, spec=dsv4_dspark_swa("draft.1"))]
    config = make_vllm_config(model_dir, MAX_MODEL_LEN, MAX_NUM_REQS, {"draft_window_size": W})
    deepseek_v4(config)
    with pytest.raises(
        ValueError,
        match=r"draft_window_size=64 cannot window the draft: .*\(not windowed: group 1 "
        r"\(UniformTypeKVCacheSpecs\[SlidingWindowMLASpec\], block size 64\): layer "
        r"draft.1 is not windowed: a sliding window the layer reads by itself",
    ):
        wire_speculator(DSparkSpeculator, make_batch(layouts), layouts, config, "dspark", NUM_SPEC)
