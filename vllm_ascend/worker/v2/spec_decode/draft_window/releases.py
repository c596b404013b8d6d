# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The vLLM and vllm-ascend releases the draft window supports, and what it hooks on each: the
one place that knows versions, module paths, class names and parameters.

The rest of the package reads versions only through this module; ``install.py`` resolves a
release's hooks on the installed vLLM, and ``hooks/`` holds their wrappers, one room per
speculator family (``Room``).
"""

from __future__ import annotations

import enum
import importlib
import importlib.metadata
from dataclasses import dataclass
from typing import Any

from vllm_ascend.worker.v2.spec_decode.draft_window import backends


class Room(enum.Enum):
    """The speculator family a hook belongs to: the module of ``hooks/`` holding its wrapper
    (``hooks.room``), named after the anchors' ``spec_decode/`` folders."""

    SPECULATOR = "speculator"  # vLLM's DraftModelSpeculator, the base of every family
    DFLASH = "dflash"  # vLLM's DFlashSpeculator (DSpark is a DFlash)
    AUTOREGRESSIVE = "autoregressive"  # vLLM's EAGLE family and its graph manager
    ASCEND_AUTOREGRESSIVE = "ascend.autoregressive"  # what vllm-ascend adds to EAGLE
    ASCEND_DSPARK = "ascend.dspark"  # what vllm-ascend adds to DSpark


@dataclass(frozen=True)
class Hook:
    """One method the window wraps (``wrapper``: the function of that name in the room's
    module; by default the method's name without leading underscores), or only calls
    (``wrapped`` False; it may then be inherited), with the parameters it relies on."""

    room: Room
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


@dataclass(frozen=True)
class Release:
    """A supported vLLM release (``major.minor``), with vllm-ascend where it pairs with one:
    its hooks, and what the window is proven for there."""

    name: str
    vllm_minor: tuple[int, int]
    hooks: tuple[Hook, ...]
    # Speculative methods the window serves on this release.
    methods: tuple[str, ...]
    # (distribution, its releases whose code the hooks are proven on) that must be installed
    # beside vLLM, or None. A local build of one (``0.30.0rc2+g1234``) is that release.
    requires: tuple[str, tuple[str, ...]] | None = None
    # Per speculative method, the attention backend class names the window is proven for on
    # the draft's groups (a method not listed: any backend of ``backend_module``); a draft
    # whose kernel takes host lengths the window does not set is refused, with the reason
    # ``backend_notes`` gives for a known one.
    backends: tuple[tuple[str, tuple[str, ...]], ...] = ()
    backend_notes: tuple[tuple[str, str], ...] = ()
    # Where the served backends are defined (a module prefix, and the project's name): one
    # defined elsewhere (a platform plugin's) may hand its kernel host lengths of its own.
    backend_module: tuple[str, str] = ("vllm.", "vLLM")
    # Under DCP: backends whose build takes a host bound as exact (why; only when the
    # interleave is above 1?), and the methods whose kernel takes the host bound plus the
    # query stretch as its actual lengths.
    dcp_backend_notes: tuple[tuple[str, str, bool], ...] = ()
    dcp_actual_from_bound: tuple[str, ...] = ()
    # The built metadata's (decode rows, prefill rows) counts where a builder's prefill path
    # takes the host bound as the exact length of its rows (vLLM's MLA: context = bound - q):
    # the path check makes sure, at every build, that the window made those rows exact.
    bound_as_exact_rows: tuple[str, str] | None = None
    # Where the kernel takes actual lengths computed on the host (vllm-ascend; window.py),
    # the window's start comes from them, on the host and the device:
    # - per method, the backends whose kernel takes the builder's host bound plus the query
    #   stretch as its actual lengths (DFlash on MLA);
    actual_from_bound_backends: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # - targets (a substring of their model_type) for whose DSpark drafts the same holds,
    #   except on the backends handed an exact host copy (below);
    dspark_host_length_targets: tuple[str, ...] = ()
    # - per method, the backends handed an exact host copy of the draft's device lengths,
    #   windowed by the device's arithmetic (DSpark on MLA);
    exact_copy_backends: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # - whether an EAGLE decode step's kernel takes the target's length plus the step (the
    #   rejected tokens included) rather than the draft's own length.
    ar_actual_from_target: bool = False
    # The exact host mirror of seq_lens the release's input buffers keep (torch and numpy
    # names, one memory), and the built metadata's host length lists its kernels take
    # (dotted paths): the path check checks both.
    host_mirror: tuple[str, str] | None = None
    built_host_lengths: tuple[str, ...] = ()
    # (module, function) telling whether a target's host lengths are not synced after
    # rejection, so that the kernel's actual lengths and the device's differ.
    unsynced_target: tuple[str, str] | None = None
    # Speculator attributes that, when set, name a layout the window does not serve here:
    # (attribute path, the layout, why, the fix).
    unserved_state: tuple[tuple[str, str, str, str], ...] = ()
    # Model-state attributes of per-step state a draft prefill rebuild would run twice.
    prefill_state: tuple[str, ...] = ()

    def backends_for(self, method: str) -> tuple[str, ...] | None:
        """The backends proven for ``method`` on this release, or None (any)."""
        return dict(self.backends).get(method)

    def actual_from_bound(self, method: str, backends: set[str], model_type: str) -> bool:
        """Whether the draft's kernel takes the host bound plus the query stretch as its
        actual lengths, for ``method`` on ``backends`` with a target of ``model_type``."""
        if backends & set(dict(self.actual_from_bound_backends).get(method, ())):
            return True
        exact_copy = backends & set(dict(self.exact_copy_backends).get(method, ()))
        family = any(f in model_type.lower() for f in self.dspark_host_length_targets)
        return method == "dspark" and family and not exact_copy

    def target_unsynced(self, hf_config: Any) -> bool:
        """Whether the target's host lengths are not synced after rejection."""
        if self.unsynced_target is None or hf_config is None:
            return False
        module, function = self.unsynced_target
        return bool(getattr(importlib.import_module(module), function)(hf_config))


