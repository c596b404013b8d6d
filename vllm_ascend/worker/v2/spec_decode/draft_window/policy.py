"""What the window serves, decided once per speculator at ``set_attn``: every refusal and
the decisions behind it, in one entry (``plan``) that takes the speculator, the validated
config and the installed line. A refusal is a ``ValueError`` naming the key, the value and
the fix; a window that would change nothing stays off with one line saying why. The
arithmetic (``window.py``) and the window (``mrv2.py``) never see these decisions, only
their outcome (``Plan``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_ascend.worker.v2.spec_decode.draft_window.config import (
    KEY,
    MIN_CONTEXT_KEY,
    SINKS_KEY,
    DraftWindowConfig,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.dcp import DcpLayout, column_tokens
from vllm_ascend.worker.v2.spec_decode.draft_window.groups import (
    GroupDecision,
    decide_groups,
    describe_decisions,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.lines import SUPPORTED, Line, dotted
from vllm_ascend.worker.v2.spec_decode.draft_window.log import logger
from vllm_ascend.worker.v2.spec_decode.draft_window.views import block_table_units
from vllm_ascend.worker.v2.spec_decode.draft_window.window import (
    align_sinks,
    effective_min_context,
    lcm_alignment,
)

# Drafts whose first pass is a prefill over the target's batch (any query length), and whose
# later passes are decode steps of one token.
AR_METHODS = frozenset({"eagle", "eagle3"})
# Drafts that read the target's own KV cache: a draft-only window does not apply.
SHARED_KV_METHODS = frozenset({"mtp"})


@dataclass(frozen=True)
class Plan:
    """What the window of one speculator is made of (``Mrv2DraftWindow``'s arguments)."""

    window_size: int
    sink_tokens: int
    # The context from which a request reads its window; 0: every context.
    min_context: int
    decisions: list[GroupDecision]
    # DFlash/DSpark: the query stretch every pass reads; an EAGLE decode step: 1.
    max_query_len: int
    # EAGLE's draft prefill: its longest query chunk (wider tables of its own), else None.
    max_chunk_len: int | None
    # Where the kernel is told lengths of its own (``lines.Line``): "bound" (the host bound
    # plus the query stretch), "per_step" (the target's length plus each decode step), or None.
    told: str | None

    @property
    def windowed_group_ids(self) -> list[int]:
        return [d.group_id for d in self.decisions if d.windowed]

    @property
    def left_alone_group_ids(self) -> list[int]:
        return [d.group_id for d in self.decisions if not d.windowed]


def plan(speculator: Any, config: DraftWindowConfig, line: Line) -> Plan | None:
    """The window this speculator gets under ``config`` on ``line``; None: off (said once)."""
    window_size, sink_tokens, method = (
        config.draft_window_size,
        config.draft_attention_sinks,
        (speculator.method),
    )
    if method in SHARED_KV_METHODS:
        sinks = f" with {SINKS_KEY}={sink_tokens}" if sink_tokens else ""
        logger.warning(
            "%s=%d%s is ignored for method %r: its draft layers share the target's KV "
            "cache and attention, which the window must not crop.",
            KEY,
            window_size,
            sinks,
            method,
        )
        return None
    refuse_method(method, line, window_size)
    query_stretch = speculator.num_speculative_steps + 1
    vllm_config = speculator.vllm_config
    _refuse_shape(method, window_size, query_stretch, vllm_config)
    decisions = decide_groups(speculator.kv_cache_config, speculator.attn_groups)
    _refuse_backends(speculator, line, decisions, window_size)
    layout = DcpLayout.of(speculator.block_tables)
    _refuse_dcp(speculator, layout, line, decisions, window_size)
    for decision in decisions:
        if decision.unknown:
            logger.warning(
                "%s: draft KV-cache group %d has a spec the window does not know "
                "(%s); it is left alone.",
                KEY,
                decision.group_id,
                decision.spec_kind,
            )
    windowed = [d.group_id for d in decisions if d.windowed]
    if not windowed:
        logger.warning(
            "%s=%d: no draft KV-cache group is one the window applies to, so the "
            "draft window stays off; %s.",
            KEY,
            window_size,
            describe_decisions(decisions),
        )
        return None
    alignment = lcm_alignment(list(column_tokens(speculator.block_tables, windowed).values()))
    sink_size = align_sinks(sink_tokens, alignment)
    max_model_len = speculator.max_model_len
    # A read leaves tokens out once start > S, which needs L - W >= S + a for some
    # L <= max_model_len.
    if max_model_len - window_size - sink_size < alignment:
        logger.info(
            "%s=%d%s never crops with max_model_len=%d (the window start moves in "
            "steps of %d tokens); the draft window stays off.",
            KEY,
            window_size,
            f" with {sink_size} attention sinks" if sink_size else "",
            max_model_len,
            alignment,
        )
        return None
    min_context = _min_context(config, window_size, sink_size, alignment, max_model_len)
    if min_context is None:
        return None
    if method == "dspark" and _model_type(vllm_config, "hf_config").startswith("deepseek_v4"):
        logger.warning(
            "%s=%d with a DeepSeek-V4 target: its DSpark draft is trained with the "
            "target for long context, and a window may lower acceptance. The window "
            "stays on.",
            KEY,
            window_size,
        )
    told = _told_lengths(speculator, line, decisions, window_size, layout is not None)
    ar = method in AR_METHODS
    return Plan(
        window_size=window_size,
        sink_tokens=sink_tokens,
        min_context=min_context,
        decisions=decisions,
        max_query_len=1 if ar else query_stretch,
        max_chunk_len=speculator.max_num_tokens if ar else None,
        told=told,
    )


def _min_context(
    config: DraftWindowConfig, window_size: int, sink_size: int, alignment: int, max_model_len: int
) -> int | None:
    """The threshold the window applies (0: every context), or None where no request can
    reach it (the window stays off); a threshold that changes nothing is said once."""
    asked = config.draft_window_min_context
    min_context = effective_min_context(asked, window_size, alignment, sink_size)
    if asked and not min_context:
        logger.info(
            "%s=%d changes nothing: no context shorter than %d tokens (%s=%d%s and "
            "the alignment %d) is cropped anyway, so every request reads its window "
            "from there.",
            MIN_CONTEXT_KEY,
            asked,
            window_size + sink_size + alignment,
            KEY,
            window_size,
            f" with {sink_size} attention sinks" if sink_size else "",
            alignment,
        )
    if min_context > max_model_len:
        logger.info(
            "%s=%d is above max_model_len=%d: no request reaches it, so the draft "
            "window stays off.",
            MIN_CONTEXT_KEY,
            min_context,
            max_model_len,
        )
        return None
    return min_context


def refuse_method(method: str, line: Line, window_size: int) -> None:
    """Stop on a speculative method the window is not proven for on the installed line."""
    if method in line.methods:
        return
    raise ValueError(
        f"{KEY}={window_size} is not supported on Model Runner V2 for speculative method "
        f"{method!r} on {line.name}; supported there: {', '.join(line.methods)}. Remove {KEY} "
        f"from additional_config or use one of those methods."
    )


def _refuse_shape(method: str, window_size: int, query_stretch: int, vllm_config: Any) -> None:
    """Stop where one block-aligned window per request cannot hold the draft: a window
    smaller than the draft's own queries, prefix-LM targets, prefill context parallelism."""
    if window_size < query_stretch:
        raise ValueError(
            f"{KEY}={window_size} is smaller than the {query_stretch} query tokens "
            f"method {method!r} drafts per request (num_speculative_tokens + 1): the window "
            f"must hold the draft's own queries. Use {KEY} >= {query_stretch}."
        )
    if getattr(vllm_config.model_config, "is_mm_prefix_lm", False):
        raise ValueError(
            f"{KEY}={window_size} does not support prefix-LM multimodal targets: their "
            f"bidirectional image spans are placed in absolute positions that a cropped "
            f"draft table no longer uses. Remove {KEY} for this model."
        )
    pcp = getattr(vllm_config.parallel_config, "prefill_context_parallel_size", 1) or 1
    if pcp > 1:
        raise ValueError(
            f"{KEY}={window_size} does not support prefill_context_parallel_size={pcp}: the "
            f"draft prefill builds metadata for the global batch while each rank runs its own "
            f"split of the tokens, which one block-aligned window per request cannot crop. "
            f"Use prefill_context_parallel_size=1 or remove {KEY}."
        )


def _refuse_dcp(
    speculator: Any,
    layout: DcpLayout | None,
    line: Line,
    decisions: list[GroupDecision],
    window_size: int,
) -> None:
    """Under decode context parallelism, stop where a window start cannot be whole columns
    of every rank's table (an interleave that does not divide a column's tokens on one
    rank), or where the line names a backend whose DCP build takes a host bound as exact."""
    if layout is None:
        return
    units = block_table_units(speculator.block_tables)
    where = f"{KEY}={window_size} with {layout.describe()}"
    notes = {
        name: why
        for name, why, interleaved_only in line.dcp_backend_notes
        if layout.interleave > 1 or not interleaved_only
    }
    for decision in decisions:
        g = decision.group_id
        if not decision.windowed or not layout.sharded[g]:
            continue
        if int(units[g]) % layout.interleave:
            raise ValueError(
                f"{where}: the interleave does not divide the {int(units[g])} tokens one column "
                f"of {decision.describe()} holds on each rank, so no window start is whole "
                f"columns on every rank. Use a cp_kv_cache_interleave_size that divides "
                f"{int(units[g])} (1, or the block size), or remove {KEY}."
            )
        for group in speculator.attn_groups[g]:
            why = notes.get(group.backend.__name__)
            if why:
                raise ValueError(
                    f"{where} is not supported for {speculator.method} with "
                    f"{decision.describe()} on attention backend {group.backend.__name__}: "
                    f"{why}. Use decode_context_parallel_size=1, another attention backend, "
                    f"or remove {KEY}."
                )


def _refuse_backends(
    speculator: Any, line: Line, decisions: list[GroupDecision], window_size: int
) -> None:
    """Stop where the draft's kernel would take lengths the window does not set on this
    line: an attention backend defined outside the line's backend module, one the line's
    table does not prove for the method (with the line's reason for a known one), or a
    layout the line names."""
    method = speculator.method
    backends = line.backends_for(method)
    notes = dict(line.backend_notes)
    for decision in decisions:
        if not decision.windowed:
            continue
        for group in speculator.attn_groups[decision.group_id]:
            name, module = group.backend.__name__, group.backend.__module__
            where = (
                f"{KEY}={window_size} is not supported on {line.name} for {method} with "
                f"{decision.describe()} on attention backend {name}"
            )
            prefix, project = line.backend_module
            if not module.startswith(prefix):
                # NOTE: a platform plugin's backend (vllm-ascend's on a later vLLM) may
                # tell its kernel host lengths of its own, which only that line's hooks
                # window: served without them, the kernel would read outside the window.
                raise ValueError(
                    f"{where} from {module}, defined outside {project}: the window is proven "
                    f"on this line for {project}'s own backends only. Use a supported line for "
                    f"that platform ({SUPPORTED}), run Model Runner V1 "
                    f"(VLLM_USE_V2_MODEL_RUNNER=0), or remove {KEY}."
                )
            if backends is not None and name not in backends:
                why = notes.get(name, "its kernel takes host lengths the window does not set yet")
                raise ValueError(
                    f"{where}: {why} (supported for {method} on this line: "
                    f"{', '.join(backends)}). Use one of those attention backends, or remove "
                    f"{KEY}."
                )
    for path, layout, why, fix in line.unserved_state:
        if dotted(speculator, path):
            raise ValueError(
                f"{KEY}={window_size} is not supported on {line.name} {layout}: "
                f"{why}. {fix}, or remove {KEY}."
            )


def _told_lengths(
    speculator: Any, line: Line, decisions: list[GroupDecision], window_size: int, dcp: bool
) -> str | None:
    """Whether the kernel is told lengths of its own, and the refusals where the window
    start cannot come from them.

    The device takes the start from the target's device lengths, the host from the line's
    host mirror of them: the two agree only where the line syncs its host counts after
    rejection. An EAGLE decode (``per_step``) has one host length list written into every
    draft layer, so no group may be left alone, and its draft prefill rebuilds through a
    model state without a second prepare of per-step state."""
    method = speculator.method
    backends = {
        group.backend.__name__
        for d in decisions
        if d.windowed
        for group in speculator.attn_groups[d.group_id]
    }
    model_type = _model_type(speculator.vllm_config, "hf_text_config")
    if (dcp and method in line.dcp_told_bound) or line.told_bound(method, backends, model_type):
        told = "bound"
    elif method in AR_METHODS and line.ar_told_target_lengths:
        told = "per_step"
        if getattr(speculator, "use_fused_multi_step_decode", False):
            raise ValueError(
                f"{KEY}={window_size} is not supported on {line.name} with the fused "
                f"multi-step draft decode (a draft attention backend that updates its "
                f"metadata in place): the line's host lengths are written per step. "
                f"Remove {KEY}."
            )
    else:
        return None
    where = f"{KEY}={window_size} is not supported on {line.name} for {method}"
    if line.target_unsynced(getattr(speculator.vllm_config.model_config, "hf_config", None)):
        raise ValueError(
            f"{where} with a DeepSeek-V4.1 target: vllm-ascend does not sync its host lengths "
            f"after rejection there, so the length its kernel is told and the device's "
            f"differ. Remove {KEY}."
        )
    if told == "per_step":
        left = [d for d in decisions if not d.windowed]
        if left:
            raise ValueError(
                f"{where} with draft KV-cache groups the window leaves alone "
                f"({describe_decisions(left)}): vllm-ascend writes one host length list into "
                f"every draft layer. Remove {KEY}."
            )
        model_state = getattr(speculator, "model_state", None)
        for name in line.prefill_state:
            if getattr(model_state, name, None) is not None:
                raise ValueError(
                    f"{where} with the model state's {name} (KV prefetch or device-built "
                    f"metadata): the draft prefill's windowed rebuild would run its per-step "
                    f"state twice. Remove {KEY}."
                )
    return told


def _model_type(vllm_config: Any, attr: str) -> str:
    return str(getattr(getattr(vllm_config.model_config, attr, None), "model_type", "") or "")
