# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""EAGLE3 under decode context parallelism (DCP) on the Ascend pairing: vllm-ascend
0.30.0rc2's own ``AscendEagleSpeculator``, its ``DCPManager`` and its DCP GQA metadata
builder (``AscendAttentionDCPMetadataBuilder``), every rank of a layout in one process
(``dcp_ranks.py``).

vllm-ascend tells each rank's FIA host lists split from the actual lengths (the target's
length plus the step, rejected tokens included): every eager decode step
(``num_computed_tokens_of_dcp[:, rank]``, FIA's FULL scope), every FULL graph replay step
(``build_fia_params_dcp``) and the draft prefill (history: ``cp_history_seq_len`` and the
prefill's chunked context; current: the pass's own tokens). Each rank must read exactly its
tokens of one window per request, through the rank's cropped table, and the ranks' partial
attention, combined by log-sum-exp, must equal dense attention over the window.
"""

import dataclasses

import numpy as np
import pytest
import torch
from vllm.config.compilation import CUDAGraphMode
from vllm.v1.attention.backends.utils import get_dcp_local_seq_lens

from testbed.dcp import assert_ranks_read_the_window
from tests.ascend.npu_testbed.dcp_ranks import (
    BLOCK,
    dcp_builders,  # noqa: F401 (a fixture)
    interleave_of,
    on_rank,
)
from tests.ascend.npu_testbed.eagle import (
    MAX_NUM_REQS,
    TARGET_LENS,
    W,
    at_step,
    build,
    draft_prefill_seen,
    full_graph_params,
    setup_decode,
)
from tests.ascend.npu_testbed.wiring import HEAD_SIZE, MAX_MODEL_LEN, NUM_KV_HEADS
from vllm_ascend.attention.context_parallel.attention_cp import DCPFIAParamProvider
from vllm_ascend.attention.context_parallel.common_cp import (
    CPKVScope,
    use_history_current_split_decode,
)

pytestmark = pytest.mark.usefixtures("registered", "dcp_builders")

N = len(TARGET_LENS)
# (cp, interleave, block size): sizes 2, 4, 8 with interleave 1 and block-sized, blocks of
# 16; blocks of 128 (vllm-ascend's usual) at sizes 2 and 4.
LAYOUTS = [(cp, i, 16) for cp in (2, 4, 8) for i in (1, BLOCK)] + [
    (2, 1, 128),
    (4, BLOCK, 128),
]


def eagle_rank(model_dir, monkeypatch, cp_size, rank, interleave, block, num_spec, **kwargs):
    on_rank(monkeypatch, cp_size, rank)
    d = setup_decode(model_dir, "eagle3", block, num_spec, cp=(cp_size, rank, interleave), **kwargs)
    builder = d.s.attn_groups[0][0].get_metadata_builder(0)
    assert type(builder).__name__ == "AscendAttentionDCPMetadataBuilder"
    assert (builder.dcp_size, builder.dcp_rank) == (cp_size, rank)
    assert d.s.dcp_manager.dcp_world_rank == rank
    assert d.s.draft_window.spec.alignment == cp_size * block  # a column of every rank
    return d


def fia_reads(md, rank: int) -> tuple[torch.Tensor, list[int]]:
    """What rank ``rank``'s FIA reads in a draft decode step: vllm-ascend's own parameter
    provider for the scope its DCP decode runs (one query token: no history/current split)."""
    assert not use_history_current_split_decode(md, is_draft_model=True, use_spec_decode=True)
    params = DCPFIAParamProvider("draft.0", rank, CPKVScope.FULL).resolve({"draft.0": md})
    return params["block_table"].clone(), list(params["actual_seq_lengths_kv"])


def actual_at(step: int) -> list[int]:
    return [min(t + step, MAX_MODEL_LEN) for t in TARGET_LENS]


def assert_device_shares_the_start(d, step: int, reads) -> None:
    """The draft's own (device) lengths, windowed from the start of the actual length."""
    for i, (actual, read) in enumerate(zip(actual_at(step), reads, strict=False)):
        own = min(TARGET_LENS[i] - int(d.rejected[i]) + step, MAX_MODEL_LEN)
        assert int(d.s.draft_window.seq_lens[i]) == own - (actual - read)


@pytest.mark.parametrize(("cp_size", "interleave", "block"), LAYOUTS)
def test_every_eager_decode_step_hands_each_rank_its_share_of_the_window(
    cp_size, interleave, block, model_dir, monkeypatch
):
    num_spec = 4
    interleave = interleave_of(interleave, block)
    steps: dict[int, list] = {}
    for rank in range(cp_size):
        d = eagle_rank(model_dir, monkeypatch, cp_size, rank, interleave, block, num_spec)
        for step in range(1, num_spec):
            at_step(d, step)
            md = build(d, step)
            assert md.decode.block_tables.data_ptr() == (
                d.s.draft_window.windows[0].block_table.data_ptr()
            )
            reads = md.decode.seq_lens_list[:N]
            assert_device_shares_the_start(d, step, reads)
            steps.setdefault(step, []).append((reads, *fia_reads(md, rank)))
            # vllm-ascend's `_generate_draft` updates the step's metadata once more after
            # the forward (with step 1): still inside the window.
            d.s._update_decode_attn_metadata({"draft.0": md}, 1, N)
            assert max(md.decode.seq_lens_list) <= d.s.draft_window.spec.max_read_len
    for step, ranks in steps.items():
        reads = ranks[0][0]
        assert all(r[0] == reads for r in ranks)  # one window per request on every rank
        assert_ranks_read_the_window(
            d.cache,
            actual_at(step),
            reads,
            [(table, local) for _, table, local in ranks],
            0,
            W,
            cp_size * block,
            d.k,
            d.v,
            block_ids=d.block_ids,
        )


@pytest.mark.parametrize(
    ("cp_size", "interleave", "block", "num_spec"),
    [
        (2, 1, 16, 3),
        (4, BLOCK, 16, 5),
        (8, 1, 16, 3),
        (2, BLOCK, 128, 5),
        (4, 1, 128, 3),
    ],
)
def test_every_full_graph_replay_step_hands_each_rank_its_share_of_the_window(
    cp_size, interleave, block, num_spec, model_dir, monkeypatch
):
    """A FULL ACL graph replay: vllm-ascend builds each step's metadata once and hands the
    graph every step's per-rank `actual_seq_lengths_kv` and block table
    (`build_fia_params_dcp`); each recorded step's build then refreshes the window's
    table. Each step's per-rank list must be the rank's share of that step's window."""
    interleave = interleave_of(interleave, block)
    padded = MAX_NUM_REQS
    steps: dict[int, list] = {}
    for rank in range(cp_size):
        d = eagle_rank(model_dir, monkeypatch, cp_size, rank, interleave, block, num_spec)
        window = d.s.draft_window
        metadatas, fia = full_graph_params(d, padded)
        for step, (params, per_step) in enumerate(zip(fia, metadatas, strict=True), start=1):
            assert params["layer_name"] == ("draft.0", CPKVScope.FULL)
            decode = per_step["draft.0"].decode
            local = params["actual_seq_lengths_kv"]
            # The graph's lists are the eager update's for the same step.
            assert local == decode.num_computed_tokens_of_dcp[:, rank].tolist()
            assert len(local) == padded and not any(local[N:])
            at_step(d, step)
            build(d, step, CUDAGraphMode.FULL, padded)  # the recorded build of this step
            table = params["block_table"]
            assert table.data_ptr() == window.windows[0].block_table.data_ptr()
            assert_device_shares_the_start(d, step, decode.seq_lens_list[:N])
            steps.setdefault(step, []).append((decode.seq_lens_list[:N], table.clone(), local))
    for step, ranks in steps.items():
        reads = ranks[0][0]
        assert all(r[0] == reads for r in ranks)
        assert_ranks_read_the_window(
            d.cache,
            actual_at(step),
            reads,
            [(table, local) for _, table, local in ranks],
            0,
            W,
            cp_size * block,
            d.k,
            d.v,
            block_ids=d.block_ids,
        )


def draft_prefill(d, monkeypatch, cp_size, rank, interleave, num_spec):
    """vllm-ascend's `_prefill` over the target's verify batch (the last request prefills a
    300-token chunk), its draft layers' metadata built by `AscendModelState.prepare_attn`;
    returns that metadata and what the draft builder got (its common metadata)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm.v1.worker.utils import AttentionGroup

    from vllm_ascend.attention.attention_v1 import AscendAttentionBackend, AscendAttentionState
    from vllm_ascend.worker.v2.input_batch import AscendInputBatch

    s, target = d.s, d.target
    query_lens = [min(num_spec + 1, t) for t in TARGET_LENS[:-1]] + [300]
    qsl = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    num_tokens = int(qsl[-1])
    tib = s.target_input_buffers
    dummy = AscendInputBatch.make_dummy(N, num_tokens, tib)  # before the buffers are written
    tib.seq_lens[:N] = tib.seq_lens_cpu[:N] = target
    tib.query_start_loc[: N + 1] = torch.from_numpy(qsl)
    # The target's DCP-local lengths: the rank's share of each whole context.
    tib.dcp_local_seq_lens[:N] = get_dcp_local_seq_lens(target, cp_size, rank, interleave)
    batch = dataclasses.replace(
        dummy,
        num_scheduled_tokens=np.array(query_lens, dtype=np.int32),
        query_start_loc_np=qsl,
        query_start_loc=tib.query_start_loc[: N + 1],
        seq_lens=tib.seq_lens[:N],
        seq_lens_np=tib.seq_lens_np[:N],
        seq_lens_cpu_upper_bound=target.clone(),
        dcp_local_seq_lens=tib.dcp_local_seq_lens[:N],
        is_prefilling_np=np.array([False] * (N - 1) + [True]),
        attn_state=AscendAttentionState.ChunkedPrefill,
    )
    spec = FullAttentionSpec(
        block_size=d.block_size, num_kv_heads=NUM_KV_HEADS, head_size=HEAD_SIZE, dtype=torch.float32
    )
    target_group = AttentionGroup(AscendAttentionBackend, ["target.0", "draft.0"], spec, 0)
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(s.vllm_config):
        target_group.create_metadata_builders(s.vllm_config, torch.device("cpu"))
    bt = s.block_tables
    target_metadata = s.model_state.prepare_attn(
        batch,
        CUDAGraphMode.NONE,
        (bt.input_block_tables[0][:N],),
        bt.slot_mappings[:, :num_tokens],
        [[target_group]],
        s.kv_cache_config,
    )
    builder = s.attn_groups[0][0].get_metadata_builder(0)
    got = []
    real_build = builder.build

    def build_spy(common_prefix_len, common_attn_metadata, *args, **kwargs):
        got.append(common_attn_metadata)
        return real_build(common_prefix_len, common_attn_metadata, *args, **kwargs)

    monkeypatch.setattr(builder, "build", build_spy)
    seen = draft_prefill_seen(s, batch, N, num_tokens, target_metadata)
    (common,) = got
    return seen["draft.0"], common, query_lens


@pytest.mark.parametrize(("cp_size", "interleave"), [(2, 1), (4, BLOCK), (8, 1), (8, BLOCK)])
def test_the_draft_prefill_hands_each_rank_its_share_of_the_window(
    cp_size, interleave, model_dir, monkeypatch
):
    """The draft prefill: the builders get the window's device DCP-local lengths (the
    rank's share of the windowed lengths, not of the target's context) and host lists split
    from the windowed host mirror. Each rank's history reads (the verify rows'
    `cp_history_seq_len`, the prefilling row's chunked context) are its tokens of the window
    before the pass's own tokens, which every rank attends to once, combined."""
    block, num_spec = 16, 3
    interleave = interleave_of(interleave, block)
    ranks = []
    for rank in range(cp_size):
        d = eagle_rank(
            model_dir, monkeypatch, cp_size, rank, interleave, block, num_spec, max_num_tokens=512
        )
        window = d.s.draft_window
        md, common, query_lens = draft_prefill(d, monkeypatch, cp_size, rank, interleave, num_spec)
        assert common.dcp_local_seq_lens.data_ptr() == window.dcp_local_seq_lens.data_ptr()
        share = get_dcp_local_seq_lens(window.seq_lens[:N], cp_size, rank, interleave)
        assert torch.equal(common.dcp_local_seq_lens[:N], share)
        assert torch.equal(common.dcp_local_seq_lens_cpu[:N], share)
        reads = md.seq_lens_list[:N]
        assert reads == window.seq_lens[:N].tolist()  # host and device: one start
        assert use_history_current_split_decode(
            md, is_draft_model=True, is_draft_model_prefill=True
        )
        num_decodes = md.num_decodes
        assert num_decodes == N - 1
        history = list(md.decode.cp_history_seq_len[:num_decodes])
        table = [md.decode.block_tables[:num_decodes]]
        chunked = md.prefill.chunked_context
        if chunked is None:
            history.append(0)
        else:
            local = chunked.local_context_lens.tolist()
            # The host lists FIA takes (cumulative) are the device's cache-load lengths.
            assert np.diff([0, *chunked.actual_seq_lengths_kv]).tolist() == local
            history += local
        table.append(md.prefill.block_tables)
        ranks.append((reads, torch.cat(table).clone(), history))
    reads = ranks[0][0]
    assert all(r[0] == reads for r in ranks)
    assert_ranks_read_the_window(
        d.cache,
        TARGET_LENS,
        reads,
        [(table, local) for _, table, local in ranks],
        0,
        [max(W, q) for q in query_lens],
        cp_size * block,
        d.k,
        d.v,
        num_queries=query_lens,
        new_tokens=query_lens,
        block_ids=d.block_ids,
    )
