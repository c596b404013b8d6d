# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The window decides each KV-cache spec vllm-ascend's own start-up builds (``kv_specs``: its
``get_kv_cache_spec`` over the registered layers) by what it is, its class and its fields,
not its name."""

import dataclasses

import pytest
import torch

from tests.ascend.npu_testbed import kv_specs
from tests.ascend.npu_testbed.dflash import BLOCK
from tests.ascend.npu_testbed.wiring import sparse_target_config
from vllm_ascend.worker.v2.spec_decode.draft_window import groups

pytestmark = pytest.mark.usefixtures("registered")


def test_vllm_ascends_packed_sparse_main_cache_is_not_windowed(sfa_model_dir):
    """Sparse C8 (``enable_sparse_sfa_c8``) packs the SFA main cache into one byte tensor
    whose kernel reads top-k tokens of the whole context."""
    config, _ = sparse_target_config(sfa_model_dir, enable_sparse_sfa_c8=True)
    main = kv_specs.start_up_kv_cache_specs(config)["target.0.attn"]
    assert main.cache_sparse_sfa_c8
    assert groups.classify(main) == (
        False,
        "a packed sparse-attention (SFA) main cache: top-k tokens of the whole context",
    )


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"store_on_host": True}, "stored on the host (sparse KV offload)"),
        ({"cache_sparse_sfa_turboquant": True}, "a packed sparse-attention (SFA) main cache"),
        ({"tokens_per_state": 4, "model_version": "deepseek_v4"}, "compressed: one state per 4"),
        ({"non_causal_multi_token_decode": True}, "full attention over the whole context"),
        ({}, "full attention over the whole context, one token per slot"),
    ],
)
def test_each_field_of_vllm_ascends_mla_spec_decides_its_window(fields, reason):
    """The fields vllm-ascend's ``get_kv_cache_spec`` sets on ``AscendMLAAttentionSpec``
    (sparse KV offload keeps the main cache on the host; turboquant packs it; DeepSeek-V4
    compresses it), each decided on vllm-ascend's own class."""
    from vllm_ascend.core.kv_cache_interface import AscendMLAAttentionSpec

    if not set(fields) <= {f.name for f in dataclasses.fields(AscendMLAAttentionSpec)}:
        # vllm-ascend 0.29's spec has no turboquant field: no such cache to decide there.
        assert "cache_sparse_sfa_turboquant" in fields
        return
    spec = AscendMLAAttentionSpec(
        block_size=BLOCK, num_kv_heads=1, head_size=576, dtype=torch.bfloat16, **fields
    )
    windowed, why = groups.classify(spec)
    assert windowed is (reason.startswith("full attention"))
    assert why.startswith(reason)


def test_the_draft_group_keeps_the_block_size_vllm_ascends_hybrid_alignment_gives_it(model_dir):
    """Beside a Mamba layer vllm-ascend's ``get_kv_cache_spec`` grows an attention layer's
    blocks until its page is the largest attention page (a draft of half the target's KV
    heads: 128-token blocks become 256; vllm-ascend 0.29 pads the page instead), and vLLM
    groups the draft apart: the draft's group is windowed with the block size its table
    counts."""
    from vllm.v1.kv_cache_interface import MambaSpec
    from vllm.v1.worker.utils import AttentionGroup

    from tests.ascend.npu_testbed.wiring import vllm_config
    from vllm_ascend.attention.attention_v1 import AscendAttentionBackend

    config = vllm_config(model_dir, "dflash", {"draft_window_size": 256})
    config.cache_config.block_size = BLOCK
    kv_specs.gqa_layer(config, "target.0", 8, 16, num_kv_heads=4)
    kv_specs.gqa_layer(config, "draft.0", 4, 16, num_kv_heads=2)
    state = MambaSpec(block_size=BLOCK, shapes=((64, 64),), dtypes=(torch.float32,))
    kv_specs.MambaLayer(config, "target.1", state)
    kv_cache_config = kv_specs.start_up_kv_cache_config(config)
    by_layer = {tuple(g.layer_names): g.kv_cache_spec for g in kv_cache_config.kv_cache_groups}
    assert sorted(by_layer) == [("draft.0",), ("target.0",), ("target.1",)]
    from vllm_ascend.worker.v2 import attn_utils

    draft_block = 256 if hasattr(attn_utils, "_align_hybrid_attention_page_sizes") else 128
    assert (by_layer[("target.0",)].block_size, by_layer[("draft.0",)].block_size) == (
        128,
        draft_block,
    )
    g = [tuple(group.layer_names) for group in kv_cache_config.kv_cache_groups].index(("draft.0",))
    attn = [[] for _ in kv_cache_config.kv_cache_groups]
    attn[g] = [AttentionGroup(AscendAttentionBackend, ["draft.0"], by_layer[("draft.0",)], g)]
    (decision,) = groups.decide_groups(kv_cache_config, attn)
    assert (decision.group_id, decision.block_size, decision.windowed) == (g, draft_block, True)
