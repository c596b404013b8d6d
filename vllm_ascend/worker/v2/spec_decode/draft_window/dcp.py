# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The window under decode context parallelism: a column holds ``cp * u`` tokens (``u`` per
rank); with the alignment a multiple of it, one start drops the same columns on every rank."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from vllm.v1.worker.gpu.block_table import BlockTables


@dataclass(frozen=True)
class DcpLayout:
    """One rank's DCP layout and which KV cache groups' tables are sharded."""

    cp_size: int
    rank: int
    interleave: int
    sharded: tuple[bool, ...]

    @classmethod
    def of(cls, block_tables: BlockTables) -> DcpLayout | None:
        """Layout of ``block_tables``; None without DCP. Syncs with the device: start-up only."""
        cp_size = int(getattr(block_tables, "cp_size", 1) or 1)
        if cp_size == 1:
            return None
        num_groups = len(block_tables.input_block_tables)
        flags = getattr(block_tables, "dcp_sharded", None)
        # vLLM 0.30's BlockTables shards every group; 0.33's says per group.
        sharded = tuple(bool(x) for x in flags.tolist()) if flags is not None else (True,) * num_groups
        return cls(cp_size, int(block_tables.cp_rank), int(block_tables.cp_interleave), sharded)

    def local_len(self, length: int, rank: int = 0) -> int:
        rounds, rest = divmod(length, self.cp_size * self.interleave)
        return rounds * self.interleave + min(max(rest - rank * self.interleave, 0), self.interleave)

    def describe(self) -> str:
        return (
            f"decode_context_parallel_size={self.cp_size} (rank {self.rank}), "
            f"cp_kv_cache_interleave_size={self.interleave}"
        )


def column_tokens(units: Sequence[int], group_ids: Sequence[int], layout: DcpLayout | None) -> dict[int, int]:
    """Tokens of a request one table column of each group covers under ``layout`` (``units``: on one rank)."""
    tokens = {}
    for g in group_ids:
        unit = int(units[g])
        if layout is not None and layout.sharded[g]:
            if unit % layout.interleave:
                raise ValueError(
                    f"cp_kv_cache_interleave_size {layout.interleave} does not divide the {unit} "
                    f"tokens of one column of group {g}'s block table on one rank"
                )
            unit *= layout.cp_size
        tokens[g] = unit
    return tokens


def dcp_local_lengths(
    seq_lens: torch.Tensor,
    layout: DcpLayout,
    *,
    scratch: torch.Tensor,
    out: torch.Tensor,
) -> torch.Tensor:
    """Each request's tokens of ``[0, L)`` on ``layout.rank``, written into ``out``."""
    cp_i, i = layout.cp_size * layout.interleave, layout.interleave
    torch.remainder(seq_lens, cp_i, out=scratch)
    scratch.sub_(layout.rank * i).clamp_(min=0, max=i)
    torch.div(seq_lens, cp_i, rounding_mode="floor", out=out)
    return out.mul_(i).add_(scratch)
