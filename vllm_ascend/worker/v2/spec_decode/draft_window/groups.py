# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Which draft KV cache groups are windowed: dense, causal full attention, one token per slot."""

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


def decide_groups(
    kv_cache_config: KVCacheConfig,
    attn_groups: list[list[AttentionGroup]],
    freed: Freed | None = None,
) -> list[GroupDecision]:
    """One decision per KV cache group the draft reads, by the specs of the draft's layers."""
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs

    decisions = []
    for g, groups in enumerate(attn_groups):
        if not groups:
            continue
        group = kv_cache_config.kv_cache_groups[g]
        spec = group.kv_cache_spec
        layer_names = None
        if isinstance(spec, UniformTypeKVCacheSpecs):
            layer_names = sorted({name for attn_group in groups for name in attn_group.layer_names})
        windowed, reason = classify(spec, _converted(group, freed), layer_names)
        decisions.append(GroupDecision(g, _kind(spec), spec.block_size, windowed, reason))
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


def classify(
    spec: KVCacheSpec, freed_tokens: int | None = None, layer_names: Sequence[str] | None = None
) -> tuple[bool, str]:
    """(windowed, reason) for one KV cache spec, by its class and fields; ``freed_tokens``: full
    attention ``draft_window_free_kv`` made a sliding window; ``layer_names``: the members of a
    uniform-type spec to decide (all without)."""
    from vllm.v1 import kv_cache_interface
    from vllm.v1.kv_cache_interface import FullAttentionSpec, UniformTypeKVCacheSpecs

    if freed_tokens is not None:
        return True, f"full attention, its KV before the last {freed_tokens} tokens freed"
    if isinstance(spec, UniformTypeKVCacheSpecs):
        members = spec.kv_cache_specs
        for name in layer_names or sorted(members):
            windowed, reason = classify(members[name])
            if not windowed:
                return False, f"layer {name} is not windowed: {reason}"
        return True, "every layer attends over the whole context, one token per slot"
    for class_name, reason in _NOT_WINDOWED:
        cls = getattr(kv_cache_interface, class_name, None)
        if isinstance(cls, type) and isinstance(spec, cls):
            return False, reason
    if _is_ascend_indexer_cache(spec):
        return False, "vllm-ascend's sparse-attention (SFA) indexer cache, not attention KV"
    if not isinstance(spec, FullAttentionSpec):
        return False, f"a KV-cache spec the draft window does not know ({type(spec).__name__})"
    if spec.tokens_per_state != 1:
        return False, f"compressed: one state per {spec.tokens_per_state} tokens"
    if spec.sliding_window is not None:
        return False, f"a sliding window of {spec.sliding_window} tokens computed in the layer"
    if spec.attention_chunk_size is not None:
        return False, "chunked local attention computed in the layer"
    if spec.non_causal:
        return False, "non-causal attention over absolute positions"
    if getattr(spec, "topk_buffer_width", None) is not None:
        return False, "sparse MLA: top-k tokens chosen over the whole context"
    role = getattr(spec, "cache_role", None)
    if role is not None and getattr(role, "value", role) != "sparse":
        return False, f"a sparse-attention {getattr(role, 'value', role)} cache"
    if getattr(spec, "store_on_host", False):
        return False, "stored on the host (sparse KV offload): read by absolute slots"
    if getattr(spec, "cache_sparse_sfa_c8", False) or getattr(spec, "cache_sparse_sfa_turboquant", False):
        return (
            False,
            "a packed sparse-attention (SFA) main cache: top-k tokens of the whole context",
        )
    if getattr(spec, "non_causal_multi_token_decode", False):
        # NOTE: the draft's query block attends within itself (no mask) and over the
        # context before it; the window crops that context, and the block, its last
        # num_speculative_tokens + 1 positions, lies inside every window.
        return True, (
            "full attention over the whole context, one token per slot (the draft's query block attends within itself)"
        )
    return True, "full attention over the whole context, one token per slot"


def _is_ascend_indexer_cache(spec: KVCacheSpec) -> bool:
    """vllm-ascend's SFA indexer cache (its ``cache_role`` is the main cache's default)."""
    try:
        from vllm_ascend.core.kv_cache_interface import AscendSFAIndexerCacheSpec
    except ImportError:  # vLLM without vllm-ascend (the plugin on CUDA)
        return False
    return isinstance(spec, AscendSFAIndexerCacheSpec)


def _kind(spec: KVCacheSpec) -> str:
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs

    name = type(spec).__name__
    if isinstance(spec, UniformTypeKVCacheSpecs):
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
