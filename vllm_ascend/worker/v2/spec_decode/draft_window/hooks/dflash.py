# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""vLLM's ``DFlashSpeculator`` (``spec_decode/dflash/``, alike on both releases; DSpark is a
DFlash). Every build goes through ``speculator.py``'s hooks; here its graph capture, made
through the windowed views, so that the graphs read the persistent windowed buffers those
hooks refresh.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_ascend.worker.v2.spec_decode.draft_window.hooks.common import Installed, around
from vllm_ascend.worker.v2.spec_decode.draft_window.mrv2 import Mrv2DraftWindow


def capture(original: Callable, installed: Installed) -> Callable:
    """``DFlashSpeculator.capture``: the graphs captured through the windowed views (and
    every build under the capture checked by the path check)."""
    path = original.__qualname__

    def body(self: Any, window: Mrv2DraftWindow) -> None:
        window.path_check.capture_on(path)
        with window.swapped_into(self, path):
            return original(self)

    return around(original, installed, body)
