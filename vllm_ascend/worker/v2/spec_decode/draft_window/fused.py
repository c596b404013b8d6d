# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""One kernel launch per window refresh: the windowed lengths and every group's cropped
table, for the padded batch, written into persistent buffers.

The torch path (``Mrv2DraftWindow.refresh`` without a fused refresh: ``window_seq_lens``
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
    """Compile-on-first-use: the module imports without Triton."""
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    @triton.jit
    def refresh_kernel(
        src_lens_ptr,  # [n] int32: the lengths windowed (the draft's own, or a prefill's)
        actual_ptr,  # [n] int32: the target's lengths the actual lengths start from (ACTUAL)
        qsl_ptr,  # [n + 1] int32: query_start_loc of a multi-token pass (QUERY)
        seq_lens_out_ptr,  # [n] int32
        skip_out_ptr,  # [n] int32
        actual_out_ptr,  # [n] int32: the actual lengths, windowed (ACTUAL)
        src_tables_ptr,  # [G] int64: data_ptr of each group's full table (int32)
        dst_tables_ptr,  # [G] int64: data_ptr of each group's cropped table (int32)
        group_params_ptr,  # [G, 6] int64: src stride, num cols, dst stride, width, b, sinks
        actual_step,
        max_model_len,
        window_size,
        alignment,
        sink_size,
        min_context,
        ACTUAL: tl.constexpr,
        QUERY: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        g = tl.program_id(1)
        length = tl.load(src_lens_ptr + row)
        base = length
        if ACTUAL:
            base = tl.minimum(tl.load(actual_ptr + row) + actual_step, max_model_len)
        skip = tl.maximum(base - window_size - sink_size, 0)
        skip = (skip // alignment) * alignment
        # Below the threshold the whole context is read (min_context 0: never below).
        skip = tl.where(base >= min_context, skip, 0)
        if QUERY:
            q = tl.load(qsl_ptr + row + 1) - tl.load(qsl_ptr + row)
            latest = length - q
            if sink_size > 0:
                latest = tl.maximum(latest - sink_size, 0)
            # floor division of a value >= 0 (q <= length)
            latest = (latest // alignment) * alignment
            skip = tl.minimum(skip, latest)
        read = length - skip
        if ACTUAL:
            read = base - skip
        if g == 0:
            tl.store(seq_lens_out_ptr + row, length - skip)
            tl.store(skip_out_ptr + row, skip)
            if ACTUAL:
                tl.store(actual_out_ptr + row, read)

        params = group_params_ptr + g * 6
        src_stride = tl.load(params)
        num_cols = tl.load(params + 1)
        dst_stride = tl.load(params + 2)
        width = tl.load(params + 3)
        block_size = tl.load(params + 4)
        sink_cols = tl.load(params + 5)
        src = tl.load(src_tables_ptr + g).to(tl.pointer_type(tl.int32))
        dst = tl.load(dst_tables_ptr + g).to(tl.pointer_type(tl.int32))

        skip_blocks = skip // block_size
        needed = (read + block_size - 1) // block_size
        needed = tl.minimum(needed + skip_blocks, num_cols) - skip_blocks
        needed = tl.maximum(needed, 0)
        for start in range(0, width, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inside = cols < width
            src_cols = tl.where(cols < sink_cols, cols, cols + skip_blocks)
            src_cols = tl.minimum(src_cols, num_cols - 1)
            ids = tl.load(src + row * src_stride + src_cols, mask=inside, other=0)
            ids = tl.where(cols < needed, ids, 0)
            tl.store(dst + row * dst_stride + cols, ids, mask=inside)

    _KERNEL = refresh_kernel
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
