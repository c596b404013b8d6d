# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""A reference for the window under decode context parallelism (DCP), for tests and the
inspector: every rank's share of the KV cache in one process, each rank's partial
attention over exactly what its kernel is handed, and their log-sum-exp combination.

Where a token lives is vLLM's layout (``owner``, ``local_position``), stated here from its
definition and checked against vLLM's own slot-mapping kernel in the tests; a rank's read
takes the keys its (cropped table, local length) point at, and their positions from a
position cache written through the same slots, so the causal mask and the comparison with
dense attention use what was written, not what the window computed.
"""

from __future__ import annotations

import numpy as np
import torch
import vllm.distributed.parallel_state as parallel_state

from testbed.buffers import CPU, make_mrv2_batch
from testbed.plans import plan_over
from testbed.reference import (
    dense_attention,
    positions_read,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import DraftWindow


def owner(p: torch.Tensor, cp_size: int, interleave: int) -> torch.Tensor:
    """The rank holding token ``p``: chunks of ``interleave`` tokens, round robin."""
    return (p // interleave) % cp_size


def local_position(p: torch.Tensor, cp_size: int, interleave: int, unit: int) -> torch.Tensor:
    """Token ``p``'s position in its rank's local sequence: virtual block ``p // (cp u)``
    holds ``u`` local tokens per rank, in order (``unit``: ``u``)."""
    virtual = cp_size * unit
    offset = p % virtual
    rounds, rest = offset // (cp_size * interleave), offset % interleave
    return (p // virtual) * unit + rounds * interleave + rest


class DcpCaches:
    """Every rank's paged cache of one KV-cache group: K, V and the positions written."""

    def __init__(
        self, cp_size: int, interleave: int, unit: int, num_blocks: int, heads: int, head_dim: int
    ) -> None:
        self.cp_size, self.interleave, self.unit = cp_size, interleave, unit
        slots = num_blocks * unit
        nan = float("nan")
        self.k = torch.full((cp_size, slots, heads, head_dim), nan, dtype=torch.float64)
        self.v = torch.full((cp_size, slots, heads, head_dim), nan, dtype=torch.float64)
        # -1: never written.
        self.pos = torch.full((cp_size, slots), -1, dtype=torch.int64)

    def write(self, block_ids: list[int], k: torch.Tensor, v: torch.Tensor) -> None:
        """Positions ``[0, len(k))`` of one request through its full table (block ids per
        column, the same on every rank), each to its owner's local slot."""
        p = torch.arange(k.shape[0])
        rank = owner(p, self.cp_size, self.interleave)
        local = local_position(p, self.cp_size, self.interleave, self.unit)
        row = torch.tensor(block_ids, dtype=torch.int64)
        slots = row[local // self.unit] * self.unit + local % self.unit
        self.k[rank, slots], self.v[rank, slots], self.pos[rank, slots] = k, v, p

    def read(
        self,
        rank: int,
        table_row: torch.Tensor,
        local_len: int,
        q: torch.Tensor,
        q_pos: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rank ``rank``'s partial causal attention of ``q`` [q_len, H, D] at positions
        ``q_pos`` over the first ``local_len`` local tokens of ``table_row``: (output
        [q_len, H, D], log-sum-exp [q_len, H], the positions read)."""
        j = torch.arange(local_len)
        slots = table_row[j // self.unit].long() * self.unit + j % self.unit
        pos = self.pos[rank, slots]
        assert (pos >= 0).all(), f"rank {rank} read a slot never written"
        out, lse = partial_attention(q, q_pos, self.k[rank, slots], self.v[rank, slots], pos)
        return out, lse, pos


def partial_attention(
    q: torch.Tensor, q_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of ``q`` at ``q_pos`` over keys at positions ``pos``: (output, its
    log-sum-exp, -inf where a query sees no key), what a DCP rank hands the combination."""
    scores = torch.einsum("qhd,khd->qhk", q, k) / q.shape[-1] ** 0.5
    visible = pos[None, :] <= q_pos[:, None]
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.where(torch.isinf(lse)[..., None], 0.0, (scores - lse[..., None]).exp())
    return torch.einsum("qhk,khd->qhd", weights, v), lse


def combine(outputs: list[torch.Tensor], lses: list[torch.Tensor]) -> torch.Tensor:
    """The ranks' partial outputs combined as DCP combines them: vLLM's own log-sum-exp
    weighted combination (``_lse_weighted_combine``, its CPU reference)."""
    from vllm.v1.attention.ops.dcp import _lse_weighted_combine

    return _lse_weighted_combine(torch.stack(outputs), torch.stack(lses))


B = 16
HEADS, DIM = 2, 8
# (cp, interleave) over sizes 2, 4, 8 and interleaves 1, a divisor of the block size, and
# the block size.
CP_LAYOUTS = [(2, 1), (4, 1), (8, 1), (2, 4), (4, 8), (8, 4), (2, 16), (4, 16), (8, 16)]
# Around window, alignment (up to 8 * 16) and sink edges, and far past them.
LENGTHS = [1, 5, 63, 64, 65, 127, 128, 129, 200, 255, 256, 257, 383, 500, 1000, 1500]


class DcpGroupStandIn:
    """Stand-in for vLLM's DCP process group (device collectives): the size and rank the
    builders read; no collective runs on CPU here."""

    def __init__(self, cp_size: int, rank: int) -> None:
        self.world_size, self.rank_in_group, self.ranks = cp_size, rank, list(range(cp_size))
        self.device_group, self.unique_name = None, "dcp"


def dcp_group(monkeypatch, cp_size: int, rank: int) -> None:
    monkeypatch.setattr(parallel_state, "_DCP", DcpGroupStandIn(cp_size, rank))


def true_kv(lengths, seed=0, heads: int = HEADS, dim: int = DIM):
    """Random keys and values of each request, ``heads`` of ``dim`` per token."""
    gen = torch.Generator().manual_seed(seed)
    k = [torch.randn(n, heads, dim, generator=gen, dtype=torch.float64) for n in lengths]
    v = [torch.randn(n, heads, dim, generator=gen, dtype=torch.float64) for n in lengths]
    return k, v


def reference_caches(cp_size, interleave, req_block_ids, k, v, block_size: int = B) -> DcpCaches:
    """Every rank's cache of one group, written through the full tables by vLLM's layout."""
    num_blocks = max(max(ids, default=0) for ids in req_block_ids) + 1
    caches = DcpCaches(cp_size, interleave, block_size, num_blocks, *k[0].shape[1:])
    for ids, ki, vi in zip(req_block_ids, k, v, strict=True):
        caches.write(ids, ki, vi)
    return caches


def assert_ranks_read_the_window(
    caches: DcpCaches,
    lengths,
    reads,
    rank_reads,
    sinks: int,
    window,
    alignment: int,
    k,
    v,
    num_queries=1,
    min_context=0,
    new_tokens=0,
    causal: bool = True,
    block_ids=None,
) -> None:
    """``reads[i]``: the global windowed length of request ``i``; ``rank_reads[r]``: what
    rank ``r``'s kernel is handed, ``(table, local lengths)``. Each rank reads exactly its
    tokens of the window, in order, its start a multiple of ``alignment``, and the log-sum-exp
    combination of the ranks' partial attention equals attention over exactly the window
    (causal: ``dense_attention``; else every query sees it all). ``window``, ``num_queries``
    and ``new_tokens``: one for every request, or each request's.

    ``new_tokens[i]`` (flash attention's DCP, vllm-ascend's history/current split): the ranks
    read the window's context only, and the step's own last tokens are attended to from the
    step's K/V, as one more partial, counted once. ``block_ids[i]``: the request's full table
    row; a rank's cropped row must be its columns from the start on (after the sinks')."""
    cp_size = caches.cp_size

    def each(value) -> list:
        return [value] * len(lengths) if isinstance(value, int) else list(value)

    window, num_queries, new_tokens = each(window), each(num_queries), each(new_tokens)
    for i, length in enumerate(lengths):
        new, read = int(new_tokens[i]), int(reads[i])
        start, kept = positions_read(length, read, sinks)
        assert start % alignment == 0, (i, start, alignment)
        if length < min_context:
            assert read == length
        else:
            assert min(length, sinks + window[i]) <= read <= sinks + window[i] + alignment - 1
        q_len = num_queries[i]
        q = k[i][length - q_len : length] * 0.5
        q_pos = torch.arange(length - q_len, length)
        if not causal:
            q_pos = torch.full((q_len,), length - 1)
        outs, lses = [], []
        context = kept[kept < length - new]
        for r in range(cp_size):
            table, local = rank_reads[r]
            if block_ids is not None:
                # A window start drops whole columns, the same ones on every rank.
                column = cp_size * caches.unit
                first, cols = start // column, -(-int(local[i]) // caches.unit)
                held = [*block_ids[i][: min(sinks, start) // column], *block_ids[i][first:]]
                assert table[i][:cols].tolist() == held[:cols], (i, r)
            out, lse, pos = caches.read(r, table[i], int(local[i]), q, q_pos)
            mine = context[owner(context, cp_size, caches.interleave) == r]
            assert pos.tolist() == mine.tolist(), (i, r)
            outs.append(out)
            lses.append(lse)
        if new:
            pos = torch.arange(length - new, length)
            out, lse = partial_attention(q, q_pos, k[i][pos], v[i][pos], pos)
            outs.append(out)
            lses.append(lse)
        if causal:
            expected = dense_attention(q, k[i], v[i], start, length, sinks)
        else:
            expected, _ = partial_attention(q, q_pos, k[i][kept], v[i][kept], kept)
        torch.testing.assert_close(combine(outs, lses), expected)


def window_per_rank(cp_size, interleave, window, sinks=0, min_context=0, dcp_sharded=None):
    """One window per rank over the rank's real BlockTables and InputBuffers (the lengths
    written by vLLM's kernels): (batch, window) per rank."""
    out = []
    for rank in range(cp_size):
        batch = make_mrv2_batch(
            [B],
            LENGTHS,
            1,
            len(LENGTHS) + 2,
            len(LENGTHS) + 4,
            2048,
            np.random.default_rng(3),
            cp=(cp_size, rank, interleave),
            dcp_sharded=dcp_sharded,
        )
        w = DraftWindow(
            plan_over(window, batch.block_tables, [0], sink_tokens=sinks, min_context=min_context),
            batch.input_buffers,
            batch.block_tables,
            len(LENGTHS) + 4,
            CPU,
        )
        w.refresh(batch.num_reqs_padded)
        out.append((batch, w))
    return out
