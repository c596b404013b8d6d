"""The vLLM lines the draft window supports, and what it hooks on each: the one place that
knows versions, module paths, class names and parameters.

The rest of the package reads versions only through this module; ``install.py`` resolves a
line's hooks on the installed vLLM.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass
from typing import Any

_SPEC_DECODE = "vllm.v1.worker.gpu.spec_decode"


@dataclass(frozen=True)
class Hook:
    """One method the window wraps (``wrapper`` names its factory in ``hooks.FACTORIES``), or
    only calls (``wrapper`` None; it may then be inherited), with the parameters it relies
    on."""

    module: str
    cls: str
    method: str
    wrapper: str | None
    parameters: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.cls}.{self.method}"


@dataclass(frozen=True)
class Line:
    """A supported vLLM release line (``major.minor``), its hooks, and what the window is
    proven for there."""

    name: str
    vllm_minor: tuple[int, int]
    hooks: tuple[Hook, ...]
    # Speculative methods the window serves on this line.
    methods: tuple[str, ...]
    # (distribution, version prefix) that must be installed beside vLLM, or None.
    requires: tuple[str, str] | None = None
    # Per speculative method, the attention backend class names the window is proven for on
    # the draft's groups (a method not listed: any backend of ``backend_module``); a draft
    # whose kernel takes host lengths the window does not set is refused, with the reason
    # ``backend_notes`` gives for a known one.
    backends: tuple[tuple[str, tuple[str, ...]], ...] = ()
    backend_notes: tuple[tuple[str, str], ...] = ()
    # Where the served backends are defined (a module prefix, and the project's name): one
    # defined elsewhere (a platform plugin's) may tell its kernel host lengths of its own,
    # which only that line's hooks window.
    backend_module: tuple[str, str] = ("vllm.", "vLLM")
    # Under DCP: backends whose build takes a host bound as exact (why; only when the
    # interleave is above 1?), and the methods told the host bound plus the query stretch.
    dcp_backend_notes: tuple[tuple[str, str, bool], ...] = ()
    dcp_told_bound: tuple[str, ...] = ()
    # The built metadata's (decode rows, prefill rows) counts where a builder's prefill path
    # takes the host bound as the exact length of its rows (vLLM's MLA: context = bound - q):
    # the run-time proof checks, at every build, that the window made those rows exact.
    bound_as_exact_rows: tuple[str, str] | None = None
    # Where the kernel is told host lengths of its own (vllm-ascend; window.py: a told
    # length), the window's start comes from that told length, on the host and the device:
    # - per method, the backends whose kernel takes the builder's host bound plus the query
    #   stretch as the exact length (DFlash on MLA);
    told_bound_backends: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # - targets (a substring of their model_type) for whose DSpark drafts the same holds,
    #   except on the backends handed an exact host copy (below);
    dspark_host_length_targets: tuple[str, ...] = ()
    # - per method, the backends handed an exact host copy of the draft's device lengths,
    #   windowed by the device's arithmetic (DSpark on MLA);
    exact_copy_backends: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # - whether an EAGLE decode step's kernel is told the target's length plus the step (the
    #   rejected tokens included) rather than the draft's own length.
    ar_told_target_lengths: bool = False
    # The exact host mirror of seq_lens the line's input buffers keep (torch and numpy
    # names, one memory), and the built metadata's host length lists its kernels take
    # (dotted paths): the run-time proof checks both.
    host_mirror: tuple[str, str] | None = None
    built_host_lengths: tuple[str, ...] = ()
    # (module, function) telling whether a target's host lengths are not synced after
    # rejection, so that a told length and the device's differ.
    unsynced_target: tuple[str, str] | None = None
    # Speculator attributes that, when set, name a layout the window does not serve here:
    # (attribute path, the layout, why, the fix).
    unserved_state: tuple[tuple[str, str, str, str], ...] = ()
    # Model-state attributes of per-step state a draft prefill rebuild would run twice.
    prefill_state: tuple[str, ...] = ()

    def backends_for(self, method: str) -> tuple[str, ...] | None:
        """The backends proven for ``method`` on this line, or None (any)."""
        return dict(self.backends).get(method)

    def told_bound(self, method: str, backends: set[str], model_type: str) -> bool:
        """Whether the draft's kernel takes the host bound plus the query stretch as its
        exact length, for ``method`` on ``backends`` with a target of ``model_type``."""
        if backends & set(dict(self.told_bound_backends).get(method, ())):
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


_AR = f"{_SPEC_DECODE}.target_dependent_ar"

# vLLM 0.33's draft attention backends the window is proven for (design doc, section 4.2):
# their builders hand the kernel the window's device lengths and cropped tables, and take
# host values as bounds only, on every pass of the method. Flash attention, Triton and the
# MLA decode path are driven through their real builds in the tests; FlashInfer (which
# copies the exact device lengths to the host whenever speculative tokens are configured),
# CPU attention, FlashMLA and the FlashInfer and FlashAttention MLA builders do not build
# on a CPU without their kernels' packages and are served from reading their builds, with
# the run-time proof checking the MLA prefill rows at every build.
_GQA_0_33 = (
    "FlashAttentionBackend",
    "TritonAttentionBackend",
    "FlashInferBackend",
    "CPUAttentionBackend",
)
# MLA builders whose decode threshold (1 + K, or more) keeps a DFlash/DSpark query pass of
# K + 1 or K tokens per request on the decode path, which reads the device lengths.
_MLA_QUERY_PASS_0_33 = (
    "TritonMLABackend",
    "FlashMLABackend",
    "FlashInferMLABackend",
    "FlashAttnMLABackend",
)
# MLA builders that send only rows longer than the threshold to their prefill path (a
# draft prefill's prefilling rows, whose host length the window makes exact).
_MLA_VARLEN_0_33 = ("FlashInferMLABackend", "FlashAttnMLABackend")
_SINGLE_ONLY_MLA = (
    "its builder takes single-token queries only, so every draft query of several tokens "
    "goes to its prefill path, which takes the host bound as the exact context length; the "
    "window's host bound is only a bound there"
)
_UNIFORM_MLA_AR = (
    "its builder sends every row from the first query of another length on to its prefill "
    "path, which takes the host bound as the exact context length; an EAGLE draft prefill's "
    "verify rows have only a bound there"
)
_BACKEND_NOTES_0_33 = (
    ("CutlassMLABackend", _SINGLE_ONLY_MLA),
    ("CPUMLABackend", _SINGLE_ONLY_MLA),
    ("XPUFlashAttnMLABackend", _SINGLE_ONLY_MLA),
    ("TritonMLABackend", _UNIFORM_MLA_AR),
    ("FlashMLABackend", _UNIFORM_MLA_AR),
    (
        "FlexAttentionBackend",
        "its builder copies the lengths into buffers of its own, which "
        "the window's in-place updates and its run-time proof do not follow",
    ),
)
# Under DCP an MLA builder without varlen DCP support gets multi-token queries on its prefill
# path (``_init_reorder_batch_threshold``), which takes the host bound as exact.
_DCP_NO_VARLEN = (
    "under decode context parallelism its builder declares no varlen support, so vLLM "
    "sends the draft's queries of several tokens to its prefill path, which takes the host "
    "bound as the exact context length; the window's host bound is only a bound there"
)
_DCP_NOTES_0_33 = (
    ("TritonMLABackend", _DCP_NO_VARLEN, False),
    ("FlashMLABackend", _DCP_NO_VARLEN, False),
    (
        "FlashAttnMLABackend",
        _DCP_NO_VARLEN.replace(
            "declares no varlen support",
            "declares varlen support only with cp_kv_cache_interleave_size=1",
        ),
        True,
    ),
)
# Hooked alike on both lines.
_SET_ATTN = Hook(
    f"{_SPEC_DECODE}.speculator",
    "DraftModelSpeculator",
    "set_attn",
    "set_attn",
    (
        "model_state",
        "kv_cache_config",
        "block_tables",
        "target_input_buffers",
        "target_attn_groups",
    ),
)
_BUILD_ATTN_METADATA = Hook(
    f"{_SPEC_DECODE}.speculator",
    "DraftModelSpeculator",
    "_build_attn_metadata",
    "build_attn_metadata",
    ("num_reqs", "batch_desc", "query_start_loc_np", "seq_lens_cpu_upper_bound", "step"),
)
_DFLASH_CAPTURE = Hook(
    f"{_SPEC_DECODE}.dflash.speculator", "DFlashSpeculator", "capture", "dflash_capture"
)
# Called, not wrapped: the EAGLE draft prefill builds through it.
_PREPARE_ATTN = Hook(
    "vllm.v1.worker.gpu.model_states.interface",
    "ModelState",
    "prepare_attn",
    None,
    (
        "input_batch",
        "cudagraph_mode",
        "block_tables",
        "slot_mappings",
        "attn_groups",
        "kv_cache_config",
    ),
)


def _ar_hooks(module: str, cls: str) -> tuple[Hook, ...]:
    """vLLM's autoregressive (EAGLE) speculator hooks, alike on both lines but for where the
    speculator and its graph manager live."""
    return (
        Hook(f"{module}.speculator", cls, "propose", "propose", ("input_batch", "attn_metadata")),
        Hook(
            f"{module}.speculator",
            cls,
            "_prefill",
            "prefill",
            ("num_reqs", "num_tokens", "attn_metadata"),
        ),
        Hook(
            f"{module}.speculator",
            cls,
            "init_cudagraph_manager",
            "init_cudagraph_manager",
            ("cudagraph_mode",),
        ),
        # Called, not wrapped: the graph manager class the speculator module names (which
        # init_cudagraph_manager makes; vllm-ascend replaces the name with its own class).
        Hook(
            f"{module}.speculator",
            "SpeculatorCudaGraphManager",
            "__init__",
            None,
            ("vllm_config", "device", "cudagraph_mode", "decode_query_len"),
        ),
    )


VLLM_0_33 = Line(
    name="vLLM 0.33.x",
    vllm_minor=(0, 33),
    hooks=(
        _SET_ATTN,
        _BUILD_ATTN_METADATA,
        Hook(
            f"{_SPEC_DECODE}.speculator",
            "DraftModelSpeculator",
            "_update_draft_decode_metadata",
            "update_draft_decode_metadata",
            ("attn_metadata", "num_reqs"),
        ),
        _DFLASH_CAPTURE,
        *_ar_hooks(_AR, "TargetDependentARSpeculator"),
        Hook(f"{_AR}.speculator", "TargetDependentARSpeculator", "capture", "ar_capture"),
        Hook(
            f"{_AR}.speculator",
            "TargetDependentARSpeculator",
            "_fused_multi_step_decode",
            "fused_multi_step_decode",
            ("num_speculative_steps",),
        ),
        Hook(
            f"{_AR}.cudagraph_utils",
            "SpeculatorCudaGraphManager",
            "capture",
            "manager_capture",
            ("input_buffers", "block_tables"),
        ),
        _PREPARE_ATTN,
    ),
    methods=("dflash", "dspark", "eagle", "eagle3"),
    backends=(
        ("dflash", _GQA_0_33 + _MLA_QUERY_PASS_0_33),
        ("dspark", _GQA_0_33 + _MLA_QUERY_PASS_0_33),
        ("eagle", _GQA_0_33 + _MLA_VARLEN_0_33),
        ("eagle3", _GQA_0_33 + _MLA_VARLEN_0_33),
    ),
    backend_notes=_BACKEND_NOTES_0_33,
    dcp_backend_notes=_DCP_NOTES_0_33,
    bound_as_exact_rows=("num_decodes", "num_prefills"),
)

# vllm-ascend 0.30.0rc2 on vLLM 0.30.0, every draft through vllm-ascend's GQA (FIA) backend.
# DFlash and DSpark: FIA takes the device lengths the window sets (the per-propose build,
# the ACL graph replay build and the capture all go through the build hook). EAGLE/EAGLE3:
# vLLM 0.30's AutoRegressiveSpeculator runs the draft prefill and the per-step decode
# builds; vllm-ascend's subclass tells FIA host lengths of its own for each decode step
# (_calc_next_seq_lens_cpu for seq_lens_list, build_fia_params for a FULL ACL graph
# replay), captures without super() and through its own graph manager. DSpark on GLM-family
# targets: FIA takes the host bound plus the query stretch as the exact length. MLA drafts
# (DFlash, DSpark) take host lengths as exact: DSpark's own exact copy of the device lengths
# (_prepare_draft_dcp_metadata_inputs, taken before any hook) is windowed; DFlash's is the
# host bound plus the query stretch, windowed as a told length.
_ASCEND_AR = "vllm_ascend.worker.v2.spec_decode.autoregressive"
_AR_0_30 = f"{_SPEC_DECODE}.autoregressive"
VLLM_0_30_ASCEND = Line(
    name="vLLM 0.30.x with vllm-ascend 0.30.0rc2",
    vllm_minor=(0, 30),
    hooks=(
        _SET_ATTN,
        _BUILD_ATTN_METADATA,
        _DFLASH_CAPTURE,
        *_ar_hooks(_AR_0_30, "AutoRegressiveSpeculator"),
        Hook(f"{_ASCEND_AR}.speculator", "AscendAutoRegressiveSpeculator", "capture", "ar_capture"),
        Hook(
            f"{_ASCEND_AR}.speculator",
            "AscendAutoRegressiveSpeculator",
            "_calc_next_seq_lens_cpu",
            "told_host_lengths",
            ("seq_lens_cpu", "num_reqs", "num_reqs_padded", "step"),
        ),
        Hook(
            f"{_ASCEND_AR}.speculator",
            "AscendAutoRegressiveSpeculator",
            "build_fia_params",
            "fia_params",
            ("num_reqs_padded", "draft_attn_metadata", "is_draft_model_prefill"),
        ),
        Hook(
            f"{_ASCEND_AR}.speculator",
            "AscendAutoRegressiveSpeculator",
            "_build_attn_metadata",
            "dcp_told_lengths",
            ("num_reqs", "batch_desc", "step"),
        ),
        Hook(
            f"{_ASCEND_AR}.aclgraph",
            "AutoRegressiveAclGraphManager",
            "capture",
            "manager_capture",
            ("input_buffers", "block_tables"),
        ),
        Hook(
            "vllm_ascend.worker.v2.spec_decode.dspark.speculator",
            "AscendDSparkSpeculator",
            "_prepare_draft_dcp_metadata_inputs",
            "exact_host_lengths",
            ("num_reqs", "num_reqs_padded", "step"),
        ),
        _PREPARE_ATTN,
    ),
    methods=("dflash", "dspark", "eagle", "eagle3"),
    requires=("vllm-ascend", "0.30.0rc2"),
    backends=(
        ("dflash", ("AscendAttentionBackend", "AscendMLABackend")),
        ("dspark", ("AscendAttentionBackend", "AscendMLABackend")),
        ("eagle", ("AscendAttentionBackend",)),
        ("eagle3", ("AscendAttentionBackend",)),
    ),
    told_bound_backends=(("dflash", ("AscendMLABackend",)),),
    dspark_host_length_targets=("glm",),
    exact_copy_backends=(("dspark", ("AscendMLABackend",)),),
    # Under DCP its GQA/MLA builders take per-rank lists split from the host bound plus the
    # query stretch (DSpark: its DCP manager's equal told lengths) as exact.
    dcp_told_bound=("dflash", "dspark"),
    ar_told_target_lengths=True,
    backend_module=("vllm_ascend.", "vllm-ascend"),
    host_mirror=("seq_lens_cpu", "seq_lens_np"),
    built_host_lengths=("seq_lens_list", "decode.seq_lens_list"),
    unsynced_target=("vllm_ascend.utils", "is_deepseek_v41"),
    unserved_state=(
        (
            "replicated_pcp",
            "with vllm-ascend's replicated draft under prefill_context_parallel_size > 1",
            "its draft prefill rebuilds metadata for the global batch outside the window's hooks",
            "Use prefill_context_parallel_size=1",
        ),
        # vllm-ascend builds these buffers only with sparse_kv_offload_config enabled.
        (
            "_sparse_kv_offload_metadata.req_ids_buffers",
            "with vllm-ascend's sparse_kv_offload_config enabled",
            "its draft metadata reads offloaded KV by absolute slots the window does not crop",
            "Disable the offload",
        ),
    ),
    prefill_state=("kvpp_runtime", "device_metadata"),
)

LINES = (VLLM_0_33, VLLM_0_30_ASCEND)
# vllm-ascend's config of additional_config's keys (module, class), which later releases
# validate strictly: the window's own keys are let through it (plugin.accept_own_keys).
STRICT_CONFIG = ("vllm_ascend.ascend_config", "AscendConfig")
SUPPORTED = ", ".join(line.name for line in LINES)


def installed_versions() -> dict[str, str]:
    """The installed vLLM and vllm-ascend distributions, for messages."""
    return {dist: _version_of(dist) for dist in ("vllm", "vllm-ascend")}


def describe_versions() -> str:
    versions = installed_versions()
    return f"vLLM {versions['vllm']}, vllm-ascend {versions['vllm-ascend']}"


def line_for(vllm_version: str) -> Line | None:
    """The supported line of a vLLM version (``0.33.0``, ``0.33.1.dev4+g...``), or None."""
    parts = vllm_version.split(".")
    try:
        minor = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        return None
    return next((line for line in LINES if line.vllm_minor == minor), None)


def requirement_problem(line: Line) -> str | None:
    """Why the line's companion distribution does not fit, or None."""
    if line.requires is None:
        return None
    dist, version = line.requires
    installed = installed_versions()[dist]
    if installed == "not installed" or not installed.startswith(version):
        return f"{line.name} needs {dist} {version}, installed: {installed}"
    return None


def _version_of(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def dotted(obj: Any, path: str) -> Any:
    """``obj.a.b`` for ``path`` ``"a.b"`` (attribute paths the lines name), None if absent."""
    for name in path.split("."):
        obj = getattr(obj, name, None)
    return obj
