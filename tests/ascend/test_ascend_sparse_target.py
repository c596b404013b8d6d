# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""A sparse-attention (SFA/DSA) target on vllm-ascend's start-up path (``kv_specs``): its
layers, their indexer caches and a dense MLA DSpark draft (GLM-5 with its draft) share one
uniform-type KV-cache group, and the draft's own layers decide its window: served where they
are dense, refused by name where the draft reads the sparse layers."""

import pytest
from vllm.v1.worker.utils import AttentionGroup

from tests.ascend.npu_testbed.dflash import (
    BLOCK,
    EAGER,
    MAX_NUM_REQS,
    SEQ_LENS,
    W,
    assert_fia_reads_exactly_the_window,
)
from tests.ascend.npu_testbed.wiring import (
    fill,
    make_batch,
    sparse_target_config,
    window_as_set_attn_makes_it,
)
from tests.ascend.npu_testbed.wiring import speculator as make_speculator

pytestmark = pytest.mark.usefixtures("registered")


def glm_dspark(config):
    """vllm-ascend's DSpark speculator over a dense MLA draft layer that decodes its query
    block non-causally (glm5_dspark's), beside the registered target layers."""
    from vllm_ascend.attention.mla_v1 import AscendMLABackend

    return make_speculator(
        config,
        "dspark",
        BLOCK,
        MAX_NUM_REQS,
        backend=AscendMLABackend,
        non_causal_multi_token_decode=True,
    )


def test_a_dense_draft_beside_a_sparse_target_reads_exactly_its_window(sfa_model_dir):
    """GLM-5's layout: its sparse layers, their indexer caches and its dense MLA DSpark draft
    share one uniform-type group; the draft's own layer decides its window."""
    config, indexer = sparse_target_config(sfa_model_dir)
    s = glm_dspark(config)
    (group,) = s.kv_cache_config.kv_cache_groups
    members = {
        name: type(spec).__name__ for name, spec in group.kv_cache_spec.kv_cache_specs.items()
    }
    assert members == {
        "target.0.attn": "AscendMLAAttentionSpec",
        indexer: "AscendSFAIndexerCacheSpec",
        "draft.0": "AscendMLAAttentionSpec",
    }
    (decision,) = s.draft_window.plan.decisions
    assert decision.windowed, decision.reason
    batch = make_batch(SEQ_LENS, BLOCK, MAX_NUM_REQS)
    fill(s, batch)
    md = EAGER(s)
    assert md.decode.block_table.data_ptr() == s.draft_window.windows[0].block_table.data_ptr()
    assert_fia_reads_exactly_the_window(s, batch, md.decode.seq_lens_list, md.decode.block_table)


def test_a_draft_that_reads_sparse_attention_stops_start_up_by_name(sfa_model_dir):
    """A draft whose attention groups are the target's sparse layers (as a draft sharing the
    target's layers reads them): the indexer cache is never windowed, and with nothing left to
    window the key stops start-up before the KV cache is allocated; the sparse main cache
    alone is refused by its backend's name."""
    from vllm_ascend.attention.indexer import AscendSFAIndexerBackend
    from vllm_ascend.attention.sfa_v1 import AscendSFABackend

    config, indexer = sparse_target_config(sfa_model_dir)
    s = glm_dspark(config)
    specs = s.kv_cache_config.kv_cache_groups[0].kv_cache_spec.kv_cache_specs
    main = AttentionGroup(AscendSFABackend, ["target.0.attn"], specs["target.0.attn"], 0)
    index = AttentionGroup(AscendSFAIndexerBackend, [indexer], specs[indexer], 0)
    s.attn_groups = [[main, index]]
    with pytest.raises(ValueError) as refused:
        window_as_set_attn_makes_it(s)
    assert str(refused.value) == (
        f"draft_window_size={W} cannot window the draft: none of its KV-cache groups is dense, "
        "causal attention over the whole context (not windowed: group 0 "
        "(UniformTypeKVCacheSpecs[AscendMLAAttentionSpec, AscendSFAIndexerCacheSpec], block "
        f"size {BLOCK}): layer {indexer} is not windowed: vllm-ascend's sparse-attention (SFA) "
        "indexer cache, not attention KV). Use a draft whose attention layers are, or remove "
        "draft_window_size."
    )
    s.attn_groups = [[main]]
    with pytest.raises(ValueError, match=r"on attention backend AscendSFABackend: "):
        window_as_set_attn_makes_it(s)
