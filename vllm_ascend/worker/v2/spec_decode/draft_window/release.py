# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What the window depends on in a release: speculators, attention backends, host lengths."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Release:
    """A supported vLLM release (with vllm-ascend where paired) and what the window serves."""

    name: str
    # Per method: the speculator classes and attention backends the window is proven for.
    speculators: tuple[tuple[str, tuple[str, ...]], ...]
    backends: tuple[tuple[str, tuple[str, ...]], ...] = ()
    backend_notes: tuple[tuple[str, str], ...] = ()
    method_notes: tuple[tuple[str, str], ...] = ()
    backend_module: tuple[str, str] = ("vllm.", "vLLM")
    # Under DCP: (backend, why, only with interleave > 1) taking a host bound as exact.
    dcp_backend_notes: tuple[tuple[str, str, bool], ...] = ()
    dcp_actual_from_bound: tuple[str, ...] = ()
    dcp_unserved: str | None = None
    # Kernels taking actual lengths computed on the host, from which the window starts.
    actual_from_bound_backends: tuple[tuple[str, tuple[str, ...]], ...] = ()
    dspark_host_length_targets: tuple[str, ...] = ()
    exact_copy_backends: tuple[tuple[str, tuple[str, ...]], ...] = ()
    ar_actual_from_target: bool = False
    # (torch, numpy) names of the input buffers' exact host copy of seq_lens.
    host_mirror: tuple[str, str] | None = None
    built_host_lengths: tuple[str, ...] = ()
    unsynced_target: tuple[str, str] | None = None
    # (attribute path, layout, why, fix) of speculator state the window does not serve.
    unserved_state: tuple[tuple[str, str, str, str], ...] = ()
    model_runner_v1: bool = True
    # What the draft's model state keeps of a ``prepare_attn`` call (the EAGLE draft prefill's).
    prepare_attn_state: tuple[str, ...] = ()
    block_table_width: tuple[str, str] = ("vllm.v1.worker.block_table", "get_block_table_width")
    free_kv_unserved: str | None = None

    @property
    def methods(self) -> tuple[str, ...]:
        """The speculative methods the window serves on this release."""
        return tuple(method for method, _ in self.speculators)

    def block_table_width_function(self) -> Callable[[int, int], int]:
        """vLLM's ``get_block_table_width`` on this release."""
        module, function = self.block_table_width
        return getattr(importlib.import_module(module), function)

    def speculators_for(self, method: str) -> tuple[str, ...]:
        return dict(self.speculators).get(method, ())

    def backends_for(self, method: str) -> tuple[str, ...] | None:
        return dict(self.backends).get(method)


def dotted(obj: object, path: str) -> object:
    """``obj.a.b`` for ``path`` ``"a.b"``; None if absent."""
    for name in path.split("."):
        obj = getattr(obj, name, None)
    return obj


UNSERVED_STATE_ASCEND = (
    (
        "replicated_pcp",
        "with vllm-ascend's replicated draft under prefill_context_parallel_size > 1",
        "its draft prefill rebuilds metadata for the global batch outside the window's hooks",
        "Use prefill_context_parallel_size=1",
    ),
    (
        "_sparse_kv_offload_metadata.req_ids_buffers",
        "with vllm-ascend's sparse_kv_offload_config enabled",
        "its draft metadata reads offloaded KV by absolute slots the window does not crop",
        "Disable the offload",
    ),
)

FREE_KV_ASCEND = (
    "vLLM 0.30's Model Runner V2 does not null a sliding-window group's freed blocks and "
    "vllm-ascend turns sliding-window specs back into full ones for DSpark's KV reuse; "
    "freeing draft blocks is unproven on its NPU kernels and graphs"
)

ASCEND_SPECULATORS = (
    ("dflash", ("AscendDFlashSpeculator", "AscendDFlash2Speculator")),
    ("dspark", ("AscendDSparkSpeculator",)),
    ("eagle", ("AscendEagleSpeculator",)),
    ("eagle3", ("AscendEagleSpeculator",)),
)

# vllm-ascend 0.30.0rc1/rc2. EAGLE decode steps hand FIA host lengths of their own
# (_calc_next_seq_lens_cpu, build_fia_params); DFlash on MLA and DSpark on GLM targets take
# the host bound plus the query length as exact; DSpark on MLA has an exact host copy.
VLLM_0_30_ASCEND = Release(
    name="vLLM 0.30.x with vllm-ascend 0.30.0rc1 or 0.30.0rc2",
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
    dcp_actual_from_bound=("dflash", "dspark"),
    ar_actual_from_target=True,
    backend_module=("vllm_ascend.", "vllm-ascend"),
    host_mirror=("seq_lens_cpu", "seq_lens_np"),
    built_host_lengths=("seq_lens_list", "decode.seq_lens_list"),
    unsynced_target=("vllm_ascend.utils", "is_deepseek_v41"),
    unserved_state=UNSERVED_STATE_ASCEND,
    prepare_attn_state=("block_tables", "slot_mappings", "kv_cache_config", "pcp_context", "attn_metadata"),
    free_kv_unserved=FREE_KV_ASCEND,
)
