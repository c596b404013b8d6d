# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Tiny models for a real vLLM engine on CPU, made locally (no model hub): a byte-level BPE
tokenizer trained on a seeded corpus, a Llama target of seeded random weights, and the
draft heads vLLM's CPU engine runs beside it (EAGLE3, DFlash, DSpark), each in the layout
vLLM's model code loads. A draft model (method ``draft_model``) is the target itself: it
drafts what the target verifies, so every draft token is accepted unless the window crops
what the draft reads.

Sizes: vocab 512, hidden 128, 4 layers, 4 query heads and 2 KV heads of 32 (the CPU
attention backend's smallest head size), float32.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

VOCAB = 512
HIDDEN = 128
INTERMEDIATE = 256
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 32
TARGET_LAYERS = 4
MAX_POSITIONS = 2048
# <s>, </s>, <pad>, and the mask token DFlash and DSpark drafts fill their queries with.
SPECIALS = ("<s>", "</s>", "<pad>", "<|mask|>")
MASK_TOKEN_ID = 3
# The target layers whose hidden states the heads read (vLLM numbers them from 1 for DFlash
# and DSpark's ``target_layer_ids``, which count after the embedding).
AUX_LAYERS = (1, 2, 3)
SEED = 1234


@dataclass(frozen=True)
class TinyModels:
    root: Path

    @property
    def target(self) -> str:
        return str(self.root / "target")

    def draft(self, method: str) -> str:
        """The draft checkpoint of ``method`` (a draft model: the target itself)."""
        return self.target if method == "draft_model" else str(self.root / method)


def make_tiny_models(root: Path) -> TinyModels:
    """Write the tokenizer, the target and the heads under ``root`` (once: a second call
    finds them)."""
    models = TinyModels(Path(root))
    done = models.root / ".complete"
    if done.exists():
        return models
    import torch
    from transformers.utils import logging as transformers_logging

    # Its "Writing model shards" bar would land in the middle of make demo's tables.
    transformers_logging.disable_progress_bar()
    models.root.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer()
    torch.manual_seed(SEED)
    target = _target()
    target.save_pretrained(models.target, safe_serialization=True)
    tokenizer.save_pretrained(models.target)
    generator = torch.Generator().manual_seed(SEED + 1)
    for method, (config, tensors) in _heads(generator).items():
        path = models.root / method
        path.mkdir(exist_ok=True)
        (path / "config.json").write_text(json.dumps(config, indent=1))
        _save(path / "model.safetensors", tensors)
        tokenizer.save_pretrained(path)
    done.touch()
    return models


# The words of the corpus the tokenizer is trained on.
_WORDS = (
    "the a of to and in is it that was for on are with as they be at one have this "
    "from or had by word but what some we can out other were all there when up use "
    "how said an each which do their time if will way about many then them would like "
    "so these long make see two has look more day could go come number no most people "
    "over know water than call first who may down side been now find new work part "
    "draft window token cache block speculative decode model runner engine"
)


def _corpus(lines: int = 3000) -> list[str]:
    rng = random.Random(SEED)
    words = _WORDS.split()
    return [
        " ".join(rng.choice(words) for _ in range(rng.randint(5, 20))).capitalize()
        for _ in range(lines)
    ]


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    assert tokenizer.get_vocab_size() == VOCAB, tokenizer.get_vocab_size()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=SPECIALS[0],
        eos_token=SPECIALS[1],
        pad_token=SPECIALS[2],
        mask_token=SPECIALS[3],
        model_max_length=MAX_POSITIONS,
    )


def _shape() -> dict:
    """What the target and every head share."""
    return {
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
    }


def _target():
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = {k: v for k, v in _shape().items() if k not in ("hidden_act", "torch_dtype")}
    # Weights five times transformers' default spread: greedy decoding then varies with the
    # context (at the default a random model repeats one token), so a token that differs
    # shows.
    config = LlamaConfig(num_hidden_layers=TARGET_LAYERS, initializer_range=0.1, **shape)
    return LlamaForCausalLM(config).float().eval()


