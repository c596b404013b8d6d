# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What vllm-ascend's EAGLE-family speculator adds for its kernels, with the window: the
parameters of a FULL decode graph's replay (``build_fia_params``), windowed like the device
side of each recorded step. Both forms call it: the overlay's
``hooks/ascend/autoregressive.py`` and vllm-ascend's explicit call. The host lengths
vllm-ascend computes for each step (``_calc_next_seq_lens_cpu``, its DCP manager's, DSpark's
exact copy) are windowed in place by ``DraftWindow.window_actual_seq_lens``.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_ascend.worker.v2.spec_decode.draft_window.dcp import dcp_local_lengths
from vllm_ascend.worker.v2.spec_decode.draft_window.path_check import not_in_path
from vllm_ascend.worker.v2.spec_decode.draft_window.release import Release
from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import DraftWindow


def fia_params(
    speculator: Any,
    window: DraftWindow | None,
    params: list,
    num_reqs_padded: int,
    is_draft_model_prefill: bool,
    release: Release,
) -> list:
    """``build_fia_params``' result for the window: the per-step ``actual_seq_lengths_kv`` a
    FULL-graph replay hands the recorded kernel, windowed like the device side of each
    recorded step (and, where the release takes its block table from the target's metadata,
    the cropped table the recorded refresh rewrites at every step)."""
    if window is None:
        return params
    if is_draft_model_prefill:
        # Only a FULL draft-prefill graph replays with these; the window runs the draft
        # prefill without one (init_cudagraph_manager).
        raise not_in_path(
            f"{type(speculator).__name__}.build_fia_params was asked for a FULL draft-prefill "
            f"graph, which reads the target's unwindowed metadata; the window runs the "
            f"draft prefill without FULL graphs"
        )
    if release.fia_table_from_target:
        _cropped_tables(speculator, window, params, num_reqs_padded)
    if window.dcp is not None:
        return _dcp_shares(speculator, window, params)
    # Every layer of a step gets the same list: window each list once (the entry keeps the
    # list alive, so its id is not reused meanwhile).
    done: dict[int, tuple[list[int], list[int]]] = {}
    for param in params:
        lengths = param["actual_seq_lengths_kv"]
        if id(lengths) not in done:
            windowed = window.window_actual_seq_lens(torch.tensor(lengths, dtype=torch.int32))
            done[id(lengths)] = (lengths, windowed.tolist())
        param["actual_seq_lengths_kv"] = done[id(lengths)][1]
    return params


def _cropped_tables(
    speculator: Any, window: DraftWindow, params: list, num_reqs_padded: int
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


def _dcp_shares(speculator: Any, window: DraftWindow, params: list) -> list:
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
