# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Which draft KV cache groups are windowed: causal full attention, one token per slot."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_ascend.worker.v2.spec_decode.draft_window.config import FREE_KV_KEY, KEY

if TYPE_CHECKING:
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, KVCacheSpec
    from vllm.v1.worker.utils import AttentionGroup


@dataclass(frozen=True)
class Freed:
    """Draft ``layers`` that ``draft_window_free_kv`` made a sliding window of ``tokens``."""

    tokens: int
    layers: frozenset[str]


@dataclass(frozen=True)
class GroupDecision:
    group_id: int
    spec_kind: str
    block_size: int
    windowed: bool
    reason: str
    # A spec class not known here (not windowed, with a warning).
    unknown: bool = False

    def describe(self) -> str:
        return f"group {self.group_id} ({self.spec_kind}, block size {self.block_size})"


# Never windowed (subclasses included); names missing from the installed vLLM are skipped.
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
# Windowed when their fields say full, dense, causal attention (exact class only).
_FULL = ("FullAttentionSpec", "MLAAttentionSpec")
_UNIFORM = "UniformTypeKVCacheSpecs"


def decide_groups(
    kv_cache_config: KVCacheConfig,
    attn_groups: list[list[AttentionGroup]],
    freed: Freed | None = None,
) -> list[GroupDecision]:
    """One decision per KV cache group the draft reads (a non-empty ``attn_groups[g]``)."""
    decisions = []
    for g, groups in enumerate(attn_groups):
        if not groups:
            continue
        group = kv_cache_config.kv_cache_groups[g]
        spec = group.kv_cache_spec
        windowed, reason, unknown = classify(spec, _converted(group, freed))
        decisions.append(GroupDecision(g, _kind(spec), spec.block_size, windowed, reason, unknown))
    return decisions


def _converted(group: KVCacheGroupSpec, freed: Freed | None) -> int | None:
    """The sliding window ``draft_window_free_kv`` gave the group's layers, else None."""
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


def classify(spec: KVCacheSpec, freed_tokens: int | None = None) -> tuple[bool, str, bool]:
    """(windowed, reason, unknown class) for one KV cache spec; ``freed_tokens``: a full
    attention spec ``draft_window_free_kv`` converted to a sliding window."""
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


def _kind(spec: KVCacheSpec) -> str:
    name = type(spec).__name__
    if name == _UNIFORM:
        members = sorted({type(member).__name__ for member in spec.kv_cache_specs.values()})
        return f"{name}[{', '.join(members)}]"
    return name


def describe_decisions(decisions: Sequence[GroupDecision]) -> str:
    windowed = [d.describe() for d in decisions if d.windowed]
    unwindowed = [f"{d.describe()}: {d.reason}" for d in decisions if not d.windowed]
    parts = []
    if windowed:
        parts.append("windowed: " + ", ".join(windowed))
    if unwindowed:
        parts.append("not windowed: " + "; ".join(unwindowed))
    return "; ".join(parts)
