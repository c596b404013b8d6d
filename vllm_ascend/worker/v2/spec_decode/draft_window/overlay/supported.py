# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The vLLM and vllm-ascend releases the draft window supports, and what it hooks on each: the
one place that knows versions, module paths, class names and parameters. The rest of the
package reads versions only here and in ``versions.py`` (what the host has installed);
``install.py`` resolves a release's hooks on the installed vLLM, and ``hooks/`` holds their
wrappers, one module per speculator family (``Family``).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any

from vllm_ascend.worker.v2.spec_decode.draft_window import release as core_release
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import vllm_backends
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.plugin_release import PluginRelease


class Family(enum.Enum):
    """The speculator family a hook belongs to: the module of ``hooks/`` holding its wrapper
    (``hooks.family_module``), named after the anchors' ``spec_decode/`` folders."""

    SPECULATOR = "speculator"  # vLLM's DraftModelSpeculator, the base of every family
    DFLASH = "dflash"  # vLLM's DFlashSpeculator (DSpark is a DFlash)
    AUTOREGRESSIVE = "autoregressive"  # vLLM's EAGLE family and its graph manager
    ASCEND_AUTOREGRESSIVE = "ascend.autoregressive"  # what vllm-ascend adds to EAGLE
    ASCEND_DSPARK = "ascend.dspark"  # what vllm-ascend adds to DSpark
    KV_CACHE = "kv_cache"  # the model runner's KV-cache specs (draft_window_free_kv)


@dataclass(frozen=True)
class Hook:
    """One method the window wraps (``wrapper``: the function of that name in the family's
    module; by default the method's name without leading underscores), or only calls
    (``wrapped`` False; it may then be inherited), with the parameters it relies on."""

    family: Family
    module: str
    cls: str
    method: str
    parameters: tuple[str, ...] = ()
    wrapped: bool = True
    wrapper: str | None = None

    @property
    def name(self) -> str:
        return f"{self.cls}.{self.method}"

    @property
    def wrapper_name(self) -> str:
        return self.wrapper or self.method.lstrip("_")


def _on(family: Family, module: str, cls: str) -> Any:
    """The hooks of one class: ``hook(method, *parameters, **fields)``."""

    def hook(method: str, *parameters: str, **fields: Any) -> Hook:
        return Hook(family, module, cls, method, parameters, **fields)

    return hook


_SD = "vllm.v1.worker.gpu.spec_decode"
_draft = _on(Family.SPECULATOR, f"{_SD}.speculator", "DraftModelSpeculator")
# Hooked alike on both releases.
_SET_ATTN = _draft(
    "set_attn",
    *("model_state", "kv_cache_config", "block_tables", "target_input_buffers"),
    "target_attn_groups",
)
_BUILD_ATTN_METADATA = _draft(
    "_build_attn_metadata",
    *("num_reqs", "batch_desc", "query_start_loc_np", "seq_lens_cpu_upper_bound", "step"),
)
_UPDATE_DRAFT_DECODE_METADATA = _draft("_update_draft_decode_metadata", "attn_metadata", "num_reqs")
_DFLASH_CAPTURE = Hook(Family.DFLASH, f"{_SD}.dflash.speculator", "DFlashSpeculator", "capture")
# The draft's KV-cache specs (draft_window_free_kv): the model runner's, after vLLM's own.
_GET_KV_CACHE_SPEC = _on(Family.KV_CACHE, "vllm.v1.worker.gpu.model_runner", "GPUModelRunner")("get_kv_cache_spec")
# Called, not wrapped: the EAGLE draft prefill builds through it.
_PREPARE_ATTN = _on(Family.AUTOREGRESSIVE, "vllm.v1.worker.gpu.model_states.interface", "ModelState")(
    "prepare_attn",
    *("input_batch", "cudagraph_mode", "block_tables", "slot_mappings", "attn_groups"),
    "kv_cache_config",
    wrapped=False,
)


