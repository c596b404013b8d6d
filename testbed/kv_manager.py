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
    resolve_kv_cache_block_sizes,
)
from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec
from vllm.v1.request import Request


@dataclass(frozen=True)
class Shape:
    """A target and a drafter by their attention layers (each the same KV heads and head
    size unless the draft's are given), the KV dtype and the block size; optionally target
    layers with a sliding window of their own, or an MLA target (one latent KV head of
    ``mla_head_size``)."""

    name: str
    target_layers: int
    draft_layers: int
    block_size: int = 16
    kv_heads: int = 8
    head_size: int = 128
    dtype: torch.dtype = torch.bfloat16
    draft_kv_heads: int | None = None
    target_sliding_layers: int = 0
    target_sliding_window: int = 4096
    mla_head_size: int | None = None

    def specs(self) -> dict[str, Any]:
        """The model runner's specs: vLLM's ``FullAttentionSpec`` per layer (the target's
        ``MLAAttentionSpec`` or ``SlidingWindowSpec`` where the shape says), the draft's
        marked as vLLM marks them."""
        common = {"block_size": self.block_size, "head_size": self.head_size, "dtype": self.dtype}
        target = FullAttentionSpec(**common, num_kv_heads=self.kv_heads)
        if self.mla_head_size is not None:
            target = MLAAttentionSpec(
                block_size=self.block_size,
                num_kv_heads=1,
                head_size=self.mla_head_size,
                dtype=self.dtype,
            )
        draft = FullAttentionSpec(
            **common, num_kv_heads=self.draft_kv_heads or self.kv_heads, is_draft=True
        )
        found = {f"model.layers.{i}.self_attn.attn": target for i in range(self.target_layers)}
        for i in range(self.target_sliding_layers):
            found[f"model.sliding_layers.{i}.self_attn.attn"] = SlidingWindowSpec(
                **common, num_kv_heads=self.kv_heads, sliding_window=self.target_sliding_window
            )
        for i in range(self.draft_layers):
            found[f"draft_model.layers.{i}.self_attn.attn"] = draft
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
    """vLLM's ``KVCacheManager`` over ``config``, prefix caching on; its scheduler and hash
    block sizes as vLLM's engine core resolves them (``resolve_kv_cache_block_sizes``: one
    group's block size, or the lcm and gcd of the groups')."""
    init_none_hash(sha256)
    scheduler_block, hash_block = resolve_kv_cache_block_sizes(config, served(vllm_config, config))
    return KVCacheManager(
        config,
        max_model_len=max_model_len,
        scheduler_block_size=scheduler_block,
        hash_block_size=hash_block,
        enable_caching=True,
        use_eagle=use_eagle,
        num_hash_lookahead_tokens=1 if use_eagle else 0,
    )


def hash_block_size(vllm_config: Any, config: Any) -> int:
    """The block size requests' block hashes count in (``manager``)."""
    return resolve_kv_cache_block_sizes(config, served(vllm_config, config))[1]


def served(vllm_config: Any, config: Any) -> Any:
    """The config as an engine serving ``config`` holds it: ``--block-size`` the smallest of
    its groups' (the shapes here set it; vLLM's grouping only raises a group's)."""
    probe = copy.copy(vllm_config)
    probe.cache_config = copy.copy(vllm_config.cache_config)
    probe.cache_config.block_size = min(g.kv_cache_spec.block_size for g in config.kv_cache_groups)
    return probe


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


def with_extra_retained(config: Any, extra: int) -> Any:
    """``config`` with every sliding-window group's ``extra_retained_tokens`` set to
    ``extra``, as vLLM's planning sets it from a drafter's prefill lookahead."""
    groups = [
        dataclasses.replace(
            group,
            kv_cache_spec=dataclasses.replace(group.kv_cache_spec, extra_retained_tokens=extra),
        )
        if isinstance(group.kv_cache_spec, SlidingWindowSpec)
        else group
        for group in config.kv_cache_groups
    ]
    return dataclasses.replace(config, kv_cache_groups=groups)


@dataclass(frozen=True)
class Step:
    """One step of a request as the worker runs it: its first query position (``first``,
    every token before it computed), the tokens it computes (a prefill chunk, or 1 + K), and
    of a decode step the draft tokens accepted (None: a prefill chunk)."""

    first: int
    scheduled: int
    accepted: int | None


def serve(
    kv: KVCacheManager,
    req: Request,
    *,
    chunk: int,
    k: int,
    decode_steps: int,
    accepted: Any,
    overlap: bool,
    hit: tuple[Any, int] | None = None,
):
    """vLLM's scheduler's calls for one request, step by step: its prefix-cache ``hit``
    (blocks, tokens) adopted with the first chunk, the prompt in chunks of ``chunk`` tokens,
    then ``decode_steps`` speculative steps of 1 + ``k`` tokens, ``accepted(i)`` of step
    ``i``'s drafts kept and the rest rolled back (``num_computed_tokens`` lowered, as
    ``update_from_output`` does). Every allocation asks ``k`` lookahead slots. With
    ``overlap`` (async scheduling) each step is scheduled while the one before is in flight:
    ``num_computed_tokens`` counts it optimistically and ``num_in_flight_tokens`` holds it
    until its output arrives. Yields, after each allocation, the steps still running on the
    worker then (without overlap the step just scheduled; with it, the one before it too),
    so that the caller checks their reads against the tables vLLM left."""
    plan = []
    done = hit[1] if hit else 0
    while done < req.num_prompt_tokens:
        new = min(chunk, req.num_prompt_tokens - done)
        plan.append((new, None))
        done += new
    plan += [(1 + k, accepted(i)) for i in range(decode_steps)]
    first, running = hit[1] if hit else 0, []
    for index, (new, kept) in enumerate(plan):
        adopt = hit if index == 0 else None
        blocks = kv.allocate_slots(
            req,
            new,
            num_new_computed_tokens=adopt[1] if adopt else 0,
            new_computed_blocks=adopt[0] if adopt else None,
            num_lookahead_tokens=k,
        )
        assert blocks is not None, f"step {index} did not fit"
        if adopt:
            req.num_computed_tokens += adopt[1]
        req.num_computed_tokens += new
        req.num_in_flight_tokens += new
        running.append(Step(first, new, kept))
        first += new if kept is None else kept + 1
        if overlap and len(running) < 2 and index + 1 < len(plan):
            continue
        yield list(running)
        # The oldest step's output: its tokens processed, its rejected drafts rolled back.
        step = running.pop(0)
        req.num_in_flight_tokens -= step.scheduled
        if step.accepted is not None:
            req.num_computed_tokens -= k - step.accepted
            for _ in range(step.accepted + 1):
                req.append_output_token_ids(7)
        elif step.first + step.scheduled == req.num_prompt_tokens:
            # The prompt's last chunk samples the first output token.
            req.append_output_token_ids(7)
    if running:
        yield list(running)
