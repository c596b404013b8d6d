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
# DeepSeek-V3.2 / GLM-5 sparse attention: an indexer scores the context for the top-k tokens
# each query reads (vllm-ascend's ``enable_sfa`` reads ``index_topk``); a latent rank that
# vllm-ascend's packed C8 cache tiles (by 128).
TINY_SFA = {
    **TINY_MLA,
    "kv_lora_rank": 128,
    "index_topk": 64,
    "index_head_dim": 32,
    "index_n_heads": 4,
}


def write_model_dir(root: Path, config: dict, **overrides) -> Path:
    """``root`` holding ``config`` (with ``overrides``) as its ``config.json``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({**config, **overrides}))
    return root


# Draft checkpoints as each family publishes its config.json, declaring its training context
# (``draft_window_size: "auto"``) where that layout declares it. The speculative method vLLM
# validates each with, and the dotted field the context sits in.
_TINY_QWEN3 = {**TINY_LLAMA, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}
DRAFT_LAYOUTS = {
    # An EAGLE3 native head (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's layout: 2048 tokens).
    "eagle3": ("eagle3", "max_position_embeddings"),
    # The speculators format (speculators_model_type): the transformer layer's own config.
    "eagle3-speculators": ("eagle3", "transformer_layer_config.max_position_embeddings"),
    # DFlash and DSpark drafts in the Qwen3 layout, their draft settings beside it.
    "dflash": ("dflash", "max_position_embeddings"),
    "dspark": ("dspark", "max_position_embeddings"),
    # A small model of the target's family drafting on its own.
    "draft_model": ("draft_model", "max_position_embeddings"),
}


def draft_checkpoint(layout: str, context: int | None) -> dict:
    """The config.json of a tiny draft checkpoint in ``layout`` (``DRAFT_LAYOUTS``) declaring
    ``context`` tokens (None: no context declared anywhere)."""
    declared = {} if context is None else {"max_position_embeddings": context}

    def without_context(config: dict) -> dict:
        return {k: v for k, v in config.items() if k != "max_position_embeddings"}

    if layout == "eagle3":
        return {
            **without_context(TINY_LLAMA),
            "architectures": ["LlamaForCausalLMEagle3"],
            "draft_vocab_size": TINY_LLAMA["vocab_size"],
            **declared,
        }
    if layout == "eagle3-speculators":
        layer = {k: v for k, v in without_context(TINY_LLAMA).items() if k != "architectures"}
        return {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "draft_vocab_size": TINY_LLAMA["vocab_size"],
            "transformer_layer_config": {**layer, **declared},
            "speculators_config": {
                "algorithm": "eagle3",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": "target", "architectures": ["LlamaForCausalLM"]},
            },
        }
    if layout == "dflash":
        return {
            **without_context(_TINY_QWEN3),
            "architectures": ["DFlashDraftModel"],
            "dflash_config": {"mask_token_id": 250},
            **declared,
        }
    if layout == "dspark":
        return {
            **without_context(_TINY_QWEN3),
            "architectures": ["Qwen3DSparkModel"],
            "dflash_config": {"mask_token_id": 250},
            "block_size": 4,
            "markov_rank": 4,
            "mask_token_id": 250,
            **declared,
        }
    if layout == "draft_model":
        return {**without_context(TINY_LLAMA), **declared}
    raise ValueError(f"no draft layout {layout!r}: one of {', '.join(DRAFT_LAYOUTS)}")


def write_draft_dir(root: Path, layout: str, context: int | None) -> Path:
    """``root`` holding a draft checkpoint's config.json (``draft_checkpoint``)."""
    return write_model_dir(root, draft_checkpoint(layout, context))