def _autoregressive(package: str, cls: str, graph_manager_module: str, graph_manager: str):
    """vLLM's EAGLE speculator hooks, alike on both releases but for where the speculator and
    its decode graph manager live."""
    speculator = _on(Family.AUTOREGRESSIVE, f"{package}.speculator", cls)
    manager = _on(Family.AUTOREGRESSIVE, graph_manager_module, graph_manager)
    return (
        speculator("propose", "input_batch", "attn_metadata"),
        speculator("_prefill", "num_reqs", "num_tokens", "attn_metadata"),
        speculator("init_cudagraph_manager", "cudagraph_mode"),
        # Called, not wrapped: the graph manager class the speculator module names (which
        # init_cudagraph_manager makes; vllm-ascend replaces the name with its own class).
        _on(Family.AUTOREGRESSIVE, f"{package}.speculator", "SpeculatorCudaGraphManager")(
            "__init__",
            *("vllm_config", "device", "cudagraph_mode", "decode_query_len"),
            wrapped=False,
        ),
        # The decode graph manager's capture: a class of its own, its own wrapper.
        manager("capture", "input_buffers", "block_tables", wrapper="manager_capture"),
    )


_AR_0_33 = f"{_SD}.target_dependent_ar"
_ar_0_33 = _on(Family.AUTOREGRESSIVE, f"{_AR_0_33}.speculator", "TargetDependentARSpeculator")
VLLM_0_33 = PluginRelease(
    name="vLLM 0.33.x",
    vllm_minor=(0, 33),
    # vLLM's init_speculator: method "dflash" makes a DFlash, or by the draft's architecture
    # one of the DFlash family (their own passes read only hidden states and token ids).
    speculators=(
        (
            "dflash",
            ("DFlashSpeculator", "XPressSpeculator", "DFlash2Speculator", "LiLiCorrSpeculator"),
        ),
        ("dspark", ("DSparkSpeculator",)),
        ("eagle", ("EagleSpeculator",)),
        ("eagle3", ("EagleSpeculator",)),
        ("draft_model", ("StandaloneARSpeculator",)),
    ),
    backends=(
        ("dflash", vllm_backends.GQA_0_33 + vllm_backends.MLA_QUERY_PASS_0_33),
        ("dspark", vllm_backends.GQA_0_33 + vllm_backends.MLA_QUERY_PASS_0_33),
        ("eagle", vllm_backends.GQA_0_33 + vllm_backends.MLA_VARLEN_0_33),
        ("eagle3", vllm_backends.GQA_0_33 + vllm_backends.MLA_VARLEN_0_33),
        ("draft_model", vllm_backends.GQA_0_33),
    ),
    backend_notes=vllm_backends.NOTES_0_33,
    method_notes=vllm_backends.METHOD_NOTES_0_33,
    dcp_backend_notes=vllm_backends.DCP_NOTES_0_33,
    bound_as_exact_rows=("num_decodes", "num_prefills"),
)

# vllm-ascend 0.30.0rc1/rc2: the release its call sites name, with the plugin's facts.
VLLM_0_30_ASCEND = PluginRelease.of(core_release.VLLM_0_30_ASCEND, vllm_minor=(0, 30))
_ASCEND_SD = "vllm_ascend.worker.v2.spec_decode"
_ASCEND_AR = f"{_ASCEND_SD}.autoregressive"
_ascend_ar = _on(Family.ASCEND_AUTOREGRESSIVE, f"{_ASCEND_AR}.speculator", "AscendAutoRegressiveSpeculator")
# vLLM's EAGLE hooks with vllm-ascend's graph manager and capture, and the host lengths its
# subclass computes for each decode step: alike on every vllm-ascend release.
_ASCEND_AUTOREGRESSIVE = (
    *_autoregressive(
        f"{_SD}.autoregressive",
        "AutoRegressiveSpeculator",
        f"{_ASCEND_AR}.aclgraph",
        "AutoRegressiveAclGraphManager",
    ),
    # vllm-ascend reimplements capture without super(): vLLM's capture wrapper serves it.
    _on(Family.AUTOREGRESSIVE, f"{_ASCEND_AR}.speculator", "AscendAutoRegressiveSpeculator")("capture"),
    _ascend_ar("_calc_next_seq_lens_cpu", "seq_lens_cpu", "num_reqs", "num_reqs_padded", "step"),
)
_HOOKS_0_30_ASCEND = (
    _SET_ATTN,
    _BUILD_ATTN_METADATA,
    _DFLASH_CAPTURE,
    *_ASCEND_AUTOREGRESSIVE,
    _ascend_ar("build_fia_params", "num_reqs_padded", "draft_attn_metadata", "is_draft_model_prefill"),
    _ascend_ar("_build_attn_metadata", "num_reqs", "batch_desc", "step"),
    _on(Family.ASCEND_DSPARK, f"{_ASCEND_SD}.dspark.speculator", "AscendDSparkSpeculator")(
        "_prepare_draft_dcp_metadata_inputs", "num_reqs", "num_reqs_padded", "step"
    ),
    _PREPARE_ATTN,
)

