"""The draft builds every family goes through, and DFlash's graph (vLLM's ``speculator.py``
and ``dflash/``, alike on both lines; DSpark is a DFlash).

- ``DraftModelSpeculator._build_attn_metadata``: the choke point every draft metadata build
  goes through (``_build_uniform_attn_metadata`` forwards to it): windows the inputs, then
  builds. An EAGLE decode step's build too.
- ``DraftModelSpeculator._update_draft_decode_metadata`` (vLLM 0.33): the in-place update a
  FULL graph records; the window's refresh (device ops into persistent buffers) is recorded
  with it.
- ``DFlashSpeculator.capture``: captures through the windowed views, so the graphs read
  the persistent windowed buffers that the two paths above refresh.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from vllm_ascend.worker.v2.spec_decode.draft_window.hooks.common import (
    Installed,
    around,
    propose_state,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.log import logger
from vllm_ascend.worker.v2.spec_decode.draft_window.mrv2 import Mrv2DraftWindow
from vllm_ascend.worker.v2.spec_decode.draft_window.proof import UPDATE_PATH


def build_attn_metadata(original: Callable, installed: Installed) -> Callable:
    """``DraftModelSpeculator._build_attn_metadata``: the window refreshed (its start from the
    length the kernel is told, where the line tells one), the host bound windowed, then
    vLLM's build through the windowed views; groups the window leaves alone get vLLM's own
    build."""
    signature = inspect.signature(original)
    path = original.__qualname__

    def body(self: Any, window: Mrv2DraftWindow, *args: Any, **kwargs: Any) -> Any:
        state = propose_state(self)
        state.num_builds += 1
        if state.num_builds == 1:
            logger.info("Draft KV window active: the first draft metadata build is windowed.")
        bound = signature.bind(self, *args, **kwargs)
        arguments = bound.arguments
        num_reqs, step = arguments["num_reqs"], arguments["step"]
        told = window.told is not None and step > 0
        window.refresh(
            arguments["batch_desc"].num_reqs or num_reqs, told_step=step if told else None
        )
        host_bound = arguments["seq_lens_cpu_upper_bound"]
        if window.told is not None and window.told.bound:
            arguments["seq_lens_cpu_upper_bound"] = window.told_host_bound(
                host_bound, num_reqs, step
            )
        else:
            arguments["seq_lens_cpu_upper_bound"] = window.host_upper_bound(
                host_bound, num_reqs, step, extra_steps=state.extra_steps
            )
        with window.swapped_into(self, path, window.windowed_attn_groups):
            metadata = original(*bound.args, **bound.kwargs)
        if window.left_alone_attn_groups is None:
            return metadata
        # The groups the window leaves alone: vLLM's own build from vLLM's own inputs.
        with window.left_alone_only(self):
            left_alone = original(self, *args, **kwargs)
        if metadata is None:
            return left_alone
        metadata.update(left_alone or {})
        return metadata

    return around(original, installed, body)


def update_draft_decode_metadata(original: Callable, installed: Installed) -> Callable:
    """``DraftModelSpeculator._update_draft_decode_metadata``: the window refreshed in the
    persistent buffers the recorded metadata references, then vLLM's update."""

    def body(self: Any, window: Mrv2DraftWindow, attn_metadata: Any, num_reqs: int) -> None:
        window.refresh(num_reqs)
        # A backend with smaller kernel blocks reads a kernel-block table that only a
        # build maps; the update skips the build, so map the refreshed windows here
        # (a write into the group's persistent table, fit for recording in a graph).
        for g, cropped in window.windows.items():
            for group in self.attn_groups[g]:
                if group.kernel_block_size is not None:
                    group.map_to_kernel_block_table(cropped.block_table[:num_reqs])
        with window.on_path(UPDATE_PATH):
            original(self, attn_metadata, num_reqs)

    return around(original, installed, body)


def dflash_capture(original: Callable, installed: Installed) -> Callable:
    """``DFlashSpeculator.capture``: the graphs captured through the windowed views (and
    every build under the capture checked by the proof)."""
    path = original.__qualname__

    def body(self: Any, window: Mrv2DraftWindow) -> None:
        window.proof.capture_on(path)
        with window.swapped_into(self, path):
            return original(self)

    return around(original, installed, body)
