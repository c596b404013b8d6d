# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Real vLLM 0.33.0 MRV2 buffers on CPU, written by vLLM's own Triton kernels.

The per-request tables go through vLLM's staged writes; its kernels (the staged-write
apply, the block-table gather, the slot mappings, the target runner's positions and
lengths, DFlash's input prep) run under Triton's interpreter (``use_triton_interpreter``).
"""

from dataclasses import dataclass

import numpy as np
import torch
from vllm.v1.worker.gpu.block_table import BlockTables
from vllm.v1.worker.gpu.input_batch import InputBuffers

from testbed.vllm_line import get_block_table_width

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
    # decode context parallelism: ranks, this batch's rank, interleave (1, 0, 1: none)
    cp: tuple[int, int, int] = (1, 0, 1)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    @property
    def query_start_loc_np(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.query_lens)]).astype(np.int32)


def _block_tables(
    block_sizes: list[int],
    max_num_reqs: int,
    max_num_tokens: int,
    max_model_len: int,
    cp: tuple[int, int, int],
    sharded: list[bool],
) -> tuple[BlockTables, list[int], list[int]]:
    """vLLM's ``BlockTables`` for one rank, sized as the model runner sizes them (enough
    blocks for max_model_len, rounded up to the 128-token alignment kernels load block ids
    in), the tokens each group's column covers and each group's width in columns."""
    cp_size = cp[0]
    column = [b * cp_size if s else b for b, s in zip(block_sizes, sharded, strict=True)]
    max_blocks = [
        get_block_table_width(-(-max_model_len // c), b)
        for b, c in zip(block_sizes, column, strict=True)
    ]
    block_tables = BlockTables(
        block_sizes=list(block_sizes),
        max_num_reqs=max_num_reqs,
        max_num_batched_tokens=max_num_tokens,
        max_num_blocks_per_group=max_blocks,
        device=CPU,
        # (ranks, rank, interleave), as BlockTables names them.
        **dict(zip(("cp_size", "cp_rank", "cp_interleave"), cp, strict=True)),
        dcp_sharded=sharded,
    )
    return block_tables, column, max_blocks


def _block_ids(
    rng: np.random.Generator,
    seq_lens: list[int],
    lookahead_tokens: int,
    column: int,
    max_blocks: int,
    max_num_reqs: int,
) -> list[list[int]]:
    """Distinct random block ids (0 is the null block) for each request of one group."""
    pool = rng.permutation(np.arange(1, max_num_reqs * max_blocks + 1))
    per_req, used = [], 0
    for length in seq_lens:
        n = min(-(-(length + lookahead_tokens) // column), max_blocks)
        per_req.append([int(x) for x in pool[used : used + n]])
        used += n
    return per_req


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
    cp: tuple[int, int, int] = (1, 0, 1),
    dcp_sharded: list[bool] | None = None,
) -> Mrv2Batch:
    """A batch whose `seq_lens` count each request's query (`query_lens`, default
    `num_query_per_req` each): DFlash's layout, and the target's verify batch.

    Every request owns distinct random block ids (0 is the null block), sized for
    `seq_lens + lookahead_tokens`, in a random request-state row, so a wrong gather or a
    wrong column shows up as a wrong id.

    ``cp``: (ranks, rank, interleave) of decode context parallelism, as the model runner
    builds ``BlockTables`` for one rank; a group sharded over them (``dcp_sharded``, default
    all) has one column per ``cp * b`` tokens, with the same block ids on every rank.
    """
    num_reqs = len(seq_lens)
    query_lens = list(query_lens or [num_query_per_req] * num_reqs)
    # Room past the batch's tokens, as a real step rarely fills the token budget.
    max_num_tokens = max(max_num_reqs * num_query_per_req, sum(query_lens) + 16)
    assert num_reqs <= num_reqs_padded <= max_num_reqs
    sharded = dcp_sharded or [True] * len(block_sizes)
    block_tables, column, widths = _block_tables(
        block_sizes, max_num_reqs, max_num_tokens, max_model_len, cp, sharded
    )
    input_buffers = InputBuffers(max_num_reqs, max_num_tokens, CPU)
    idx_mapping = rng.permutation(max_num_reqs)[:num_reqs]
    req_block_ids = [
        _block_ids(rng, seq_lens, lookahead_tokens, c, w, max_num_reqs)
        for c, w in zip(column, widths, strict=True)
    ]
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
        cp=cp,
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
    """Each request's block ids into its request-state row of the per-request tables, as the
    model runner adds a request: vLLM's own ``append_block_ids`` and
    ``apply_staged_writes``."""
    bt = batch.block_tables
    for i in range(batch.num_reqs):
        ids = tuple(per_req[i] for per_req in batch.req_block_ids)
        bt.append_block_ids(int(batch.idx_mapping[i]), ids, overwrite=True)
    bt.apply_staged_writes()


def fill_input_block_tables(batch: Mrv2Batch) -> None:
    """vLLM's own `_gather_block_tables_kernel` (`BlockTables.gather_block_tables`, no
    sliding-window masking): a real row copies its request's table row, a padded row is
    zeroed. Runs under Triton's interpreter on CPU."""
    idx_mapping = torch.from_numpy(batch.idx_mapping.astype(np.int32))
    batch.block_tables.gather_block_tables(idx_mapping, batch.num_reqs_padded)


