# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""One kernel launch per window refresh: the windowed lengths and every group's cropped
table, for the padded batch, written into persistent buffers.

The torch path (``DraftWindow.refresh`` without a fused refresh: ``window_seq_lens``
and one ``BlockTableWindow.gather`` per group) is the reference: this kernel computes the
same integers (window.py's arithmetic, row by row) and must equal it bit for bit
(``fused_check.py`` checks that before it is used). It launches a fixed grid
``(num_reqs_padded, num_groups)`` from static sizes, reads no device value on the host and
allocates nothing per call, so a graph capture may record it. The groups' full and
cropped tables are reached through a pointer table built once (their buffers are
persistent), as vLLM's own MRV2 block-table kernels do.

Triton is imported lazily: without it the window runs the torch path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vllm_ascend.worker.v2.spec_decode.draft_window.window import WindowSpec

_KERNEL: Any = None


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _kernel() -> Any:
    """The Triton kernel, compiled on first use: this module imports without Triton."""
    global _KERNEL
    if _KERNEL is None:
        from vllm_ascend.ops.triton.v2.spec_decode.draft_window_refresh import (
            draft_window_refresh_kernel,
        )

        _KERNEL = draft_window_refresh_kernel
    return _KERNEL


class FusedRefresh:
    """The pointer table and static sizes of one set of cropped tables (a window's per-step
    ones, or a draft prefill's wider ones), built once from persistent tensors, and the
    outputs the launch writes."""

    def __init__(
        self,
        spec: WindowSpec,
        # per group: (full table, cropped table, block size), int32 row-major
        tables: Sequence[tuple[torch.Tensor, torch.Tensor, int]],
        # [max_num_reqs] int32 each: the windowed lengths, the skips, the windowed actual
        # lengths
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
        # NOTE: persistent tables: their addresses are fixed for the window's life.
        self.src_tables = torch.tensor(
            [full.data_ptr() for full, _, _ in tables], dtype=torch.int64, device=device
        )
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
        """Window rows ``[0, num_reqs_padded)`` of ``source`` (or, with ``actual_source``, of
        ``min(actual_source + actual_step, max_model_len)``): one launch."""
        spec = self.spec
        dummy = self.seq_lens_out  # an int32 pointer for the inputs a variant does not read
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
