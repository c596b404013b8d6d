"""Real vLLM 0.33.0 MRV2 buffers on CPU, filled the way its Triton kernels fill them.

Triton does not run on CPU, so `BlockTables.apply_staged_writes`, `gather_block_tables`,
`compute_slot_mappings` and the speculators' prep kernels cannot be called here; each
`fill_*` function below writes what the named kernel writes, and nothing else.
"""

from dataclasses import dataclass

import numpy as np
import torch
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
    # per request: its query tokens, the last ones before its seq_len
    query_lens: list[int]
    max_model_len: int

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    @property
    def query_start_loc_np(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.query_lens)]).astype(np.int32)


def make_mrv2_batch(
    block_sizes: list[int],
    seq_lens: list[int],
    num_query_per_req: int,
    num_reqs_padded: int,
    max_num_reqs: int,
    max_model_len: int,
    rng: np.random.Generator,
    lookahead_tokens: int = 0,
    query_lens: list[int] | None = None,
) -> Mrv2Batch:
    """A batch whose `seq_lens` count each request's query (`query_lens`, default
    `num_query_per_req` each): DFlash's layout, and the target's verify batch.

    Every request owns distinct random block ids (0 is the null block), sized for
    `seq_lens + lookahead_tokens`, in a random request-state row, so a wrong gather or a
    wrong column shows up as a wrong id.
    """
    num_reqs = len(seq_lens)
    query_lens = list(query_lens or [num_query_per_req] * num_reqs)
    # Room past the batch's tokens, as a real step rarely fills the token budget.
    max_num_tokens = max(max_num_reqs * num_query_per_req, sum(query_lens) + 16)
    assert num_reqs <= num_reqs_padded <= max_num_reqs
    # As the model runner sizes them: enough blocks for max_model_len, rounded up to the
    # 128-token alignment kernels load block ids in.
    max_blocks = [get_block_table_width(-(-max_model_len // b), b) for b in block_sizes]
    block_tables = BlockTables(
        block_sizes=list(block_sizes),
        max_num_reqs=max_num_reqs,
        max_num_batched_tokens=max_num_tokens,
        max_num_blocks_per_group=max_blocks,
        device=CPU,
    )
    input_buffers = InputBuffers(max_num_reqs, max_num_tokens, CPU)
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
        query_lens=query_lens,
        max_model_len=max_model_len,
    )
    fill_persistent_block_tables(batch)
    # Rows and columns of a previous, larger step are still in the gathered tables.
    for table in block_tables.input_block_tables:
        table.copy_(torch.from_numpy(rng.integers(1, 1 << 20, tuple(table.shape), np.int32)))
    fill_input_block_tables(batch)
    fill_query_inputs(batch)
    fill_slot_mappings(batch)
    return batch


def fill_persistent_block_tables(batch: Mrv2Batch) -> None:
    """What `append_block_ids` + `apply_staged_writes` leave in the per-request tables
    (host-side staging; the window reads only the resulting tables)."""
    bt = batch.block_tables
    for g, per_req in enumerate(batch.req_block_ids):
        for i, ids in enumerate(per_req):
            req = int(batch.idx_mapping[i])
            bt.block_tables[g].gpu[req, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
            bt.num_blocks.np[g, req] = len(ids)
    bt.num_blocks.copy_to_uva()


def fill_input_block_tables(batch: Mrv2Batch) -> None:
    """vLLM's own `_gather_block_tables_kernel` (`BlockTables.gather_block_tables`, no
    sliding-window masking): a real row copies its request's table row, a padded row is
    zeroed. Runs under Triton's interpreter on CPU."""
    idx_mapping = torch.from_numpy(batch.idx_mapping.astype(np.int32))
    batch.block_tables.gather_block_tables(idx_mapping, batch.num_reqs_padded)


def fill_query_inputs(batch: Mrv2Batch, input_buffers=None) -> None:
    """Lengths and query layout as `_prepare_dflash_inputs_kernel` writes them for DFlash
    (and the target runner for its verify batch): each request's query is its last
    `query_lens[i]` positions, `seq_lens` counts them, padded rows get `seq_lens = 0` and
    an empty query. Still an emulation: the real kernels
    need a whole target step (sampled and rejected tokens, sampling state, the target's
    input batch), of which the window reads only these lengths."""
    ib = input_buffers or batch.input_buffers
    n, n_pad = batch.num_reqs, batch.num_reqs_padded
    qsl = torch.from_numpy(batch.query_start_loc_np)
    ib.seq_lens[:n] = torch.from_numpy(batch.seq_lens.astype(np.int32))
    ib.seq_lens[n:n_pad] = 0
    ib.query_start_loc[: n + 1] = qsl
    ib.query_start_loc[n + 1 : n_pad + 1] = int(qsl[-1])
    for i, (length, q) in enumerate(zip(batch.seq_lens.tolist(), batch.query_lens, strict=True)):
        ib.positions[int(qsl[i]) : int(qsl[i]) + q] = torch.arange(length - q, length)


def fill_slot_mappings(batch: Mrv2Batch, input_buffers=None) -> None:
    """vLLM's own `_compute_slot_mappings_kernel` (`BlockTables.compute_slot_mappings`):
    absolute slots through the full per-request table, `PAD_SLOT_ID` past the last real
    token. Runs under Triton's interpreter on CPU."""
    bt, ib = batch.block_tables, input_buffers or batch.input_buffers
    idx_mapping = torch.from_numpy(batch.idx_mapping.astype(np.int32))
    n = batch.num_reqs
    bt.compute_slot_mappings(idx_mapping, ib.query_start_loc[: n + 1], ib.positions,
                             bt.slot_mappings.shape[1])  # fmt: skip
