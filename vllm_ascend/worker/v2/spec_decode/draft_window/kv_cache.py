# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""``draft_window_free_kv``: the draft's KV before the window given back to vLLM's KV cache
manager, which frees it as it frees a sliding-window layer's.

With the key, each of the draft's full-attention layers declares a ``SlidingWindowSpec`` of
``N`` tokens as its KV-cache spec, and nothing else changes: its kernel still attends over
whatever table and lengths it is handed (the layer's own ``sliding_window`` stays None), the
window still hands it the cropped tables and windowed lengths, and slot mappings stay
absolute. vLLM then groups the draft's layers apart from the target's, and its
``SlidingWindowManager`` frees a request's draft blocks wholly before the last ``N - 1``
tokens it has processed (and MRV2 nulls them in the step's gathered tables).

Exact (design doc, section 3.4): ``N = W + a - b`` (``WindowSpec.retained_tokens``; ``a``:
the alignment, ``b``: the draft group's block size as vLLM's grouping sets it). A pass whose
first query position is ``C`` reads from a multiple of ``a`` at or after ``C - W - a + 2``,
while vLLM frees and nulls only blocks wholly before ``C - N + 1``; one token fewer and a
read at ``L = C + 1`` finds a freed block. ``"auto"`` sizes ``W = C_d - a + 1`` from the
context ``C_d`` the checkpoint declares, so there ``N = C_d - b + 1``.

Without the key nothing here runs: the runner's specs come back as vLLM made them, and
nothing of the runner is read.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

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
from vllm_ascend.worker.v2.spec_decode.draft_window.kv_cost import (
    Freed,
    Reclaim,
    describe,
    draft_block_sizes,
    grouped,
    reclaim,
    table_bytes,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.log import logger
from vllm_ascend.worker.v2.spec_decode.draft_window.methods import METHODS, Kind
from vllm_ascend.worker.v2.spec_decode.draft_window.release import Release
from vllm_ascend.worker.v2.spec_decode.draft_window.window import WindowSpec


def asks_free_kv(runner: Any) -> bool:
    """Whether the runner's config sets ``draft_window_free_kv`` to true; reads nothing else
    (vLLM's own tests build runners without a config, or with stand-ins)."""
    additional = getattr(getattr(runner, "vllm_config", None), "additional_config", None)
    return isinstance(additional, dict) and additional.get(FREE_KV_KEY) is True


def draft_kv_cache_spec(
    runner: Any, specs: dict[str, Any], table_width: Any
) -> tuple[dict[str, Any], Freed | None]:
    """The runner's KV-cache specs with ``draft_window_free_kv`` (``asks_free_kv``): the
    draft's full-attention layers freed before the window, said once; and what was freed,
    for the speculator's ``set_attn`` (None: the draft's KV stays whole). ``table_width``:
    the release's ``get_block_table_width``."""
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
    vllm_config: Any,
    kv_cache_spec: dict[str, Any],
    draft_layers: set[str],
    window_size: int | None,
    declared: Declared | None = None,
    table_width: Any = None,
    refuse: bool = True,
) -> tuple[dict[str, Any], Reclaim] | None:
    """The model's KV-cache specs with each draft full-attention layer's turned into a
    ``SlidingWindowSpec`` of ``N`` tokens, and what that frees; None (said once) where it
    would free nothing: ``"auto"`` sizes no window, or ``N`` reaches ``max_model_len``.
    ``window_size`` None: ``"auto"`` over the ``declared`` context. With ``refuse``, a
    ``ValueError`` naming the key where it cannot be served or is refused."""
    layers = {
        name for name in draft_layers & kv_cache_spec.keys() if convertible(kv_cache_spec[name])
    }
    if not layers:
        raise ValueError(
            f"{FREE_KV_KEY}=true: no draft layer has full attention whose KV the window could "
            f"free (draft layers: {', '.join(sorted(draft_layers)) or 'none'}). Remove "
            f"{FREE_KV_KEY}."
        )
    # vLLM's grouping sets the draft groups' block sizes (it raises a smaller page's to unify
    # page sizes), and N is counted in them: a first grouping, whose block sizes do not
    # depend on the window's length, then N.
    probe = sliding_draft_specs(kv_cache_spec, layers, window_size or declared.tokens)
    block_sizes = draft_block_sizes(grouped(vllm_config, probe), layers)
    alignment = math.lcm(*block_sizes)
    asked = AUTO if window_size is None else window_size
    max_model_len = vllm_config.model_config.max_model_len
    if window_size is None and declared.tokens >= max_model_len:
        # The same test turns the window off at set_attn (plan.py): nothing to free.
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
    if window_size is None:
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
    block_size = min(block_sizes)
    spec = WindowSpec.derive(window_size, block_sizes)
    tokens = spec.retained_tokens(block_size)
    if tokens >= max_model_len:
        logger.info(
            "%s: with %s=%s the draft's KV-cache groups would keep N = W + a - b = %d + %d - "
            "%d = %d tokens per request, not below max_model_len=%d, so %s frees nothing: "
            "the draft's KV stays whole.",
            FREE_KV_KEY,
            KEY,
            asked,
            window_size,
            alignment,
            block_size,
            tokens,
            max_model_len,
            FREE_KV_KEY,
        )
        return None
    if not spec.crops_within(max_model_len):
        # The same test turns the window off at set_attn (plan.py): nothing to free.
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
    converted = sliding_draft_specs(kv_cache_spec, layers, tokens)
    kept = tokens
    while _shared_with_other_layers(converted, layers):
        # vLLM groups layers of equal specs together: one token more than the reads need
        # keeps the draft's groups its own (and stays exact).
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
        if tokens >= max_model_len:
            logger.info("%s frees nothing: the draft's KV stays whole.", FREE_KV_KEY)
            return None
    found = reclaim(vllm_config, kv_cache_spec, converted, Freed(tokens, frozenset(layers)))
    found = dataclasses.replace(found, table_bytes=table_bytes(vllm_config, found, table_width))
    if refuse and (why := found.refusal()) is not None:
        raise ValueError(
            f"{FREE_KV_KEY}=true {why}. Remove {FREE_KV_KEY} ({KEY} still windows what the "
            "draft reads)."
        )
    return converted, found


def convertible(spec: Any) -> bool:
    """A spec the key frees: plain, dense, causal full attention (what the window windows,
    groups.py); anything else bounds or reshapes its reads already and stays as vLLM made
    it."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    return type(spec) is FullAttentionSpec and groups.classify(spec)[0]


def _shared_with_other_layers(converted: dict[str, Any], layers: set[str]) -> bool:
    """Whether a converted draft spec equals the spec of a layer outside ``layers``."""
    others = [spec for name, spec in converted.items() if name not in layers]
    return any(converted[name] in others for name in layers)


def sliding_draft_specs(kv_cache_spec: dict[str, Any], layers: set[str], tokens: int) -> dict:
    """``kv_cache_spec`` with each of ``layers``' specs a ``SlidingWindowSpec`` of ``tokens``
    (its other fields unchanged)."""
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


def refuse_free_kv(vllm_config: Any, config: Any, release: Release | None) -> None:
    """Stop on ``draft_window_free_kv`` where freeing the draft's KV before the window cannot
    be exact or is not freed at all (design doc, section 3.4). Where it would not pay, the
    runner's KV-cache specs refuse it, once the layers are known (``draft_kv_cache_spec``)."""
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