def _heads(generator) -> dict[str, tuple[dict, dict]]:
    """Config and weights of each head, in the names vLLM's loaders take. The heads share
    the target's embedding and LM head (vLLM hands them the target's)."""
    import torch

    def random(*shape):
        return torch.randn(*shape, generator=generator) * 0.02

    def ones(n):
        return torch.ones(n)

    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    aux = len(AUX_LAYERS) * HIDDEN

    def mlp(prefix: str) -> dict:
        return {
            f"{prefix}mlp.gate_proj.weight": random(INTERMEDIATE, HIDDEN),
            f"{prefix}mlp.up_proj.weight": random(INTERMEDIATE, HIDDEN),
            f"{prefix}mlp.down_proj.weight": random(HIDDEN, INTERMEDIATE),
        }

    # EAGLE3 (vLLM's LlamaForCausalLMEagle3): one layer whose attention takes the token's
    # embedding beside the hidden state, and ``fc`` over the target's auxiliary hidden
    # states. A 4-layer target needs its auxiliary layers named: vLLM's default repeats one.
    eagle3 = {
        **_shape(),
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "target_hidden_size": HIDDEN,
        "draft_vocab_size": VOCAB,
        "eagle_aux_hidden_state_layer_ids": list(AUX_LAYERS),
    }
    eagle3_weights = {
        "midlayer.input_layernorm.weight": ones(HIDDEN),
        "midlayer.hidden_norm.weight": ones(HIDDEN),
        "midlayer.post_attention_layernorm.weight": ones(HIDDEN),
        "midlayer.self_attn.q_proj.weight": random(q, 2 * HIDDEN),
        "midlayer.self_attn.k_proj.weight": random(kv, 2 * HIDDEN),
        "midlayer.self_attn.v_proj.weight": random(kv, 2 * HIDDEN),
        "midlayer.self_attn.o_proj.weight": random(HIDDEN, q),
        **mlp("midlayer."),
        "fc.weight": random(HIDDEN, aux),
        "norm.weight": ones(HIDDEN),
    }
    # DFlash (vLLM's DFlashDraftModel): Qwen3 layers (per-head query and key norms), ``fc``
    # over the auxiliary hidden states and their norm.
    target_layer_ids = [layer - 1 for layer in AUX_LAYERS]
    dflash = {
        **_shape(),
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "num_hidden_layers": 1,
        "target_hidden_size": HIDDEN,
        "attention_bias": False,
        "block_size": 4,
        "dflash_config": {"mask_token_id": MASK_TOKEN_ID, "target_layer_ids": target_layer_ids},
    }
    dflash_weights = {
        "layers.0.input_layernorm.weight": ones(HIDDEN),
        "layers.0.post_attention_layernorm.weight": ones(HIDDEN),
        "layers.0.self_attn.q_proj.weight": random(q, HIDDEN),
        "layers.0.self_attn.k_proj.weight": random(kv, HIDDEN),
        "layers.0.self_attn.v_proj.weight": random(kv, HIDDEN),
        "layers.0.self_attn.o_proj.weight": random(HIDDEN, q),
        "layers.0.self_attn.q_norm.weight": ones(HEAD_DIM),
        "layers.0.self_attn.k_norm.weight": ones(HEAD_DIM),
        **mlp("layers.0."),
        "fc.weight": random(HIDDEN, aux),
        "hidden_norm.weight": ones(HIDDEN),
        "norm.weight": ones(HIDDEN),
    }
    # DSpark (vLLM's dense Qwen3DSparkModel): the DFlash head and a low-rank Markov head.
    rank = 16
    dspark = {
        **dflash,
        "architectures": ["Qwen3DSparkModel"],
        "block_size": 3,
        "markov_rank": rank,
        "mask_token_id": MASK_TOKEN_ID,
        "target_layer_ids": target_layer_ids,
    }
    dspark_weights = {
        **dflash_weights,
        "markov_head.markov_w1.weight": random(VOCAB, rank),
        "markov_head.markov_w2.weight": random(VOCAB, rank),
    }
    return {
        "eagle3": (eagle3, eagle3_weights),
        "dflash": (dflash, dflash_weights),
        "dspark": (dspark, dspark_weights),
    }


def _save(path: Path, tensors: dict) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), {"format": "pt"})
