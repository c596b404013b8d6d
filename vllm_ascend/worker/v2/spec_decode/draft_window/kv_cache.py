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

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from vllm_ascend.worker.v2.spec_decode.draft_window import groups
from vllm_ascend.worker.v2.spec_decode.draft_window.config import (
    AUTO,
    FREE_KV_KEY,
    KEY,
    DraftWindowConfig,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.declared import (
    auto_window_size,
    declared_context,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.log import logger
from vllm_ascend.worker.v2.spec_decode.draft_window.window import WindowSpec

# The speculator attribute holding what the key did (``Freed``), set where the runner returns
# the specs and read at set_attn (plan.py, groups.py); absent: the draft's KV is whole.
FREED_ATTR = "_draft_window_freed"
# Below this share of every token's KV bytes the draft gives back too little for the
# KV-cache groups it costs (a one-layer EAGLE head beside 36 target layers holds 2.7%: 37
# groups of one layer for 2.6% more concurrency, measured; benchmarks/kv_reclaim.py).
MIN_DRAFT_SHARE = 0.05
# What one more KV-cache group costs on the device in Model Runner V2's ``BlockTables``: two
# int32 tables of [max_num_reqs, width] (the persistent and the gathered one) and an int64
# slot-mapping row of max_num_batched_tokens (tests/test_kv_reclaim.py measures vLLM's).
TABLE_BYTES_PER_COLUMN = 2 * 4
SLOT_MAPPING_BYTES_PER_TOKEN = 8


@dataclass(frozen=True)
class Freed:
    """What the key did to the draft's specs: ``layers`` declare a ``SlidingWindowSpec`` of
    ``tokens`` (``N``). The window recognises their groups by these layers (groups.py)."""

    tokens: int
    layers: frozenset[str]


@dataclass(frozen=True)
class Reclaim:
    """vLLM's grouping of the converted specs and what it costs and frees: ``block_size``,
    the draft groups' (smallest) as vLLM's grouping set it; ``groups`` KV-cache groups with
    the key against ``groups_without``; the draft's share of each token's KV bytes; the
    layers vLLM pads; per request at ``max_model_len``, the draft KV bytes freed; and the
    device bytes the extra groups' block tables and slot mappings take."""

    freed: Freed
    block_size: int
    groups: int
    groups_without: int
    draft_share: float
    padding_layers: int
    kv_bytes_freed: int
    table_bytes: int

    def refusal(self) -> str | None:
        """Why the key does not pay here, or None."""
        draft = len(self.freed.layers)
        if self.padding_layers:
            return (
                f"vLLM groups the {draft} draft layers apart from the target's in "
                f"{self.groups} KV-cache groups of equal size with {self.padding_layers} "
                f"padding layers, which waste more KV than the draft's {self.draft_share:.1%} "
                "share frees"
            )
        if self.draft_share < MIN_DRAFT_SHARE:
            return (
                f"the draft's {draft} layer(s) hold {self.draft_share:.1%} of each token's KV, "
                f"so freeing them gives back at most that much, for {self.groups} KV-cache "
                f"groups instead of {self.groups_without} (below {MIN_DRAFT_SHARE:.0%} it is "
                "refused)"
            )
        if self.table_bytes >= self.kv_bytes_freed:
            return (
                f"the {self.groups - self.groups_without} extra KV-cache groups' block tables "
                f"and slot mappings take {self.table_bytes} bytes, at least the "
                f"{self.kv_bytes_freed} bytes of draft KV freed per request at max_model_len"
            )
        return None


def asks_free_kv(runner: Any) -> bool:
    """Whether the runner's config sets ``draft_window_free_kv`` to true; reads nothing else
    (vLLM's own tests build runners without a config, or with stand-ins)."""
    additional = getattr(getattr(runner, "vllm_config", None), "additional_config", None)
    return isinstance(additional, dict) and additional.get(FREE_KV_KEY) is True


def draft_kv_cache_spec(runner: Any, specs: dict[str, Any], table_width: Any) -> dict[str, Any]:
    """The runner's KV-cache specs with ``draft_window_free_kv`` (``asks_free_kv``): the
    draft's full-attention layers freed before the window, what was done recorded on the
    speculator, said once. ``table_width``: the release's ``get_block_table_width``."""
    speculator = getattr(runner, "speculator", None)
    if speculator is None:
        return specs
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
        found = declared_context(vllm_config)
        if found.tokens is None:
            logger.info(
                "%s: %s=%s and the draft checkpoint %s declares no training context, so the "
                "draft window stays off and %s frees nothing: the draft's KV stays whole.",
                FREE_KV_KEY,
                KEY,
                AUTO,
                found.checkpoint,
                FREE_KV_KEY,
            )
            return specs
        declared = found.tokens
    window_size = None if config.auto else config.draft_window_size
    planned = free_draft_kv(vllm_config, specs, draft_layers, window_size, declared, table_width)
    if planned is None:
        logger.info(
            "%s: the draft window keeps every token up to max_model_len=%d, so the draft's KV "
            "stays whole.",
            FREE_KV_KEY,
            vllm_config.model_config.max_model_len,
        )
        return specs
    converted, found = planned
    setattr(speculator, FREED_ATTR, found.freed)
    logger.info(describe(found, vllm_config))
    return converted


def free_draft_kv(
    vllm_config: Any,
    kv_cache_spec: dict[str, Any],
    draft_layers: set[str],
    window_size: int | None,
    declared: int | None = None,
    table_width: Any = None,
    refuse: bool = True,
) -> tuple[dict[str, Any], Reclaim] | None:
    """The model's KV-cache specs with each draft full-attention layer's turned into a
    ``SlidingWindowSpec`` of ``N`` tokens, and what that frees; None where the window keeps
    every token up to ``max_model_len`` (or ``"auto"`` cannot size one: set_attn says why).
    ``window_size`` None: ``"auto"`` over the ``declared`` context. With ``refuse``, a
    ``ValueError`` naming the key where it cannot be served or does not pay."""
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
    probe = sliding_draft_specs(kv_cache_spec, layers, window_size or declared)
    block_sizes = draft_block_sizes(_grouped(vllm_config, probe), layers)
    spec = window_spec(window_size, declared, block_sizes)
    if spec is None:
        return None
    tokens = spec.retained_tokens(min(block_sizes))
    if tokens >= vllm_config.model_config.max_model_len:
        return None
    converted = sliding_draft_specs(kv_cache_spec, layers, tokens)
    found = reclaim(vllm_config, kv_cache_spec, converted, Freed(tokens, frozenset(layers)))
    found = dataclasses.replace(found, table_bytes=table_bytes(vllm_config, found, table_width))
    if refuse and (why := found.refusal()) is not None:
        raise ValueError(
            f"{FREE_KV_KEY}=true does not pay here: {why}. Remove {FREE_KV_KEY} ({KEY} still "
            "windows what the draft reads)."
        )
    return converted, found


def window_spec(
    window_size: int | None, declared: int | None, block_sizes: list[int]
) -> WindowSpec | None:
    """The window over draft groups of ``block_sizes``: ``window_size`` tokens, or with
    ``"auto"`` (None) sized from the ``declared`` context; None where that is no window."""
    alignment = math.lcm(*block_sizes)
    if window_size is None:
        window_size = auto_window_size(declared, alignment)
        if window_size < 1:
            return None
    return WindowSpec.derive(window_size, block_sizes)


def convertible(spec: Any) -> bool:
    """A spec the key frees: plain, dense, causal full attention (what the window windows,
    groups.py); anything else bounds or reshapes its reads already and stays as vLLM made
    it."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    return type(spec) is FullAttentionSpec and groups.classify(spec)[0]


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


def draft_block_sizes(formed: list[Any], layers: set[str]) -> list[int]:
    """The block sizes of the groups vLLM formed for the converted ``layers``; refused by
    name where vLLM turned them back into full attention (it does where it cannot unify the
    page sizes, as for an MLA target with a GQA draft): nothing would be freed."""
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    sizes = set()
    for group in formed:
        for name in layers & set(group.layer_names):
            spec = group.kv_cache_spec
            member = getattr(spec, "kv_cache_specs", {}).get(name, spec)
            if not isinstance(member, SlidingWindowSpec):
                raise ValueError(
                    f"{FREE_KV_KEY}=true cannot be served here: vLLM cannot unify the KV "
                    f"cache page sizes of the draft's layers with the target's (an MLA target "
                    f"with a GQA draft, for one), so it keeps the draft layer {name} as full "
                    f"attention ({type(member).__name__}) in one group with the target's and "
                    f"frees nothing. Remove {FREE_KV_KEY} ({KEY} still windows what the draft "
                    "reads)."
                )
            sizes.add(spec.block_size)
    return sorted(sizes)


def reclaim(vllm_config: Any, whole: dict, converted: dict, freed: Freed) -> Reclaim:
    """vLLM's own grouping of ``converted`` against ``whole`` (the specs without the key),
    and what the key frees per request at ``max_model_len`` (``table_bytes`` left 0)."""
    formed = _grouped(vllm_config, converted)
    layers = sum(len(group.layer_names) for group in formed)
    padding = len(formed) * max(len(group.layer_names) for group in formed) - layers
    per_token = {name: spec.page_size_bytes / spec.block_size for name, spec in whole.items()}
    draft_per_token = sum(per_token[name] for name in freed.layers)
    share = draft_per_token / sum(per_token.values())
    max_model_len = vllm_config.model_config.max_model_len
    return Reclaim(
        freed=freed,
        block_size=min(draft_block_sizes(formed, set(freed.layers))),
        groups=len(formed),
        groups_without=len(_grouped(vllm_config, whole)),
        draft_share=share,
        padding_layers=padding,
        kv_bytes_freed=int(draft_per_token * (max_model_len - freed.tokens)),
        table_bytes=0,
    )


def table_bytes(vllm_config: Any, found: Reclaim, table_width: Any = None) -> int:
    """The device bytes the key's extra KV-cache groups take in Model Runner V2's
    ``BlockTables`` (``TABLE_BYTES_PER_COLUMN``), their tables as wide as the release's
    ``get_block_table_width`` makes them for ``max_model_len``."""
    scheduler = vllm_config.scheduler_config
    blocks = -(-vllm_config.model_config.max_model_len // found.block_size)
    width = table_width(blocks, found.block_size) if table_width is not None else blocks
    per_group = (
        TABLE_BYTES_PER_COLUMN * scheduler.max_num_seqs * width
        + SLOT_MAPPING_BYTES_PER_TOKEN * scheduler.max_num_batched_tokens
    )
    return (found.groups - found.groups_without) * per_group


def _grouped(vllm_config: Any, specs: dict) -> list[Any]:
    """vLLM's grouping of the whole model, as the engine core forms it."""
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups

    return get_global_kv_cache_groups(_with_layout(vllm_config), [dict(specs)])


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


def held_blocks(
    tokens: int, block_size: int, scheduled: int, lookahead: int, in_flight: int, extra: int
) -> int:
    """The most blocks a sliding-window group of ``tokens`` holds for one request at a step
    that schedules ``scheduled`` tokens with ``lookahead`` slots beyond them, ``in_flight``
    tokens scheduled before and not yet processed, and vLLM's ``extra_retained_tokens``:
    the blocks from the first kept token (``N - 1 + extra`` before the processed ones) to
    the last slot, wherever the span starts in a block."""
    span = tokens - 1 + extra + in_flight + scheduled + lookahead
    return -(-(span - 1) // block_size) + 1


def describe(found: Reclaim, vllm_config: Any) -> str:
    """The start-up line of the key: what the draft's groups hold per request in steady
    decode and during a prefill chunk, from vLLM's own scheduling settings."""
    scheduler = vllm_config.scheduler_config
    k = vllm_config.speculative_config.num_speculative_tokens
    lookahead = int(getattr(vllm_config, "num_lookahead_tokens", k) or 0)
    extra = max(0, int(getattr(vllm_config, "num_prefill_lookahead_tokens", 0) or 0) - 1)
    chunk = min(scheduler.max_num_batched_tokens, vllm_config.model_config.max_model_len)
    overlap = bool(getattr(scheduler, "async_scheduling", False))
    tokens, block = found.freed.tokens, found.block_size

    def most(scheduled: int) -> int:
        return held_blocks(tokens, block, scheduled, lookahead, scheduled if overlap else 0, extra)

    in_flight = ", a step in flight" if overlap else ""
    line = (
        f"{FREE_KV_KEY}: the draft's {len(found.freed.layers)} layer(s) "
        f"({found.draft_share:.1%} of each token's KV) keep a sliding window of {tokens} "
        f"tokens per request instead of the whole context, in blocks of {block}: at most "
        f"{most(1 + k)} blocks per request in steady decode (1 + {k} tokens a step, "
        f"{lookahead} lookahead{in_flight}), {most(chunk)} during a prefill chunk of {chunk} "
        f"tokens; vLLM frees the rest (KV-cache groups: {found.groups}, "
        f"{found.groups_without} without the key)."
    )
    if vllm_config.cache_config.enable_prefix_caching:
        line += (
            " Prefix caching: a hit now needs the draft's last blocks before it still cached, "
            "so the first request sharing a long prefix with an earlier, different one misses "
            "it (later ones hit; vLLM's prefix_cache_retention_interval keeps more of them)."
        )
    return line
