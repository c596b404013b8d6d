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
tokens it has processed (and nulls them in the step's gathered tables).

Exact (design doc, section 3.4): at a draft step whose first query position is ``C`` the
window reads ``[start, L)`` with ``L >= C + 1`` and ``start >= L - (W + a - 1)`` (``a``:
the alignment), while vLLM frees and nulls only blocks wholly before
``C - (N - 1) <= L - N``. So with ``N = W + a - 1`` every block the cropped table names
is held and unnulled. ``"auto"`` sizes ``W = C_d - a + 1`` from the context ``C_d`` the
checkpoint declares, so there ``N = C_d``: the draft holds exactly its training context.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from vllm_ascend.worker.v2.spec_decode.draft_window import groups
from vllm_ascend.worker.v2.spec_decode.draft_window.config import (
    FREE_KV_KEY,
    KEY,
    DraftWindowConfig,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.declared import declared_context
from vllm_ascend.worker.v2.spec_decode.draft_window.log import logger

# The speculator attribute holding the tokens its draft's layers keep (N), set where the
# runner returns their specs and read at set_attn (plan.py); absent: the KV is whole.
FREED_ATTR = "_draft_window_freed_tokens"
# Below this share of every token's KV bytes the draft gives back too little for the
# KV-cache groups it costs (a one-layer EAGLE head beside 36 target layers holds 2.7%: 37
# groups of one layer for 2.6% more concurrency, measured; benchmarks/kv_reclaim.py).
MIN_DRAFT_SHARE = 0.05


@dataclass(frozen=True)
class Reclaim:
    """What the draft's layers hold with the key: ``tokens`` (``N``) of KV per request at
    most, ``blocks`` of ``block_size`` tokens, in ``groups`` KV-cache groups of vLLM's own
    grouping (the draft's and the target's), the draft's share of each token's KV bytes."""

    tokens: int
    block_size: int
    groups: int
    draft_share: float
    draft_layers: int
    padding_layers: int = 0

    @property
    def blocks(self) -> int:
        """The most blocks a draft layer holds for one request in a step: the window's
        tokens, a partly filled block on each side, and a decode step's new tokens."""
        return math.ceil((self.tokens - 1) / self.block_size) + 1


def retained_tokens(
    config: DraftWindowConfig, block_size: int, declared_tokens: int | None = None
) -> int | None:
    """``N``, the tokens each draft layer keeps per request (above); None where the window
    is off. ``declared_tokens``: the context a draft checkpoint declares, for ``"auto"``."""
    if not config.draft_window_free_kv or not config.enabled:
        return None
    if config.auto:
        return declared_tokens
    return config.draft_window_size + block_size - 1


def draft_kv_cache_spec(runner: Any, specs: dict[str, Any]) -> dict[str, Any]:
    """The runner's KV-cache specs with ``draft_window_free_kv`` (``specs`` unchanged
    without it, or where the window would keep every token anyway): the draft's layers'
    freed before the window, the tokens they keep recorded on the speculator, said once."""
    vllm_config = runner.vllm_config
    config = DraftWindowConfig.from_additional_config(vllm_config.additional_config)
    speculator = getattr(runner, "speculator", None)
    draft_layers = set(getattr(speculator, "draft_attn_layer_names", None) or ())
    if not config.draft_window_free_kv or not draft_layers:
        return specs
    block_size = next(specs[name].block_size for name in sorted(draft_layers & specs.keys()))
    declared = declared_context(vllm_config).tokens if config.auto else None
    tokens = retained_tokens(config, block_size, declared)
    max_model_len = vllm_config.model_config.max_model_len
    if tokens is None or tokens >= max_model_len:
        logger.info(
            "%s: the draft window keeps every token up to max_model_len=%d, so the draft's KV "
            "stays whole.",
            FREE_KV_KEY,
            max_model_len,
        )
        return specs
    converted, reclaim = free_draft_kv(vllm_config, specs, draft_layers, tokens)
    setattr(speculator, FREED_ATTR, tokens)
    logger.info(describe(reclaim, bool(vllm_config.cache_config.enable_prefix_caching)))
    return converted


def free_draft_kv(
    vllm_config: Any, kv_cache_spec: dict[str, Any], draft_layers: set[str], tokens: int
) -> tuple[dict[str, Any], Reclaim]:
    """The model's KV-cache specs with each draft full-attention layer's turned into a
    ``SlidingWindowSpec`` of ``tokens``, and what that frees; refused by name (a
    ``ValueError``) where vLLM's grouping of the result would cost more than it frees."""
    converted, freed = sliding_draft_specs(kv_cache_spec, draft_layers, tokens)
    if not freed:
        raise ValueError(
            f"{FREE_KV_KEY}=true: no draft layer has full attention whose KV the window could "
            f"free (draft layers: {', '.join(sorted(draft_layers)) or 'none'}). Remove "
            f"{FREE_KV_KEY}."
        )
    return converted, reclaim(vllm_config, converted, freed, tokens, refuse=True)


def sliding_draft_specs(
    kv_cache_spec: dict[str, Any], draft_layers: set[str], tokens: int
) -> tuple[dict[str, Any], set[str]]:
    """``kv_cache_spec`` with each draft full-attention layer's spec a ``SlidingWindowSpec``
    of ``tokens`` (its other fields unchanged), and the names of those layers."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    converted = dict(kv_cache_spec)
    freed = set()
    for name in sorted(draft_layers & kv_cache_spec.keys()):
        spec = kv_cache_spec[name]
        # Only what the window windows (groups.py): plain, dense, causal full attention.
        # Anything else bounds or reshapes its reads already, and stays as vLLM made it.
        if type(spec) is not FullAttentionSpec or not groups.classify(spec)[0]:
            continue
        fields = {
            field.name: getattr(spec, field.name)
            for field in dataclasses.fields(SlidingWindowSpec)
            if field.init and field.name != "sliding_window" and hasattr(spec, field.name)
        }
        converted[name] = SlidingWindowSpec(**{**fields, "sliding_window": tokens})
        freed.add(name)
    return converted, freed


def reclaim(
    vllm_config: Any, converted: dict, freed: set[str], tokens: int, refuse: bool = False
) -> Reclaim:
    """vLLM's own grouping of the converted specs and what it frees; with ``refuse``, a
    ``ValueError`` where it pads layers or where the draft's share of the KV is too small
    to pay for the groups."""
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups

    # vLLM's grouping of the whole model, as the engine core forms it.
    formed = get_global_kv_cache_groups(_with_layout(vllm_config), [dict(converted)])
    layers = sum(len(group.layer_names) for group in formed)
    padding = len(formed) * max(len(group.layer_names) for group in formed) - layers
    per_token = {name: spec.page_size_bytes / spec.block_size for name, spec in converted.items()}
    share = sum(per_token[name] for name in freed) / sum(per_token.values())
    block_size = next(converted[name].block_size for name in freed)
    found = Reclaim(tokens, block_size, len(formed), share, len(freed), padding)
    if not refuse:
        return found
    if padding:
        raise ValueError(
            f"{FREE_KV_KEY}=true does not pay here: vLLM groups the {len(freed)} draft layers "
            f"apart from the {layers - len(freed)} target layers in {len(formed)} KV-cache "
            f"groups of equal size with {padding} padding layers, which waste more KV than the "
            f"draft's {share:.1%} share frees. Remove {FREE_KV_KEY} ({KEY} still windows what "
            "the draft reads)."
        )
    if share < MIN_DRAFT_SHARE:
        raise ValueError(
            f"{FREE_KV_KEY}=true does not pay here: the draft's {len(freed)} layer(s) hold "
            f"{share:.1%} of each token's KV, so freeing them gives back at most that much, "
            f"for {len(formed)} KV-cache groups instead of one (below "
            f"{MIN_DRAFT_SHARE:.0%} it is refused). Remove {FREE_KV_KEY} ({KEY} still windows "
            "what the draft reads)."
        )
    return found


def _with_layout(vllm_config: Any) -> Any:
    """vLLM groups layers by its KV cache layout, which the engine core resolves only once
    the workers have returned their specs; until then, the layout of a backend that
    declares none (LBNHC: not block-outermost, so vLLM's default grouping)."""
    if vllm_config.cache_config.kv_cache_layout is not None:
        return vllm_config
    probe = copy.copy(vllm_config)
    probe.cache_config = copy.copy(vllm_config.cache_config)
    probe.cache_config.kv_cache_layout = "LBNHC"
    return probe


def describe(freed: Reclaim, prefix_caching: bool) -> str:
    """The start-up line of the key."""
    line = (
        f"{FREE_KV_KEY}: the draft's {freed.draft_layers} layer(s) ({freed.draft_share:.1%} "
        f"of each token's KV) keep {freed.tokens} tokens per request, at most "
        f"{freed.blocks} blocks of {freed.block_size}, instead of the whole context; "
        f"vLLM frees the rest (KV-cache groups: {freed.groups})."
    )
    if prefix_caching:
        line += (
            " Prefix caching: a hit now needs the draft's last blocks before it still cached, "
            "so the first request sharing a long prefix with an earlier, different one misses "
            "it (later ones hit; vLLM's prefix_cache_retention_interval keeps more of them)."
        )
    return line
