# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What vllm-ascend adds to the EAGLE family (``AscendAutoRegressiveSpeculator``, 0.30): the
actual lengths its kernel takes, which it computes on the host, each windowed by the
device's arithmetic from the same start as the device's lengths and cropped table:

- each decode step's ``_calc_next_seq_lens_cpu`` (``seq_lens_list``, ``seq_lens_cpu``):
  the target's length plus the step, windowed like the device side of the same step;
- ``build_fia_params``, a FULL-graph replay's ``actual_seq_lengths_kv`` per recorded step
  (and, where the release takes its block table from the target's metadata, the cropped
  table the recorded refresh rewrites at every step);
- ``_build_draft_attn_metadata`` (0.29): each decode step's host lengths set before its
  forward, where vllm-ascend sets them only after it;
- under decode context parallelism, the lengths its DCP manager hands each build
  (``_build_attn_metadata``), which vllm-ascend then splits per rank: windowed before the
  split, so that every rank gets its share of the window (a window start is whole rounds
  of every rank).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.worker.v2.spec_decode.draft_window import ascend
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.hooks.common import (
    Installed,
    after,
    around,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import (
    DraftWindow,
    not_in_path,
)


def calc_next_seq_lens_cpu(original: Callable, installed: Installed) -> Callable:
    """``_calc_next_seq_lens_cpu``: the host lengths an EAGLE decode step's kernel takes,
    windowed in place."""

    def windowed(self: Any, window: DraftWindow, lengths: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return window.window_actual_seq_lens(lengths)

    return after(original, installed, windowed)


def build_fia_params(original: Callable, installed: Installed) -> Callable:
    """``build_fia_params``: the replay's parameters windowed (``ascend.fia_params``)."""
    signature = inspect.signature(original)

    def windowed(self: Any, window: DraftWindow, params: list, *args: Any, **kwargs: Any) -> list:
        arguments = signature.bind(self, *args, **kwargs).arguments
        params = ascend.fia_params(
            self,
            window,
            params,
            arguments["num_reqs_padded"],
            arguments["is_draft_model_prefill"],
        )
        if installed.release.fia_table_from_target:
            _cropped_tables(self, window, params, arguments["num_reqs_padded"])
        return params

    return after(original, installed, windowed)


def _cropped_tables(
    speculator: Any,
    window: DraftWindow,
    params: list[dict[str, Any]],
    num_reqs_padded: int,
) -> None:
    """Point each layer's ``block_table`` at its group's cropped table."""
    groups = {
        name: g
        for g, attn_groups in enumerate(speculator.attn_groups)
        for group in attn_groups
        for name in group.layer_names
    }
    for param in params:
        g = groups.get(param["layer_name"])
        if g not in window.windows:
            raise not_in_path(
                f"{type(speculator).__name__}.build_fia_params names layer "
                f"{param['layer_name']}, which no windowed draft KV-cache group holds"
            )
        param["block_table"] = window.windows[g].block_table[:num_reqs_padded]


def build_attn_metadata(original: Callable, installed: Installed) -> Callable:
    """``AscendAutoRegressiveSpeculator._build_attn_metadata`` under DCP: the actual lengths
    its DCP manager returns for the build (``prepare_draft_dcp_metadata_inputs``: the
    target's length plus the step), windowed in place before vllm-ascend splits them."""

    def body(self: Any, window: DraftWindow, *args: Any, **kwargs: Any) -> Any:
        manager = getattr(self, "dcp_manager", None) if getattr(self, "use_dcp", False) else None
        if manager is None:
            return original(self, *args, **kwargs)
        prepare = manager.prepare_draft_dcp_metadata_inputs

        def windowed(*inner: Any, **inner_kwargs: Any) -> tuple:
            seq_lens_cpu, is_prefilling = prepare(*inner, **inner_kwargs)
            window.window_actual_seq_lens(seq_lens_cpu)
            return seq_lens_cpu, is_prefilling

        # For this build only: the manager's own method comes back after it.
        manager.prepare_draft_dcp_metadata_inputs = windowed
        try:
            return original(self, *args, **kwargs)
        finally:
            del manager.prepare_draft_dcp_metadata_inputs

    return around(original, installed, body)


def build_draft_attn_metadata(original: Callable, installed: Installed) -> Callable:
    """``AscendAutoRegressiveSpeculator._build_draft_attn_metadata`` (0.29): vllm-ascend sets
    a decode step's host lengths (``_update_decode_attn_metadata``, through
    ``_calc_next_seq_lens_cpu``) only after the step's forward, which until then reads the
    one batch-wide host length every draft build is handed; the window sets them for the
    step before it, as vllm-ascend 0.30 does in this build."""
    signature = inspect.signature(original)

    def windowed(self: Any, window: DraftWindow, metadata: Any, *args: Any, **kwargs: Any):
        arguments = signature.bind(self, *args, **kwargs).arguments
        if metadata is not None and arguments["step"] > 0:
            self._update_decode_attn_metadata(metadata, arguments["step"], arguments["num_reqs"])
        return metadata

    return after(original, installed, windowed)
