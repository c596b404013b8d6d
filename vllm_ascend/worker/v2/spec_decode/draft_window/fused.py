# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Window refresh in one Triton launch, bit-exact with the torch path; no host sync or
allocation, so graphs may capture it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from vllm_ascend.worker.v2.spec_decode.draft_window.window import WindowSpec

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
        from vllm_ascend.ops.triton.v2.spec_decode.draft_window_refresh import (
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