def _on(room: Room, module: str, cls: str) -> Any:
    """The hooks of one class: ``hook(method, *parameters, **fields)``."""

    def hook(method: str, *parameters: str, **fields: Any) -> Hook:
        return Hook(room, module, cls, method, parameters, **fields)

    return hook


_SD = "vllm.v1.worker.gpu.spec_decode"
_draft = _on(Room.SPECULATOR, f"{_SD}.speculator", "DraftModelSpeculator")
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
_DFLASH_CAPTURE = Hook(Room.DFLASH, f"{_SD}.dflash.speculator", "DFlashSpeculator", "capture")
# Called, not wrapped: the EAGLE draft prefill builds through it.
_PREPARE_ATTN = _on(Room.AUTOREGRESSIVE, "vllm.v1.worker.gpu.model_states.interface", "ModelState")(
    "prepare_attn",
    *("input_batch", "cudagraph_mode", "block_tables", "slot_mappings", "attn_groups"),
    "kv_cache_config",
    wrapped=False,
)


def _autoregressive(package: str, cls: str, graph_manager_module: str, graph_manager: str):
    """vLLM's EAGLE speculator hooks, alike on both releases but for where the speculator and
    its decode graph manager live."""
    speculator = _on(Room.AUTOREGRESSIVE, f"{package}.speculator", cls)
    manager = _on(Room.AUTOREGRESSIVE, graph_manager_module, graph_manager)
    return (
        speculator("propose", "input_batch", "attn_metadata"),
        speculator("_prefill", "num_reqs", "num_tokens", "attn_metadata"),
        speculator("init_cudagraph_manager", "cudagraph_mode"),
        # Called, not wrapped: the graph manager class the speculator module names (which
        # init_cudagraph_manager makes; vllm-ascend replaces the name with its own class).
        _on(Room.AUTOREGRESSIVE, f"{package}.speculator", "SpeculatorCudaGraphManager")(
            "__init__",
            *("vllm_config", "device", "cudagraph_mode", "decode_query_len"),
            wrapped=False,
        ),
        # The decode graph manager's capture: a class of its own, its own wrapper.
        manager("capture", "input_buffers", "block_tables", wrapper="manager_capture"),
    )


_AR_0_33 = f"{_SD}.target_dependent_ar"
_ar_0_33 = _on(Room.AUTOREGRESSIVE, f"{_AR_0_33}.speculator", "TargetDependentARSpeculator")
VLLM_0_33 = Release(
    name="vLLM 0.33.x",
    vllm_minor=(0, 33),
    hooks=(
        _SET_ATTN,
        _BUILD_ATTN_METADATA,
        _draft("_update_draft_decode_metadata", "attn_metadata", "num_reqs"),
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
    ),
    methods=("dflash", "dspark", "eagle", "eagle3"),
    backends=(
        ("dflash", backends.GQA_0_33 + backends.MLA_QUERY_PASS_0_33),
        ("dspark", backends.GQA_0_33 + backends.MLA_QUERY_PASS_0_33),
        ("eagle", backends.GQA_0_33 + backends.MLA_VARLEN_0_33),
        ("eagle3", backends.GQA_0_33 + backends.MLA_VARLEN_0_33),
    ),
    backend_notes=backends.NOTES_0_33,
    dcp_backend_notes=backends.DCP_NOTES_0_33,
    bound_as_exact_rows=("num_decodes", "num_prefills"),
)

