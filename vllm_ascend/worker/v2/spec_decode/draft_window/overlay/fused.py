# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The window's refresh in one Triton launch, bit-exact with the torch path; no host sync
or allocation, so graphs may capture it. The plugin form enables it where its start-up
self-check passes (``fused_check.py``); the window refreshes with the torch path otherwise."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from vllm_ascend.worker.v2.spec_decode.draft_window.window import BlockTableWindow, WindowSpec
from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import DraftWindow

if TYPE_CHECKING:
    from triton.runtime.jit import JITFunction

_KERNEL: JITFunction | None = None


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _kernel() -> JITFunction:
    global _KERNEL
    if _KERNEL is None:
        from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.refresh_kernel import (
            draft_window_refresh_kernel,
        )

        _KERNEL = draft_window_refresh_kernel
    return _KERNEL


class FusedRefresh:
    """Pointer tables and static sizes of one set of persistent cropped tables."""

    def __init__(
        self,
        spec: WindowSpec,
        # Per group: (full table, cropped table, block size).
        tables: Sequence[tuple[torch.Tensor, torch.Tensor, int]],
        seq_lens_out: torch.Tensor,
        skip_out: torch.Tensor,
        actual_out: torch.Tensor,
    ) -> None:
        self.spec = spec
        self.seq_lens_out, self.skip_out, self.actual_out = seq_lens_out, skip_out, actual_out
        self.cropped_tables = [cropped for _, cropped, _ in tables]
        device = seq_lens_out.device
        for full, cropped, _ in tables:
            for table in (full, cropped):
                if table.dtype != torch.int32 or table.stride(1) != 1:
                    raise ValueError(
                        f"the fused window refresh needs int32 row-major tables, got "
                        f"{table.dtype} with strides {table.stride()}"
                    )
        self.src_tables = torch.tensor([full.data_ptr() for full, _, _ in tables], dtype=torch.int64, device=device)
        self.dst_tables = torch.tensor(
            [cropped.data_ptr() for _, cropped, _ in tables], dtype=torch.int64, device=device
        )
        self.group_params = torch.tensor(
            [
                [
                    full.stride(0),
                    full.shape[1],
                    cropped.stride(0),
                    cropped.shape[1],
                    b,
                    min(spec.sink_size // b, cropped.shape[1]),
                ]
                for full, cropped, b in tables
            ],
            dtype=torch.int64,
            device=device,
        )
        self.num_groups = len(tables)
        max_width = max(cropped.shape[1] for _, cropped, _ in tables)
        self.block = min(1 << (max(max_width, 16) - 1).bit_length(), 1024)

    def launch(
        self,
        num_reqs_padded: int,
        source: torch.Tensor,
        query_start_loc: torch.Tensor | None = None,
        actual_source: torch.Tensor | None = None,
        actual_step: int = 0,
        max_model_len: int = 0,
    ) -> None:
        spec = self.spec
        dummy = self.seq_lens_out  # int32 pointer for inputs this variant does not read
        _kernel()[(num_reqs_padded, self.num_groups)](
            source,
            dummy if actual_source is None else actual_source,
            dummy if query_start_loc is None else query_start_loc,
            self.seq_lens_out,
            self.skip_out,
            self.actual_out,
            self.src_tables,
            self.dst_tables,
            self.group_params,
            actual_step,
            max_model_len,
            spec.window_size,
            spec.alignment,
            spec.sink_size,
            spec.min_context,
            ACTUAL=actual_source is not None,
            QUERY=query_start_loc is not None,
            BLOCK=self.block,
        )


class FusedWindowRefresh:
    """``DraftWindow.refresh`` in one launch: a ``RefreshKernel`` over the window's decode
    tables and, where a draft prefill has wider ones, its chunk tables."""

    def __init__(self, window: DraftWindow) -> None:
        self.actual = window.actual
        full_tables = window.block_tables.base.input_block_tables

        def refresh_of(windows: dict[int, BlockTableWindow]) -> FusedRefresh:
            tables = [(full_tables[g], windows[g].block_table, windows[g].block_size) for g in sorted(windows)]
            return FusedRefresh(window.spec, tables, window.seq_lens, window.window_skip, window.actual_windowed)

        self.steps = refresh_of(window.windows)
        self.chunks = self.steps if window.chunk_windows is window.windows else refresh_of(window.chunk_windows)

    def launch(
        self,
        num_reqs_padded: int,
        source: torch.Tensor,
        query_start_loc: torch.Tensor | None,
        actual_step: int | None,
    ) -> None:
        actual = self.actual if actual_step is not None else None
        fused = self.steps if query_start_loc is None else self.chunks
        fused.launch(
            num_reqs_padded,
            source,
            query_start_loc,
            actual_source=None if actual is None else actual.source,
            actual_step=actual_step or 0,
            max_model_len=0 if actual is None else actual.max_model_len,
        )


def enable_fused(window: DraftWindow) -> None:
    """Refresh ``window`` with one kernel launch from now on."""
    window.refresh_kernel = FusedWindowRefresh(window)