# vllm-ascend 0.29.0rc1 on vLLM 0.29.0 (design doc, section 8.3): the builds go through
# vLLM's _build_draft_attn_metadata (no batch_desc; DFlash, DSpark and vllm-ascend's
# overrides reach it through super()). Its draft builders give every request one host length,
# draft_max_seq_len: FIA on GQA reads the device lengths for DFlash and DSpark (the window's),
# the EAGLE decode's host lengths are set from the target's plus the step only after each
# step's forward (so the window sets them before it), and MLA drafts, which take that host
# length as exact, are refused. An EAGLE FULL decode replay takes its block table from the
# target's metadata (fia_table_from_target). No DCP path; the target's host lengths are
# always synced after rejection.
VLLM_0_29_ASCEND = PluginRelease(
    name="vLLM 0.29.x with vllm-ascend 0.29.0rc1",
    vllm_minor=(0, 29),
    speculators=core_release.ASCEND_SPECULATORS,
    backends=(
        ("dflash", ("AscendAttentionBackend",)),
        ("dspark", ("AscendAttentionBackend",)),
        ("eagle", ("AscendAttentionBackend",)),
        ("eagle3", ("AscendAttentionBackend",)),
    ),
    backend_notes=vllm_backends.NOTES_ASCEND_0_29,
    dcp_unserved=vllm_backends.DCP_UNSERVED_ASCEND_0_29,
    ar_actual_from_target=True,
    backend_module=("vllm_ascend.", "vllm-ascend"),
    host_mirror=("seq_lens_cpu", "seq_lens_np"),
    built_host_lengths=("seq_lens_list", "decode.seq_lens_list"),
    unserved_state=core_release.UNSERVED_STATE_ASCEND[:1],
    fia_table_from_target=True,
    free_kv_unserved=core_release.FREE_KV_ASCEND,
    prepare_attn_state=("attn_metadata",),
)

# vLLM 0.34.x (design doc, section 8.4): Model Runner V2 only. The EAGLE family and draft
# models share a new AutoRegressiveSpeculator (its capture, and _run_fused_multi_step_decode),
# an EAGLE draft prefill builds through the new _build_drafter_attn_metadata (a draft model's
# through _build_attn_metadata); the prefill graph managers are made in their speculators'
# modules, the decode one in AutoRegressiveSpeculator's.
_AR_0_34 = f"{_SD}.autoregressive"
_ar_0_34 = _on(Family.AUTOREGRESSIVE, f"{_AR_0_34}.speculator", "AutoRegressiveSpeculator")
# 0.33 with what 0.34 changes: one more backend refused, no Model Runner V1, its layouts.
VLLM_0_34 = dataclasses.replace(
    VLLM_0_33,
    name="vLLM 0.34.x",
    vllm_minor=(0, 34),
    backend_notes=VLLM_0_33.backend_notes + vllm_backends.NOTES_0_34,
    model_runner_v1=False,
    block_table_width=("vllm.v1.kv_cache_interface", "get_block_table_width"),
    unserved_config=vllm_backends.UNSERVED_CONFIG_0_34,
    own_draft_dcp=True,
    # Its mamba-hybrid model state keeps the query starts of a prepare_attn call.
    prepare_attn_state=("_replayssm_query_start_loc",),
)

_HOOKS_0_33 = (
    _SET_ATTN,
    _BUILD_ATTN_METADATA,
    _UPDATE_DRAFT_DECODE_METADATA,
    _DFLASH_CAPTURE,
    *_autoregressive(
        _AR_0_33,
        "TargetDependentARSpeculator",
        f"{_AR_0_33}.cudagraph_utils",
        "SpeculatorCudaGraphManager",
    ),
    _ar_0_33("capture"),
    _ar_0_33("_fused_multi_step_decode", "num_speculative_steps"),
    _PREPARE_ATTN,
    _GET_KV_CACHE_SPEC,
)

