# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""``draft_window_free_kv``: each draft full-attention layer declares a ``SlidingWindowSpec``
of ``N = W + a - b`` tokens, so vLLM frees its KV before the window. A pass from position
``C`` reads at or after ``C - W - a + 2``; vLLM frees only blocks wholly before ``C - N + 1``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from vllm_ascend.worker.v2.spec_decode.draft_window import groups
from vllm_ascend.worker.v2.spec_decode.draft_window.config import (
    AUTO,
    FREE_KV_KEY,
    KEY,
    MIN_CONTEXT_KEY,
    SINKS_KEY,
    DraftWindowConfig,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.declared import (
    Declared,
    auto_window_size,
    declared_context,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.methods import METHODS, Kind
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.kv_reclaim import (
    Freed,
    Reclaim,
    describe,
    draft_block_sizes,
    grouped,
    reclaim,
    table_bytes,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.log import logger
from vllm_ascend.worker.v2.spec_decode.draft_window.release import Release
from vllm_ascend.worker.v2.spec_decode.draft_window.window import WindowSpec

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheSpec
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner


def asks_free_kv(runner: GPUModelRunner) -> bool:
    """Whether ``draft_window_free_kv`` is true (runners in tests may have no config)."""
    additional = getattr(getattr(runner, "vllm_config", None), "additional_config", None)
    return isinstance(additional, dict) and additional.get(FREE_KV_KEY) is True


def draft_kv_cache_spec(
    runner: GPUModelRunner,
    specs: dict[str, KVCacheSpec],
    table_width: Callable[[int, int], int] | None,
) -> tuple[dict[str, KVCacheSpec], Freed | None]:
    """The runner's KV cache specs with the draft's layers converted, and what is freed."""
    speculator = getattr(runner, "speculator", None)
    if speculator is None:
        return specs, None
    vllm_config = runner.vllm_config
    config = DraftWindowConfig.from_additional_config(vllm_config.additional_config)
    draft_layers = set(getattr(speculator, "draft_attn_layer_names", None) or ())
    if not draft_layers & specs.keys():
        raise ValueError(
            f"{FREE_KV_KEY}=true: the draft's attention layers "
            f"({', '.join(sorted(draft_layers)) or 'none'}) keep no KV cache of their own (they "
            f"read the target's), so there is no draft KV to free. Remove {FREE_KV_KEY}."
        )
    declared = None
    if config.auto:
        declared = declared_context(vllm_config)
        if declared.tokens is None:
            logger.info(
                "%s: %s=%s and the draft checkpoint %s declares no training context, so the "
                "draft window stays off and %s frees nothing: the draft's KV stays whole.",
                FREE_KV_KEY,
                KEY,
                AUTO,
                declared.checkpoint,
                FREE_KV_KEY,
            )
            return specs, None
    window_size = None if config.auto else config.draft_window_size
    planned = free_draft_kv(vllm_config, specs, draft_layers, window_size, declared, table_width)
    if planned is None:
        return specs, None
    converted, found = planned
    logger.info(describe(found, vllm_config))
    return converted, found.freed


def free_draft_kv(
    vllm_config: VllmConfig,
    kv_cache_spec: dict[str, KVCacheSpec],
    draft_layers: set[str],
    window_size: int | None,
    declared: Declared | None = None,
    table_width: Callable[[int, int], int] | None = None,
    refuse: bool = True,
) -> tuple[dict[str, KVCacheSpec], Reclaim] | None:
    """Convert the draft's full-attention specs; None (logged) where nothing is freed."""
    layers = {name for name in draft_layers & kv_cache_spec.keys() if convertible(kv_cache_spec[name])}
    if not layers:
        raise ValueError(
            f"{FREE_KV_KEY}=true: no draft layer has full attention whose KV the window could "
            f"free (draft layers: {', '.join(sorted(draft_layers)) or 'none'}). Remove "
            f"{FREE_KV_KEY}."
        )
    # N counts in the block sizes vLLM's grouping sets, which do not depend on N.
    probe = sliding_draft_specs(kv_cache_spec, layers, window_size or declared.tokens)
    block_sizes = draft_block_sizes(grouped(vllm_config, probe), layers)
    max_model_len = vllm_config.model_config.max_model_len
    if window_size is None:
        window_size = _auto_window(declared, math.lcm(*block_sizes), max_model_len)
        if window_size is None:
            return None
        asked = AUTO
    else:
        asked = window_size
    tokens = _retained_tokens(WindowSpec.derive(window_size, block_sizes), block_sizes, asked, max_model_len)
    if tokens is None:
        return None
    converted, tokens = _apart_from_other_layers(kv_cache_spec, layers, tokens)
    if tokens >= max_model_len:
        logger.info("%s frees nothing: the draft's KV stays whole.", FREE_KV_KEY)
        return None
    found = reclaim(vllm_config, kv_cache_spec, converted, Freed(tokens, frozenset(layers)))
    found = dataclasses.replace(found, table_bytes=table_bytes(vllm_config, found, table_width))
    if refuse and (why := found.refusal()) is not None:
        raise ValueError(f"{FREE_KV_KEY}=true {why}. Remove {FREE_KV_KEY} ({KEY} still windows what the draft reads).")
    return converted, found


def _auto_window(declared: Declared, alignment: int, max_model_len: int) -> int | None:
    """``"auto"``'s window as set_attn will size it; None (logged) where it stays off."""
    if declared.tokens >= max_model_len:
        logger.info(
            "%s: %s=%s and the draft checkpoint %s declares %s=%d, not below "
            "max_model_len=%d, so the draft window stays off and %s frees nothing: the "
            "draft's KV stays whole.",
            FREE_KV_KEY,
            KEY,
            AUTO,
            declared.checkpoint,
            declared.field,
            declared.tokens,
            max_model_len,
            FREE_KV_KEY,
        )
        return None
    window_size = auto_window_size(declared.tokens, alignment)
    if window_size < 1:
        logger.info(
            "%s: %s=%s sizes no window over the draft's KV-cache groups: the draft "
            "checkpoint %s declares %s=%d, so W = %d - %d + 1 = %d (alignment %d) is below "
            "1 token, and %s frees nothing: the draft's KV stays whole.",
            FREE_KV_KEY,
            KEY,
            AUTO,
            declared.checkpoint,
            declared.field,
            declared.tokens,
            declared.tokens,
            alignment,
            window_size,
            alignment,
            FREE_KV_KEY,
        )
        return None
    return window_size


def _retained_tokens(spec: WindowSpec, block_sizes: list[int], asked: int | str, max_model_len: int) -> int | None:
    """``N = W + a - b``; None (logged) where it frees nothing or the window stays off."""
    block_size = min(block_sizes)
    tokens = spec.retained_tokens(block_size)
    if tokens >= max_model_len:
        logger.info(
            "%s: with %s=%s the draft's KV-cache groups would keep N = W + a - b = %d + %d - "
            "%d = %d tokens per request, not below max_model_len=%d, so %s frees nothing: "
            "the draft's KV stays whole.",
            FREE_KV_KEY,
            KEY,
            asked,
            spec.window_size,
            spec.alignment,
            block_size,
            tokens,
            max_model_len,
            FREE_KV_KEY,
        )
        return None
    if spec.reach > max_model_len or spec.min_context > max_model_len:
        # set_attn turns the window off by the same test.
        logger.info(
            "%s: %s=%s never crops with max_model_len=%d (it crops contexts of W + a = %d tokens "
            "or more), so the draft window stays off and %s frees nothing: the draft's KV "
            "stays whole.",
            FREE_KV_KEY,
            KEY,
            asked,
            max_model_len,
            spec.reach,
            FREE_KV_KEY,
        )
        return None
    return tokens


def _apart_from_other_layers(
    kv_cache_spec: dict[str, KVCacheSpec], layers: set[str], tokens: int
) -> tuple[dict[str, KVCacheSpec], int]:
    """The converted specs, with ``N`` raised until no draft spec equals another layer's:
    vLLM groups equal specs together (``is_draft`` aside); a larger ``N`` stays exact."""
    kept = tokens
    converted = sliding_draft_specs(kv_cache_spec, layers, tokens)
    while _shared_with_other_layers(converted, layers):
        tokens += 1
        converted = sliding_draft_specs(kv_cache_spec, layers, tokens)
    if tokens != kept:
        logger.info(
            "%s: the draft keeps %d tokens per request, not %d: a layer outside the draft has "
            "a sliding window of %d tokens and the same KV layout, and vLLM would group the "
            "two together.",
            FREE_KV_KEY,
            tokens,
            kept,
            kept,
        )
    return converted, tokens


def convertible(spec: KVCacheSpec) -> bool:
    """Whether the key converts ``spec``: plain, dense, causal full attention."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    return type(spec) is FullAttentionSpec and groups.classify(spec)[0]


def _shared_with_other_layers(converted: dict[str, KVCacheSpec], layers: set[str]) -> bool:
    others = [spec for name, spec in converted.items() if name not in layers]
    return any(converted[name] in others for name in layers)


def sliding_draft_specs(kv_cache_spec: dict[str, KVCacheSpec], layers: set[str], tokens: int) -> dict[str, KVCacheSpec]:
    """``kv_cache_spec`` with ``layers`` as ``SlidingWindowSpec`` of ``tokens``."""
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    converted = dict(kv_cache_spec)
    for name in layers:
        spec = kv_cache_spec[name]
        fields = {
            field.name: getattr(spec, field.name)
            for field in dataclasses.fields(SlidingWindowSpec)
            if field.init and field.name != "sliding_window" and hasattr(spec, field.name)
        }
        converted[name] = SlidingWindowSpec(**{**fields, "sliding_window": tokens})
    return converted


def refuse_free_kv(vllm_config: VllmConfig, config: DraftWindowConfig, release: Release | None) -> None:
    """Raise where ``draft_window_free_kv`` cannot be exact or would free nothing."""
    reason = None
    method = getattr(vllm_config.speculative_config, "method", None)
    if METHODS.get(method) is Kind.MTP:
        reason = (
            f"for speculative method {method!r}: the draft window leaves MTP drafts alone "
            "(their modules are trained over the target's whole context, or read the target's "
            "own KV), so no draft KV is windowed and none can be freed"
        )
    elif release is not None and release.free_kv_unserved is not None:
        reason = f"on {release.name}: {release.free_kv_unserved}"
    elif config.draft_attention_sinks:
        reason = (
            f"with {SINKS_KEY}={config.draft_attention_sinks}: vLLM's sliding-window KV cache "
            "manager frees a request's first blocks too, the sinks' among them"
        )
    elif config.draft_window_min_context:
        reason = (
            f"with {MIN_CONTEXT_KEY}={config.draft_window_min_context}: a request below it "
            "reads its whole context, which the draft would then have to keep"
        )
    elif vllm_config.parallel_config.decode_context_parallel_size > 1:
        reason = (
            "under decode context parallelism: vLLM's sliding-window KV cache is one rank's, "
            "never sharded across decode-context-parallel ranks"
        )
    elif vllm_config.scheduler_config.disable_hybrid_kv_cache_manager:
        reason = (
            "with the hybrid KV cache manager off (--disable-hybrid-kv-cache-manager, or vLLM "
            "turned it off, as for a KV connector without its support): vLLM then merges every "
            "layer into one full-attention group and frees nothing"
        )
    if reason is not None:
        raise ValueError(
            f"{FREE_KV_KEY}=true cannot be served {reason}. Remove {FREE_KV_KEY} ({KEY} still "
            "windows what the draft reads)."
        )