# vllm-ascend 0.30.0rc1/rc2 on vLLM 0.30.0 (design doc, section 8.2). DFlash and DSpark: FIA
# takes the device lengths the window sets (the per-propose build, the ACL graph replay
# build and the capture all go through the build hook). EAGLE/EAGLE3: vLLM 0.30's
# AutoRegressiveSpeculator runs the draft prefill and the per-step decode builds;
# vllm-ascend's subclass hands FIA actual lengths of its own for each decode step
# (_calc_next_seq_lens_cpu for seq_lens_list, build_fia_params for a FULL ACL graph replay)
# and captures without super(), through its own graph manager. DSpark on GLM-family targets
# and DFlash on MLA: the kernel takes the host bound plus the query stretch as exact.
# DSpark on MLA: its exact host copy of the device lengths
# (_prepare_draft_dcp_metadata_inputs, taken before any hook) is windowed.
_ASCEND_SD = "vllm_ascend.worker.v2.spec_decode"
_ASCEND_AR = f"{_ASCEND_SD}.autoregressive"
_ascend_ar = _on(
    Room.ASCEND_AUTOREGRESSIVE, f"{_ASCEND_AR}.speculator", "AscendAutoRegressiveSpeculator"
)
VLLM_0_30_ASCEND = Release(
    name="vLLM 0.30.x with vllm-ascend 0.30.0rc1 or 0.30.0rc2",
    vllm_minor=(0, 30),
    hooks=(
        _SET_ATTN,
        _BUILD_ATTN_METADATA,
        _DFLASH_CAPTURE,
        *_autoregressive(
            f"{_SD}.autoregressive",
            "AutoRegressiveSpeculator",
            f"{_ASCEND_AR}.aclgraph",
            "AutoRegressiveAclGraphManager",
        ),
        # vllm-ascend reimplements capture without super(): vLLM's capture wrapper serves it.
        _on(Room.AUTOREGRESSIVE, f"{_ASCEND_AR}.speculator", "AscendAutoRegressiveSpeculator")(
            "capture"
        ),
        _ascend_ar(
            "_calc_next_seq_lens_cpu", "seq_lens_cpu", "num_reqs", "num_reqs_padded", "step"
        ),
        _ascend_ar(
            "build_fia_params", "num_reqs_padded", "draft_attn_metadata", "is_draft_model_prefill"
        ),
        _ascend_ar("_build_attn_metadata", "num_reqs", "batch_desc", "step"),
        _on(Room.ASCEND_DSPARK, f"{_ASCEND_SD}.dspark.speculator", "AscendDSparkSpeculator")(
            "_prepare_draft_dcp_metadata_inputs", "num_reqs", "num_reqs_padded", "step"
        ),
        _PREPARE_ATTN,
    ),
    methods=("dflash", "dspark", "eagle", "eagle3"),
    # rc2 is rc1 with new Dockerfiles: the Python package differs only in _version.py (a test
    # compares the two trees).
    requires=("vllm-ascend", ("0.30.0rc1", "0.30.0rc2")),
    backends=(
        ("dflash", ("AscendAttentionBackend", "AscendMLABackend")),
        ("dspark", ("AscendAttentionBackend", "AscendMLABackend")),
        ("eagle", ("AscendAttentionBackend",)),
        ("eagle3", ("AscendAttentionBackend",)),
    ),
    actual_from_bound_backends=(("dflash", ("AscendMLABackend",)),),
    dspark_host_length_targets=("glm",),
    exact_copy_backends=(("dspark", ("AscendMLABackend",)),),
    # Under DCP its GQA/MLA builders take per-rank lists split from the host bound plus the
    # query stretch (DSpark: its DCP manager's equal lengths) as exact.
    dcp_actual_from_bound=("dflash", "dspark"),
    ar_actual_from_target=True,
    backend_module=("vllm_ascend.", "vllm-ascend"),
    host_mirror=("seq_lens_cpu", "seq_lens_np"),
    built_host_lengths=("seq_lens_list", "decode.seq_lens_list"),
    unsynced_target=("vllm_ascend.utils", "is_deepseek_v41"),
    unserved_state=backends.UNSERVED_STATE_ASCEND,
    prefill_state=("kvpp_runtime", "device_metadata"),
)

RELEASES = (VLLM_0_33, VLLM_0_30_ASCEND)
# vllm-ascend's config of additional_config's keys (module, class), which later releases
# validate strictly: the window's own keys are let through it (plugin.accept_own_keys).
STRICT_CONFIG = ("vllm_ascend.ascend_config", "AscendConfig")
SUPPORTED = ", ".join(release.name for release in RELEASES)


def installed_versions() -> dict[str, str]:
    """The installed vLLM and vllm-ascend distributions, for messages."""
    return {dist: _version_of(dist) for dist in ("vllm", "vllm-ascend")}


def describe_versions() -> str:
    versions = installed_versions()
    return f"vLLM {versions['vllm']}, vllm-ascend {versions['vllm-ascend']}"


def release_for(vllm_version: str) -> Release | None:
    """The supported release of a vLLM version (``0.33.0``, ``0.33.1.dev4+g...``), or None."""
    parts = vllm_version.split(".")
    try:
        minor = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        return None
    return next((r for r in RELEASES if r.vllm_minor == minor), None)


def requirement_problem(release: Release) -> str | None:
    """Why the release's companion distribution does not fit, or None."""
    if release.requires is None:
        return None
    dist, versions = release.requires
    installed = installed_versions()[dist]
    if installed.split("+")[0] not in versions:
        return f"{release.name} needs {dist} {' or '.join(versions)}, installed: {installed}"
    return None


def _version_of(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def dotted(obj: Any, path: str) -> Any:
    """``obj.a.b`` for ``path`` ``"a.b"`` (attribute paths a release names), None if absent."""
    for name in path.split("."):
        obj = getattr(obj, name, None)
    return obj
