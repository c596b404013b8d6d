# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What ``draft_window_free_kv`` frees and costs, by vLLM's own grouping (``kv_cache.py`` asks):
the draft layers the key converted (``Freed``), the groups vLLM forms from them and when the
key is refused (``Reclaim``), the block tables extra groups take in Model Runner V2, and the most
blocks one request's draft group holds (the start-up line)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from vllm_ascend.worker.v2.spec_decode.draft_window.config import FREE_KV_KEY, KEY

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
    layers vLLM pads with the key and without it; per request at ``max_model_len``, the
    draft KV bytes freed; and the device bytes the extra groups' block tables and slot
    mappings take."""

    freed: Freed
    block_size: int
    groups: int
    groups_without: int
    draft_share: float
    padding_layers: int
    padding_layers_without: int
    kv_bytes_freed: int
    table_bytes: int

    def refusal(self) -> str | None:
        """Why the key is refused here, after ``draft_window_free_kv=true``; None: served.
        Padding refuses it only where the key adds padding to vLLM's grouping."""
        draft = len(self.freed.layers)
        if self.padding_layers > self.padding_layers_without:
            return (
                f"adds padding here: vLLM groups the {draft} draft layers apart from the "
                f"target's in {self.groups} KV-cache groups of equal size with "
                f"{self.padding_layers} padding layers, against {self.padding_layers_without} "
                f"padding layers in the {self.groups_without} group(s) it forms without the "
                f"key, for a draft that holds {self.draft_share:.1%} of each token's KV"
            )
        if self.draft_share < MIN_DRAFT_SHARE:
            return (
                f"does not pay here: the draft's {draft} layer(s) hold {self.draft_share:.1%} "
                f"of each token's KV, so freeing them gives back at most that much, for "
                f"{self.groups} KV-cache groups instead of {self.groups_without} (below "
                f"{MIN_DRAFT_SHARE:.0%} it is refused)"
            )
        if self.table_bytes >= self.kv_bytes_freed:
            return (
                f"does not pay here: the {self.groups - self.groups_without} extra KV-cache "
                f"groups' block tables and slot mappings take {self.table_bytes} bytes, at "
                f"least the {self.kv_bytes_freed} bytes of draft KV freed per request at "
                "max_model_len"
            )
        return None


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
    formed = grouped(vllm_config, converted)
    formed_without = grouped(vllm_config, whole)
    per_token = {name: spec.page_size_bytes / spec.block_size for name, spec in whole.items()}
    draft_per_token = sum(per_token[name] for name in freed.layers)
    share = draft_per_token / sum(per_token.values())
    max_model_len = vllm_config.model_config.max_model_len
    return Reclaim(
        freed=freed,
        block_size=min(draft_block_sizes(formed, set(freed.layers))),
        groups=len(formed),
        groups_without=len(formed_without),
        draft_share=share,
        padding_layers=padding_layers(formed),
        padding_layers_without=padding_layers(formed_without),
        kv_bytes_freed=int(draft_per_token * (max_model_len - freed.tokens)),
        table_bytes=0,
    )


def padding_layers(formed: list[Any]) -> int:
    """The layers vLLM pads ``formed`` with: it sizes every group as its largest."""
    largest = max(len(group.layer_names) for group in formed)
    return sum(largest - len(group.layer_names) for group in formed)


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


def grouped(vllm_config: Any, specs: dict) -> list[Any]:
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
