# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The window inspector under decode context parallelism: ``--dcp N`` (``make demo
DEMO_ARGS="--dcp 2"``).

Each of the N ranks gets real ``BlockTables`` of its own (``cp_size`` N, its ``cp_rank``, the
interleave of ``--dcp-interleave``) holding the same block ids, as the ranks of a DCP group
do, and builds the draft metadata through vLLM's real path with the window on and off. Per
request it prints what the inspector prints without DCP, and per rank the local tokens read
(the rank's share of the windowed length) against its share of the context, with the blocks
and KV bytes of the rank that reads the most. Checks, on every rank: the slot mappings are
vLLM's own (the rank's local slots, PAD elsewhere) with and without the window; the window
(start and length) is the same; the kernel is handed the rank's share of the windowed
length; and each rank's partial attention over its cropped table row and local length,
combined by log-sum-exp as DCP combines the ranks', equals dense attention over exactly the
window (and the sinks).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from tools.inspector import common
from vllm_ascend.worker.v2.spec_decode.draft_window.config import (
    KEY,
    MIN_CONTEXT_KEY,
    SINKS_KEY,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.window import ceil_div


def add_arguments(parser) -> None:
    parser.add_argument(
        "--dcp",
        default="1",
        help="decode_context_parallel_size: ranks the KV is sharded over (default 1: none)",
    )
    parser.add_argument(
        "--dcp-interleave",
        default="1",
        help="cp_kv_cache_interleave_size: tokens each rank holds in turn (default 1); must "
        "divide every block size",
    )


def check_arguments(args) -> None:
    """``--dcp`` and ``--dcp-interleave`` as integers, after ``--block-sizes``; a ValueError
    naming the flag otherwise."""
    args.dcp = _positive_int("--dcp", args.dcp)
    args.dcp_interleave = _positive_int("--dcp-interleave", args.dcp_interleave)
    for b in args.block_sizes:
        # A rank's tokens of one block are whole interleave chunks (vLLM requires it).
        if b % args.dcp_interleave:
            raise ValueError(
                f"--dcp-interleave {args.dcp_interleave} does not divide the "
                f"block size {b}: cp_kv_cache_interleave_size must divide every "
                f"block size"
            )
    if args.dcp > 1 and args.plot:
        raise ValueError("--plot draws one table's blocks without DCP; leave it out with --dcp")


def _positive_int(flag: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{flag} must be a positive integer, got {text!r}")
    return value


@dataclass
class Built:
    """What one rank's build handed the draft's kernel, copied out at once (the next build
    rewrites the shared buffers): per group, lengths, DCP-local lengths, tables, slots."""

    seq_lens: list[list[int]]
    local_lens: list[list[int]]
    # per group: [n, width] int32, the cropped (or full) table rows
    tables: list
    slots: list[list[int]]


def inspect_method(args, method: str, model_dir) -> list[dict]:
    """Build every rank's draft metadata with the window on and off; check it; one row a
    request."""

    from testbed.reference import positions_read

    k_spec = args.num_spec_tokens
    # DFlash/DSpark seq_lens count the whole query stretch; an EAGLE decode step, one token.
    query = common.query_len(method, k_spec)
    seq_lens = [length + query for length in args.seq_lens]
    windowed, plain, spec, block_ids = _build_every_rank(args, method, model_dir, seq_lens, query)
    rows = []
    for i, length in enumerate(seq_lens):
        checks = []
        for g, b in enumerate(args.block_sizes):
            built = (windowed, plain, spec, block_ids[g][i])
            checks += _group_checks(args, built, g, b, i, length, query)
        read = windowed[0].seq_lens[0][i]
        start, _ = positions_read(length, read, spec.sink_size)
        engaged = length >= spec.min_context
        b0 = args.block_sizes[0]
        per_token = 2 * args.draft_layers * args.kv_heads * args.head_dim * args.dtype_bytes
        # Local tokens depend on the layout only, not on the group: the first group's.
        reads = [w.local_lens[0][i] for w in windowed]
        fulls = [p.local_lens[0][i] for p in plain]
        rows.append(
            {
                "context": length - query,
                "seq_len": length,
                "start": start,
                "windowed": windowed[0].seq_lens[0][i],
                "engaged": engaged,
                "ranks": list(zip(reads, fulls, strict=True)),
                # The rank that reads the most: rank 0 (it holds the first chunk of each round).
                "blocks": ceil_div(max(reads), b0),
                "full_blocks": ceil_div(max(fulls), b0),
                "kv_bytes": max(reads) * per_token,
                "full_kv_bytes": max(fulls) * per_token,
                "ok": all(checks),
                "alignment": spec.alignment,
                "sinks": spec.sink_size,
                "min_context": spec.min_context,
            }
        )
    return rows


def _group_checks(args, built, g: int, b: int, i: int, length: int, query: int) -> list[bool]:
    """Request ``i``'s checks in group ``g`` on every rank."""
    import torch

    from testbed.reference import positions_read

    windowed, plain, spec, ids = built
    cp = args.dcp
    checks = []
    read = windowed[0].seq_lens[g][i]
    start, kept = positions_read(length, read, spec.sink_size)
    # One window on every rank, its start whole columns of every rank's table.
    checks.append(all(w.seq_lens[g][i] == read for w in windowed))
    checks.append(start % spec.alignment == 0 and spec.alignment % (cp * b) == 0)
    if length >= spec.min_context:
        checks.append(min(length, spec.sink_size + args.window) <= read < spec.reach)
    else:
        checks.append(read == length)
    checks.append(all(p.seq_lens[g][i] == length for p in plain))
    # Each rank's kernel is handed its share: of the window, of the whole context.
    reads = [w.local_lens[g][i] for w in windowed]
    fulls = [p.local_lens[g][i] for p in plain]
    checks.append(reads == _shares(read, cp, args.dcp_interleave) and sum(reads) == read)
    checks.append(fulls == _shares(length, cp, args.dcp_interleave))
    # Slots stay vLLM's own: the rank's local slot of a token it holds, PAD elsewhere.
    positions = torch.arange(length - query, length)
    for r in range(cp):
        truth = _local_slots(positions, ids, cp, r, args.dcp_interleave, b)
        checks.append(windowed[r].slots[g][i * query : (i + 1) * query] == truth)
        checks.append(plain[r].slots[g][i * query : (i + 1) * query] == truth)
    tables = [w.tables[g][i] for w in windowed]
    where = (ids, b, cp, args.dcp_interleave, i, length, start, spec.sink_size, kept, query)
    checks.append(_reference_check(*where, tables, reads))
    return checks


def _build_every_rank(args, method: str, model_dir, seq_lens: list[int], query: int):
    """Every rank's windowed and plain builds (``Built``), the window's spec, and the block ids
    of every rank's table."""
    from testbed.buffers import make_mrv2_batch
    from testbed.speculators import (
        SPECULATOR_CLASSES,
        GroupLayout,
        make_vllm_config,
        wire_speculator,
    )

    cp, k_spec, n = args.dcp, args.num_spec_tokens, len(seq_lens)
    max_model_len = ceil_div(max(seq_lens) + k_spec + 1, 1024) * 1024
    layouts = [GroupLayout(b) for b in args.block_sizes]
    on = {KEY: args.window, SINKS_KEY: args.sinks, MIN_CONTEXT_KEY: args.min_context}
    configs = {
        w: make_vllm_config(model_dir, max_model_len, n, on if w else {}) for w in (True, False)
    }
    windowed, plain, spec, block_ids = [], [], None, None
    for rank in range(cp):
        # One seed for every rank: the same requests and block ids (one column per cp * b
        # tokens), as the ranks of a DCP group hold them; each rank its own slots.
        batch = make_mrv2_batch(
            args.block_sizes,
            seq_lens,
            query,
            n,
            n,
            max_model_len,
            np.random.default_rng(0),
            lookahead_tokens=k_spec,
            cp=(cp, rank, args.dcp_interleave),
        )
        assert block_ids in (None, batch.req_block_ids), "the ranks' block ids differ"
        block_ids = batch.req_block_ids
        # An EAGLE decode step reads its own buffers, laid out one token per request.
        own = None if query > 1 else batch.input_buffers
        for window, out in ((True, windowed), (False, plain)):
            with _start_up_lines_once(rank):
                wired = wire_speculator(
                    SPECULATOR_CLASSES[method],
                    batch,
                    layouts,
                    configs[window],
                    method,
                    k_spec,
                    dcp_size=cp,
                    draft_input_buffers=own,
                )
                metadata = common.draft_metadata(wired.speculator, batch, n, query)
            out.append(_copy_out(wired, metadata, n, n * query))
            if window:
                spec = wired.speculator.draft_window.spec
    return windowed, plain, spec, block_ids


@contextmanager
def _start_up_lines_once(rank: int):
    """The window's start-up lines for rank 0 only: every rank would say the same."""
    # Records logged on vLLM's logger itself (the core's) pass its filters.
    logger = logging.getLogger("vllm")

    def others(record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not common.window_record(record)

    if rank:
        logger.addFilter(others)
    try:
        yield
    finally:
        logger.removeFilter(others)


def _copy_out(wired, metadata, n: int, tokens: int) -> Built:
    groups = sorted(wired.received)
    cams = [wired.received[g][-1] for g in groups]
    return Built(
        seq_lens=[metadata[f"draft.{g}"].seq_lens[:n].tolist() for g in groups],
        local_lens=[cam.dcp_local_seq_lens[:n].tolist() for cam in cams],
        tables=[metadata[f"draft.{g}"].block_table[:n].clone() for g in groups],
        slots=[cam.slot_mapping[:tokens].tolist() for cam in cams],
    )


def _shares(length: int, cp: int, interleave: int) -> list[int]:
    """Each rank's tokens of ``[0, length)``: vLLM's ``get_dcp_local_seq_lens``."""
    import torch
    from vllm.v1.attention.backends.utils import get_dcp_local_seq_lens

    lengths = torch.tensor([length], dtype=torch.int32)
    return get_dcp_local_seq_lens(lengths, cp, None, interleave)[0].tolist()


def _local_slots(
    positions, ids: list[int], cp: int, rank: int, interleave: int, b: int
) -> list[int]:
    """The slots rank ``rank`` writes ``positions`` to through the full table: the testbed's
    statement of vLLM's layout (``testbed/dcp.py``), PAD (-1) where another rank holds it."""
    import torch

    from testbed.dcp import local_position, owner

    local = local_position(positions, cp, interleave, b)
    row = torch.tensor(ids, dtype=torch.int64)
    slots = row[local // b] * b + local % b
    return torch.where(owner(positions, cp, interleave) == rank, slots, -1).tolist()


def _reference_check(
    ids, b, cp, interleave, i, length, start, sinks, kept, query, tables, local_lens
) -> bool:
    """Every rank's partial attention over what its kernel is handed (cropped table row,
    local length), combined as DCP combines them, equals dense attention over exactly the
    sinks and ``[start, length)``; each rank reads its own tokens of those, in order, and
    nothing else."""
    import torch

    from testbed.dcp import (
        DcpCaches,
        combine,
        owner,
    )
    from testbed.reference import dense_attention

    gen = torch.Generator().manual_seed(i)
    shape = (length, common.CHECK_HEADS, common.CHECK_HEAD_DIM)
    k = torch.randn(shape, generator=gen, dtype=torch.float64)
    v = torch.randn(shape, generator=gen, dtype=torch.float64)
    caches = DcpCaches(cp, interleave, b, max(ids) + 1, common.CHECK_HEADS, common.CHECK_HEAD_DIM)
    caches.write(ids, k, v)
    q = k[length - query : length]
    q_pos = torch.arange(length - query, length)
    outputs, lses, own = [], [], True
    for r in range(cp):
        try:
            out, lse, pos = caches.read(r, tables[r], local_lens[r], q, q_pos)
        except (AssertionError, IndexError):  # a slot never written, or past the table
            return False
        outputs.append(out)
        lses.append(lse)
        own &= torch.equal(pos, kept[owner(kept, cp, interleave) == r])
    expected = dense_attention(q, k, v, start, length, sinks)
    return own and bool(torch.allclose(combine(outputs, lses), expected))


def print_table(method: str, args, rows: list[dict]) -> None:
    mib = 1 << 20
    sinks = rows[0]["sinks"]
    cp = args.dcp
    print(
        f"{common.title(method, args, rows)}; decode_context_parallel_size={cp}, "
        f"cp_kv_cache_interleave_size={args.dcp_interleave}: a table column spans {cp} "
        f"blocks of a request's tokens, one on each rank"
    )
    ranks = [(f"rank {r} read/full", 16) for r in range(cp)]
    columns = [*common.REQUEST_COLUMNS, *ranks, *common.kv_columns("blocks/rank", "KV MiB/rank")]
    cells = [
        [
            *common.request_cells(r),
            *(f"{read}/{full}" for read, full in r["ranks"]),
            *common.kv_cells(r),
        ]
        for r in rows
    ]
    print("\n".join(common.text_table(columns, cells)))
    most = sum(r["kv_bytes"] for r in rows), sum(r["full_kv_bytes"] for r in rows)
    print(
        f"batch: the rank that reads the most (rank 0) reads {most[0] / mib:.1f} MiB of KV "
        f"instead of {most[1] / mib:.1f} MiB ({most[1] / max(most[0], 1):.1f}x less); "
        f"blocks/rank and KV MiB/rank are its. Checks, on every rank: slot mappings vLLM's "
        f"own (the rank's local slots, PAD elsewhere) with and without the window; one "
        f"window start per request on every rank, whole columns of every rank's tables (a "
        f"multiple of {cp} blocks), length between min(L, S + W) and S + W + a - 1 (S: sinks, "
        f"{sinks} here), or the whole context where the window is not engaged; each rank's "
        f"kernel handed its share of the windowed length (vLLM's get_dcp_local_seq_lens), "
        f"the shares summing to it; each rank's partial attention through its cropped table "
        f"and local length, combined by log-sum-exp, equals dense attention over the sinks "
        f"and the window."
    )
