# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What the window depends on in a release: its speculator classes, attention backends and
host lengths. ``VLLM_0_30_ASCEND`` is vllm-ascend's, which its speculators name."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Release:
    """A supported vLLM release (``major.minor``), with vllm-ascend where it pairs with one:
    its hooks, and what the window is proven for there."""

    name: str
    vllm_minor: tuple[int, int]
    # Per speculative method the window serves on this release, the speculator classes (by
    # name) vLLM or vllm-ascend makes for it that the window is tested with: any other class
    # (a new draft family, a subclass that reads more) is refused by name, never windowed
    # untested.
    speculators: tuple[tuple[str, tuple[str, ...]], ...]
    # Per speculative method, the attention backend class names the window is proven for on
    # the draft's groups (a method not listed: any backend of ``backend_module``); a draft
    # whose kernel takes host lengths the window does not set is refused, with the reason
    # ``backend_notes`` gives for a known one.
    backends: tuple[tuple[str, tuple[str, ...]], ...] = ()
    backend_notes: tuple[tuple[str, str], ...] = ()
    # Per method, why a backend it is not proven for is refused (before ``backend_notes``).
    method_notes: tuple[tuple[str, str], ...] = ()
    # Where the served backends are defined (a module prefix, and the project's name): one
    # defined elsewhere (a platform plugin's) may hand its kernel host lengths of its own.
    backend_module: tuple[str, str] = ("vllm.", "vLLM")
    # Under DCP: backends whose build takes a host bound as exact (why; only when the
    # interleave is above 1?), and the methods whose kernel takes the host bound plus the
    # query stretch as its actual lengths.
    dcp_backend_notes: tuple[tuple[str, str, bool], ...] = ()
    dcp_actual_from_bound: tuple[str, ...] = ()
    # Why drafts under DCP are not served on this release at all (None: served).
    dcp_unserved: str | None = None
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
    # Whether an EAGLE FULL decode graph's replay parameters (build_fia_params) take their
    # block table from the target's metadata rather than the draft's: the window hands them
    # the cropped table its recorded refresh rewrites at every step.
    fia_table_from_target: bool = False
    # Whether the release still has Model Runner V1 (vLLM 0.34 removed it): where it has
    # not, messages never suggest it.
    model_runner_v1: bool = True
    # (module, function) of vLLM's block-table width rounding, which the cropped tables
    # follow (vLLM 0.34 moved it).
    block_table_width: tuple[str, str] = ("vllm.v1.worker.block_table", "get_block_table_width")
    # Config attributes that, when set, name a layout the window does not serve here:
    # (attribute path in the VllmConfig, the layout, why, the fix).
    unserved_config: tuple[tuple[str, str, str, str], ...] = ()
    # Whether a draft may run at a decode-context-parallel size of its own
    # (draft_decode_context_parallel_size): the window then serves only the sizes earlier
    # releases gave each method.
    own_draft_dcp: bool = False
    # Why draft_window_free_kv is not served on this release (None: served, through the
    # model runner's get_kv_cache_spec hook).
    free_kv_unserved: str | None = None

    @property
    def methods(self) -> tuple[str, ...]:
        """The speculative methods the window serves on this release."""
        return tuple(method for method, _ in self.speculators)

    def block_table_width_function(self) -> Any:
        """vLLM's ``get_block_table_width`` on this release."""
        module, function = self.block_table_width
        return getattr(importlib.import_module(module), function)

    def speculators_for(self, method: str) -> tuple[str, ...]:
        """The speculator classes the window is tested with for ``method`` on this release."""
        return dict(self.speculators).get(method, ())

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


def dotted(obj: Any, path: str) -> Any:
    """``obj.a.b`` for ``path`` ``"a.b"`` (attribute paths a release names), None if absent."""
    for name in path.split("."):
        obj = getattr(obj, name, None)
    return obj


# vllm-ascend's speculator state that names a layout the window does not serve:
# (attribute path, the layout, why, the fix).
UNSERVED_STATE_ASCEND = (
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
)

# vllm-ascend's worker turns sliding-window specs back into full ones where DSpark reuses
# the target's KV; the freed draft blocks are unproven on its kernels and graphs.
FREE_KV_ASCEND = (
    "vLLM 0.30's Model Runner V2 does not null a sliding-window group's freed blocks and "
    "vllm-ascend turns sliding-window specs back into full ones for DSpark's KV reuse; "
    "freeing draft blocks is unproven on its NPU kernels and graphs"
)

# vllm-ascend's init_speculator: its own subclass of each of vLLM's (DFlash2 by the draft's
# architecture; eager only there).
ASCEND_SPECULATORS = (
    ("dflash", ("AscendDFlashSpeculator", "AscendDFlash2Speculator")),
    ("dspark", ("AscendDSparkSpeculator",)),
    ("eagle", ("AscendEagleSpeculator",)),
    ("eagle3", ("AscendEagleSpeculator",)),
)

# vllm-ascend 0.30.0rc1/rc2 on vLLM 0.30.0. DFlash and DSpark: FIA
# takes the device lengths the window sets (the per-propose build, the ACL graph replay
# build and the capture all go through the build hook). EAGLE/EAGLE3: vLLM 0.30's
# AutoRegressiveSpeculator runs the draft prefill and the per-step decode builds;
# vllm-ascend's subclass hands FIA actual lengths of its own for each decode step
# (_calc_next_seq_lens_cpu for seq_lens_list, build_fia_params for a FULL ACL graph replay)
# and captures without super(), through its own graph manager. DSpark on GLM-family targets
# and DFlash on MLA: the kernel takes the host bound plus the query stretch as exact.
# DSpark on MLA: its exact host copy of the device lengths
# (_prepare_draft_dcp_metadata_inputs, taken before any hook) is windowed.
VLLM_0_30_ASCEND = Release(
    name="vLLM 0.30.x with vllm-ascend 0.30.0rc1 or 0.30.0rc2",
    vllm_minor=(0, 30),
    speculators=ASCEND_SPECULATORS,
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
    unserved_state=UNSERVED_STATE_ASCEND,
    prefill_state=("kvpp_runtime", "device_metadata"),
    free_kv_unserved=FREE_KV_ASCEND,
)