_HOOKS_0_29_ASCEND = (
    _SET_ATTN,
    _draft(
        "_build_draft_attn_metadata",
        *("num_reqs", "num_reqs_padded", "num_tokens_padded", "seq_lens_cpu_upper_bound"),
        "step",
        wrapper="build_attn_metadata",
    ),
    _DFLASH_CAPTURE,
    *_ASCEND_AUTOREGRESSIVE,
    _ascend_ar("build_fia_params", "num_reqs_padded", "is_draft_model_prefill"),
    _ascend_ar(
        "_build_draft_attn_metadata",
        "num_reqs",
        "step",
        wrapper="build_draft_attn_metadata",
    ),
    _PREPARE_ATTN,
)

_HOOKS_0_34 = (
    _SET_ATTN,
    _BUILD_ATTN_METADATA,
    _UPDATE_DRAFT_DECODE_METADATA,
    # On the base class, its wrapper in the EAGLE family's module (its only caller).
    _on(Family.AUTOREGRESSIVE, f"{_SD}.speculator", "DraftModelSpeculator")(
        "_build_drafter_attn_metadata",
        *("input_batch", "attn_metadata", "slot_mappings", "cg_mode"),
    ),
    _DFLASH_CAPTURE,
    _ar_0_34("capture"),
    _ar_0_34(
        "_run_fused_multi_step_decode",
        "num_speculative_steps",
        wrapper="fused_multi_step_decode",
    ),
    *(
        _on(Family.AUTOREGRESSIVE, f"{_SD}.{package}.speculator", cls)("init_cudagraph_manager", "cudagraph_mode")
        for package, cls in (
            ("target_dependent_ar", "TargetDependentARSpeculator"),
            ("standalone_ar", "StandaloneARSpeculator"),
        )
    ),
    # Called, not wrapped: the graph manager both prefill managers are made from.
    _on(Family.AUTOREGRESSIVE, f"{_AR_0_34}.cudagraph_utils", "SpeculatorCudaGraphManager")(
        "__init__",
        *("vllm_config", "device", "cudagraph_mode", "decode_query_lens"),
        wrapped=False,
    ),
    _on(Family.AUTOREGRESSIVE, f"{_AR_0_34}.cudagraph_utils", "SpeculatorCudaGraphManager")(
        "capture", "input_buffers", "block_tables", wrapper="manager_capture"
    ),
    _PREPARE_ATTN,
    _GET_KV_CACHE_SPEC,
)

RELEASES = (VLLM_0_34, VLLM_0_33, VLLM_0_30_ASCEND, VLLM_0_29_ASCEND)
# vllm-ascend's config of additional_config's keys (module, class), which later releases
# validate strictly: the window's own keys are let through it (plugin.accept_own_keys).
STRICT_CONFIG = ("vllm_ascend.ascend_config", "AscendConfig")
SUPPORTED = ", ".join(release.name for release in RELEASES)


def release_for(vllm_version: str) -> PluginRelease | None:
    """The supported release of a vLLM version (``0.33.0``, ``0.33.1.dev4+g...``), or None."""
    parts = vllm_version.split(".")
    try:
        minor = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        return None
    return next((r for r in RELEASES if r.vllm_minor == minor), None)


# The hooks of each release, by its name.
_HOOKS = {
    VLLM_0_34.name: _HOOKS_0_34,
    VLLM_0_33.name: _HOOKS_0_33,
    VLLM_0_30_ASCEND.name: _HOOKS_0_30_ASCEND,
    VLLM_0_29_ASCEND.name: _HOOKS_0_29_ASCEND,
}
# (distribution, its releases the hooks are proven on) installed beside vLLM; a local build
# (``0.30.0rc2+g1234``) is that release. rc2 is rc1 with new Dockerfiles: the Python package
# differs only in _version.py (a test compares the trees).
_REQUIRES = {
    VLLM_0_30_ASCEND.name: ("vllm-ascend", ("0.30.0rc1", "0.30.0rc2")),
    VLLM_0_29_ASCEND.name: ("vllm-ascend", ("0.29.0rc1",)),
}


def hooks_for(release: PluginRelease) -> tuple[Hook, ...]:
    """The methods the window wraps or calls on ``release``."""
    return _HOOKS[release.name]


def requires_for(release: PluginRelease) -> tuple[str, tuple[str, ...]] | None:
    """The distribution and its releases that must be installed beside vLLM, or None."""
    return _REQUIRES.get(release.name)
