# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""EAGLE/EAGLE3 on the installed vllm-ascend release on CPU: a decode set up through its
speculator, each step's build and FULL-graph parameters, and the checks of what FIA is told."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from vllm.config.compilation import CUDAGraphMode

from testbed.dcp import DcpCaches
from testbed.reference import (
    PagedKVCache,
    assert_kernel_reads,
    dense_attention,
    positions_read,
)
from tests.ascend.npu_testbed.compat import draft_build, fia_params_before_replay
from tests.ascend.npu_testbed.pairing import installed_release
from tests.ascend.npu_testbed.wiring import (
    HEAD_SIZE,
    MAX_MODEL_LEN,
    NUM_KV_HEADS,
    eagle_config,
    eagle_speculator,
    load_tables,
    with_dcp,
)
from vllm_ascend.worker.v2.attn_utils import build_attn_metadata_wrapper

W = 128
MAX_NUM_REQS = 12
# Target lengths of the verify step (context + the verified tokens), around the window and
# block edges, and at max_model_len (where vllm-ascend clamps the actual length).
TARGET_LENS = [5, 120, 127, 128, 129, 255, 256, 300, 1000, MAX_MODEL_LEN - 1]


@dataclasses.dataclass
class InputBatchSeen:
    """The fields of the target's ``AscendInputBatch`` that the decode paths read (the
    prefill test uses a real one)."""

    num_reqs: int
    is_prefilling_np: np.ndarray
    seq_lens_np: np.ndarray
    seq_lens_cpu_upper_bound: torch.Tensor


@dataclasses.dataclass
class Decode:
    s: object
    target: torch.Tensor  # [n] target lengths
    rejected: torch.Tensor  # [n]
    block_ids: list
    cache: PagedKVCache | DcpCaches
    k: list
    v: list
    block_size: int


