# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""vLLM's autoregressive family: EAGLE/EAGLE3 (``TargetDependentARSpeculator`` on 0.33;
``AutoRegressiveSpeculator`` in 0.30, whose ``capture`` vllm-ascend reimplements) and, on
0.34, draft models too, under a new ``AutoRegressiveSpeculator``; and their graph managers.
Each decode step builds through the draft build hook (``speculator.py``); these serve the
rest of a propose, each through the function of ``autoregressive.py`` that vllm-ascend's
explicit calls call:

- the draft prefill: on 0.33 and 0.30, ``propose`` hands the target's batch to the draft
  prefill and checks that the prefill went through the window, and ``_prefill`` replaces
  the draft layers' entries (``prefill_attn_metadata``); on 0.34 the one method the prefill
  takes its metadata from, ``_build_drafter_attn_metadata``, does (a draft model builds its
  prefill through the build hook);
- ``capture`` names the capture (``capturing``);
- ``init_cudagraph_manager``: the draft prefill's manager made without FULL graphs
  (``prefill_cudagraph_mode``); both managers marked so that a capture over the draft's own
  buffers goes through the windowed views (``decode_capture``);
- ``_fused_multi_step_decode`` (0.33; ``_run_fused_multi_step_decode`` on 0.34): its
  metadata serves every later draft step (refreshed in place each step), so its host bound
  covers them all.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any

from vllm.config.compilation import CUDAGraphMode

