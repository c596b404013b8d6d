# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""DFlash and DSpark on the installed vllm-ascend release on CPU: speculators wired to its
builders, its per-propose and graph-replay builds, and the check that FIA reads exactly the
window."""

import torch

from testbed.reference import (
    PagedKVCache,
    assert_kernel_reads,
    dense_attention,
    positions_read,
)
from tests.ascend.npu_testbed.compat import draft_build
from tests.ascend.npu_testbed.wiring import (
    HEAD_SIZE,
    MAX_MODEL_LEN,
    NUM_KV_HEADS,
    Q,
    fill,
    make_batch,
    speculator,
    vllm_config,
)
from vllm_ascend.worker.v2.attn_utils import build_attn_metadata_wrapper

W = 128
BLOCK = 128
MAX_NUM_REQS = 12
# Contexts counting the Q query tokens, around the window (128) and block (128) edges.
SEQ_LENS = [5, 127, 128, 129, 255, 256, 257, 300, 700, 2000]


# draft_window_min_context 258: just above the window's reach (W + a = 256 for blocks of
# 128), so that 257 reads whole and 300 its window.
def window_config(min_context: int) -> dict:
    return {"draft_window_size": W, "draft_window_min_context": min_context}


def wired(model_dir, method, additional_config=None, seq_lens=SEQ_LENS, block=BLOCK, **config):
    additional = {"draft_window_size": W} if additional_config is None else additional_config
    s = speculator(
        vllm_config(model_dir, method, additional, **config), method, block, MAX_NUM_REQS
    )
    batch = make_batch(seq_lens, block, MAX_NUM_REQS)
    fill(s, batch)
    return s, batch


def per_propose_build(s):
    """The draft build of each propose (DFlash's inside vllm-ascend's build wrapper)."""
    n = s.input_batch.num_reqs
    bound = s.input_batch.seq_lens_cpu_upper_bound
    with build_attn_metadata_wrapper():
        return draft_build(
            s, n, None, n * Q, bound, Q, num_query_per_req=Q, causal=s._group_causal
        )["draft.0"]


def replay_build(s):
    """The build before an ACL graph replay, whose seq_lens_list and block_tables update the
    captured FIA task (vllm-ascend's DFlash graph manager)."""
    return s.build_draft_attn_metadatas(MAX_NUM_REQS, s.input_batch.seq_lens_cpu_upper_bound)[0][
        "draft.0"
    ]


def assert_fia_reads_exactly_the_window(s, batch, seq_lens_list, block_tables, check_slots=True):
    """FIA's lengths and tables read exactly each request's window of ``batch.seq_lens``, and
    (``check_slots``) the query's KV writes stay at the absolute positions of those lengths."""
    window = s.draft_window
    gen = torch.Generator().manual_seed(0)
    b = batch.block_size
    cache = PagedKVCache(MAX_NUM_REQS * (MAX_MODEL_LEN // b + 1) + 1, b, NUM_KV_HEADS, HEAD_SIZE)
    queries, expected_reads = [], []
    for i, length in enumerate(batch.seq_lens):
        k = torch.randn(length, NUM_KV_HEADS, HEAD_SIZE, generator=gen, dtype=torch.float64)
        v = torch.randn(length, NUM_KV_HEADS, HEAD_SIZE, generator=gen, dtype=torch.float64)
        row = torch.tensor(batch.block_ids[i], dtype=torch.int32)
        cache.write(row, torch.arange(length), k, v)
        read_len = int(seq_lens_list[i])
        start, kept = positions_read(length, read_len)
        assert start % window.spec.alignment == 0
        if length < window.spec.min_context:
            assert read_len == length  # below draft_window_min_context: the whole context
        else:
            assert min(length, W) <= read_len <= W + window.spec.alignment - 1
        q = k[length - Q : length] * 0.5
        expected = dense_attention(q, k, v, start, length)
        got, touched = cache.read(q, block_tables[i], read_len)
        torch.testing.assert_close(got, expected)
        assert touched == {batch.block_ids[i][p // b] for p in kept.tolist()}
        queries.append(q)
        expected_reads.append(expected)
        if not check_slots:
            continue
        # The query's KV writes (vllm-ascend's prepare kernel) stay at absolute positions.
        pos = torch.arange(length - Q, length)
        slots = s.block_tables.slot_mappings[0][i * Q : (i + 1) * Q]
        ids = torch.tensor(batch.block_ids[i])[pos // b]
        assert torch.equal(slots.long(), ids * b + pos % b)
    assert not any(seq_lens_list[len(batch.seq_lens) : batch.num_reqs_padded])
    # The same inputs through vLLM's Triton paged attention kernel (under the interpreter).
    assert_kernel_reads(cache, queries, block_tables, seq_lens_list[: len(queries)], expected_reads)


EAGER, REPLAY = per_propose_build, replay_build
# Without the threshold every combination; with it, each method, path and block size once.
FIA_CASES = [
    (m, b, blk, 0)
    for m in ("dflash", "dflash2", "dspark")
    for b in (EAGER, REPLAY)
    for blk in (16, 128)
] + [
    ("dflash", EAGER, 128, 258),
    ("dflash2", REPLAY, 16, 258),
    ("dspark", REPLAY, 128, 258),
    ("dspark", EAGER, 16, 258),
]
