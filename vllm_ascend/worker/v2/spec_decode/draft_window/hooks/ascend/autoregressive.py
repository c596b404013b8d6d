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

from vllm_ascend.worker.v2.spec_decode.draft_window.dcp import dcp_local_lengths
from vllm_ascend.worker.v2.spec_decode.draft_window.hooks.common import (
    Installed,
    after,
    around,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.mrv2 import Mrv2DraftWindow
from vllm_ascend.worker.v2.spec_decode.draft_window.path_check import not_in_path


def calc_next_seq_lens_cpu(original: Callable, installed: Installed) -> Callable:
    """``_calc_next_seq_lens_cpu``: the host lengths an EAGLE decode step's kernel takes,
    windowed in place."""

    def windowed(
        self: Any, window: Mrv2DraftWindow, lengths: torch.Tensor, *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        return window.window_actual_seq_lens(lengths)

    return after(original, installed, windowed)


def build_fia_params(original: Callable, installed: Installed) -> Callable:
    """``build_fia_params``: the per-step ``actual_seq_lengths_kv`` a FULL-graph replay hands
    the recorded kernel, windowed like the device side of each recorded step."""
    signature = inspect.signature(original)

    def windowed(
        self: Any, window: Mrv2DraftWindow, params: list, *args: Any, **kwargs: Any
    ) -> list:
        arguments = signature.bind(self, *args, **kwargs).arguments
        if arguments["is_draft_model_prefill"]:
            # Only a FULL draft-prefill graph replays with these; the window runs the draft
            # prefill without one (init_cudagraph_manager).
            raise not_in_path(
                f"{type(self).__name__}.build_fia_params was asked for a FULL draft-prefill "
                f"graph, which reads the target's unwindowed metadata; the window runs the "
                f"draft prefill without FULL graphs"
            )
        if installed.release.fia_table_from_target:
            _cropped_tables(self, window, params, arguments["num_reqs_padded"])
        if window.dcp is not None:
            return _dcp_shares(self, window, params)
        # Every layer of a step gets the same list: window each list once (the entry keeps
        # the list alive, so its id is not reused meanwhile).
        done: dict[int, tuple[list[int], list[int]]] = {}
        for param in params:
            lengths = param["actual_seq_lengths_kv"]
            if id(lengths) not in done:
                windowed = window.window_actual_seq_lens(torch.tensor(lengths, dtype=torch.int32))
                done[id(lengths)] = (lengths, windowed.tolist())
            param["actual_seq_lengths_kv"] = done[id(lengths)][1]
        return params

    return after(original, installed, windowed)


def _cropped_tables(
    speculator: Any, window: Mrv2DraftWindow, params: list, num_reqs_padded: int
) -> None:
    """Each layer's ``block_table`` the window's cropped table of its group: the table the
    graph recorded (through the window's views), which the recorded refresh of every step
    rewrites. The release hands the target's table, which the window does not crop."""
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


def _dcp_shares(speculator: Any, window: Mrv2DraftWindow, params: list) -> list:
    """Under DCP each step's ``actual_seq_lengths_kv`` is this rank's share of the step's
    global lengths (the target's length plus the step), which only the global lengths can be
    windowed from: each step's are recomputed as vllm-ascend computes them for the eager
    update (``_calc_next_seq_lens_cpu``, windowed by its hook), then split for this rank."""
    step_lists = list(
        {id(p["actual_seq_lengths_kv"]): p["actual_seq_lengths_kv"] for p in params}.values()
    )
    if len(step_lists) != speculator.num_speculative_steps - 1:
        raise not_in_path(
            f"{type(speculator).__name__}.build_fia_params gave {len(step_lists)} DCP length "
            f"lists for {speculator.num_speculative_steps - 1} decode steps, which the window "
            f"cannot match to their steps"
        )
    n, n_pad = speculator.input_batch.num_reqs, len(step_lists[0])
    target = torch.zeros(n_pad, dtype=torch.int32)
    target[:n] = torch.from_numpy(speculator.input_batch.seq_lens_np[:n])
    shares = {}
    for step, lengths_of_step in enumerate(step_lists, start=1):
        lengths = speculator._calc_next_seq_lens_cpu(target, n, n_pad, step)
        share = dcp_local_lengths(
            lengths, window.dcp, scratch=torch.empty_like(lengths), out=torch.empty_like(lengths)
        )
        shares[id(lengths_of_step)] = share.tolist()
    for param in params:
        param["actual_seq_lengths_kv"] = shares[id(param["actual_seq_lengths_kv"])]
    return params


def build_attn_metadata(original: Callable, installed: Installed) -> Callable:
    """``AscendAutoRegressiveSpeculator._build_attn_metadata`` under DCP: the actual lengths
    its DCP manager returns for the build (``prepare_draft_dcp_metadata_inputs``: the
    target's length plus the step), windowed in place before vllm-ascend splits them."""

    def body(self: Any, window: Mrv2DraftWindow, *args: Any, **kwargs: Any) -> Any:
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

    def windowed(self: Any, window: Mrv2DraftWindow, metadata: Any, *args: Any, **kwargs: Any):
        arguments = signature.bind(self, *args, **kwargs).arguments
        if metadata is not None and arguments["step"] > 0:
            self._update_decode_attn_metadata(metadata, arguments["step"], arguments["num_reqs"])
        return metadata

    return after(original, installed, windowed)
