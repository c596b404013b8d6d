"""The window under decode context parallelism (DCP) on vLLM 0.33: every rank's kernel is
handed exactly its share of one window per request, and the ranks' partial attention,
combined by log-sum-exp as DCP combines it (vLLM's own combination), equals dense attention
over exactly the window (and its sinks).

All ranks of a layout run in one process: each gets vLLM's real ``BlockTables`` for its
rank (the model runner's cp size, rank and interleave), a real speculator and real metadata
builders, with only the DCP process group stood in (its rank and size: the builders read
nothing else from it here). Where a token lives is vLLM's layout, checked against vLLM's
own slot-mapping kernel below; each rank's reference cache is written by that layout.
"""

import numpy as np
import pytest
import torch
import vllm.distributed.parallel_state as parallel_state
from vllm.v1.attention.backends.utils import get_dcp_local_seq_lens

from vllm_ascend.worker.v2.spec_decode.draft_window.mrv2 import Mrv2DraftWindow
from vllm_ascend.worker.v2.spec_decode.draft_window.testbed.buffers import CPU, make_mrv2_batch
from vllm_ascend.worker.v2.spec_decode.draft_window.testbed.dcp import (
    DcpCaches,
    combine,
    local_position,
    owner,
    partial_attention,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.testbed.reference import (
    dense_attention,
    positions_read,
)

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


def true_kv(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shape = (HEADS, DIM)
    k = [torch.randn(n, *shape, generator=gen, dtype=torch.float64) for n in lengths]
    v = [torch.randn(n, *shape, generator=gen, dtype=torch.float64) for n in lengths]
    return k, v


def reference_caches(cp_size, interleave, req_block_ids, k, v) -> DcpCaches:
    """Every rank's cache of one group, written through the full tables by vLLM's layout."""
    num_blocks = max(max(ids, default=0) for ids in req_block_ids) + 1
    caches = DcpCaches(cp_size, interleave, B, num_blocks, *k[0].shape[1:])
    for ids, ki, vi in zip(req_block_ids, k, v, strict=True):
        caches.write(ids, ki, vi)
    return caches


def assert_ranks_read_the_window(caches: DcpCaches, lengths, reads, rank_reads, sinks: int,
                                 window: int, alignment: int, k, v, num_queries=1,
                                 min_context=0, new_tokens=None) -> None:  # fmt: skip
    """``reads[i]``: the global windowed length of request ``i``; ``rank_reads[r]``: what
    rank ``r``'s kernel is handed, ``(table, local lengths)``. Each rank reads exactly its
    tokens of the window, in order, and the log-sum-exp combination of the ranks' partial
    attention equals dense attention over the window.

    ``new_tokens[i]`` (flash attention's DCP): the ranks read the window's context only, and
    the step's own last tokens are attended to from the step's K/V, as one more partial."""
    cp_size = caches.cp_size
    if isinstance(num_queries, int):
        num_queries = [num_queries] * len(lengths)
    if isinstance(window, int):  # per request: a draft prefill's chunk may be longer
        window = [window] * len(lengths)
    for i, length in enumerate(lengths):
        new = 0 if new_tokens is None else int(new_tokens[i])
        read = int(reads[i])
        start, kept = positions_read(length, read, sinks)
        assert start % alignment == 0, (i, start)
        if length < min_context:
            assert read == length
        else:
            assert min(length, sinks + window[i]) <= read <= sinks + window[i] + alignment - 1
        q = k[i][length - num_queries[i] : length] * 0.5
        q_pos = torch.arange(length - num_queries[i], length)
        outs, lses = [], []
        context = kept[kept < length - new]
        for r in range(cp_size):
            table, local = rank_reads[r]
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
        expected = dense_attention(q, k[i], v[i], start, length, sinks)
        torch.testing.assert_close(combine(outs, lses), expected)


@pytest.mark.parametrize(("cp_size", "interleave"), CP_LAYOUTS)
def test_vllms_slot_mapping_kernel_places_tokens_where_the_reference_does(cp_size, interleave):
    """vLLM's own ``_compute_slot_mappings_kernel`` (interpreted) for every rank: each token
    goes to its owner's local slot, PAD on the other ranks; and vLLM's DCP-local lengths
    count exactly the tokens a rank owns."""
    lengths = [700, 37, 129]
    starts = np.cumsum([0, *lengths])
    for rank in range(cp_size):
        # Every request's query is its whole context, so the kernel maps every position.
        batch = make_mrv2_batch([B], lengths, 1, 3, 4, 1024, np.random.default_rng(0),
                                query_lens=lengths, cp=(cp_size, rank, interleave))  # fmt: skip
        for i, length in enumerate(lengths):
            p = torch.arange(length)
            slots = batch.block_tables.slot_mappings[0, starts[i] : starts[i + 1]]
            mine = owner(p, cp_size, interleave) == rank
            local = local_position(p, cp_size, interleave, B)
            ids = torch.tensor(batch.req_block_ids[0][i])
            assert torch.equal(slots[mine], (ids[local // B] * B + local % B)[mine])
            assert (slots[~mine] == -1).all()
            counted = get_dcp_local_seq_lens(torch.tensor([length]), cp_size, rank, interleave)
            assert int(counted[0]) == int(mine.sum())


def window_per_rank(cp_size, interleave, window, sinks=0, min_context=0, dcp_sharded=None):
    """One window per rank over the rank's real BlockTables and InputBuffers (the lengths
    written by vLLM's kernels): (batch, window) per rank."""
    out = []
    for rank in range(cp_size):
        batch = make_mrv2_batch([B], LENGTHS, 1, len(LENGTHS) + 2, len(LENGTHS) + 4, 2048,
                                np.random.default_rng(3), cp=(cp_size, rank, interleave),
                                dcp_sharded=dcp_sharded)  # fmt: skip
        w = Mrv2DraftWindow(window, batch.input_buffers, batch.block_tables, [0],
                            len(LENGTHS) + 4, CPU, attention_sinks=sinks,
                            min_context=min_context)  # fmt: skip
        w.refresh(batch.num_reqs_padded)
        out.append((batch, w))
    return out


@pytest.mark.parametrize(("cp_size", "interleave"), CP_LAYOUTS)
@pytest.mark.parametrize(("window", "sinks", "min_context"),
                         [(64, 0, 0), (100, 0, 0), (64, 20, 0), (64, 0, 600)])  # fmt: skip
def test_every_rank_reads_exactly_its_share_of_one_window(cp_size, interleave, window, sinks,
                                                          min_context):  # fmt: skip
    """The window over each rank's real tables: its alignment is a virtual block (cp * b),
    one start per request, and each rank reading its DCP-local share of the windowed length
    (vLLM's ``get_dcp_local_seq_lens``) from its cropped table reads exactly its tokens of
    the window; combined, dense attention over the window."""
    per_rank = window_per_rank(cp_size, interleave, window, sinks, min_context)
    spec = per_rank[0][1].spec
    assert spec.alignment == cp_size * B
    n = len(LENGTHS)
    reads = per_rank[0][1].seq_lens[:n]
    rank_reads = {}
    for rank, (_, w) in enumerate(per_rank):
        assert torch.equal(w.seq_lens[:n], reads)  # one windowed length on every rank
        assert not w.seq_lens[n:].any()
        local = get_dcp_local_seq_lens(w.seq_lens[:n], cp_size, rank, interleave)
        rank_reads[rank] = (w.windows[0].block_table, local)
    k, v = true_kv(LENGTHS)
    caches = reference_caches(cp_size, interleave, per_rank[0][0].req_block_ids[0], k, v)
    assert_ranks_read_the_window(caches, LENGTHS, reads, rank_reads, spec.sink_size, window,
                                 cp_size * B, k, v, min_context=min_context)  # fmt: skip


def test_a_replicated_group_is_windowed_in_blocks_as_without_dcp():
    """A draft cache vLLM keeps whole on every rank (a DFlash/DSpark GQA draft under the
    target's DCP) has one column per block: the window aligns to the block, as without DCP."""
    (batch, w), *_ = window_per_rank(4, 1, 64, dcp_sharded=[False])
    assert w.spec.alignment == B and w.group_block_sizes == {0: B}
    k, v = true_kv(LENGTHS)
    caches = reference_caches(1, 1, batch.req_block_ids[0], k, v)
    n = len(LENGTHS)
    assert_ranks_read_the_window(caches, LENGTHS, w.seq_lens[:n],
                                 {0: (w.windows[0].block_table, w.seq_lens[:n])}, 0, 64, B, k,
                                 v)  # fmt: skip
