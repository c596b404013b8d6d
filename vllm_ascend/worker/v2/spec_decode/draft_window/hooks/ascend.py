"""vllm-ascend's told lengths (``worker/v2/spec_decode/`` on the 0.30 line): where its
speculator subclasses tell their kernel host lengths of their own, each is windowed by the
device's arithmetic, from the same start as the device's lengths and cropped table.

- the EAGLE decode's next-step host lengths (``seq_lens_list``, ``seq_lens_cpu``): the
  target's length plus the step, windowed like the device side of the same step;
- its FULL-graph replay parameters (``actual_seq_lengths_kv`` per recorded step);
- DSpark's exact host copy of the draft's device lengths (its MLA path).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.worker.v2.spec_decode.draft_window.hooks.common import Installed, after
from vllm_ascend.worker.v2.spec_decode.draft_window.mrv2 import Mrv2DraftWindow
from vllm_ascend.worker.v2.spec_decode.draft_window.proof import not_in_path


def told_host_lengths(original: Callable, installed: Installed) -> Callable:
    """The host lengths an EAGLE decode step's kernel takes, windowed in place."""

    def windowed(self: Any, window: Mrv2DraftWindow, lengths: torch.Tensor, *args: Any,
                 **kwargs: Any) -> torch.Tensor:  # fmt: skip
        return window.window_host_lengths(lengths)

    return after(original, installed, windowed)


def exact_host_lengths(original: Callable, installed: Installed) -> Callable:
    """The exact host copy of the draft's device lengths a DSpark MLA kernel takes,
    windowed in place (the copy is exact, so the start is the device's)."""

    def windowed(self: Any, window: Mrv2DraftWindow, result: tuple, *args: Any,
                 **kwargs: Any) -> tuple:  # fmt: skip
        seq_lens_cpu, _ = result
        if seq_lens_cpu is not None:
            window.window_host_lengths(seq_lens_cpu)
        return result

    return after(original, installed, windowed)


def fia_params(original: Callable, installed: Installed) -> Callable:
    """The per-step ``actual_seq_lengths_kv`` a FULL-graph replay hands the recorded kernel,
    windowed like the device side of each recorded step."""
    signature = inspect.signature(original)

    def windowed(self: Any, window: Mrv2DraftWindow, params: list, *args: Any,
                 **kwargs: Any) -> list:  # fmt: skip
        if signature.bind(self, *args, **kwargs).arguments["is_draft_model_prefill"]:
            # Only a FULL draft-prefill graph replays with these; the window runs the draft
            # prefill without one (init_cudagraph_manager).
            raise not_in_path(
                f"{type(self).__name__}.build_fia_params was asked for a FULL draft-prefill "
                f"graph, which reads the target's unwindowed metadata; the window runs the "
                f"draft prefill without FULL graphs"
            )
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
