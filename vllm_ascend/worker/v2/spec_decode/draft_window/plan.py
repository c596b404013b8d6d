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
    AUTO,
    FREE_KV_KEY,
    KEY,
    MIN_CONTEXT_KEY,
    SINKS_KEY,
    DraftWindowConfig,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.dcp import DcpLayout, column_tokens
from vllm_ascend.worker.v2.spec_decode.draft_window.declared import (
    FIELDS,
    Declared,
    auto_window_size,
    declared_context,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.groups import (
    Freed,
    GroupDecision,
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
from vllm_ascend.worker.v2.spec_decode.draft_window.window import WindowSpec, lcm_alignment
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
    asked, method = config.draft_window_size, speculator.method
    kind = METHODS.get(method)
    if kind is Kind.MTP:
        _say_mtp_ignored(speculator, config)
        return None
    query_stretch = speculator.num_speculative_steps + 1
    decisions = decide_groups(speculator.kv_cache_config, speculator.attn_groups, freed)
    layout = DcpLayout.of(speculator.block_tables)
    with policy.refusals(KEY, asked):
        policy.refuse_method(method, release)
        policy.refuse_speculator(speculator, release)
        if isinstance(asked, int):
            policy.refuse_shape(method, asked, query_stretch, speculator.vllm_config)
        policy.refuse_backends(speculator, release, decisions)
        policy.refuse_dcp(speculator, layout, release, decisions)
    declared = _auto_context(speculator) if config.auto else None
    if config.auto and declared is None:
        return None
    windowed = _windowed_groups(decisions, asked)
    units = column_tokens(speculator.block_tables, windowed, layout)
    alignment = lcm_alignment(list(units.values()))
    if declared is None:
        assert isinstance(asked, int)
        window_size = asked
    else:
        window_size = _auto_window_size(speculator, declared, alignment)
        with policy.refusals(KEY, window_size):
            policy.refuse_shape(method, window_size, query_stretch, speculator.vllm_config)
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
    actual = _actual_seq_lens(speculator, release, decisions, config, layout is not None)
    # EAGLE and a draft model: one query token per decode step, and a prefill over the
    # target's chunks (a draft model's with one correction token per request more).
    one_token_steps = kind in (Kind.AUTOREGRESSIVE, Kind.DRAFT_MODEL)
    chunk = speculator.max_num_tokens + _extra_query_slots(speculator)
    return Plan(
        spec,
        units,
        layout,
        max_query_len=1 if one_token_steps else query_stretch,
        max_chunk_len=chunk if one_token_steps else None,
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


def _actual_seq_lens(
    speculator: DraftModelSpeculator,
    release: Release,
    decisions: list[GroupDecision],
    config: DraftWindowConfig,
    dcp: bool,
) -> ActualSeqLens | None:
    with policy.refusals(KEY, config.draft_window_size):
        source = policy.actual_seq_lens_source(speculator, release, decisions, dcp)
    if source is None:
        return None
    lengths = speculator.target_input_buffers.seq_lens
    from_bound = source == policy.FROM_HOST_BOUND
    return ActualSeqLens(lengths, speculator.max_model_len, from_bound=from_bound)


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


def _extra_query_slots(speculator: DraftModelSpeculator) -> int:
    """The query slots a draft adds to each request (a draft model's correction token)."""
    extra = getattr(speculator, "num_extra_query_per_req", None)
    if extra is None:
        extra = getattr(speculator.speculative_config, "max_num_new_slots_for_drafting", 0)
    return int(extra or 0)


def _auto_context(speculator: DraftModelSpeculator) -> Declared | None:
    """The training context ``"auto"`` sizes the window from; None (off, said once) without
    one, or with one not below max_model_len."""
    declared = declared_context(speculator.vllm_config)
    max_model_len = speculator.max_model_len
    if declared.tokens is None:
        logger.warning(
            "%s=%s: the draft checkpoint %s declares no training context (none of %s in its "
            "config.json), so the draft window stays off. Set %s to the drafter's training "
            "context in tokens to window it.",
            KEY,
            AUTO,
            declared.checkpoint,
            ", ".join(FIELDS),
            KEY,
        )
        return None
    context, field = declared.tokens, declared.field
    if context >= max_model_len:
        logger.info(
            "%s=%s: the draft checkpoint %s declares %s=%d, not below max_model_len=%d, so "
            "the draft reads no context longer than it declares; the draft window stays off. "
            "Set %s to the drafter's training context in tokens to window it anyway.",
            KEY,
            AUTO,
            declared.checkpoint,
            field,
            context,
            max_model_len,
            KEY,
        )
        return None
    return declared


def _auto_window_size(speculator: DraftModelSpeculator, declared: Declared, alignment: int) -> int:
    """``"auto"`` as ``W = C - a + 1``, the largest window whose reads stay within the declared context ``C``."""
    context, field = declared.tokens, declared.field
    assert context is not None
    window_size = auto_window_size(context, alignment)
    query_stretch = speculator.num_speculative_steps + 1
    if window_size < query_stretch:
        raise ValueError(
            f"{KEY}={AUTO} cannot size the draft window: the draft checkpoint "
            f"{declared.checkpoint} declares {field}={context} and the window's alignment is "
            f"{alignment}, so W = {context} - {alignment} + 1 = {window_size} is smaller than "
            f"the {query_stretch} query tokens method {speculator.method!r} drafts per request "
            f"(num_speculative_tokens + 1). Set {KEY} explicitly to a number of tokens >= "
            f"{query_stretch}."
        )
    logger.info(
        "%s=%s became W=%d: the draft checkpoint %s declares %s=%d (its training context), "
        "and the window's reads (W to W + a - 1 = %d tokens, alignment %d) stay within it.",
        KEY,
        AUTO,
        window_size,
        declared.checkpoint,
        field,
        context,
        window_size + alignment - 1,
        alignment,
    )
    return window_size


def _windowed_groups(decisions: list[GroupDecision], window_size: int | str | None) -> list[int]:
    """The draft groups the window serves; none stops start-up (``set_attn`` runs before the KV cache is allocated)."""
    windowed = [d.group_id for d in decisions if d.windowed]
    if not windowed:
        raise ValueError(
            f"{KEY}={window_size} cannot window the draft: none of its KV-cache groups is "
            f"dense, causal attention over the whole context ({describe_decisions(decisions)}). "
            f"Use a draft whose attention layers are, or remove {KEY}."
        )
    return windowed


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
