# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What the speculator's own code reads through the window: views of vLLM's input buffers and
block tables in which the draft's lengths and the draft groups' tables are the window's
persistent buffers. Everything else (query layout, positions, slot mappings, the other
groups' tables) is the original object's, and the originals are never written: the draft's
input prep kernels and the target runner read them, and ``BlockTables`` is shared with the
target."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from vllm_ascend.worker.v2.spec_decode.draft_window.window import (
    BlockTableWindow,
    WindowSpec,
    ceil_div,
)


class InputBuffersView:
    """The draft's ``InputBuffers`` whose ``seq_lens`` is the windowed buffer.

    Input buffers that keep an exact host mirror of ``seq_lens`` (``host_mirror``: its torch
    and numpy names, one memory; vllm-ascend's ``AscendInputBuffers``) show the window's own
    mirror instead, so that nothing written or read through the view touches vLLM's. A graph
    capture's input preparation (``prepare_inputs_to_capture`` -> vllm-ascend's
    ``AscendInputBatch.make_dummy``) writes its dummy lengths into both the device lengths
    and this mirror, and the builders take the mirror as the exact host lengths: the capture
    builds from one set of lengths, the window's, as every other build does.
    """

    def __init__(
        self,
        base: Any,
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
    """The shared ``BlockTables`` whose draft groups read their cropped tables."""

    def __init__(self, base: Any, windows: dict[int, BlockTableWindow]) -> None:
        self.base = base
        self.windows = windows

    @property
    def input_block_tables(self) -> list[torch.Tensor]:
        tables = list(self.base.input_block_tables)
        for g, window in self.windows.items():
            tables[g] = window.block_table
        return tables

    def get_dummy_block_tables(self, num_reqs: int) -> tuple[torch.Tensor, ...]:
        # NOTE: graph capture records these addresses, so the draft groups must get the
        # persistent cropped tables, zeroed like vLLM zeroes its own dummy rows.
        tables = list(self.base.get_dummy_block_tables(num_reqs))
        for g, window in self.windows.items():
            window.block_table[:num_reqs].zero_()
            tables[g] = window.block_table[:num_reqs]
        return tuple(tables)

    def __getattr__(self, name: str) -> Any:
        if name == "base":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.base, name)


def block_table_units(block_tables: Any) -> Sequence[int]:
    """Tokens per column of each group's ``input_block_tables``.

    vLLM 0.33.0's ``BlockTables`` stores KV-cache-manager blocks of ``block_sizes[g]``
    tokens; a subclass that stores kernel-block ids says so with ``kernel_block_sizes``.
    """
    kernel_block_sizes = getattr(block_tables, "kernel_block_sizes", None)
    return kernel_block_sizes if kernel_block_sizes is not None else block_tables.block_sizes


def cropped_table_width(
    spec: WindowSpec,
    block_size: int,
    full_width: int,
    max_query_len: int,
    table_width: Callable[[int, int], int] | None = None,
) -> int:
    """Columns of a cropped table: what a pass of ``max_query_len`` queries per request reads
    (``WindowSpec.read_cap``), rounded up as vLLM rounds its own tables (``table_width``:
    the release's ``get_block_table_width``, as kernels load block ids a tile at a time;
    None: not rounded, for the window's own kernels without vLLM), and never wider than the
    full table, past which no window reads."""
    needed = ceil_div(spec.read_cap(max_query_len), block_size)
    if table_width is not None:
        needed = table_width(needed, block_size)
    return min(needed, full_width)
