# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Start-up refusals: each check raises a ``ValueError`` naming the key, its value and the fix
(``refused``)."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from vllm_ascend.worker.v2.spec_decode.draft_window.config import (
    AUTO,
    FREE_KV_KEY,
    KEY,
    MIN_CONTEXT_KEY,
    SINKS_KEY,
    DraftWindowConfig,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.dcp import DcpLayout
from vllm_ascend.worker.v2.spec_decode.draft_window.declared import declared_context
from vllm_ascend.worker.v2.spec_decode.draft_window.groups import (
    GroupDecision,
    describe_decisions,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.methods import METHODS, Kind
from vllm_ascend.worker.v2.spec_decode.draft_window.release import Release, dotted

if TYPE_CHECKING:
    from transformers import PretrainedConfig
    from vllm.config import VllmConfig
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator


def refused(asked: object, why: str, fix: str | None = None) -> str:
    """``"draft_window_size=<asked> <why>. <Fix>, or remove draft_window_size."``"""
    return f"{KEY}={asked} {why}. " + (f"{fix}, or remove {KEY}." if fix else f"Remove {KEY}.")


def check_start_up(
    vllm_config: VllmConfig,
    config: DraftWindowConfig,
    release: Release | None,
    model_runner_v2: bool,
) -> None:
    """Start-up check once the runner is known: on Model Runner V2 the method, the free-KV key
    and ``"auto"``'s config.json; on Model Runner V1 ``"auto"``, sinks and the threshold."""
    if model_runner_v2:
        method = getattr(vllm_config.speculative_config, "method", None)
        if config.draft_window_free_kv and release is not None and release.free_kv_unserved:
            raise ValueError(
                f"{FREE_KV_KEY}=true cannot be served on {release.name}: "
                f"{release.free_kv_unserved}. Remove {FREE_KV_KEY} ({KEY} still windows what "
                "the draft reads)."
            )
        if method is not None and release is not None and METHODS.get(method) is not Kind.MTP:
            refuse_method(method, release, config.draft_window_size)
            if config.auto:
                declared_context(vllm_config)
    elif config.draft_window_free_kv:
        raise ValueError(
            f"{FREE_KV_KEY}=true needs Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER=1): it frees "
            "the draft KV the MRV2 window never reads. Set VLLM_USE_V2_MODEL_RUNNER=1 or remove "
            f"{FREE_KV_KEY}."
        )
    elif config.auto:
        raise ValueError(
            f"{KEY}={AUTO} needs Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER=1): vllm-ascend's "
            f"Model Runner V1 draft window takes a number of tokens. Set "
            f"VLLM_USE_V2_MODEL_RUNNER=1 or set {KEY} to the drafter's training context in "
            f"tokens."
        )
    elif config.draft_attention_sinks > 0:
        raise ValueError(
            f"{SINKS_KEY}={config.draft_attention_sinks} needs Model Runner V2 "
            "(VLLM_USE_V2_MODEL_RUNNER=1): vllm-ascend's Model Runner V1 draft window has no "
            f"attention sinks. Set VLLM_USE_V2_MODEL_RUNNER=1 or remove {SINKS_KEY}."
        )
    elif config.draft_window_min_context > 0:
        raise ValueError(
            f"{MIN_CONTEXT_KEY}={config.draft_window_min_context} needs Model Runner V2 "
            "(VLLM_USE_V2_MODEL_RUNNER=1): vllm-ascend's Model Runner V1 draft window windows "
            f"every context. Set VLLM_USE_V2_MODEL_RUNNER=1 or remove {MIN_CONTEXT_KEY}."
        )


def refuse_unserved(
    speculator: DraftModelSpeculator,
    config: DraftWindowConfig,
    release: Release,
    decisions: list[GroupDecision],
    layout: DcpLayout | None,
    units: Sequence[int],
) -> str | None:
    """Every start-up refusal for the draft; returns where its kernel's actual lengths come from."""
    asked = config.draft_window_size
    refuse_method(speculator.method, release, asked)
    refuse_speculator(speculator, release, asked)
    refuse_shape(speculator, asked)
    refuse_backends(speculator, release, decisions, asked)
    refuse_dcp(speculator, layout, release, decisions, units, asked)
    source = actual_seq_lens_source(speculator, release, decisions, layout is not None, asked)
    for path, layout_name, why, fix in release.unserved_state:
        if dotted(speculator, path):
            raise ValueError(refused(asked, f"is not supported on {release.name} {layout_name}: {why}", fix))
    return source


def refuse_method(method: str, release: Release, asked: object) -> None:
    """Stop on a speculative method the window is not proven for on the installed release."""
    if method not in release.methods:
        raise ValueError(
            refused(
                asked,
                f"is not supported on Model Runner V2 for speculative method {method!r} on "
                f"{release.name}; supported there: {', '.join(release.methods)}",
                "Use one of those methods",
            )
        )


def refuse_speculator(speculator: DraftModelSpeculator, release: Release, asked: object) -> None:
    """Stop on a speculator class not tested with the window for the method on the release."""
    served = release.speculators_for(speculator.method)
    owner = type(speculator).__name__
    if owner not in served:
        raise ValueError(
            refused(
                asked,
                f"is not supported on Model Runner V2 for speculative method "
                f"{speculator.method!r} with speculator {owner} on {release.name}: the window is "
                f"tested there with {', '.join(served) or 'no speculator of that method'} only",
                "Use a draft those speculators serve",
            )
        )


def refuse_shape(speculator: DraftModelSpeculator, asked: object) -> None:
    """Stop where one block-aligned window per request cannot hold the draft (``"auto"``: sized later)."""
    vllm_config, query_stretch = speculator.vllm_config, speculator.num_speculative_steps + 1
    method = speculator.method
    if isinstance(asked, int) and asked < query_stretch:
        raise ValueError(
            refused(
                asked,
                f"is smaller than the {query_stretch} query tokens method {method!r} drafts per "
                f"request (num_speculative_tokens + 1): the window must hold the draft's own "
                f"queries",
                f"Use {KEY} >= {query_stretch}",
            )
        )
    if getattr(vllm_config.model_config, "is_mm_prefix_lm", False):
        raise ValueError(
            refused(
                asked,
                "does not support prefix-LM multimodal targets: their bidirectional image spans "
                "are placed in absolute positions that a cropped draft table no longer uses",
            )
        )
    pcp = getattr(vllm_config.parallel_config, "prefill_context_parallel_size", 1) or 1
    if pcp > 1:
        raise ValueError(
            refused(
                asked,
                f"does not support prefill_context_parallel_size={pcp}: the draft prefill builds "
                f"metadata for the global batch while each rank runs its own split of the tokens, "
                f"which one block-aligned window per request cannot crop",
                "Use prefill_context_parallel_size=1",
            )
        )


def refuse_dcp(
    speculator: DraftModelSpeculator,
    layout: DcpLayout | None,
    release: Release,
    decisions: list[GroupDecision],
    units: Sequence[int],
    asked: object,
) -> None:
    """Under DCP, stop where a window start cannot drop whole columns on every rank."""
    if layout is None:
        return
    where = f"with {layout.describe()}"
    if release.dcp_unserved is not None:
        raise ValueError(
            refused(
                asked,
                f"{where} is not supported on {release.name}: {release.dcp_unserved}",
                "Use decode_context_parallel_size=1, a release that serves it",
            )
        )
    notes = {
        name: why
        for name, why, interleaved_only in release.dcp_backend_notes
        if layout.interleave > 1 or not interleaved_only
    }
    for decision in decisions:
        g = decision.group_id
        if not decision.windowed or not layout.sharded[g]:
            continue
        if int(units[g]) % layout.interleave:
            raise ValueError(
                refused(
                    asked,
                    f"{where}: the interleave does not divide the {int(units[g])} tokens one column "
                    f"of {decision.describe()} holds on each rank, so no window start is whole "
                    f"columns on every rank",
                    f"Use a cp_kv_cache_interleave_size that divides {int(units[g])} (1, or the block size)",
                )
            )
        for group in speculator.attn_groups[g]:
            why = notes.get(group.backend.__name__)
            if why:
                raise ValueError(
                    refused(
                        asked,
                        f"{where} is not supported for {speculator.method} with "
                        f"{decision.describe()} on attention backend {group.backend.__name__}: "
                        f"{why}",
                        "Use decode_context_parallel_size=1, another attention backend",
                    )
                )


def refuse_backends(
    speculator: DraftModelSpeculator, release: Release, decisions: list[GroupDecision], asked: object
) -> None:
    """Stop where the draft's kernel would read lengths the window does not set."""
    method = speculator.method
    backends = release.backends_for(method)
    notes = dict(release.backend_notes)
    method_note = dict(release.method_notes).get(method)
    for decision in decisions:
        if not decision.windowed:
            continue
        for group in speculator.attn_groups[decision.group_id]:
            name, module = group.backend.__name__, group.backend.__module__
            where = (
                f"is not supported on {release.name} for {method} with "
                f"{decision.describe()} on attention backend {name}"
            )
            prefix, project = release.backend_module
            if not module.startswith(prefix):
                # NOTE: a platform plugin's backend (vllm-ascend's on a later vLLM) may
                # hand its kernel host lengths of its own, which only that release's hooks
                # window: served without them, the kernel would read outside the window.
                v1 = ", run Model Runner V1 (VLLM_USE_V2_MODEL_RUNNER=0)"
                raise ValueError(
                    refused(
                        asked,
                        f"{where} from {module}, defined outside {project}: the window is proven "
                        f"on this release for {project}'s own backends only",
                        "Use a supported release for that platform" + (v1 if release.model_runner_v1 else ""),
                    )
                )
            if backends is not None and name not in backends:
                why = method_note or notes.get(name, "its kernel takes host lengths the window does not set yet")
                raise ValueError(
                    refused(
                        asked,
                        f"{where}: {why} (supported for {method} on this release: {', '.join(backends)})",
                        "Use one of those attention backends",
                    )
                )


# Where a kernel's actual lengths come from (plan.ActualSeqLens), besides the draft's own.
FROM_HOST_BOUND = "host bound"  # the builder's host bound plus the query stretch
FROM_TARGET = "target"  # the target's length plus each decode step (EAGLE decode)


def actual_seq_lens_source(
    speculator: DraftModelSpeculator,
    release: Release,
    decisions: list[GroupDecision],
    dcp: bool,
    asked: object,
) -> str | None:
    """Where the draft's kernel takes host-computed actual lengths (None: its own device
    lengths); refused where the window start cannot come from them."""
    method = speculator.method
    backends = {group.backend.__name__ for d in decisions if d.windowed for group in speculator.attn_groups[d.group_id]}
    target = model_type(speculator.vllm_config, "hf_text_config")
    if (dcp and method in release.dcp_actual_from_bound) or _actual_from_bound(release, method, backends, target):
        source = FROM_HOST_BOUND
    elif METHODS.get(method) is Kind.AUTOREGRESSIVE and release.ar_actual_from_target:
        source = FROM_TARGET
        if getattr(speculator, "use_fused_multi_step_decode", False):
            raise ValueError(
                refused(
                    asked,
                    f"is not supported on {release.name} with the fused multi-step draft decode (a "
                    f"draft attention backend that updates its metadata in place): the release's "
                    f"host lengths are written per step",
                )
            )
    else:
        return None
    where = f"is not supported on {release.name} for {method}"
    if _target_unsynced(release, getattr(speculator.vllm_config.model_config, "hf_config", None)):
        raise ValueError(
            refused(
                asked,
                f"{where} with a DeepSeek-V4.1 target: vllm-ascend does not sync its host lengths "
                f"after rejection there, so the actual lengths its kernel takes and the device's "
                f"differ",
            )
        )
    if source == FROM_TARGET:
        _refuse_target_lengths(decisions, where, asked)
    return source


def _refuse_target_lengths(decisions: list[GroupDecision], where: str, asked: object) -> None:
    """The layouts an EAGLE decode whose kernel takes the target's lengths cannot serve."""
    unwindowed = [d for d in decisions if not d.windowed]
    if unwindowed:
        raise ValueError(
            refused(
                asked,
                f"{where} with draft KV-cache groups the window does not window "
                f"({describe_decisions(unwindowed)}): vllm-ascend writes one host length list "
                f"into every draft layer",
            )
        )


def model_type(vllm_config: VllmConfig, attr: str) -> str:
    return str(getattr(getattr(vllm_config.model_config, attr, None), "model_type", "") or "")


def _actual_from_bound(release: Release, method: str, backends: set[str], model_type: str) -> bool:
    """Whether the draft's kernel takes the host bound plus the query length."""
    if backends & set(dict(release.actual_from_bound_backends).get(method, ())):
        return True
    exact_copy = backends & set(dict(release.exact_copy_backends).get(method, ()))
    family = any(f in model_type.lower() for f in release.dspark_host_length_targets)
    return method == "dspark" and family and not exact_copy


def _target_unsynced(release: Release, hf_config: PretrainedConfig | None) -> bool:
    """Whether the target's host lengths are not synced after rejection."""
    if release.unsynced_target is None or hf_config is None:
        return False
    module, function = release.unsynced_target
    return bool(getattr(importlib.import_module(module), function)(hf_config))
