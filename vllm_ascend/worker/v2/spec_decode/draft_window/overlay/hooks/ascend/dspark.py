# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What vllm-ascend adds to DSpark (``AscendDSparkSpeculator``, 0.30): the exact host copy of
the draft's device lengths its MLA kernel takes (``_prepare_draft_dcp_metadata_inputs``,
taken before any hook), windowed by the device's arithmetic (the copy is exact, so the start
is the device's)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.hooks.common import Installed, after
from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import DraftWindow


def prepare_draft_dcp_metadata_inputs(original: Callable, installed: Installed) -> Callable:
    """The exact host copy of the draft's device lengths a DSpark MLA kernel takes,
    windowed in place (the copy is exact, so the start is the device's)."""

    def windowed(self: Any, window: DraftWindow, result: tuple, *args: Any, **kwargs: Any) -> tuple:
        seq_lens_cpu, _ = result
        if seq_lens_cpu is not None:
            window.window_actual_seq_lens(seq_lens_cpu)
        return result

    return after(original, installed, windowed)
