# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Every rank of a decode-context-parallel (DCP) layout in one process, on the Ascend pairing,
and what each rank's kernel reads.

A rank is vllm-ascend's real speculator and metadata builders over that rank's
``AscendBlockTables`` (cp size, rank, interleave), with only the process groups stood in
(``on_rank``). What a rank's FIA/MLA kernel is handed (its cropped block table and its host
list of local lengths) is read from every rank's reference cache (``DcpCaches``, written by
vLLM's layout), and the ranks' partial attention, combined by log-sum-exp as DCP combines it
(vLLM's own combination), must equal attention over exactly the window.
"""

from collections.abc import Sequence

import pytest
import torch
import vllm.distributed.parallel_state as parallel_state

from testbed.dcp import (
    DcpCaches,
    combine,
    owner,
    partial_attention,
)
from testbed.reference import (
    dense_attention,
    positions_read,
)

# (cp, interleave) over sizes 2, 4 and 8, interleave 1 and the block size (``BLOCK``: the
# interleave stands for "block-sized").
BLOCK = "block"


class GroupStandIn:
    """Stand-in for a vLLM process group (HCCL collectives between NPUs): the size, rank
    and member ranks vllm-ascend's builders and speculators read; no collective runs here."""

    def __init__(self, name: str, world_size: int, rank: int) -> None:
        self.unique_name, self.world_size, self.rank_in_group = name, world_size, rank
        self.ranks, self.device_group = list(range(world_size)), None


def on_rank(monkeypatch, cp_size: int, rank: int) -> None:
    """Make ``rank`` of ``cp_size`` the DCP rank vllm-ascend reads (``get_dcp_group``), with
    no prefill context parallelism and one tensor-parallel rank (the DCP attention impls of
    the registered layers keep all three groups)."""
    monkeypatch.setattr(parallel_state, "_DCP", GroupStandIn("dcp", cp_size, rank))
    monkeypatch.setattr(parallel_state, "_PCP", GroupStandIn("pcp", 1, 0))
    monkeypatch.setattr(parallel_state, "_TP", GroupStandIn("tp", 1, 0))


@pytest.fixture
def dcp_builders():
    """vllm-ascend picks its DCP metadata builders through ``enable_dcp()``, which caches the
    first config it sees for the process: cleared so that each test's config decides, and
    cleared after it so that later tests get the builders of their own config."""
    from vllm_ascend.attention.utils import enable_dcp

    enable_dcp.cache_clear()
    yield
    enable_dcp.cache_clear()


def interleave_of(interleave, block_size: int) -> int:
    return block_size if interleave == BLOCK else int(interleave)


def true_kv(lengths: Sequence[int], heads: int, dim: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    k = [torch.randn(n, heads, dim, generator=gen, dtype=torch.float64) for n in lengths]
    v = [torch.randn(n, heads, dim, generator=gen, dtype=torch.float64) for n in lengths]
    return k, v


def caches_of(cp_size: int, interleave: int, block_size: int, block_ids, k, v) -> DcpCaches:
    """Every rank's cache of the draft's group, written through the full tables."""
    num_blocks = max(max(ids) for ids in block_ids) + 1
    caches = DcpCaches(cp_size, interleave, block_size, num_blocks, *k[0].shape[1:])
    for ids, ki, vi in zip(block_ids, k, v, strict=True):
        caches.write(ids, ki, vi)
    return caches


def assert_ranks_read_the_window(
    caches: DcpCaches,
    actual: Sequence[int],
    reads: Sequence[int],
    rank_reads: Sequence[tuple[torch.Tensor, Sequence[int]]],
    alignment: int,
    window: int | Sequence[int],
    k: list[torch.Tensor],
    v: list[torch.Tensor],
    num_queries: int | Sequence[int] = 1,
    causal: bool = True,
    current: int | Sequence[int] = 0,
    min_context: int = 0,
    block_ids: Sequence[Sequence[int]] | None = None,
    sinks: int = 0,
) -> None:
    """``told[i]``: the length request ``i``'s kernels are told; ``reads[i]``: its windowed
    length; ``rank_reads[r]``: (block table, host list of local lengths) rank ``r``'s kernel
    reads. Each rank reads exactly its own tokens of the window ``[start, told)``, in order,
    ``start`` a multiple of ``alignment``; their log-sum-exp combination equals attention
    over exactly the window (causal: ``dense_attention``; else every query sees it all).

    ``current[i]``: the request's last tokens, which the kernels attend to from the pass's
    own K/V (vllm-ascend's history/current split): the ranks read the window without them,
    and the current tokens join as one more partial, counted once. ``block_ids[i]``: the
    request's full table row; a rank's cropped row must be its columns from the start on
    (after the sinks' columns: ``sinks``, the attention sinks the window keeps)."""
    n = len(actual)
    as_list = lambda x: [x] * n if isinstance(x, int) else list(x)  # noqa: E731
    window, num_queries, current = as_list(window), as_list(num_queries), as_list(current)
    cp_size = caches.cp_size
    for i, length in enumerate(actual):
        read = int(reads[i])
        start, kept = positions_read(length, read, sinks)
        assert start % alignment == 0, (i, start, alignment)
        if length < min_context:
            assert read == length
        else:
            reach = sinks + window[i] + alignment
            assert min(length, sinks + window[i]) <= read <= reach - 1, (i, read)
        q_len = num_queries[i]
        q = k[i][length - q_len : length] * 0.5
        # Non-causal: every query sees the whole window.
        q_pos = torch.arange(length - q_len, length)
        if not causal:
            q_pos = torch.full((q_len,), length - 1)
        history = kept[kept < length - current[i]]
        outs, lses = [], []
        for r, (table, local) in enumerate(rank_reads):
            if block_ids is not None:
                # A window start drops whole columns, the same ones on every rank.
                column = cp_size * caches.unit
                first, cols = start // column, -(-int(local[i]) // caches.unit)
                held = [*block_ids[i][: min(sinks, start) // column], *block_ids[i][first:]]
                assert table[i][:cols].tolist() == held[:cols], (i, r)
            out, lse, pos = caches.read(r, table[i], int(local[i]), q, q_pos)
            mine = history[owner(history, cp_size, caches.interleave) == r]
            assert pos.tolist() == mine.tolist(), (i, r, len(pos), len(mine))
            outs.append(out)
            lses.append(lse)
        if current[i]:
            pos = torch.arange(length - current[i], length)
            out, lse = partial_attention(q, q_pos, k[i][pos], v[i][pos], pos)
            outs.append(out)
            lses.append(lse)
        if causal:
            expected = dense_attention(q, k[i], v[i], start, length, sinks)
        else:
            expected, _ = partial_attention(q, q_pos, k[i][kept], v[i][kept], kept)
        torch.testing.assert_close(combine(outs, lses), expected)
