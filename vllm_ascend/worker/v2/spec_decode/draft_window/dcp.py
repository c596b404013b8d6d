# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The window under decode context parallelism (DCP): how a rank's block table covers a
request's tokens, and the DCP-local lengths of a windowed pass.

vLLM's layout (every supported release; ``BlockTables`` and its slot-mapping kernels): with
``cp`` ranks and an interleave of ``I`` tokens, token ``p`` of a request lives on rank
``floor(p / I) mod cp`` and a sharded group's table column ``c`` holds, on every rank, that
rank's tokens of the virtual block ``[c * cp * u, (c + 1) * cp * u)`` (``u``: the tokens of
one column on one rank, the group's block size or kernel block size), in order.

Why one window start per request serves every rank exactly (``window.py``'s notation; ``c``
ranks, interleave ``I``, ``u`` tokens per column on one rank, ``I | u``): column ``k`` of a
sharded table holds each rank's tokens of ``[k c u, (k + 1) c u)``, in order. Its alignment
unit is therefore ``c u`` (``a`` a multiple of it), and one start serves all ranks, each
rank ``r`` reading its local length ``n_r(windowed)`` from the cropped table:

- ``n_r(x)``, rank ``r``'s tokens of ``[0, x)``: ownership repeats every ``c I`` tokens,
  so for ``x`` a multiple of ``c I``, ``n_r(x + y) = x / c + n_r(y)``.
- ``c u`` is ``u / I`` rounds of ``c I``, so ``[0, k c u)`` gives every rank exactly ``k u``
  tokens: the ``k`` columns it fills. The skip (a multiple of ``a``) drops the same whole
  columns of every rank's table, and the sinks ``[0, S)`` are whole columns too.
- A rank's local tokens are its tokens in order, so the cropped table's first
  ``n_r(S)`` local tokens are its sinks and the next ``n_r(L) - n_r(S + skip) =
  n_r(L - skip - S)`` its tokens of ``[start, L)``: in all ``n_r(windowed)``, the share of
  the windowed length vLLM's ``get_dcp_local_seq_lens`` gives. Its columns lie below
  ``ceil(windowed / (c u))``: the table width holds.
- No finer start works: dropping ``k`` whole columns of every rank leaves ``k u`` tokens
  per rank, ``k c u`` in all. ``I`` adds no condition beyond ``I | u`` (else refused).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from vllm_ascend.worker.v2.spec_decode.draft_window.views import block_table_units


@dataclass(frozen=True)
class DcpLayout:
    """One rank's decode-context-parallel layout: ``cp``, its rank, ``I``, and whether each
    KV-cache group's table is sharded (a replicated draft's cache is not)."""

    cp_size: int
    rank: int
    interleave: int
    sharded: tuple[bool, ...]

    @classmethod
    def of(cls, block_tables: Any) -> DcpLayout | None:
        """The layout ``block_tables`` is built for; None without DCP. Start-up only (it
        reads vLLM 0.33's per-group flags back from the device once)."""
        cp_size = int(getattr(block_tables, "cp_size", 1) or 1)
        if cp_size == 1:
            return None
        num_groups = len(block_tables.input_block_tables)
        flags = getattr(block_tables, "dcp_sharded", None)
        # vLLM 0.30's BlockTables shards every group; 0.33's says per group.
        sharded = (
            tuple(bool(x) for x in flags.tolist()) if flags is not None else (True,) * num_groups
        )
        return cls(cp_size, int(block_tables.cp_rank), int(block_tables.cp_interleave), sharded)

    def column_tokens(self, group_id: int, unit: int) -> int:
        """A request's tokens one column of group ``group_id`` covers, across the ranks:
        ``cp * u`` for a sharded table, ``u`` otherwise. Needs ``I | u`` (``policy.py``
        refuses the layouts without it by name)."""
        if not self.sharded[group_id]:
            return unit
        if unit % self.interleave:
            raise ValueError(
                f"cp_kv_cache_interleave_size {self.interleave} does not divide the {unit} "
                f"tokens of one column of group {group_id}'s block table on one rank"
            )
        return self.cp_size * unit

    def local_len(self, length: int, rank: int = 0) -> int:
        """``rank``'s tokens of ``[0, length)``: whole rounds of ``cp * I`` tokens give it
        ``I`` each, the last one what reaches its slot (rank 0 holds the most)."""
        rounds, rest = divmod(length, self.cp_size * self.interleave)
        return rounds * self.interleave + min(
            max(rest - rank * self.interleave, 0), self.interleave
        )

    def describe(self) -> str:
        return (
            f"decode_context_parallel_size={self.cp_size} (rank {self.rank}), "
            f"cp_kv_cache_interleave_size={self.interleave}"
        )


def column_tokens(
    block_tables: Any, group_ids: Sequence[int], layout: DcpLayout | None
) -> dict[int, int]:
    """Tokens of a request one table column of each group covers under ``layout`` (read
    once per speculator: ``DcpLayout.of``): the unit the window's start, its alignment and
    its cropped tables count in."""
    units = block_table_units(block_tables)
    if layout is None:
        return {g: int(units[g]) for g in group_ids}
    return {g: layout.column_tokens(g, int(units[g])) for g in group_ids}


def dcp_local_lengths(
    # [n] int32: global lengths (windowed: a window start is a multiple of cp * I)
    seq_lens: torch.Tensor,
    layout: DcpLayout,
    *,
    # [n] int32, same device: scratch
    scratch: torch.Tensor,
    # [n] int32, same device
    out: torch.Tensor,
) -> torch.Tensor:
    """Each request's tokens of ``[0, L)`` on ``layout.rank``: ``floor(L / (cp I)) * I`` from
    the whole rounds, plus the rank's part of the last one. Device ops into ``out``."""
    cp_i, i = layout.cp_size * layout.interleave, layout.interleave
    torch.remainder(seq_lens, cp_i, out=scratch)
    scratch.sub_(layout.rank * i).clamp_(min=0, max=i)
    torch.div(seq_lens, cp_i, rounding_mode="floor", out=out)
    return out.mul_(i).add_(scratch)
