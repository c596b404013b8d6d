"""vllm-ascend's told lengths (``worker/v2/spec_decode/`` on the 0.30 line): where its
speculator subclasses tell their kernel host lengths of their own, each is windowed by the
device's arithmetic, from the same start as the device's lengths and cropped table.

- the EAGLE decode's next-step host lengths (``seq_lens_list``, ``seq_lens_cpu``): the
  target's length plus the step, windowed like the device side of the same step;
- its FULL-graph replay parameters (``actual_seq_lengths_kv`` per recorded step);
- DSpark's exact host copy of the draft's device lengths (its MLA path);
- under decode context parallelism, the told lengths its DCP manager hands each EAGLE
  build, which vllm-ascend then splits per rank: windowed before the split, so that every
  rank is told its share of the window (a window start is whole rounds of every rank).
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
from vllm_ascend.worker.v2.spec_decode.draft_window.proof import not_in_path


def told_host_lengths(original: Callable, installed: Installed) -> Callable:
    """The host lengths an EAGLE decode step's kernel takes, windowed in place."""

    def windowed(
        self: Any, window: Mrv2DraftWindow, lengths: torch.Tensor, *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        return window.window_host_lengths(lengths)

    return after(original, installed, windowed)


def exact_host_lengths(original: Callable, installed: Installed) -> Callable:
    """The exact host copy of the draft's device lengths a DSpark MLA kernel takes,
    windowed in place (the copy is exact, so the start is the device's)."""

    def windowed(
        self: Any, window: Mrv2DraftWindow, result: tuple, *args: Any, **kwargs: Any
    ) -> tuple:
        seq_lens_cpu, _ = result
        if seq_lens_cpu is not None:
            window.window_host_lengths(seq_lens_cpu)
        return result

    return after(original, installed, windowed)


def fia_params(original: Callable, installed: Installed) -> Callable:
    """The per-step ``actual_seq_lengths_kv`` a FULL-graph replay hands the recorded kernel,
    windowed like the device side of each recorded step."""
    signature = inspect.signature(original)

    def windowed(
        self: Any, window: Mrv2DraftWindow, params: list, *args: Any, **kwargs: Any
    ) -> list:
        if signature.bind(self, *args, **kwargs).arguments["is_draft_model_prefill"]:
            # Only a FULL draft-prefill graph replays with these; the window runs the draft
            # prefill without one (init_cudagraph_manager).
            raise not_in_path(
                f"{type(self).__name__}.build_fia_params was asked for a FULL draft-prefill "
                f"graph, which reads the target's unwindowed metadata; the window runs the "
                f"draft prefill without FULL graphs"
            )
        if window.dcp is not None:
            return _dcp_shares(self, window, params)
        # Every layer of a step gets the same list: window each list once (the entry keeps
        # the list alive, so its id is not reused meanwhile).
        done: dict[int, tuple[list[int], list[int]]] = {}
        for param in params:
            told = param["actual_seq_lengths_kv"]
            if id(told) not in done:
                lengths = torch.tensor(told, dtype=torch.int32)
                done[id(told)] = (told, window.window_host_lengths(lengths).tolist())
            param["actual_seq_lengths_kv"] = done[id(told)][1]
        return params

    return after(original, installed, windowed)


def _dcp_shares(speculator: Any, window: Mrv2DraftWindow, params: list) -> list:
    """Under DCP each step's ``actual_seq_lengths_kv`` is this rank's share of the step's
    told lengths (the target's length plus the step), which only the told lengths can be
    windowed from: each step's are recomputed as vllm-ascend computes them for the eager
    update (``_calc_next_seq_lens_cpu``, windowed by its hook), then split for this rank."""
    told_lists = list(
        {id(p["actual_seq_lengths_kv"]): p["actual_seq_lengths_kv"] for p in params}.values()
    )
    if len(told_lists) != speculator.num_speculative_steps - 1:
        raise not_in_path(
            f"{type(speculator).__name__}.build_fia_params gave {len(told_lists)} DCP length "
            f"lists for {speculator.num_speculative_steps - 1} decode steps, which the window "
            f"cannot match to their steps"
        )
    n, n_pad = speculator.input_batch.num_reqs, len(told_lists[0])
    target = torch.zeros(n_pad, dtype=torch.int32)
    target[:n] = torch.from_numpy(speculator.input_batch.seq_lens_np[:n])
    shares = {}
    for step, told in enumerate(told_lists, start=1):
        lengths = speculator._calc_next_seq_lens_cpu(target, n, n_pad, step)
        share = dcp_local_lengths(
            lengths, window.dcp, scratch=torch.empty_like(lengths), out=torch.empty_like(lengths)
        )
        shares[id(told)] = share.tolist()
    for param in params:
        param["actual_seq_lengths_kv"] = shares[id(param["actual_seq_lengths_kv"])]
    return params


def dcp_told_lengths(original: Callable, installed: Installed) -> Callable:
    """``AscendAutoRegressiveSpeculator._build_attn_metadata`` under DCP: the told lengths
    its DCP manager returns for the build (``prepare_draft_dcp_metadata_inputs``: the
    target's length plus the step), windowed in place before vllm-ascend splits them."""

    def body(self: Any, window: Mrv2DraftWindow, *args: Any, **kwargs: Any) -> Any:
        manager = getattr(self, "dcp_manager", None) if getattr(self, "use_dcp", False) else None
        if manager is None:
            return original(self, *args, **kwargs)
        told = manager.prepare_draft_dcp_metadata_inputs

        def windowed(*inner: Any, **inner_kwargs: Any) -> tuple:
            seq_lens_cpu, is_prefilling = told(*inner, **inner_kwargs)
            window.window_host_lengths(seq_lens_cpu)
            return seq_lens_cpu, is_prefilling

        # For this build only: the manager's own method comes back after it.
        manager.prepare_draft_dcp_metadata_inputs = windowed
        try:
            return original(self, *args, **kwargs)
        finally:
            del manager.prepare_draft_dcp_metadata_inputs

    return around(original, installed, body)
