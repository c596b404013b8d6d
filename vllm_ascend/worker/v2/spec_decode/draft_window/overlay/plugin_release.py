# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""A release as the plugin form serves it: the core's ``Release`` and what only the plugin
reads of it (the vLLM version it pairs with, what the path check and vllm-ascend 0.29's FULL
replay read, vLLM 0.34's layouts)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm_ascend.worker.v2.spec_decode.draft_window.methods import METHODS, Kind
from vllm_ascend.worker.v2.spec_decode.draft_window.policy import refused
from vllm_ascend.worker.v2.spec_decode.draft_window.release import Release, dotted

if TYPE_CHECKING:
    from vllm.config import VllmConfig


@dataclass(frozen=True, kw_only=True)
class PluginRelease(Release):
    vllm_minor: tuple[int, int]
    # Metadata (decode, prefill) row counts where prefill rows take the host bound as exact.
    bound_as_exact_rows: tuple[str, str] | None = None
    # An EAGLE FULL decode replay takes its block table from the target's metadata.
    fia_table_from_target: bool = False
    # (attribute path, layout, why, fix) of configurations the window does not serve.
    unserved_config: tuple[tuple[str, str, str, str], ...] = ()
    # The draft may run at a decode context parallel size of its own.
    own_draft_dcp: bool = False

    @classmethod
    def of(cls, release: Release, **facts: Any) -> PluginRelease:
        """``release`` with the plugin's ``facts``."""
        fields = {f.name: getattr(release, f.name) for f in dataclasses.fields(Release)}
        return cls(**fields, **facts)


def refuse_config(vllm_config: VllmConfig, release: PluginRelease, asked: object) -> None:
    """Stop on a layout the release does not serve (vLLM 0.34's dual-batch overlap) or a draft
    DCP size other than the target's (1 for a DFlash-family draft without MLA)."""
    speculative = vllm_config.speculative_config
    method = getattr(speculative, "method", None)
    if METHODS.get(method or "") is Kind.MTP:
        return
    for path, layout, why, fix in release.unserved_config:
        if dotted(vllm_config, path):
            raise ValueError(refused(asked, f"is not supported on {release.name} {layout}: {why}", fix))
    draft_dcp = getattr(speculative, "draft_decode_context_parallel_size", None)
    if not release.own_draft_dcp or draft_dcp is None:
        return
    target_dcp = vllm_config.parallel_config.decode_context_parallel_size
    draft_config = getattr(speculative, "draft_model_config", None)
    replicated = METHODS.get(method) is Kind.PARALLEL and not getattr(draft_config, "use_mla", False)
    served = 1 if replicated else target_dcp
    if draft_dcp != served:
        raise ValueError(
            refused(
                asked,
                f"is not supported on {release.name} with draft_decode_context_parallel_size="
                f"{draft_dcp} under decode_context_parallel_size={target_dcp} for method "
                f"{method!r}: the window is proven for that draft at "
                f"draft_decode_context_parallel_size={served} only",
                f"Set draft_decode_context_parallel_size={served} (or leave it unset)",
            )
        )
