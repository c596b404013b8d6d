# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
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
from vllm.v1.attention.backends.utils import get_dcp_local_seq_lens

from testbed.buffers import make_mrv2_batch
from testbed.dcp import (
    CP_LAYOUTS,
    LENGTHS,
    B,
    assert_ranks_read_the_window,
    local_position,
    owner,
    reference_caches,
    true_kv,
    window_per_rank,
)


@pytest.mark.parametrize(("cp_size", "interleave"), CP_LAYOUTS)
def test_vllms_slot_mapping_kernel_places_tokens_where_the_reference_does(cp_size, interleave):
    """vLLM's own ``_compute_slot_mappings_kernel`` (interpreted) for every rank: each token
    goes to its owner's local slot, PAD on the other ranks; and vLLM's DCP-local lengths
    count exactly the tokens a rank owns."""
    lengths = [700, 37, 129]
    starts = np.cumsum([0, *lengths])
    for rank in range(cp_size):
        # Every request's query is its whole context, so the kernel maps every position.
        batch = make_mrv2_batch(
            [B],
            lengths,
            1,
            3,
            4,
            1024,
            np.random.default_rng(0),
            query_lens=lengths,
            cp=(cp_size, rank, interleave),
        )
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


@pytest.mark.parametrize(("cp_size", "interleave"), CP_LAYOUTS)
@pytest.mark.parametrize(
    ("window", "sinks", "min_context"), [(64, 0, 0), (100, 0, 0), (64, 20, 0), (64, 0, 600)]
)
def test_every_rank_reads_exactly_its_share_of_one_window(
    cp_size, interleave, window, sinks, min_context
):
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
    assert_ranks_read_the_window(
        caches,
        LENGTHS,
        reads,
        rank_reads,
        spec.sink_size,
        window,
        cp_size * B,
        k,
        v,
        min_context=min_context,
    )


def test_a_replicated_group_is_windowed_in_blocks_as_without_dcp():
    """A draft cache vLLM keeps whole on every rank (a DFlash/DSpark GQA draft under the
    target's DCP) has one column per block: the window aligns to the block, as without DCP."""
    (batch, w), *_ = window_per_rank(4, 1, 64, dcp_sharded=[False])
    assert w.spec.alignment == B and w.group_block_sizes == {0: B}
    k, v = true_kv(LENGTHS)
    caches = reference_caches(1, 1, batch.req_block_ids[0], k, v)
    n = len(LENGTHS)
    assert_ranks_read_the_window(
        caches,
        LENGTHS,
        w.seq_lens[:n],
        {0: (w.windows[0].block_table, w.seq_lens[:n])},
        0,
        64,
        B,
        k,
        v,
    )
