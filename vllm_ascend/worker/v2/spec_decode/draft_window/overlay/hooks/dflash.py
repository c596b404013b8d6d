# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""vLLM's ``DFlashSpeculator`` (``spec_decode/dflash/``, alike on every release; DSpark is a
DFlash). Every build goes through ``speculator.py``'s hooks; here its graph capture
(``speculator.capture_query_pass``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from vllm_ascend.worker.v2.spec_decode.draft_window import speculator
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.hooks.common import Installed, around
from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import DraftWindow


def capture(original: Callable, installed: Installed) -> Callable:
    """``DFlashSpeculator.capture``, through the windowed views."""
    path = original.__qualname__

    def body(self: Any, window: DraftWindow) -> None:
        return speculator.capture_query_pass(self, window, functools.partial(original, self), path)

    return around(original, installed, body)
