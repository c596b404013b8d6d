# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""One DFlash draft block through vLLM's own model class (``DFlashQwen3ForCausalLM``, as
vLLM builds it on its CPU platform, the checkpoint loaded by its ``load_weights``):

    python dflash_forward.py PLAN.json INPUTS.pt LOGITS.pt

PLAN: {"target": path, "draft": path, "max_model_len": n, "num_spec": k}. INPUTS: the
target's hidden states the drafter reads at the context positions 0..p ("features"), the
block's token ids ("query_ids") and positions ("query_positions"). The context's keys and
values are what the model's ``precompute_and_store_context_kv`` hands to each layer's KV
cache write; each layer's attention (the only part a kernel computes) is dense attention of
the block's queries over them and the block's own keys and values, non-causal, as the
DFlash speculator runs it. LOGITS: ``compute_logits`` of the block, the embedding and LM
head the target's (what vLLM's DFlash loader shares).

Run as a script from a directory outside the checkout (vLLM's CPU environment:
``tools.cpu_engine``).
"""

from __future__ import annotations

import json
import socket
import sys

import torch


class DenseAttention(torch.nn.Module):
    """Non-causal attention of a block's queries over the stored context and the block."""

    def __init__(self, heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.context: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, q, k, v):
        context_k, context_v = self.context
        keys = torch.cat([context_k.flatten(1), k]).unflatten(-1, (self.heads, self.head_dim))
        values = torch.cat([context_v.flatten(1), v]).unflatten(-1, (self.heads, self.head_dim))
        q = q.unflatten(-1, (self.heads, self.head_dim))
        scores = torch.einsum("qhd,khd->hqk", q, keys) * self.head_dim**-0.5
        attended = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), values)
        return attended.flatten(1)


def dflash_config(plan: dict):
    """vLLM's config of the target with the DFlash draft of ``plan``."""
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig, VllmConfig

    model_config = ModelConfig(
        model=plan["target"],
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=plan["max_model_len"],
    )
    parallel = ParallelConfig()
    return VllmConfig(
        model_config=model_config,
        parallel_config=parallel,
        speculative_config=SpeculativeConfig(
            method="dflash",
            model=plan["draft"],
            num_speculative_tokens=plan["num_spec"],
            target_model_config=model_config,
            target_parallel_config=parallel,
        ),
    )


def load_dflash(config, plan: dict):
    """vLLM's DFlash model class over the draft's checkpoint and the target's embedding and
    LM head (which vLLM's DFlash loader shares with the draft), loaded as vLLM's loader
    does (on CPU: its GEMM chosen per layer)."""
    from safetensors.torch import load_file
    from vllm.model_executor.model_loader.utils import process_weights_after_loading
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM

    model = DFlashQwen3ForCausalLM(vllm_config=config)
    target = load_file(f"{plan['target']}/model.safetensors")
    draft = load_file(f"{plan['draft']}/model.safetensors")
    shared = {
        "embed_tokens.weight": target["model.embed_tokens.weight"],
        "lm_head.weight": target["lm_head.weight"],
    }
    model.load_weights([*draft.items(), *shared.items()])
    process_weights_after_loading(model, config.model_config, torch.device("cpu"))
    return model.eval()


def main(plan_path: str, inputs_path: str, out_path: str) -> int:
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment

    with open(plan_path) as f:
        plan = json.load(f)
    inputs = torch.load(inputs_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = dflash_config(plan)
    with set_current_vllm_config(config):
        init_distributed_environment(1, 0, f"tcp://127.0.0.1:{port}", 0, "gloo")
        ensure_model_parallel_initialized(1, 1)
        model = load_dflash(config, plan)
        stored = {}

        def capture(layer, key, value, kv_cache, slot_mapping):
            stored[layer.layer_name] = (key.clone(), value.clone())

        dense = []
        for layer in model.model.layers:
            attn = layer.self_attn.attn
            attn.impl.do_kv_cache_update = capture
            attn.kv_cache = torch.empty(0)
            dense.append(DenseAttention(attn.num_heads, attn.head_size))
        features = inputs["features"]
        context = model.combine_hidden_states(features)
        positions = torch.arange(features.shape[0])
        with torch.inference_mode():
            model.precompute_and_store_context_kv(context, positions, positions.clone())
            for layer, attention in zip(model.model.layers, dense, strict=True):
                attention.context = stored[layer.self_attn.attn.layer_name]
                layer.self_attn.attn = attention
            hidden = model(inputs["query_ids"], inputs["query_positions"])
            logits = model.compute_logits(hidden)
    torch.save(
        {
            "logits": logits,
            "context_keys": [stored[n][0] for n in sorted(stored)],
            "context_values": [stored[n][1] for n in sorted(stored)],
        },
        out_path,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
