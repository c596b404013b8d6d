"""Which of a draft's KV-cache groups the window serves, and which parallel layouts it
refuses: decisions with reasons, made once at ``set_attn``; the arithmetic never sees them.

A group is windowed only when its layers attend over every token of the request, one
token per cache slot, causally: ``FullAttentionSpec`` and ``MLAAttentionSpec`` without a
sliding window, chunk, compression, sparsity or sinks of their own (and a per-layer-uniform
wrapper whose every member is such). Cropping its table to the window then reads exactly
the window's tokens. Every other group is left alone, and kept out of the alignment: its own
spec already bounds or reshapes what it reads (a sliding window the layer was trained with,
a chunk, a ring, compressed or sparse states, recurrent state), or its early columns are not
the request's first tokens, so neither a window start nor sinks mean anything there. A spec
class this table does not know is left alone too, with a warning that names it: a window is
never applied by default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_ascend.worker.v2.spec_decode.draft_window.config import KEY
from vllm_ascend.worker.v2.spec_decode.draft_window.lines import SUPPORTED as SUPPORTED_LINES


@dataclass(frozen=True)
class GroupDecision:
    """The window's decision for one draft KV-cache group."""

    group_id: int
    spec_kind: str
    block_size: int
    windowed: bool
    reason: str
    # A spec class the table does not know (left alone, with a warning).
    unknown: bool = False

    def describe(self) -> str:
        return f"group {self.group_id} ({self.spec_kind}, block size {self.block_size})"


# Spec classes left alone whatever their fields, by the vLLM class name (isinstance, so
# their subclasses too), with the reason. A name missing from the installed vLLM is skipped.
_LEFT_ALONE = (
    ("SlidingWindowSpec", "a sliding window the layer reads by itself (and was trained with)"),
    ("ChunkedLocalAttentionSpec", "chunked local attention: the layer reads its own chunk"),
    ("CircularBufferSpec", "a ring buffer, one block per request: its columns are no range "
     "of positions"),
    ("MambaSpec", "recurrent (mamba/SSM) state: no per-token KV to window"),
    ("HiddenStateCacheSpec", "a hidden-state cache, not attention KV"),
    ("EncoderOnlyAttentionSpec", "encoder attention: no KV of the request's tokens"),
    ("CrossAttentionSpec", "cross attention over the encoder's states"),
    ("SinkFullAttentionSpec", "attention sinks the model declares itself"),
    ("RSWASpec", "restricted sliding window: its tables already leave the gap out"),
    ("HiSparseHotSpec", "a sparse (HiSparse) cache"),
    ("HiSparseResidentSpec", "a sparse (HiSparse) cache"),
)  # fmt: skip
# Spec classes windowed when their fields say full, dense, causal attention (exact class:
# a subclass of them is a different kind of cache, unknown here until this table says so).
_FULL = ("FullAttentionSpec", "MLAAttentionSpec")
_UNIFORM = "UniformTypeKVCacheSpecs"


def decide_groups(kv_cache_config: Any, attn_groups: list[list[Any]]) -> list[GroupDecision]:
    """One decision per KV-cache group the draft reads (a non-empty ``attn_groups[g]``)."""
    decisions = []
    for g, groups in enumerate(attn_groups):
        if not groups:
            continue
        spec = kv_cache_config.kv_cache_groups[g].kv_cache_spec
        windowed, reason, unknown = classify(spec)
        decisions.append(GroupDecision(g, _kind(spec), spec.block_size, windowed, reason, unknown))
    return decisions


def classify(spec: Any) -> tuple[bool, str, bool]:
    """(windowed, reason, unknown class) for one KV-cache spec."""
    from vllm.v1 import kv_cache_interface

    name = type(spec).__name__
    if name == _UNIFORM:
        members = [classify(member) for member in spec.kv_cache_specs.values()]
        for windowed, reason, unknown in members:
            if not windowed:
                return False, f"a member layer is left alone: {reason}", unknown
        return True, "every layer attends over the whole context, one token per slot", False
    for class_name, reason in _LEFT_ALONE:
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
    """``windowed: group 0 (FullAttentionSpec, block size 16); left alone: group 1 (...): why``."""
    windowed = [d.describe() for d in decisions if d.windowed]
    left = [f"{d.describe()}: {d.reason}" for d in decisions if not d.windowed]
    parts = []
    if windowed:
        parts.append("windowed: " + ", ".join(windowed))
    if left:
        parts.append("left alone: " + "; ".join(left))
    return "; ".join(parts)


def refuse_parallel_layout(parallel_config: Any, window_size: int) -> None:
    """Stop on a parallel layout whose draft KV one block-aligned window cannot crop."""
    layouts = (
        ("decode_context_parallel_size", "each rank holds an interleaved shard of the KV"),
        ("prefill_context_parallel_size", "the draft prefill builds metadata for the global "
         "batch while each rank runs its own split of the tokens"),
    )  # fmt: skip
    for name, why in layouts:
        size = getattr(parallel_config, name, 1) or 1
        if size > 1:
            raise ValueError(
                f"{KEY}={window_size} does not support {name}={size}: {why}, which one "
                f"block-aligned window per request cannot crop. Use {name}=1 or remove {KEY}."
            )


