# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Views of vLLM's input buffers and block tables whose draft lengths are the window's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from vllm_ascend.worker.v2.spec_decode.draft_window.window import BlockTableWindow

if TYPE_CHECKING:
    from vllm.v1.worker.gpu.block_table import BlockTables
    from vllm.v1.worker.gpu.input_batch import InputBuffers


class InputBuffersView:
    """The draft's ``InputBuffers`` with the windowed ``seq_lens`` and its host copy."""

    def __init__(
        self,
        base: InputBuffers,
        seq_lens: torch.Tensor,
        host_mirror: tuple[str, str] | None = None,
        seq_lens_cpu: torch.Tensor | None = None,
    ) -> None:
        self.base = base
        self.seq_lens = seq_lens
        if host_mirror is not None and seq_lens_cpu is not None:
            torch_name, numpy_name = host_mirror
            setattr(self, torch_name, seq_lens_cpu)
            setattr(self, numpy_name, seq_lens_cpu.numpy())

    def __getattr__(self, name: str) -> Any:
        if name == "base":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.base, name)


class BlockTablesView:
    def __init__(self, base: BlockTables, windows: dict[int, BlockTableWindow]) -> None:
        self.base = base
        self.windows = windows

    @property
    def input_block_tables(self) -> list[torch.Tensor]:
        tables = list(self.base.input_block_tables)
        for g, window in self.windows.items():
            tables[g] = window.block_table
        return tables

    def get_dummy_block_tables(self, num_reqs: int) -> tuple[torch.Tensor, ...]:
        # Graph capture records these addresses: hand out the persistent cropped tables.
        tables = list(self.base.get_dummy_block_tables(num_reqs))
        for g, window in self.windows.items():
            window.block_table[:num_reqs].zero_()
            tables[g] = window.block_table[:num_reqs]
        return tuple(tables)

    def __getattr__(self, name: str) -> Any:
        if name == "base":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.base, name)


def block_table_units(block_tables: BlockTables) -> Sequence[int]:
    """Tokens per column of each group's ``input_block_tables``."""
    kernel_block_sizes = getattr(block_tables, "kernel_block_sizes", None)
    return kernel_block_sizes if kernel_block_sizes is not None else block_tables.block_sizes
