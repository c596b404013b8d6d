# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""KV-cache specs and groups as vllm-ascend's Model Runner V2 start-up makes them: the model's
attention layers registered in the config, vllm-ascend's own ``get_kv_cache_spec`` over them
(the one its patch installs into vLLM's model runner: MLA layers become
``AscendMLAAttentionSpec``, the SFA indexer ``AscendSFAIndexerCacheSpec``), grouped by vLLM's
``get_kv_cache_groups``. vllm-ascend's platform patch of that grouping is not applied here: it
replaces vLLM's module functions for the whole process."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from vllm.config import set_current_vllm_config
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec, MambaSpec


def gqa_layer(config, prefix: str, num_heads: int, head_size: int, num_kv_heads: int) -> None:
    """A real vLLM attention layer on vllm-ascend's GQA (FIA) backend, registered in
    ``config`` as a model registers it."""
    from vllm.model_executor.layers.attention.attention import Attention

    from vllm_ascend.attention.attention_v1 import AscendAttentionBackend

    with set_current_vllm_config(config):
        Attention(
            num_heads,
            head_size,
            head_size**-0.5,
            num_kv_heads=num_kv_heads,
            prefix=prefix,
            attn_backend=AscendAttentionBackend,
        )


def mla_layer(
    config,
    prefix: str,
    *,
    backend: type | None = None,
    non_causal_multi_token_decode: bool = False,
    dcp_manager: object = None,
    **impl_fields: object,
) -> None:
    """vllm-ascend's MLA attention layer, registered in ``config``; built as
    vllm-ascend's unit tests build one (``__new__`` plus the state read: constructing it
    needs the model's projections and its impl's NPU kernels). vLLM's own
    ``MLAAttention.get_kv_cache_spec`` runs on it; ``impl`` stands in for the NPU impl with
    the fields the spec and the metadata builders read. ``backend``: vllm-ascend's MLA
    backend unless given (its SFA backend for a sparse target); ``impl_fields``: the impl's
    switches vllm-ascend's spec reads (``enable_sparse_sfa_c8``, ...)."""
    from vllm.model_executor.layers.attention import MLAAttention

    from vllm_ascend.attention import mla_v1

    mla = config.model_config.hf_text_config
    # vllm-ascend 0.30's MLA wrapper builds its own subclass; 0.29's vLLM's MLAAttention.
    layer_class = getattr(mla_v1, "AscendMLAAttention", MLAAttention)
    layer = layer_class.__new__(layer_class)
    torch.nn.Module.__init__(layer)
    layer.layer_name = prefix
    layer.num_heads, layer.num_kv_heads = mla.num_attention_heads, 1
    layer.q_lora_rank, layer.kv_lora_rank = mla.q_lora_rank, mla.kv_lora_rank
    layer.qk_nope_head_dim, layer.qk_rope_head_dim = mla.qk_nope_head_dim, mla.qk_rope_head_dim
    layer.v_head_dim = mla.v_head_dim
    layer.head_size = mla.kv_lora_rank + mla.qk_rope_head_dim
    layer.kv_cache_dtype = config.cache_config.cache_dtype
    layer.sliding_window = layer.indexer = layer.kv_sharing_target_layer_name = None
    layer.non_causal_multi_token_decode = non_causal_multi_token_decode
    layer.attn_backend = backend or mla_v1.AscendMLABackend
    layer.impl = SimpleNamespace(
        use_mla_rope=True,
        num_heads=mla.num_attention_heads,
        fa_quant_layer=False,
        enable_sparse_sfa_c8=False,
        enable_sparse_sfa_turboquant=False,
        runtime_has_indexer=True,
    )
    vars(layer.impl).update(impl_fields)
    layer.prefill_backend = SimpleNamespace(clone=lambda: None)
    layer.dcp_manager = dcp_manager
    config.compilation_config.static_forward_context[prefix] = layer


def sfa_indexer_layer(config, attention_prefix: str) -> str:
    """vLLM's real ``DeepseekV32IndexerCache`` of a sparse (SFA/DSA) MLA layer, registered
    beside it as DeepSeek-V3.2 and GLM-5 register theirs. Returns its name."""
    from vllm.model_executor.models.deepseek_v2 import DeepseekV32IndexerCache

    name = attention_prefix.removesuffix(".attn") + ".indexer.k_cache"
    head_dim = config.model_config.hf_text_config.index_head_dim
    with set_current_vllm_config(config):
        DeepseekV32IndexerCache(head_dim, torch.float32, name, config.cache_config)
    return name


class MambaLayer(torch.nn.Module, AttentionLayerBase):
    """Stand-in for a hybrid target's registered Mamba mixer (building one needs the model's
    projections and kernels): the ``MambaSpec`` vLLM's mixer returns, on vLLM's Mamba2
    backend."""

    def __init__(self, config, prefix: str, spec: MambaSpec) -> None:
        super().__init__()
        self.spec = spec
        config.compilation_config.static_forward_context[prefix] = self

    def get_kv_cache_spec(self, vllm_config) -> MambaSpec:
        return self.spec

    def get_attn_backend(self) -> type:
        from vllm.v1.attention.backends.mamba2_attn import Mamba2AttentionBackend

        return Mamba2AttentionBackend


def start_up_kv_cache_specs(config) -> dict[str, KVCacheSpec]:
    """vllm-ascend's ``get_kv_cache_spec`` over the layers registered in ``config``."""
    from vllm_ascend.worker.v2.attn_utils import get_kv_cache_spec

    with set_current_vllm_config(config):
        return get_kv_cache_spec(config)


def start_up_kv_cache_config(config) -> KVCacheConfig:
    """The registered layers' specs from vllm-ascend's ``get_kv_cache_spec``, in the groups
    vLLM's ``get_kv_cache_groups`` makes of them once the engine core has resolved the KV
    cache layout from what the layers' backends support (as it does before grouping)."""
    from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        resolve_kv_cache_layout,
    )
    from vllm.v1.core.kv_cache_utils import get_kv_cache_groups

    specs = start_up_kv_cache_specs(config)
    with set_current_vllm_config(config):
        supported = get_supported_kv_cache_layouts(get_current_attn_backends(config))
        resolve_kv_cache_layout(config, [[layout.name for layout in supported]], specs.values())
        groups = get_kv_cache_groups(config, specs)
    return KVCacheConfig(num_blocks=1, kv_cache_tensors=[], kv_cache_groups=groups)