def setup_decode(
    model_dir, method, block_size, num_spec, additional=None, seed=0, max_num_tokens=None, cp=None
):
    """``cp``: (ranks, this rank, interleave) under decode context parallelism (the DCP
    group stood in by the caller, ``dcp_ranks.on_rank``): the rank's speculator, every rank's
    reference cache (``DcpCaches``; the same block ids and K/V on every rank's call)."""
    rng = np.random.default_rng(seed)
    config = eagle_config(
        model_dir, method, {"draft_window_size": W} if additional is None else additional, num_spec
    )
    if cp is not None:
        with_dcp(config, cp[0], cp[2])
    s = eagle_speculator(config, block_size, MAX_NUM_REQS, num_spec, max_num_tokens, cp=cp)
    n = len(TARGET_LENS)
    target = torch.tensor(TARGET_LENS, dtype=torch.int32)
    rejected = torch.from_numpy(rng.integers(0, num_spec + 1, n)).to(torch.int32)
    rejected = torch.minimum(rejected, target - 1)
    # Every position a step can be told to read: up to the target length + the last step.
    ends = [min(t + num_spec, MAX_MODEL_LEN) for t in TARGET_LENS]
    # A column covers a block of every rank under DCP.
    column = block_size * (1 if cp is None else cp[0])
    pool = rng.permutation(np.arange(1, 1 + sum(-(-e // column) for e in ends)))
    block_ids, used = [], 0
    for e in ends:
        count = -(-e // column)
        block_ids.append([int(x) for x in pool[used : used + count]])
        used += count
    load_tables(s, block_ids, MAX_NUM_REQS, rng)
    gen = torch.Generator().manual_seed(seed)
    if cp is None:
        cache = PagedKVCache(used + 1, block_size, NUM_KV_HEADS, HEAD_SIZE)
    else:
        cache = DcpCaches(cp[0], cp[2], block_size, used + 1, NUM_KV_HEADS, HEAD_SIZE)
    k, v = [], []
    for i, e in enumerate(ends):
        k.append(torch.randn(e, NUM_KV_HEADS, HEAD_SIZE, generator=gen, dtype=torch.float64))
        v.append(torch.randn(e, NUM_KV_HEADS, HEAD_SIZE, generator=gen, dtype=torch.float64))
        if cp is None:
            cache.write(torch.tensor(block_ids[i], dtype=torch.int32), torch.arange(e), k[i], v[i])
        else:
            cache.write(block_ids[i], k[i], v[i])
    tib = s.target_input_buffers
    tib.seq_lens.zero_()
    tib.seq_lens[:n] = target
    tib.seq_lens_cpu.zero_()
    tib.seq_lens_cpu[:n] = target
    s.input_batch = InputBatchSeen(n, np.zeros(n, dtype=bool), tib.seq_lens_np[:n], target.clone())
    if getattr(installed_release(), "fia_table_from_target", False):  # the plugin's 0.29
        # What the target runner leaves in the model state for the draft layers (vllm-ascend
        # 0.29 takes a FULL replay's block table from it): the full table of this step.
        full = s.block_tables.input_block_tables[0]
        s.model_state.attn_metadata = {"draft.0": SimpleNamespace(block_tables=full)}
    return Decode(s, target, rejected, block_ids, cache, k, v, block_size)


def at_step(d: Decode, step: int) -> None:
    """The draft's own inputs at a decode step, written by vLLM's own kernels (under Triton's
    interpreter): ``prepare_decode_inputs`` after the prefill (which leaves each position at
    the last accepted token), then ``update_draft_inputs`` after each earlier step (zero
    tokens and hidden states stand in for the draft forward's output)."""
    from vllm.v1.worker.gpu.spec_decode.autoregressive.speculator import (
        prepare_decode_inputs,
        update_draft_inputs,
    )

    s, n, m = d.s, len(TARGET_LENS), MAX_NUM_REQS
    num_spec, ib = s.num_speculative_steps, s.input_buffers
    ib.positions[:n] = (d.target - d.rejected - 1).long()
    prepare_decode_inputs(
        torch.zeros(n, num_spec, dtype=torch.int64),
        d.target,
        d.rejected,
        ib,
        torch.zeros(m, dtype=torch.int64),
        MAX_MODEL_LEN,
        m,
    )
    for done in range(1, step):
        update_draft_inputs(
            torch.zeros(n, dtype=torch.int64),
            torch.tensor([done], dtype=torch.int32),
            torch.zeros(n, 4),
            torch.zeros(n, num_spec, dtype=torch.int64),
            torch.zeros(m, 4),
            ib,
            torch.zeros(m, dtype=torch.int64),
            n,
            MAX_MODEL_LEN,
            num_spec,
        )
    # The kernels' lengths: after the last accepted token, one more per step (a check of
    # this setup, not of the window).
    expected = torch.clamp(d.target - d.rejected + step, max=MAX_MODEL_LEN)
    assert torch.equal(ib.seq_lens[:n], expected) and not ib.seq_lens[n:].any()


def build(d: Decode, step: int, cg_mode=CUDAGraphMode.NONE, num_reqs_padded=None):
    """The build of one decode step, as vLLM's `_multi_step_decode` runs it (inside
    vllm-ascend's build wrapper, which its propose and capture set)."""
    n = len(TARGET_LENS)
    padded = num_reqs_padded or n
    bound = d.s.input_batch.seq_lens_cpu_upper_bound
    with build_attn_metadata_wrapper():
        return draft_build(d.s, n, padded, padded, bound, step, cg_mode=cg_mode)["draft.0"]


def assert_fia_reads_the_window_of_the_told_length(d: Decode, step, actual_lens, table):
    """What FIA gets (actual lengths, block table) reads exactly the window of the length it is
    told, and the device lengths share its start."""
    window = d.s.draft_window
    spec = window.spec
    n = len(TARGET_LENS)
    queries, expected_reads = [], []
    for i, target in enumerate(TARGET_LENS):
        actual = min(target + step, MAX_MODEL_LEN)
        read = int(actual_lens[i])
        start, kept = positions_read(actual, read)
        assert start % spec.alignment == 0
        if actual < spec.min_context:
            assert read == actual  # below draft_window_min_context: the whole actual length
        else:
            assert min(actual, W) <= read <= W + spec.alignment - 1
        q = d.k[i][actual - 1 : actual] * 0.5
        expected = dense_attention(q, d.k[i], d.v[i], start, actual)
        got, touched = d.cache.read(q, table[i], read)
        torch.testing.assert_close(got, expected)
        assert touched == {d.block_ids[i][p // d.block_size] for p in kept.tolist()}
        queries.append(q)
        expected_reads.append(expected)
        # The draft's own (device) length, windowed from the same start.
        own = min(target - int(d.rejected[i]) + step, MAX_MODEL_LEN)
        assert int(window.seq_lens[i]) == own - start
    assert not any(actual_lens[n:])
    # The same inputs through vLLM's Triton paged attention kernel (under the interpreter).
    assert_kernel_reads(d.cache, queries, table, actual_lens[:n], expected_reads)


def full_graph_params(d: Decode, padded: int) -> tuple[list, list]:
    """What vllm-ascend hands a FULL ACL graph replay, made before it: every step's metadata
    (built once at step 1) and each step's FIA parameters (``build_fia_params``)."""
    at_step(d, 1)
    metadatas, fia = fia_params_before_replay(d.s, padded)
    assert len(fia) == d.s.num_speculative_steps - 1
    assert metadatas is None or len(metadatas) == len(fia)
    return metadatas, fia


def draft_prefill_seen(s, batch, n: int, num_tokens: int, target_metadata: dict) -> dict:
    """vLLM's ``_prefill`` as ``propose`` runs it (vllm-ascend's propose keeps the target's
    batch as ``input_batch``, the propose hook stashes it too); returns what the draft layers
    are handed (no draft weights on CPU: the forward stops there)."""
    seen = {}

    class Stop(Exception):
        pass

    def run_model(num_tokens, attn_metadata, *args, **kwargs):
        seen.update(attn_metadata)
        raise Stop

    s._run_model = run_model
    s.last_token_indices = torch.zeros(MAX_NUM_REQS, dtype=torch.int64)
    s.idx_mapping = torch.zeros(MAX_NUM_REQS, dtype=torch.int64)
    kept = s.input_batch
    s.input_batch = s.draft_window.propose.prefill_batch = batch
    try:
        with pytest.raises(Stop):
            s._prefill(n, num_tokens, target_metadata, None, num_tokens_across_dp=None)
    finally:
        s.draft_window.propose.prefill_batch = None
        s.input_batch = kept
    return seen


def refused(d: Decode, match: str) -> None:
    from vllm.config import set_current_vllm_config

    from vllm_ascend.worker.v2.spec_decode.draft_window.speculator import (
        create_draft_window,
    )

    with set_current_vllm_config(d.s.vllm_config), pytest.raises(ValueError, match=match):
        create_draft_window(d.s, installed_release())
