# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""vLLM's own KV-cache planning and KV cache manager, driven as its scheduler drives them,
for ``draft_window_free_kv`` (``kv_cache.py``): a model's layer specs by shape, vLLM's
grouping and KV-cache config for a memory budget, its ``KVCacheManager``, and a request
prefilled in chunks and decoded with speculative tokens, as the scheduler's
``allocate_slots`` calls go. Nothing here stands in for vLLM: these are its functions."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs
from vllm.v1.core.kv_cache_utils import (
    get_max_concurrency_for_kv_cache_config,
    get_request_block_hasher,
    init_none_hash,
)
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.request import Request


@dataclass(frozen=True)
class Shape:
    """A target and a drafter by their attention layers (each the same KV heads and head
    size), the KV dtype and the block size."""

    name: str
    target_layers: int
    draft_layers: int
    block_size: int = 16
    kv_heads: int = 8
    head_size: int = 128
    dtype: torch.dtype = torch.bfloat16

    def specs(self) -> dict[str, Any]:
        """The model runner's specs: vLLM's ``FullAttentionSpec`` per layer, the draft's
        marked as vLLM marks them."""

        def spec(draft: bool) -> FullAttentionSpec:
            return FullAttentionSpec(
                block_size=self.block_size,
                num_kv_heads=self.kv_heads,
                head_size=self.head_size,
                dtype=self.dtype,
                is_draft=draft,
            )

        found = {f"model.layers.{i}.self_attn.attn": spec(False) for i in range(self.target_layers)}
        for i in range(self.draft_layers):
            found[f"draft_model.layers.{i}.self_attn.attn"] = spec(True)
        return found

    @property
    def draft_names(self) -> set[str]:
        return {f"draft_model.layers.{i}.self_attn.attn" for i in range(self.draft_layers)}


def engine_core(vllm_config: Any, layout: str = "LBHNC") -> Any:
    """The config as the engine core holds it once it has resolved the KV cache layout
    from the workers' backends (vLLM's CPU attention backend takes LBHNC only)."""
    resolved = copy.copy(vllm_config)
    resolved.cache_config = copy.copy(vllm_config.cache_config)
    resolved.cache_config.kv_cache_layout = layout
    return resolved


def kv_cache_config(vllm_config: Any, specs: dict[str, Any], memory_bytes: int) -> Any:
    """vLLM's KV-cache config of ``specs`` in ``memory_bytes`` (one worker)."""
    core = engine_core(vllm_config)
    grouped = get_global_kv_cache_groups(core, [dict(specs)])
    (config,) = get_kv_cache_configs(core, [dict(specs)], [memory_bytes], grouped)
    return config


def groups(vllm_config: Any, specs: dict[str, Any]) -> list[Any]:
    """vLLM's grouping of ``specs``, as the engine core forms it."""
    return get_global_kv_cache_groups(engine_core(vllm_config), [dict(specs)])


def max_concurrency(vllm_config: Any, config: Any) -> float:
    """What vLLM logs as "Maximum concurrency for max_model_len tokens per request"."""
    return get_max_concurrency_for_kv_cache_config(vllm_config, config)


def manager(vllm_config: Any, config: Any, max_model_len: int, use_eagle: bool = False):
    """vLLM's ``KVCacheManager`` over ``config``, prefix caching on; its block size and
    hash block size the groups' common block size."""
    init_none_hash(sha256)
    block = max(group.kv_cache_spec.block_size for group in config.kv_cache_groups)
    return KVCacheManager(
        config,
        max_model_len=max_model_len,
        scheduler_block_size=block,
        hash_block_size=block,
        enable_caching=True,
        use_eagle=use_eagle,
        num_hash_lookahead_tokens=1 if use_eagle else 0,
    )


def request(request_id: str, token_ids: list[int], block_size: int, use_eagle: bool = False):
    hasher = get_request_block_hasher(block_size, sha256, 1 if use_eagle else 0)
    return Request(
        request_id,
        list(token_ids),
        SamplingParams(max_tokens=1 << 16),
        None,
        block_hasher=hasher,
    )


def prefill(kv: KVCacheManager, req: Request, chunk: int, lookahead: int) -> bool:
    """The scheduler's prefill of ``req``: its cache hit, then chunks of ``chunk`` tokens
    (one stopping at the shared-prefix boundary the lookup names, so that a sliding-window
    group caches the junction, as the scheduler does), each allocated then computed; False
    where a chunk did not fit."""
    hit, hit_tokens, boundary = kv.get_computed_blocks(req)
    # Where the scheduler keeps it: the manager caches a sliding-window group's blocks there.
    req.shared_prefix_boundary = boundary
    first = True
    while req.num_computed_tokens < req.num_prompt_tokens:
        done = req.num_computed_tokens + (hit_tokens if first else 0)
        new = min(chunk, req.num_prompt_tokens - done)
        if done < boundary < done + new:
            new = boundary - done
        blocks = kv.allocate_slots(
            req,
            new,
            num_new_computed_tokens=hit_tokens if first else 0,
            new_computed_blocks=hit if first else None,
            num_lookahead_tokens=lookahead,
        )
        if blocks is None:
            return False
        req.num_computed_tokens = done + new
        first = False
    return True


def decode(kv: KVCacheManager, req: Request, steps: int, k: int, accepted: int) -> bool:
    """``steps`` speculative decode steps: 1 + ``k`` tokens scheduled each, ``accepted``
    draft tokens plus the bonus token kept; False where a step did not fit."""
    for step in range(steps):
        for _ in range(accepted + 1):
            req.append_output_token_ids(7 + step)
        new = req.num_tokens - req.num_computed_tokens
        if kv.allocate_slots(req, new, num_lookahead_tokens=k) is None:
            return False
        req.num_computed_tokens += new
    return True


def held(kv: KVCacheManager, request_id: str) -> list[int]:
    """The blocks each group holds for the request (the null block, freed, not counted)."""
    blocks = kv.coordinator.get_blocks(request_id)
    return [sum(not block.is_null for block in group) for group in blocks]


def block_ids(kv: KVCacheManager, request_id: str) -> list[list[int | None]]:
    """Each group's table of the request: a block id per column, None where freed."""
    blocks = kv.coordinator.get_blocks(request_id)
    return [[None if b.is_null else b.block_id for b in group] for group in blocks]


def spec_fields(spec: Any) -> dict[str, Any]:
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
