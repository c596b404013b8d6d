"""Real vLLM 0.33.0 MRV2 buffers on CPU, filled the way its Triton kernels fill them.

Triton does not run on CPU, so `BlockTables.apply_staged_writes`, `gather_block_tables`,
`compute_slot_mappings` and the speculators' prep kernels cannot be called here; each
`fill_*` function below writes what the named kernel writes, and nothing else.
"""

from dataclasses import dataclass

import numpy as np
import torch
from vllm.v1.attention.backends.utils import PAD_SLOT_ID
from vllm.v1.worker.block_table import get_block_table_width
from vllm.v1.worker.gpu.block_table import BlockTables
from vllm.v1.worker.gpu.input_batch import InputBuffers

CPU = torch.device("cpu")


@dataclass
class Mrv2Batch:
    block_tables: BlockTables
    input_buffers: InputBuffers
    block_sizes: list[int]
    # [num_reqs] int: the lengths written into input_buffers.seq_lens
    seq_lens: np.ndarray
    # [num_reqs] int: batch index -> request-state row of the persistent tables
    idx_mapping: np.ndarray
    # per group, per request: the KV-cache-manager block ids of that request
    req_block_ids: list[list[list[int]]]
    num_reqs: int
    num_reqs_padded: int
    num_query_per_req: int
    max_model_len: int

    @property
    def num_tokens(self) -> int:
        return self.num_reqs * self.num_query_per_req


def make_mrv2_batch(
    block_sizes: list[int],
    seq_lens: list[int],
    num_query_per_req: int,
    num_reqs_padded: int,
    max_num_reqs: int,
    max_model_len: int,
    rng: np.random.Generator,
    lookahead_tokens: int = 0,
) -> Mrv2Batch:
    """A DFlash-style batch: `seq_lens` already count each request's query stretch.

    Every request owns distinct random block ids (0 is the null block), sized for
    `seq_lens + lookahead_tokens`, in a random request-state row, so a wrong gather or a
    wrong column shows up as a wrong id.
    """
    num_reqs = len(seq_lens)
    assert num_reqs <= num_reqs_padded <= max_num_reqs
    # As the model runner sizes them: enough blocks for max_model_len, rounded up to the
    # 128-token alignment kernels load block ids in.
    max_blocks = [get_block_table_width(-(-max_model_len // b), b) for b in block_sizes]
    block_tables = BlockTables(
        block_sizes=list(block_sizes),
        max_num_reqs=max_num_reqs,
        max_num_batched_tokens=max_num_reqs * num_query_per_req,
        max_num_blocks_per_group=max_blocks,
        device=CPU,
    )
    input_buffers = InputBuffers(max_num_reqs, max_num_reqs * num_query_per_req, CPU)
    idx_mapping = rng.permutation(max_num_reqs)[:num_reqs]
    req_block_ids = []
    for g, b in enumerate(block_sizes):
        pool = rng.permutation(np.arange(1, max_num_reqs * max_blocks[g] + 1))
        per_req, used = [], 0
        for length in seq_lens:
            n = min(-(-(length + lookahead_tokens) // b), max_blocks[g])
            per_req.append([int(x) for x in pool[used : used + n]])
            used += n
        req_block_ids.append(per_req)
    batch = Mrv2Batch(
        block_tables=block_tables,
        input_buffers=input_buffers,
        block_sizes=list(block_sizes),
        seq_lens=np.asarray(seq_lens, dtype=np.int64),
        idx_mapping=idx_mapping,
        req_block_ids=req_block_ids,
        num_reqs=num_reqs,
        num_reqs_padded=num_reqs_padded,
        num_query_per_req=num_query_per_req,
        max_model_len=max_model_len,
    )
    fill_persistent_block_tables(batch)
    # Rows and columns of a previous, larger step are still in the gathered tables.
    for table in block_tables.input_block_tables:
        table.copy_(torch.from_numpy(rng.integers(1, 1 << 20, tuple(table.shape), np.int32)))
    fill_input_block_tables(batch)
    fill_dflash_inputs(batch)
    fill_slot_mappings(batch)
    return batch


def fill_persistent_block_tables(batch: Mrv2Batch) -> None:
    """What `append_block_ids` + `apply_staged_writes` leave in the per-request tables."""
    bt = batch.block_tables
    for g, per_req in enumerate(batch.req_block_ids):
        for i, ids in enumerate(per_req):
            req = int(batch.idx_mapping[i])
            bt.block_tables[g].gpu[req, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
            bt.num_blocks.np[g, req] = len(ids)


def fill_input_block_tables(batch: Mrv2Batch) -> None:
    """`_gather_block_tables_kernel` without sliding-window masking: a real row copies its
    request's first `num_blocks` entries (later columns keep stale values); a padded row
    is zeroed."""
    bt = batch.block_tables
    for g in range(bt.num_kv_cache_groups):
        src, dst = bt.block_tables[g].gpu, bt.input_block_tables[g]
        for i in range(batch.num_reqs):
            req = int(batch.idx_mapping[i])
            n = int(bt.num_blocks.np[g, req])
            dst[i, :n] = src[req, :n]
        dst[batch.num_reqs : batch.num_reqs_padded] = 0


def fill_dflash_inputs(batch: Mrv2Batch) -> None:
    """`_prepare_dflash_inputs_kernel`'s lengths and query layout: each request's query is
    its last `num_query_per_req` positions, `seq_lens` counts them, padded rows get
    `seq_lens = 0` and an empty query."""
    ib, q = batch.input_buffers, batch.num_query_per_req
    n, n_pad = batch.num_reqs, batch.num_reqs_padded
    ib.seq_lens[:n] = torch.from_numpy(batch.seq_lens.astype(np.int32))
    ib.seq_lens[n:n_pad] = 0
    ib.query_start_loc[: n + 1] = torch.arange(n + 1, dtype=torch.int32) * q
    ib.query_start_loc[n + 1 : n_pad + 1] = n * q
    for i, length in enumerate(batch.seq_lens):
        ib.positions[i * q : (i + 1) * q] = torch.arange(int(length) - q, int(length))


def fill_slot_mappings(batch: Mrv2Batch) -> None:
    """`_compute_slot_mappings_kernel`: absolute slots through the full per-request table,
    `PAD_SLOT_ID` from the last real token to the end of the buffer."""
    bt, ib, q = batch.block_tables, batch.input_buffers, batch.num_query_per_req
    for g, b in enumerate(bt.block_sizes):
        table = bt.block_tables[g].gpu
        for i in range(batch.num_reqs):
            req = int(batch.idx_mapping[i])
            pos = ib.positions[i * q : (i + 1) * q]
            bt.slot_mappings[g, i * q : (i + 1) * q] = table[req, pos // b].long() * b + pos % b
        bt.slot_mappings[g, batch.num_tokens :] = PAD_SLOT_ID
