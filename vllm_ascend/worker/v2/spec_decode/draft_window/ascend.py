# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The window in vllm-ascend's autoregressive speculator's FULL decode graph replays."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from vllm_ascend.worker.v2.spec_decode.draft_window.dcp import DcpLayout, dcp_local_lengths
from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import (
    DraftWindow,
    not_in_path,
)

if TYPE_CHECKING:
    from vllm_ascend.worker.v2.spec_decode.autoregressive.speculator import (
        AscendAutoRegressiveSpeculator,
    )


def fia_params(
    speculator: AscendAutoRegressiveSpeculator,
    window: DraftWindow | None,
    params: list[dict[str, Any]],
    num_reqs_padded: int,
    is_draft_model_prefill: bool,
) -> list[dict[str, Any]]:
    """Window ``build_fia_params``' per-step KV lengths."""
    if window is None:
        return params
    if is_draft_model_prefill:
        raise not_in_path(
            f"{type(speculator).__name__}.build_fia_params was asked for a FULL draft-prefill "
            f"graph, which reads the target's unwindowed metadata; the window runs the "
            f"draft prefill without FULL graphs"
        )
    if window.dcp is not None:
        return _dcp_shares(speculator, window.dcp, params)
    # Layers of one step share a list: window it once (``done`` keeps ids alive).
    done: dict[int, tuple[list[int], list[int]]] = {}
    for param in params:
        lengths = param["actual_seq_lengths_kv"]
        if id(lengths) not in done:
            windowed = window.window_actual_seq_lens(torch.tensor(lengths, dtype=torch.int32))
            done[id(lengths)] = (lengths, windowed.tolist())
        param["actual_seq_lengths_kv"] = done[id(lengths)][1]
    return params


def _dcp_shares(
    speculator: AscendAutoRegressiveSpeculator, layout: DcpLayout, params: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """This rank's share of each step's windowed global lengths, recomputed with
    ``_calc_next_seq_lens_cpu``: a rank's share cannot be windowed by itself."""
    step_lists = list({id(p["actual_seq_lengths_kv"]): p["actual_seq_lengths_kv"] for p in params}.values())
    if len(step_lists) != speculator.num_speculative_steps - 1:
        raise not_in_path(
            f"{type(speculator).__name__}.build_fia_params gave {len(step_lists)} DCP length "
            f"lists for {speculator.num_speculative_steps - 1} decode steps, which the window "
            f"cannot match to their steps"
        )
    batch = speculator.input_batch
    assert batch is not None
    n, n_pad = batch.num_reqs, len(step_lists[0])
    target = torch.zeros(n_pad, dtype=torch.int32)
    target[:n] = torch.from_numpy(batch.seq_lens_np[:n])
    shares = {}
    for step, lengths_of_step in enumerate(step_lists, start=1):
        lengths = speculator._calc_next_seq_lens_cpu(target, n, n_pad, step)
        share = dcp_local_lengths(lengths, layout, scratch=torch.empty_like(lengths), out=torch.empty_like(lengths))
        shares[id(lengths_of_step)] = share.tolist()
    for param in params:
        param["actual_seq_lengths_kv"] = shares[id(param["actual_seq_lengths_kv"])]
    return params
