# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""A reference paged attention, for tests only.

KV is written into a paged cache through slot mappings computed from the *full* block
table at absolute positions; it is read back through (block table, seq_len) the way a
paged kernel reads it: KV index j of a request lives in block `table[j // b]` at offset
`j % b`, and query i of q sits at KV index `seq_len - q + i` with a causal mask. The read
also reports every block id it touched.
"""

import numpy as np
import torch


class PagedKVCache:
    def __init__(self, num_blocks: int, block_size: int, num_heads: int, head_dim: int) -> None:
        self.block_size = block_size
        shape = (num_blocks * block_size, num_heads, head_dim)
        self.k = torch.full(shape, float("nan"), dtype=torch.float64)
        self.v = torch.full(shape, float("nan"), dtype=torch.float64)

    def write(
        self,
        block_table_row: torch.Tensor,
        positions: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> None:
        """Write K/V of absolute `positions` through the full table (the slot mapping)."""
        b = self.block_size
        slots = block_table_row[positions // b].long() * b + positions % b
        self.k[slots] = k
        self.v[slots] = v

    def read(
        self,
        q: torch.Tensor,
        block_table_row: torch.Tensor,
        seq_len: int,
        block_size: int | None = None,
        track_blocks: bool = True,
    ) -> tuple[torch.Tensor, set[int]]:
        """Causal attention of `q` [q_len, H, D] over the first `seq_len` KV entries of a
        row, exactly as a paged kernel indexes them; `block_size` is the row's unit when it
        holds smaller kernel blocks of the same cache. Returns (output, block ids read)."""
        b = block_size or self.block_size
        j = torch.arange(seq_len)
        blocks = block_table_row[j // b].long()
        slots = blocks * b + j % b
        out = _causal_attention(q, self.k[slots], self.v[slots])
        return out, {int(x) for x in blocks} if track_blocks else set()


def dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, end: int, sinks: int = 0
) -> torch.Tensor:
    """Causal attention of `q` (the last q_len positions before `end`) over the true K/V
    [positions, H, D] at absolute positions [0, min(sinks, start)) and [start, end)."""
    kept = window_positions(start, end, sinks)
    return _causal_attention(q, k[kept], v[kept])


def window_positions(start: int, end: int, sinks: int = 0) -> torch.Tensor:
    """Absolute positions [0, min(sinks, start)) then [start, end), ascending."""
    return torch.cat([torch.arange(min(sinks, start)), torch.arange(start, end)])


def positions_read(length: int, read_len: int, sinks: int = 0) -> tuple[int, torch.Tensor]:
    """What a windowed read of `read_len` KV entries of a `length`-token context covers:
    the first `sinks` positions, then the recent ones, with the `length - read_len` in
    between left out. Returns (the window start, the positions)."""
    skip = length - read_len
    start = sinks + skip if skip else 0
    return start, window_positions(start, length, sinks)


def _causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    q_len, kv_len = q.shape[0], k.shape[0]
    assert 1 <= q_len <= kv_len
    scores = torch.einsum("qhd,khd->hqk", q, k) / q.shape[-1] ** 0.5
    # Query i sits at KV index kv_len - q_len + i and sees indices up to it.
    allowed = torch.arange(kv_len)[None, :] <= torch.arange(kv_len - q_len, kv_len)[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def unified_attention_read(
    cache: PagedKVCache,
    queries: list[torch.Tensor],
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int | None = None,
) -> list[torch.Tensor]:
    """The same reads through vLLM's production Triton paged attention kernel
    (``unified_attention``, the Triton backend's), one launch for the batch: request i's
    causal queries ``queries[i]`` [q_len, H, D] over the first ``seq_lens[i]`` KV entries of
    ``block_table[i]``. Needs Triton (on CPU: its interpreter). float32; slots never
    written read as zero here (the reference read above proves none is read)."""
    from vllm.v1.attention.ops.triton_unified_attention import (
        unified_attention as _run_unified_attention,
    )

    b = block_size or cache.block_size
    heads, dim = cache.k.shape[1:]
    k = torch.nan_to_num(cache.k).float().view(-1, b, heads, dim)
    v = torch.nan_to_num(cache.v).float().view(-1, b, heads, dim)
    q = torch.cat(queries).float()
    lens = [x.shape[0] for x in queries]
    cu_seqlens_q = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    seqused_k = seq_lens[: len(queries)].to(torch.int32).contiguous()
    out = torch.empty_like(q)
    # The interpreter evaluates masked-off lanes too (0/0 there, discarded by the mask).
    with np.errstate(invalid="ignore", divide="ignore"):
        _run_unified_attention(
            q=q,
            k=k,
            v=v,
            out=out,
            cu_seqlens_q=cu_seqlens_q,
            max_seqlen_q=max(lens),
            seqused_k=seqused_k,
            max_seqlen_k=int(seqused_k.max()),
            softmax_scale=dim**-0.5,
            causal=True,
            window_size=(-1, -1),
            block_table=block_table[: len(queries)].to(torch.int32).contiguous(),
            softcap=0,
            q_descale=None,
            k_descale=None,
            v_descale=None,
        )
    return list(out.split(lens))


def assert_kernel_reads(
    cache: PagedKVCache,
    queries: list[torch.Tensor],
    block_table: torch.Tensor,
    seq_lens: torch.Tensor | list[int],
    expected: list[torch.Tensor],
    block_size: int | None = None,
) -> None:
    """``unified_attention_read`` of these inputs equals the expected reads (float64), to
    the kernel's float32 precision."""
    lens = torch.as_tensor(seq_lens, dtype=torch.int32)
    got = unified_attention_read(cache, queries, block_table, lens, block_size)
    for read, want in zip(got, expected, strict=True):
        torch.testing.assert_close(read.double(), want, atol=2e-5, rtol=1e-4)


def assert_window_reads(
    cache: PagedKVCache,
    k: list[torch.Tensor],
    v: list[torch.Tensor],
    block_ids: list[list[int]],
    lengths: list[int],
    table: torch.Tensor,
    ends: list[int],
    num_queries: int | list[int],
    spec=None,
) -> None:
    """A kernel told ``lengths`` over ``table`` reads, for each request ``i``, exactly the
    window of the length ``ends[i]`` it should read (all of it when ``spec`` is None, or
    when ``ends[i]`` is below ``spec.min_context``; the window's start, aligned and
    ``W`` to ``W + a - 1`` tokens back, is the only one that fits the bounds, and a query
    chunk longer than the window is kept whole): its last ``num_queries`` (per request, or
    one count for all) queries over the reference paged read equal dense attention over the
    sinks and that window (of ``spec``: W, alignment, sinks), through exactly the blocks
    ``block_ids[i]`` that hold them. ``k``/``v``: the true K/V of each request's positions."""
    b = cache.block_size
    sinks = 0 if spec is None else spec.sink_size
    for i, end in enumerate(ends):
        queries = num_queries if isinstance(num_queries, int) else num_queries[i]
        read = int(lengths[i])
        start, kept = positions_read(end, read, sinks)
        if spec is None or end < spec.min_context:
            assert read == end, (i, read, end)
        else:
            assert start % spec.alignment == 0, (i, start)
            assert start <= end - queries, (i, start, end, queries)
            cap = sinks + max(spec.window_size, queries) + spec.alignment - 1
            assert min(end, sinks + spec.window_size) <= read <= cap, (i, read, end)
        q = k[i][end - queries : end] * 0.5
        got, touched = cache.read(q, table[i], read)
        torch.testing.assert_close(got, dense_attention(q, k[i], v[i], start, end, sinks))
        assert touched == {block_ids[i][p // b] for p in kept.tolist()}
