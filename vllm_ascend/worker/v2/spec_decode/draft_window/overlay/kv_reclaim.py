# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What ``draft_window_free_kv`` frees and costs, computed with vLLM's own KV cache grouping."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_ascend.worker.v2.spec_decode.draft_window.config import FREE_KV_KEY, KEY
from vllm_ascend.worker.v2.spec_decode.draft_window.groups import Freed

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec, KVCacheSpec

# Below this share of each token's KV bytes, the freed KV does not pay for the extra groups
# (a one-layer EAGLE head beside 36 target layers holds 2.7%).
MIN_DRAFT_SHARE = 0.05
# Per extra KV cache group in Model Runner V2's BlockTables: two int32 tables of
# [max_num_reqs, width] and an int64 slot mapping of max_num_batched_tokens.
TABLE_BYTES_PER_COLUMN = 2 * 4
SLOT_MAPPING_BYTES_PER_TOKEN = 8


@dataclass(frozen=True)
class Reclaim:
    """vLLM's grouping with and without the key, and the KV freed per request."""

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
        """Why the key is refused here; None: served."""
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


def draft_block_sizes(formed: list[KVCacheGroupSpec], layers: set[str]) -> list[int]:
    """Block sizes of the groups vLLM formed for the converted ``layers``."""
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


def reclaim(
    vllm_config: VllmConfig,
    whole: dict[str, KVCacheSpec],
    converted: dict[str, KVCacheSpec],
    freed: Freed,
) -> Reclaim:
    """Group ``converted`` and ``whole`` (the specs without the key); ``table_bytes`` is 0."""
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


def padding_layers(formed: list[KVCacheGroupSpec]) -> int:
    """Layers vLLM pads ``formed`` with: every group is sized as the largest."""
    largest = max(len(group.layer_names) for group in formed)
    return sum(largest - len(group.layer_names) for group in formed)


def table_bytes(
    vllm_config: VllmConfig,
    found: Reclaim,
    table_width: Callable[[int, int], int] | None = None,
) -> int:
    """Device bytes of the block tables and slot mappings of the extra KV cache groups."""
    scheduler = vllm_config.scheduler_config
    blocks = -(-vllm_config.model_config.max_model_len // found.block_size)
    width = table_width(blocks, found.block_size) if table_width is not None else blocks
    per_group = (
        TABLE_BYTES_PER_COLUMN * scheduler.max_num_seqs * width
        + SLOT_MAPPING_BYTES_PER_TOKEN * scheduler.max_num_batched_tokens
    )
    return (found.groups - found.groups_without) * per_group


def grouped(vllm_config: VllmConfig, specs: dict[str, KVCacheSpec]) -> list[KVCacheGroupSpec]:
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups

    return get_global_kv_cache_groups(_with_layout(vllm_config), [dict(specs)])


def _with_layout(vllm_config: VllmConfig) -> VllmConfig:
    """The config with LBNHC (vLLM's default grouping) until the engine sets a layout."""
    if vllm_config.cache_config.kv_cache_layout is not None:
        return vllm_config
    probe = copy.copy(vllm_config)
    probe.cache_config = copy.copy(vllm_config.cache_config)
    probe.cache_config.kv_cache_layout = "LBNHC"
    return probe


def held_blocks(tokens: int, block_size: int, scheduled: int, lookahead: int, in_flight: int, extra: int) -> int:
    """Most blocks a sliding-window group of ``tokens`` holds for one request in a step."""
    span = tokens - 1 + extra + in_flight + scheduled + lookahead
    return -(-(span - 1) // block_size) + 1


def describe(found: Reclaim, vllm_config: VllmConfig) -> str:
    """The key's start-up log line."""
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