from vllm_ascend.worker.v2.spec_decode.draft_window import autoregressive
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.hooks.common import (
    WINDOW_ATTR,
    Installed,
    around,
    window_of,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import (
    DraftWindow,
    not_in_path,
)


def propose(original: Callable, installed: Installed) -> Callable:
    """``propose``: hands the target's batch to the draft prefill, and checks the prefill
    went through the window."""

    def body(self: Any, window: DraftWindow, input_batch: Any, *args: Any, **kwargs: Any) -> Any:
        state = window.propose
        state.prefill_batch, state.prefill_windowed = input_batch, False
        try:
            drafts = original(self, input_batch, *args, **kwargs)
        finally:
            state.prefill_batch = None
        target_metadata = kwargs["attn_metadata"] if "attn_metadata" in kwargs else args[0]
        # The draft prefill reads the target's metadata unless the _prefill hook replaced
        # the draft layers' entries: a subclass that overrides _prefill without super()
        # would have the draft read its whole context.
        if target_metadata is not None and not state.prefill_windowed:
            raise not_in_path(
                f"{type(self).__name__}.propose ran its draft prefill without the window's "
                f"hook {installed.hooked('_prefill')} (an override without super()?), so the "
                f"draft prefill read the target's unwindowed metadata"
            )
        return drafts

    return around(original, installed, body)


def prefill(original: Callable, installed: Installed) -> Callable:
    """``_prefill``: the draft layers' entries of the target's metadata replaced by
    metadata built for the window (``windowed_prefill_metadata``)."""
    signature = inspect.signature(original)
    path = original.__qualname__

    def body(self: Any, window: DraftWindow, *args: Any, **kwargs: Any) -> Any:
        state = window.propose
        bound = signature.bind(self, *args, **kwargs)
        target_metadata = bound.arguments["attn_metadata"]
        if target_metadata is None:
            state.prefill_windowed = True  # no metadata: the draft reads nothing
            return original(*bound.args, **bound.kwargs)
        if state.prefill_batch is None:
            # Only a graph capture runs the prefill outside propose; it builds its dummy
            # metadata through the target's builders, and the prefill graphs it records
            # are PIECEWISE at most (init_cudagraph_manager), so attention runs eagerly.
            if not state.capturing:
                raise not_in_path(
                    f"{type(self).__name__}._prefill ran with the target's metadata outside "
                    f"the window's propose hook (an override of propose without super()?), "
                    f"so the draft prefill would read the target's unwindowed metadata"
                )
            return original(*bound.args, **bound.kwargs)
        bound.arguments["attn_metadata"] = autoregressive.prefill_attn_metadata(
            self,
            window,
            state.prefill_batch,
            target_metadata,
            bound.arguments["num_tokens"],
            path,
            installed.release,
        )
        return original(*bound.args, **bound.kwargs)

    return around(original, installed, body)


def build_drafter_attn_metadata(original: Callable, installed: Installed) -> Callable:
    """``_build_drafter_attn_metadata`` (vLLM 0.34): the one method an EAGLE draft prefill
    takes its metadata from; the draft layers' entries are replaced by metadata built for
    the window from the target's batch (``windowed_prefill_metadata``), the slot mappings
    stay vLLM's."""
    signature = inspect.signature(original)
    path = original.__qualname__

    def body(self: Any, window: DraftWindow, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        attn_metadata, slot_mappings = original(*bound.args, **bound.kwargs)
        if attn_metadata is None:
            return attn_metadata, slot_mappings  # nothing to read (a dummy run)
        windowed = autoregressive.prefill_attn_metadata(
            self,
            window,
            bound.arguments["input_batch"],
            attn_metadata,
            None,
            path,
            installed.release,
        )
        return windowed, slot_mappings

    return around(original, installed, body)


def capture(original: Callable, installed: Installed) -> Callable:
    """The speculator's ``capture``: named on the window's path, and its draft prefill
    (outside propose) allowed to read the target's dummy metadata."""
    path = original.__qualname__

    def body(self: Any, window: DraftWindow) -> None:
        with autoregressive.capturing(self, window, path):
            return original(self)

    return around(original, installed, body)


def _makes_prefill_manager(arguments: dict[str, Any]) -> bool:
    """Whether the graph manager built from ``arguments`` is the draft prefill's."""
    if "decode_query_lens" in arguments:
        return max(arguments["decode_query_lens"], default=1) > 1
    return arguments["decode_query_len"] > 1


def init_cudagraph_manager(original: Callable, installed: Installed) -> Callable:
    """A FULL prefill graph would read the target's captured metadata, so with the window on
    the draft prefill's graph manager is made without FULL graphs. vLLM makes both managers
    here, from the graph manager class its speculator module names (which vllm-ascend
    replaces with its own); the prefill manager (``decode_query_len > 1``) is made with the
    lowered mode in the first place: a second manager made afterwards would repeat the
    first's start-up work, which vllm-ascend's refuses to do twice."""
    module = sys.modules[original.__module__]

    @functools.wraps(original)
    def wrapper(self, cudagraph_mode: CUDAGraphMode) -> None:
        window = window_of(self, installed)
        if window is None or not cudagraph_mode.has_full_cudagraphs():
            original(self, cudagraph_mode)
        else:
            prefill_mode = autoregressive.prefill_cudagraph_mode(cudagraph_mode)
            manager_cls = module.SpeculatorCudaGraphManager
            signature = inspect.signature(manager_cls)

            def make_manager(*args: Any, **kwargs: Any) -> Any:
                bound = signature.bind(*args, **kwargs)
                if _makes_prefill_manager(bound.arguments):
                    bound.arguments["cudagraph_mode"] = prefill_mode
                return manager_cls(*bound.args, **bound.kwargs)

            module.SpeculatorCudaGraphManager = make_manager
            try:
                original(self, cudagraph_mode)
            finally:
                module.SpeculatorCudaGraphManager = manager_cls
        if window is not None:
            for manager in (self.decode_cudagraph_manager, self.prefill_cudagraph_manager):
                if manager is not None:
                    setattr(manager, WINDOW_ATTR, window)

    return wrapper


def manager_capture(original: Callable, installed: Installed) -> Callable:
    """A speculator graph manager's ``capture`` over the draft's own input buffers (every
    decode graph; a draft model's prefill graphs on vLLM 0.34): the graphs record the
    persistent windowed buffers (and every build under the capture is checked by the path
    check). An EAGLE prefill's capture, over the target's buffers and attention groups, is
    left as it is (its graphs are PIECEWISE at most with the window on)."""
    signature = inspect.signature(original)
    path = original.__qualname__

    @functools.wraps(original)
    def wrapper(self, *args: Any, **kwargs: Any) -> None:
        window: DraftWindow | None = getattr(self, WINDOW_ATTR, None)
        if window is None or not installed.active:
            return original(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        if bound.arguments["input_buffers"] is not window.input_buffers.base:
            return original(*bound.args, **bound.kwargs)
        bound.arguments["input_buffers"] = window.input_buffers
        bound.arguments["block_tables"] = window.block_tables
        # A draft model's prefill capture (vLLM 0.34) computes its slot mappings into a
        # buffer of its own, ``slot_mappings_buffer``: vLLM's own, the path check's reference.
        window.build_slot_mappings = bound.arguments.get("slot_mappings_buffer")
        try:
            with autoregressive.decode_capture(window, path):
                return original(*bound.args, **bound.kwargs)
        finally:
            window.build_slot_mappings = None

    return wrapper


def fused_multi_step_decode(original: Callable, installed: Installed) -> Callable:
    """``_fused_multi_step_decode``: built at step 1, the metadata serves steps 1 .. K - 1,
    so its host bound covers the later steps too."""
    signature = inspect.signature(original)

    def body(self: Any, window: DraftWindow, *args: Any, **kwargs: Any) -> None:
        steps = signature.bind(self, *args, **kwargs).arguments["num_speculative_steps"]
        state = window.propose
        state.extra_steps = max(steps - 2, 0)
        try:
            return original(self, *args, **kwargs)
        finally:
            state.extra_steps = 0

    return around(original, installed, body)