def fill_query_inputs(batch: Mrv2Batch, input_buffers=None) -> None:
    """Lengths and query layout of a batch whose ``seq_lens`` count each request's query (the
    target's verify batch; DFlash's lengths have the same layout): ``query_start_loc`` as
    the model runner writes it from the host (padded rows empty), then the target runner's
    own ``_prepare_pos_seq_lens_kernel`` (``prepare_pos_seq_lens``) from each request's
    computed tokens: positions and ``seq_lens``, every row past the batch zero. Runs under
    Triton's interpreter on CPU."""
    from vllm.v1.worker.gpu.input_batch import prepare_pos_seq_lens

    ib = input_buffers or batch.input_buffers
    n, n_pad = batch.num_reqs, batch.num_reqs_padded
    qsl = torch.from_numpy(batch.query_start_loc_np)
    ib.query_start_loc[: n + 1] = qsl
    ib.query_start_loc[n + 1 : n_pad + 1] = int(qsl[-1])
    idx_mapping = torch.from_numpy(batch.idx_mapping.astype(np.int32))
    num_computed = torch.zeros(ib.seq_lens.shape[0], dtype=torch.int32)
    num_computed[idx_mapping.long()] = torch.from_numpy(
        (batch.seq_lens - np.asarray(batch.query_lens)).astype(np.int32)
    )
    prepare_pos_seq_lens(
        idx_mapping, ib.query_start_loc[: n + 1], num_computed, ib.positions, ib.seq_lens
    )


@dataclass
class TargetVerifyStep:
    """The fields of vLLM's ``InputBatch`` that ``prepare_dflash_inputs`` reads."""

    num_reqs: int
    num_scheduled_tokens: np.ndarray
    positions: torch.Tensor
    query_start_loc: torch.Tensor
    idx_mapping: torch.Tensor


def verify_step(
    seq_lens: np.ndarray, q: int, idx_mapping: np.ndarray, rng: np.random.Generator
) -> tuple[TargetVerifyStep, np.ndarray]:
    """A target verify step of ``q`` tokens per request ending with random rejected tokens
    (at least one token sampled), placed so that the DFlash draft after it has lengths
    ``seq_lens`` (its ``q`` query tokens after the last token kept). Returns the step and
    the rejected counts. Not drawn: a prefill chunk (nothing sampled) and a fully rejected
    step."""
    n = len(seq_lens)
    kept = np.asarray(seq_lens) - q  # the target's tokens kept after rejection
    assert (kept >= 1).all(), f"a DFlash draft length counts its {q} query tokens and more"
    rejected = np.array([rng.integers(max(0, q - a), q) for a in kept], dtype=np.int32)
    first = kept + rejected - q
    step = TargetVerifyStep(
        n,
        np.full(n, q, dtype=np.int32),
        torch.from_numpy(np.concatenate([np.arange(f, f + q) for f in first]).astype(np.int64)),
        torch.from_numpy((np.arange(n + 1) * q).astype(np.int32)),
        torch.from_numpy(np.asarray(idx_mapping, dtype=np.int32)),
    )
    return step, rejected


def prepare_dflash_step(
    batch: Mrv2Batch, num_spec: int, rng: np.random.Generator, draft_group_ids: list[int]
) -> None:
    """DFlash's own input prep (vLLM's ``prepare_dflash_inputs``, once per draft KV-cache
    group as its ``propose`` runs it) after a ``verify_step`` of ``num_spec + 1`` tokens per
    request: lengths, query layout, positions and each draft group's query slot mappings.
    Runs under Triton's interpreter on CPU."""
    from vllm.v1.worker.gpu.spec_decode.dflash.speculator import prepare_dflash_inputs

    q = num_spec + 1
    assert batch.query_lens == [q] * batch.num_reqs
    n, m = batch.num_reqs, batch.block_tables.max_num_reqs
    ib, bt = batch.input_buffers, batch.block_tables
    target, rejected = verify_step(batch.seq_lens, q, batch.idx_mapping, rng)
    tokens = ib.positions.shape[0]
    i64 = lambda size: torch.zeros(size, dtype=torch.int64)  # noqa: E731
    for g in draft_group_ids:
        prepare_dflash_inputs(
            ib,
            bt.slot_mappings[g],
            i64(tokens),
            i64(tokens),
            i64(m * num_spec),
            i64(m * num_spec),
            i64(m * num_spec),
            torch.zeros(m),
            i64(m),
            target,
            torch.from_numpy(q - rejected),
            torch.from_numpy(rejected),
            i64(m),
            i64(m),
            torch.zeros(m),
            i64(m),
            bt.input_block_tables[g],
            batch.block_sizes[g],
            batch.cp[1],
            batch.cp[0] if bool(bt.dcp_sharded[g]) else 1,
            batch.cp[2],
            0,
            q,
            num_spec,
            m,
            tokens,
            batch.max_model_len,
        )
    # The kernel's lengths are the batch's (a check of this setup, not of the window).
    expected = np.minimum(batch.seq_lens, batch.max_model_len)
    assert ib.seq_lens[:n].tolist() == expected.tolist()


def fill_slot_mappings(batch: Mrv2Batch, input_buffers=None) -> None:
    """vLLM's own `_compute_slot_mappings_kernel` (`BlockTables.compute_slot_mappings`):
    absolute slots through the full per-request table, `PAD_SLOT_ID` past the last real
    token. Runs under Triton's interpreter on CPU."""
    bt, ib = batch.block_tables, input_buffers or batch.input_buffers
    idx_mapping = torch.from_numpy(batch.idx_mapping.astype(np.int32))
    n = batch.num_reqs
    bt.compute_slot_mappings(
        idx_mapping, ib.query_start_loc[: n + 1], ib.positions, bt.slot_mappings.shape[1]
    )
