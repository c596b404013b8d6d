# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""One speculator's window, decided once at ``set_attn``: settings through every refusal to a
``Plan``; a window that would change nothing stays off, said once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from vllm.logger import logger

from vllm_ascend.worker.v2.spec_decode.draft_window import policy
from vllm_ascend.worker.v2.spec_decode.draft_window.config import (
    FREE_KV_KEY,
    KEY,
    MIN_CONTEXT_KEY,
    SINKS_KEY,
    DraftWindowConfig,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.dcp import DcpLayout, column_tokens
from vllm_ascend.worker.v2.spec_decode.draft_window.declared import auto_context, auto_window
from vllm_ascend.worker.v2.spec_decode.draft_window.groups import (
    Freed,
    decide_groups,
    describe_decisions,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.methods import (
    METHODS,
    MTP_REASON,
    MTP_REASONS,
    Kind,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.release import Release
from vllm_ascend.worker.v2.spec_decode.draft_window.views import block_table_units
from vllm_ascend.worker.v2.spec_decode.draft_window.window import WindowSpec
from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import ActualSeqLens, Plan

if TYPE_CHECKING:
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator


def plan(
    speculator: DraftModelSpeculator,
    config: DraftWindowConfig,
    release: Release,
    freed: Freed | None = None,
) -> Plan | None:
    """The speculator's window under ``config`` on ``release``; None: off (said once)."""
    method = speculator.method
    kind = METHODS.get(method)
    if kind is Kind.MTP:
        _say_mtp_ignored(speculator, config)
        return None
    decisions = decide_groups(speculator.kv_cache_config, speculator.attn_groups, freed)
    layout = DcpLayout.of(speculator.block_tables)
    per_rank = block_table_units(speculator.block_tables)
    source = policy.refuse_unserved(speculator, config, release, decisions, layout, per_rank)
    declared = auto_context(speculator) if config.auto else None
    if config.auto and declared is None:
        return None
    windowed = [d.group_id for d in decisions if d.windowed]
    if not windowed:
        # Refused at set_attn, before the KV cache is allocated.
        raise ValueError(
            f"{KEY}={config.draft_window_size} cannot window the draft: none of its KV-cache groups is dense, "
            f"causal attention over the whole context ({describe_decisions(decisions)}). Use a draft whose "
            f"attention layers are, or remove {KEY}."
        )
    units = column_tokens(per_rank, windowed, layout)
    window_size = config.draft_window_size if declared is None else auto_window(speculator, declared, units.values())
    assert isinstance(window_size, int)
    spec = WindowSpec.derive(window_size, units.values(), config.draft_attention_sinks, config.draft_window_min_context)
    if not _engages(spec, config, speculator.max_model_len):
        return None
    if freed is not None:
        _refuse_freed_reads(spec, units, freed, speculator.kv_cache_config)
    if method == "dspark" and policy.model_type(speculator.vllm_config, "hf_config").startswith("deepseek_v4"):
        logger.warning(
            "%s=%s with a DeepSeek-V4 target: its DSpark draft is trained with the "
            "target for long context, and a window may lower acceptance. The window "
            "stays on.",
            KEY,
            config.draft_window_size,
        )
    actual = None
    if source is not None:
        lengths = speculator.target_input_buffers.seq_lens
        actual = ActualSeqLens(lengths, speculator.max_model_len, from_bound=source == policy.FROM_HOST_BOUND)
    # EAGLE and a draft model: one query token per decode step, and a prefill over the
    # target's chunks (a draft model's with one correction token per request more).
    one_token_steps = kind in (Kind.AUTOREGRESSIVE, Kind.DRAFT_MODEL)
    extra = getattr(speculator, "num_extra_query_per_req", None)
    if extra is None:
        extra = getattr(speculator.speculative_config, "max_num_new_slots_for_drafting", 0)
    return Plan(
        spec,
        units,
        layout,
        max_query_len=1 if one_token_steps else speculator.num_speculative_steps + 1,
        max_chunk_len=speculator.max_num_tokens + int(extra or 0) if one_token_steps else None,
        actual=actual,
        decisions=tuple(decisions),
        sink_tokens=config.draft_attention_sinks,
    )


def _say_mtp_ignored(speculator: DraftModelSpeculator, config: DraftWindowConfig) -> None:
    sinks = f" with {SINKS_KEY}={config.draft_attention_sinks}"
    owner = type(speculator).__name__
    logger.warning(
        "%s=%s%s is ignored for method %r (%s): %s.",
        KEY,
        config.draft_window_size,
        sinks if config.draft_attention_sinks else "",
        speculator.method,
        owner,
        MTP_REASONS.get(owner, MTP_REASON),
    )


def _refuse_freed_reads(
    spec: WindowSpec, units: Mapping[int, int], freed: Freed, kv_cache_config: KVCacheConfig
) -> None:
    """Stop where a group ``draft_window_free_kv`` converted keeps fewer tokens than the
    window's reads need: a kernel block size other than the group's could undercut ``N``."""
    kept = freed.tokens
    for group_id, column in sorted(units.items()):
        layers = set(kv_cache_config.kv_cache_groups[group_id].layer_names)
        needed = spec.retained_tokens(column)
        if layers & freed.layers and kept < needed:
            raise ValueError(
                f"{FREE_KV_KEY}=true: the draft's KV-cache group {group_id} keeps a sliding "
                f"window of {kept} tokens per request, fewer than the {needed} the window's "
                f"reads need ({KEY}={spec.window_size}, alignment {spec.alignment}, "
                f"{column}-token table columns); remove {FREE_KV_KEY}."
            )


def _engages(spec: WindowSpec, config: DraftWindowConfig, max_model_len: int) -> bool:
    """Whether a request within ``max_model_len`` is ever cropped; why not, said once."""
    sinks = f" with {spec.sink_size} attention sinks" if spec.sink_size else ""
    # A read leaves tokens out once start > S, which needs L >= S + W + a.
    if max_model_len < spec.reach:
        logger.info(
            "%s=%d%s never crops with max_model_len=%d (the window start moves in "
            "steps of %d tokens); the draft window stays off.",
            KEY,
            spec.window_size,
            sinks,
            max_model_len,
            spec.alignment,
        )
        return False
    asked = config.draft_window_min_context
    if asked and not spec.min_context:
        logger.info(
            "%s=%d changes nothing: no context shorter than %d tokens (%s=%d%s and "
            "the alignment %d) is cropped anyway, so every request reads its window "
            "from there.",
            MIN_CONTEXT_KEY,
            asked,
            spec.reach,
            KEY,
            spec.window_size,
            sinks,
            spec.alignment,
        )
    if spec.min_context > max_model_len:
        logger.info(
            "%s=%d is above max_model_len=%d: no request reaches it, so the draft window stays off.",
            MIN_CONTEXT_KEY,
            spec.min_context,
            max_model_len,
        )
        return False
    return True
