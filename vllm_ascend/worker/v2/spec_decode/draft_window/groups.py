# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Which of a draft's KV-cache groups the window serves: decisions with reasons, made once at
``set_attn`` (``plan.py`` asks); the arithmetic never sees them.

A group is windowed only when its layers attend over every token of the request, one
token per cache slot, causally: ``FullAttentionSpec`` and ``MLAAttentionSpec`` without a
sliding window, chunk, compression, sparsity or sinks of their own (and a per-layer-uniform
wrapper whose every member is such). Cropping its table to the window then reads exactly
the window's tokens. Every other group is not windowed, and kept out of the alignment: its
own spec already bounds or reshapes what it reads (a sliding window the layer was trained
with, a chunk, a ring, compressed or sparse states, recurrent state), or its early columns
are not the request's first tokens, so neither a window start nor sinks mean anything
there. A spec class this table does not know is not windowed either, with a warning that
names it: a window is never applied by default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_ascend.worker.v2.spec_decode.draft_window.config import FREE_KV_KEY, KEY


@dataclass(frozen=True)
class GroupDecision:
    """The window's decision for one draft KV-cache group."""

    group_id: int
    spec_kind: str
    block_size: int
    windowed: bool
    reason: str
    # A spec class the table does not know (not windowed, with a warning).
    unknown: bool = False

    def describe(self) -> str:
        return f"group {self.group_id} ({self.spec_kind}, block size {self.block_size})"


# Spec classes not windowed whatever their fields, by the vLLM class name (isinstance, so
# their subclasses too), with the reason. A name missing from the installed vLLM is skipped.
_NOT_WINDOWED = (
    ("SlidingWindowSpec", "a sliding window the layer reads by itself (and was trained with)"),
    ("ChunkedLocalAttentionSpec", "chunked local attention: the layer reads its own chunk"),
    (
        "CircularBufferSpec",
        "a ring buffer, one block per request: its columns are no range of positions",
    ),
    ("MambaSpec", "recurrent (mamba/SSM) state: no per-token KV to window"),
    ("HiddenStateCacheSpec", "a hidden-state cache, not attention KV"),
    ("EncoderOnlyAttentionSpec", "encoder attention: no KV of the request's tokens"),
    ("CrossAttentionSpec", "cross attention over the encoder's states"),
    ("SinkFullAttentionSpec", "attention sinks the model declares itself"),
    ("RSWASpec", "restricted sliding window: its tables already leave the gap out"),
    ("HiSparseHotSpec", "a sparse (HiSparse) cache"),
    ("HiSparseResidentSpec", "a sparse (HiSparse) cache"),
)
# Spec classes windowed when their fields say full, dense, causal attention (exact class:
# a subclass of them is a different kind of cache, unknown here until this table says so).
_FULL = ("FullAttentionSpec", "MLAAttentionSpec")
_UNIFORM = "UniformTypeKVCacheSpecs"


def decide_groups(
    kv_cache_config: Any, attn_groups: list[list[Any]], freed: Any = None
) -> list[GroupDecision]:
    """One decision per KV-cache group the draft reads (a non-empty ``attn_groups[g]``);
    ``freed``: what ``draft_window_free_kv`` did (``kv_cost.Freed``: the draft layers it
    turned into a sliding window, and its tokens), or None."""
    decisions = []
    for g, groups in enumerate(attn_groups):
        if not groups:
            continue
        group = kv_cache_config.kv_cache_groups[g]
        spec = group.kv_cache_spec
        windowed, reason, unknown = classify(spec, _converted(group, freed))
        decisions.append(GroupDecision(g, _kind(spec), spec.block_size, windowed, reason, unknown))
    return decisions


def _converted(group: Any, freed: Any) -> int | None:
    """The tokens the group's layers keep where ``draft_window_free_kv`` made them a sliding
    window (every layer of the group one it converted, the spec still that window), else
    None; a group holding a converted layer that vLLM turned back into full attention stops
    start-up (the draft's KV would stay whole while the window's plan counted it freed)."""
    if freed is None or not set(group.layer_names) & freed.layers:
        return None
    spec = group.kv_cache_spec
    if (
        set(group.layer_names) <= freed.layers
        and type(spec).__name__ == "SlidingWindowSpec"
        and spec.sliding_window == freed.tokens
    ):
        return freed.tokens
    raise ValueError(
        f"{FREE_KV_KEY}=true: vLLM grouped the draft layers it converted "
        f"({', '.join(sorted(set(group.layer_names) & freed.layers))}) as {_kind(spec)}, not "
        f"as the sliding window of {freed.tokens} tokens the key gave them. Remove "
        f"{FREE_KV_KEY} ({KEY} still windows what the draft reads)."
    )


def classify(spec: Any, freed_tokens: int | None = None) -> tuple[bool, str, bool]:
    """(windowed, reason, unknown class) for one KV-cache spec. ``freed_tokens``: the spec is
    a draft full-attention layer's that ``draft_window_free_kv`` turned into a sliding window
    of that many tokens (``decide_groups`` knows by its layers): its layers attend over the
    whole context, and the window reads only blocks vLLM keeps (``kv_cache.py``)."""
    from vllm.v1 import kv_cache_interface

    name = type(spec).__name__
    if freed_tokens is not None:
        return True, f"full attention, its KV before the last {freed_tokens} tokens freed", False
    if name == _UNIFORM:
        members = [classify(member, freed_tokens) for member in spec.kv_cache_specs.values()]
        for windowed, reason, unknown in members:
            if not windowed:
                return False, f"a member layer is not windowed: {reason}", unknown
        return True, "every layer attends over the whole context, one token per slot", False
    for class_name, reason in _NOT_WINDOWED:
        cls = getattr(kv_cache_interface, class_name, None)
        if isinstance(cls, type) and isinstance(spec, cls):
            return False, reason, False
    if name not in _FULL:
        return False, f"a KV-cache spec the draft window does not know ({name})", True
    tokens_per_state = getattr(spec, "tokens_per_state", 1)
    if tokens_per_state != 1:
        return False, f"compressed: one state per {tokens_per_state} tokens", False
    if getattr(spec, "sliding_window", None) is not None:
        window = spec.sliding_window
        return False, f"a sliding window of {window} tokens computed in the layer", False
    if getattr(spec, "attention_chunk_size", None) is not None:
        return False, "chunked local attention computed in the layer", False
    if getattr(spec, "non_causal", False):
        return False, "non-causal attention over absolute positions", False
    if getattr(spec, "topk_buffer_width", None) is not None:
        return False, "sparse MLA: top-k tokens chosen over the whole context", False
    role = getattr(spec, "cache_role", None)
    if role is not None and getattr(role, "value", role) != "sparse":
        return False, f"a sparse-attention {getattr(role, 'value', role)} cache", False
    return True, "full attention over the whole context, one token per slot", False


def _kind(spec: Any) -> str:
    name = type(spec).__name__
    if name == _UNIFORM:
        members = sorted({type(member).__name__ for member in spec.kv_cache_specs.values()})
        return f"{name}[{', '.join(members)}]"
    return name


def describe_decisions(decisions: list[GroupDecision]) -> str:
    """``windowed: group 0 (FullAttentionSpec, block size 16); not windowed: group 1 (...):
    why``."""
    windowed = [d.describe() for d in decisions if d.windowed]
    unwindowed = [f"{d.describe()}: {d.reason}" for d in decisions if not d.windowed]
    parts = []
    if windowed:
        parts.append("windowed: " + ", ".join(windowed))
    if unwindowed:
        parts.append("not windowed: " + "; ".join(unwindowed))
    return "; ".join(parts)
