# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Tiny model configs (no weights) for vLLM's and vllm-ascend's configs and builders on CPU,
shared by both test environments: nothing here imports vLLM."""

import json
from pathlib import Path

NUM_KV_HEADS, HEAD_SIZE = 2, 16
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": NUM_KV_HEADS,
    "head_dim": HEAD_SIZE,
    "num_hidden_layers": 2,
    "vocab_size": 256,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
}
# A tiny DeepSeek-V2 (MLA) config, for drafts on vllm-ascend's MLA backend.
TINY_MLA = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 32,
    "q_lora_rank": None,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "num_hidden_layers": 2,
    "vocab_size": 256,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 2,
}
# vLLM 0.33's MLA metadata takes head size 576 only (kv_lora_rank 512 + rope 64).
TINY_MLA_576 = {**TINY_MLA, "kv_lora_rank": 512, "qk_rope_head_dim": 64}


def write_model_dir(root: Path, config: dict, **overrides) -> Path:
    """``root`` holding ``config`` (with ``overrides``) as its ``config.json``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({**config, **overrides}))
    return root
