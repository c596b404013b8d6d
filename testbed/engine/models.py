# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Tiny models for a real vLLM engine on CPU, made locally (no model hub): a byte-level BPE
tokenizer trained on a seeded corpus, a Llama target of seeded random weights, and the
draft heads vLLM's CPU engine runs beside it (EAGLE3, DFlash, DSpark, and the DFlash
family: XPress, DFlash2, LiLiCorr), each in the layout vLLM's model code loads. A draft
model (method ``draft_model``) is the target itself: it drafts what the target verifies, so
every draft token is accepted unless the window crops what the draft reads.

Sizes: vocab 512, hidden 128, 4 layers, 4 query heads and 2 KV heads of 32 (the CPU
attention backend's smallest head size), float32.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from trained_models.recipe import SPECIALS, with_specials

VOCAB = 512
HIDDEN = 128
INTERMEDIATE = 256
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 32
TARGET_LAYERS = 4
MAX_POSITIONS = 2048
# The committed models' specials (<s>, </s>, <pad>, and the mask token DFlash and DSpark
# drafts fill their queries with), the trained tokenizer's first ids: 0 to 3.
MASK_TOKEN_ID = SPECIALS.index("<|mask|>")
# The target layers whose hidden states the heads read (vLLM numbers them from 1 for DFlash
# and DSpark's ``target_layer_ids``, which count after the embedding).
AUX_LAYERS = (1, 2, 3)
SEED = 1234
NUM_SPEC = 3
# Each head's draft method: the DFlash family's are ``dflash`` drafts, their speculator
# chosen by the checkpoint's architecture.
HEAD_METHODS = {
    "eagle3": "eagle3",
    "dflash": "dflash",
    "dspark": "dspark",
    "xpress": "dflash",
    "dflash2": "dflash",
    "lilicorr": "dflash",
}


@dataclass(frozen=True)
class TinyModels:
    root: Path

    @property
    def target(self) -> str:
        return str(self.root / "target")

    def draft(self, name: str) -> str:
        """The draft checkpoint ``name``: a head of ``HEAD_METHODS``, or ``draft_model``
        (the target itself)."""
        return self.target if name == "draft_model" else str(self.root / name)


def make_tiny_models(root: Path) -> TinyModels:
    """Write the tokenizer, the target and the heads under ``root`` (once: a second call
    finds them)."""
    models = TinyModels(Path(root))
    done = models.root / ".complete"
    if done.exists() and done.read_text() == " ".join(HEAD_METHODS):
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
    done.write_text(" ".join(HEAD_METHODS))
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
    return with_specials(tokenizer, model_max_length=MAX_POSITIONS)


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


class _Weights:
    """Seeded random weights, drawn in the order the heads are built, and the shapes the
    heads' layers share."""

    def __init__(self, generator) -> None:
        self.generator = generator

    def random(self, *shape):
        import torch

        return torch.randn(*shape, generator=self.generator) * 0.02

    @staticmethod
    def ones(n: int):
        import torch

        return torch.ones(n)

    @staticmethod
    def zeros(n: int):
        import torch

        return torch.zeros(n)

    def linear(self, name: str, out: int, into: int, bias: bool = False) -> dict:
        bias_ = {f"{name}.bias": self.zeros(out)} if bias else {}
        return {f"{name}.weight": self.random(out, into), **bias_}

    def mlp(self, prefix: str) -> dict:
        return {
            f"{prefix}mlp.gate_proj.weight": self.random(INTERMEDIATE, HIDDEN),
            f"{prefix}mlp.up_proj.weight": self.random(INTERMEDIATE, HIDDEN),
            f"{prefix}mlp.down_proj.weight": self.random(HIDDEN, INTERMEDIATE),
        }


Head = tuple[dict, dict]
# Query and KV projection widths, and the auxiliary hidden states' (``fc``'s input).
_Q, _KV, _AUX = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, len(AUX_LAYERS) * HIDDEN


def _eagle3(w: _Weights) -> Head:
    """vLLM's LlamaForCausalLMEagle3: one layer whose attention takes the token's embedding
    beside the hidden state, and ``fc`` over the target's auxiliary hidden states. A 4-layer
    target needs its auxiliary layers named: vLLM's default repeats one."""
    config = {
        **_shape(),
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "target_hidden_size": HIDDEN,
        "draft_vocab_size": VOCAB,
        "eagle_aux_hidden_state_layer_ids": list(AUX_LAYERS),
    }
    weights = {
        "midlayer.input_layernorm.weight": w.ones(HIDDEN),
        "midlayer.hidden_norm.weight": w.ones(HIDDEN),
        "midlayer.post_attention_layernorm.weight": w.ones(HIDDEN),
        "midlayer.self_attn.q_proj.weight": w.random(_Q, 2 * HIDDEN),
        "midlayer.self_attn.k_proj.weight": w.random(_KV, 2 * HIDDEN),
        "midlayer.self_attn.v_proj.weight": w.random(_KV, 2 * HIDDEN),
        "midlayer.self_attn.o_proj.weight": w.random(HIDDEN, _Q),
        **w.mlp("midlayer."),
        "fc.weight": w.random(HIDDEN, _AUX),
        "norm.weight": w.ones(HIDDEN),
    }
    return config, weights


def _dflash(w: _Weights) -> Head:
    """vLLM's DFlashDraftModel: Qwen3 layers (per-head query and key norms), ``fc`` over the
    auxiliary hidden states and their norm."""
    config = {
        **_shape(),
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "num_hidden_layers": 1,
        "target_hidden_size": HIDDEN,
        "attention_bias": False,
        "block_size": 4,
        "dflash_config": {
            "mask_token_id": MASK_TOKEN_ID,
            "target_layer_ids": [layer - 1 for layer in AUX_LAYERS],
        },
    }
    weights = {
        "layers.0.input_layernorm.weight": w.ones(HIDDEN),
        "layers.0.post_attention_layernorm.weight": w.ones(HIDDEN),
        "layers.0.self_attn.q_proj.weight": w.random(_Q, HIDDEN),
        "layers.0.self_attn.k_proj.weight": w.random(_KV, HIDDEN),
        "layers.0.self_attn.v_proj.weight": w.random(_KV, HIDDEN),
        "layers.0.self_attn.o_proj.weight": w.random(HIDDEN, _Q),
        "layers.0.self_attn.q_norm.weight": w.ones(HEAD_DIM),
        "layers.0.self_attn.k_norm.weight": w.ones(HEAD_DIM),
        **w.mlp("layers.0."),
        "fc.weight": w.random(HIDDEN, _AUX),
        "hidden_norm.weight": w.ones(HIDDEN),
        "norm.weight": w.ones(HIDDEN),
    }
    return config, weights


def _dspark(w: _Weights, dflash: Head) -> Head:
    """vLLM's dense Qwen3DSparkModel: the DFlash head and a low-rank Markov head."""
    rank = 16
    config, weights = dflash
    config = {
        **config,
        "architectures": ["Qwen3DSparkModel"],
        "block_size": 3,
        "markov_rank": rank,
        "mask_token_id": MASK_TOKEN_ID,
        "target_layer_ids": config["dflash_config"]["target_layer_ids"],
    }
    weights = {
        **weights,
        "markov_head.markov_w1.weight": w.random(VOCAB, rank),
        "markov_head.markov_w2.weight": w.random(VOCAB, rank),
    }
    return config, weights


def _xpress(w: _Weights, dflash: Head) -> Head:
    """Qwen3XPressModel: a Jacobi refiner over the draft's block. Its Triton kernels take a
    power-of-two rank and an MLP width in steps of 64; its block is the query's."""
    block, rank, width = NUM_SPEC + 1, 32, 64
    config, weights = dflash
    config = {
        **config,
        "architectures": ["Qwen3XPressModel"],
        "xpress_block_size": block,
        "xpress_rank": rank,
        "xpress_mlp_hidden": width,
        "xpress_topc": 64,
        "xpress_num_passes": 2,
        "xpress_compile_head": False,
    }
    weights = {
        **weights,
        **w.linear("xpress_head.w1", VOCAB, rank),
        **w.linear("xpress_head.down_h", rank, HIDDEN),
        **w.linear("xpress_head.down_g", rank, HIDDEN),
        **w.linear("xpress_head.in_proj", rank, 3 * rank),
        "xpress_head.mix.L": w.random(rank, block, block),
        **w.linear("xpress_head.mlp.gate_proj", width, rank),
        **w.linear("xpress_head.mlp.up_proj", width, rank),
        **w.linear("xpress_head.mlp.down_proj", rank, width),
        **w.linear("xpress_head.w2", VOCAB, rank),
    }
    return config, weights


def _dflash2(w: _Weights, dflash: Head) -> Head:
    """DFlash2DraftModel: grouped convolutions around the layer's attention and MLP (two
    taps, the first near identity), and a candidate selector over the top 4."""
    taps, group, selector = 2, 32, 16

    def convolution(name: str) -> dict:
        kernel = w.random(2, taps, HIDDEN)
        kernel[:, 0] += 1.0
        return {
            f"{name}.base_kernel": kernel,
            **w.linear(f"{name}.kernel_projection", 2 * taps * HIDDEN // group, HIDDEN),
        }

    config, weights = dflash
    config = {
        **config,
        "architectures": ["DFlash2DraftModel"],
        "dflash_config": {
            **config["dflash_config"],
            "conv_kernel_size": taps,
            "conv_group_size": group,
            "selector_rank": selector,
            "selector_top_k": 4,
        },
    }
    weights = {
        **weights,
        **convolution("layers.0.attention_conv"),
        **convolution("layers.0.mlp_conv"),
        "candidate_selector.predecessor_codebook": w.random(VOCAB, selector),
        "candidate_selector.successor_codebook": w.random(VOCAB, selector),
        **w.linear("candidate_selector.hidden_projection", selector, HIDDEN),
    }
    return config, weights


def _lilicorr_config(dflash_config: dict, heads: int, topk: int, factors: int) -> dict:
    """LiLiCorr's keys: every one is required; no convolutions."""
    return {
        **dflash_config,
        "architectures": ["LiLiCorrDraftModel"],
        "dflash_config": {
            **dflash_config["dflash_config"],
            "block_size": NUM_SPEC + 1,
            "lilicorr_enabled": True,
            "conv_kernel_size": 0,
            "conv_group_size": 0,
            "lilicorr_hidden_size": None,
            "lilicorr_candidate_topk": topk,
            "lilicorr_num_heads": heads,
            "lilicorr_mlp_ratio": 2.0,
            "lilicorr_factor_dim": factors,
            "lilicorr_vector_eps": 1e-6,
            "lilicorr_logit_scale": 10.0,
            "lilicorr_num_layers": 1,
        },
    }


def _lilicorr(w: _Weights, dflash: Head) -> Head:
    """LiLiCorrDraftModel: a one-layer correlator over the top 4 candidates of each draft
    position."""
    block, heads, topk, factors = NUM_SPEC + 1, 2, 4, 16
    config, weights = dflash
    layer = "lilicorr.layers.0"
    weights = {
        **weights,
        **w.linear("lilicorr.pass_hidden_proj", HIDDEN, HIDDEN, bias=True),
        "lilicorr.feature_norm.weight": w.ones(5),
        "lilicorr.feature_norm.bias": w.zeros(5),
        **w.linear("lilicorr.feature_mlp.up_proj", HIDDEN, 5, bias=True),
        **w.linear("lilicorr.feature_mlp.down_proj", HIDDEN, HIDDEN, bias=True),
        "lilicorr.slot_embedding": w.random(1, 1, block - 1, 1, HIDDEN),
        "lilicorr.rank_embedding": w.random(1, 1, 1, topk, HIDDEN),
        "lilicorr.relative_slot_bias": w.random(heads, 2 * block - 1),
        "lilicorr.same_slot_bias": w.random(heads),
        **w.linear("lilicorr.context_proj", HIDDEN, HIDDEN, bias=True),
        f"{layer}.attn_norm.weight": w.ones(HIDDEN),
        f"{layer}.attn.in_proj_weight": w.random(3 * HIDDEN, HIDDEN),
        f"{layer}.attn.in_proj_bias": w.zeros(3 * HIDDEN),
        **w.linear(f"{layer}.attn.out_proj", HIDDEN, HIDDEN, bias=True),
        f"{layer}.mlp_norm.weight": w.ones(HIDDEN),
        **w.linear(f"{layer}.mlp.up_proj", 2 * HIDDEN, HIDDEN, bias=True),
        **w.linear(f"{layer}.mlp.down_proj", HIDDEN, 2 * HIDDEN, bias=True),
        "lilicorr.output_norm.weight": w.ones(HIDDEN),
        "lilicorr.anchor_norm.weight": w.ones(HIDDEN),
        **w.linear("lilicorr.factor_input_proj", HIDDEN, 3 * HIDDEN, bias=True),
        **{
            f"lilicorr.{name}": tensor
            for head in ("out_head", "in_head", "anchor_out_head")
            for name, tensor in w.linear(head, factors, HIDDEN, bias=True).items()
        },
    }
    return _lilicorr_config(config, heads, topk, factors), weights


# The heads built over the DFlash head, in the order their weights are drawn.
_OVER_DFLASH = {"dspark": _dspark, "xpress": _xpress, "dflash2": _dflash2, "lilicorr": _lilicorr}


def _heads(generator) -> dict[str, Head]:
    """Config and weights of each head, in the names vLLM's loaders take. The heads share
    the target's embedding and LM head (vLLM hands them the target's)."""
    w = _Weights(generator)
    heads = {"eagle3": _eagle3(w), "dflash": _dflash(w)}
    heads |= {name: build(w, heads["dflash"]) for name, build in _OVER_DFLASH.items()}
    assert heads.keys() == HEAD_METHODS.keys()
    return heads


def _save(path: Path, tensors: dict) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), {"format": "pt"})