def refuse_method(method: str, line: Any, window_size: int) -> None:
    """Stop on a speculative method the window is not proven for on the installed line."""
    if method in line.methods:
        return
    raise ValueError(
        f"{KEY}={window_size} is not supported on Model Runner V2 for speculative method "
        f"{method!r} on {line.name}; supported there: {', '.join(line.methods)}. Remove {KEY} "
        f"from additional_config or use one of those methods."
    )


def refuse_unproven_paths(
    speculator: Any, line: Any, decisions: list[GroupDecision], window_size: int
) -> None:
    """Stop where the draft's kernel would take lengths the window does not set on this line:
    an attention backend outside ``line.backends`` on a windowed group, or vllm-ascend's
    sparse KV offload."""
    backends = line.backends_for(speculator.method)
    for decision in decisions:
        if not decision.windowed:
            continue
        for group in speculator.attn_groups[decision.group_id]:
            name, module = group.backend.__name__, group.backend.__module__
            if backends is not None and name not in backends:
                raise ValueError(
                    f"{KEY}={window_size} is not supported on {line.name} for "
                    f"{speculator.method} with {decision.describe()} on attention "
                    f"backend {name}: its kernel takes host lengths the window does not "
                    f"set yet (supported: {', '.join(backends)}). Remove {KEY}."
                )
            if backends is None and not module.startswith("vllm."):
                # NOTE: a platform plugin's backend (vllm-ascend's on a later vLLM) may
                # tell its kernel host lengths of its own, which only that line's hooks
                # window: served without them, the kernel would read outside the window.
                raise ValueError(
                    f"{KEY}={window_size} is not supported on {line.name} for "
                    f"{speculator.method} with {decision.describe()} on attention "
                    f"backend {name} from {module}, defined outside vLLM: the window is "
                    f"proven on this line for vLLM's own backends only. Use a supported "
                    f"line for that platform ({SUPPORTED_LINES}), run Model Runner V1 "
                    f"(VLLM_USE_V2_MODEL_RUNNER=0), or remove {KEY}."
                )
    if getattr(speculator, "replicated_pcp", False):
        raise ValueError(
            f"{KEY}={window_size} does not support prefill_context_parallel_size > 1 with "
            f"{line.name}'s replicated draft: its draft prefill rebuilds metadata for the "
            f"global batch outside the window's hooks. Use prefill_context_parallel_size=1 "
            f"or remove {KEY}."
        )
    # vllm-ascend builds these buffers only with sparse_kv_offload_config enabled.
    offload = getattr(speculator, "_sparse_kv_offload_metadata", None)
    if getattr(offload, "req_ids_buffers", None):
        raise ValueError(
            f"{KEY}={window_size} is not supported on {line.name} with vllm-ascend's "
            f"sparse_kv_offload_config enabled: its draft metadata reads offloaded KV by "
            f"absolute slots the window does not crop. Remove {KEY} or disable the offload."
        )


def told_bound_family(speculator: Any, line: Any) -> str | None:
    """The target family (``line.dspark_host_length_targets``) for whose DSpark drafts the
    kernel takes the host bound plus the step as the exact length, or None."""
    if not line.dspark_host_length_targets:
        return None
    hf_config = getattr(speculator.vllm_config.model_config, "hf_text_config", None)
    model_type = str(getattr(hf_config, "model_type", "") or "").lower()
    return next((f for f in line.dspark_host_length_targets if f in model_type), None)


def refuse_told_length_paths(
    speculator: Any, line: Any, decisions: list[GroupDecision], window_size: int, per_step: bool
) -> None:
    """Stop where the window start cannot come from the length vllm-ascend's kernel is told.

    The device takes it from the target's device lengths, the host from vllm-ascend's host
    mirror of them: the two agree only where vllm-ascend syncs its host counts after
    rejection (not for DeepSeek-V4.1 targets). ``per_step`` (EAGLE decode): vllm-ascend writes
    one host length list into every draft layer, so no group may be left alone; and its
    draft prefill rebuilds through a model state without a second prepare for KV prefetch
    or device-built metadata."""
    hf_config = getattr(speculator.vllm_config.model_config, "hf_config", None)
    try:
        from vllm_ascend.utils import is_deepseek_v41
    except ImportError:  # not vllm-ascend's line: nothing told
        return
    if hf_config is not None and is_deepseek_v41(hf_config):
        raise ValueError(
            f"{KEY}={window_size} is not supported on {line.name} for {speculator.method} "
            f"with a DeepSeek-V4.1 target: vllm-ascend does not sync its host lengths after "
            f"rejection there, so the length its kernel is told and the device's differ. "
            f"Remove {KEY}."
        )
    if not per_step:
        return
    left = [d for d in decisions if not d.windowed]
    if left:
        raise ValueError(
            f"{KEY}={window_size} is not supported on {line.name} for {speculator.method} "
            f"with draft KV-cache groups the window leaves alone ({describe_decisions(left)}): "
            f"vllm-ascend writes one host length list into every draft layer. Remove {KEY}."
        )
    model_state = getattr(speculator, "model_state", None)
    for name in ("kvpp_runtime", "device_metadata"):
        if getattr(model_state, name, None) is not None:
            raise ValueError(
                f"{KEY}={window_size} is not supported on {line.name} for {speculator.method} "
                f"with the model state's {name} (KV prefetch or device-built metadata): the "
                f"draft prefill's windowed rebuild would run its per-step state twice. "
                f"Remove {KEY}."
            )
