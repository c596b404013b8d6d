# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""DFlash and DSpark under decode context parallelism (DCP) on the Ascend pairing:
vllm-ascend 0.30.0rc2's own speculators through its DCP metadata builders, GQA
(``AscendAttentionDCPMetadataBuilder``, FIA) and MLA (``AscendMlaDCPMetadataBuilder``),
at the per-propose build and the ACL graph replay build, every rank of a layout in one
process (``dcp_ranks.py``).

Under DCP vllm-ascend hands each rank's kernel a host list split from a actual length: the
host bound plus the query stretch (DFlash), or the target's host length plus the draft
width from its DCP manager (DSpark), both counting the rejected tokens the draft's device
length does not. The window's start comes from that actual length on host and device, so
each rank reads exactly its tokens of one window per request through its cropped table,
and the ranks' partial attention (non-causal: the queries see the whole window), combined
by log-sum-exp, equals attention over exactly the window.
"""

import pytest
import torch
from vllm.v1.attention.backends.utils import PAD_SLOT_ID

from testbed.dcp import (
    assert_ranks_read_the_window,
    local_position,
    owner,
    reference_caches,
    true_kv,
)
from tests.ascend.npu_testbed.dcp_ranks import (
    BLOCK,
    dcp_builders,  # noqa: F401 (a fixture)
    interleave_of,
    on_rank,
)
from tests.ascend.npu_testbed.dflash import EAGER, MAX_NUM_REQS, REPLAY, SEQ_LENS, W
from tests.ascend.npu_testbed.wiring import (
    HEAD_SIZE,
    NUM_KV_HEADS,
    Q,
    fill,
    make_batch,
    speculator,
    vllm_config,
    with_dcp,
)
from vllm_ascend.attention.attention_v1 import AscendAttentionBackend
from vllm_ascend.attention.context_parallel.attention_cp import DCPFIAParamProvider
from vllm_ascend.attention.context_parallel.common_cp import (
    CPKVScope,
    use_history_current_split_decode,
)
from vllm_ascend.attention.mla_v1 import AscendMLABackend

pytestmark = pytest.mark.usefixtures("registered", "dcp_builders")

N = len(SEQ_LENS)
BACKENDS = {"GQA": AscendAttentionBackend, "MLA": AscendMLABackend}
BUILDERS = {"GQA": "AscendAttentionDCPMetadataBuilder", "MLA": "AscendMlaDCPMetadataBuilder"}
# (method, attention, block size, cp, interleave, builds): sizes 2, 4 and 8, interleave 1
# and block-sized; MLA in blocks of 128 (vllm-ascend's), GQA in blocks of 16 and 128; eight
# ranks at one build each (the slowest to run).
BOTH = (EAGER, REPLAY)
LAYOUTS = [
    ("dflash", "MLA", 128, 2, 1, BOTH),
    ("dflash", "MLA", 128, 4, BLOCK, BOTH),
    ("dflash", "MLA", 128, 8, 1, (EAGER,)),
    ("dspark", "MLA", 128, 2, BLOCK, BOTH),
    ("dspark", "MLA", 128, 4, 1, BOTH),
    ("dspark", "GQA", 16, 2, 1, BOTH),
    ("dspark", "GQA", 16, 4, BLOCK, BOTH),
    ("dspark", "GQA", 128, 8, BLOCK, (REPLAY,)),
    ("dflash", "GQA", 16, 8, 1, (EAGER,)),
    ("dflash", "GQA", 128, 2, BLOCK, BOTH),
]
CASES = [
    pytest.param(*layout, build, id="-".join(map(str, layout)) + f"-{build.__name__}")
    for *layout, builds in LAYOUTS
    for build in builds
]


def rejected_of(seq_lens) -> torch.Tensor:
    return torch.tensor(
        [min(i % Q, length - Q) for i, length in enumerate(seq_lens)], dtype=torch.int32
    )


def draft_rank(
    model_dir,
    mla_model_dir,
    monkeypatch,
    method,
    attention,
    block,
    cp_size,
    rank,
    interleave,
    sinks=0,
):
    """One rank's speculator after a target verify step: the actual lengths (the batch's
    lengths) count rejected tokens, the draft's device lengths do not."""
    on_rank(monkeypatch, cp_size, rank)
    cp = (cp_size, rank, interleave)
    additional = {"draft_window_size": W, **({"draft_attention_sinks": sinks} if sinks else {})}
    config = vllm_config(mla_model_dir if attention == "MLA" else model_dir, method, additional)
    s = speculator(
        with_dcp(config, cp_size, interleave),
        method,
        block,
        MAX_NUM_REQS,
        backend=BACKENDS[attention],
        cp=cp,
    )
    builder = s.attn_groups[0][0].get_metadata_builder(0)
    assert type(builder).__name__ == BUILDERS[attention]
    assert (builder.dcp_size, builder.dcp_rank) == (cp_size, rank)
    window = s.draft_window
    assert window.actual is not None and window.actual.from_bound
    assert window.spec.alignment == cp_size * block  # a column of every rank
    batch = make_batch(SEQ_LENS, block, MAX_NUM_REQS, cp_size=cp_size)
    fill(s, batch, cp=cp)
    assert_query_writes_follow_the_layout(s, batch, cp)
    actual = torch.tensor(batch.seq_lens, dtype=torch.int32)
    s.target_input_buffers.seq_lens[:N] = actual - Q
    s.target_input_buffers.seq_lens_cpu[:N] = actual - Q  # what DSpark's DCP manager reads
    s.input_buffers.seq_lens[:N] = actual - rejected_of(batch.seq_lens)
    return s, batch


def assert_query_writes_follow_the_layout(s, batch, cp) -> None:
    """vllm-ascend's own input prep writes each query token's KV to its owner's local slot
    (PAD on the other ranks): where the reference caches put it."""
    cp_size, rank, interleave = cp
    b = batch.block_size
    for i, length in enumerate(batch.seq_lens):
        p = torch.arange(length - Q, length)
        slots = s.block_tables.slot_mappings[0][i * Q : (i + 1) * Q].long()
        mine = owner(p, cp_size, interleave) == rank
        local = local_position(p, cp_size, interleave, b)
        ids = torch.tensor(batch.block_ids[i])[local // b]
        assert torch.equal(slots[mine], (ids * b + local % b)[mine])
        assert (slots[~mine] == PAD_SLOT_ID).all()


def kernel_reads(md, attention: str, rank: int) -> tuple[torch.Tensor, list[int]]:
    """What the rank's kernel reads: MLA's decode `cp_seq_len` over its block table; FIA's
    FULL-scope parameters from vllm-ascend's own provider. Non-causal queries: no
    history/current split."""
    assert not md.causal
    assert not use_history_current_split_decode(md, is_draft_model=True, use_spec_decode=True)
    if attention == "MLA":
        return md.decode.block_table.clone(), list(md.decode.cp_seq_len)
    params = DCPFIAParamProvider("draft.0", rank, CPKVScope.FULL).resolve({"draft.0": md})
    return params["block_table"].clone(), list(params["actual_seq_lengths_kv"])


@pytest.mark.parametrize(("method", "attention", "block", "cp_size", "interleave", "build"), CASES)
def test_each_rank_reads_its_share_of_the_window_of_the_actual_length(
    method, attention, block, cp_size, interleave, build, model_dir, mla_model_dir, monkeypatch
):
    assert_each_rank_reads_its_share(
        method, attention, block, cp_size, interleave, build, model_dir, mla_model_dir, monkeypatch
    )


SINK_LAYOUTS = [("dflash", "MLA", 128, 2, 1), ("dspark", "GQA", 16, 4, BLOCK)]


@pytest.mark.parametrize(("method", "attention", "block", "cp_size", "interleave"), SINK_LAYOUTS)
def test_attention_sinks_under_dcp_are_whole_columns_of_every_rank(
    method, attention, block, cp_size, interleave, model_dir, mla_model_dir, monkeypatch
):
    """Sinks (20 tokens, rounded up to a column of every rank) stay exact under DCP: each rank
    reads its share of the sinks and of the window, from its cropped table."""
    assert_each_rank_reads_its_share(
        method,
        attention,
        block,
        cp_size,
        interleave,
        EAGER,
        model_dir,
        mla_model_dir,
        monkeypatch,
        sinks=20,
    )


def assert_each_rank_reads_its_share(
    method,
    attention,
    block,
    cp_size,
    interleave,
    build,
    model_dir,
    mla_model_dir,
    monkeypatch,
    sinks=0,
):
    interleave = interleave_of(interleave, block)
    ranks = []
    for rank in range(cp_size):
        s, batch = draft_rank(
            model_dir,
            mla_model_dir,
            monkeypatch,
            method,
            attention,
            block,
            cp_size,
            rank,
            interleave,
            sinks,
        )
        assert s.draft_window.spec.sink_size == (cp_size * block if sinks else 0)
        md = build(s)
        window = s.draft_window
        table = md.decode.block_table if attention == "MLA" else md.decode.block_tables
        assert table.data_ptr() == window.windows[0].block_table.data_ptr()
        assert window.path_check.num_checks >= 1
        # The actual lengths windowed on the device, the start of every read below. MLA
        # keeps the host's as its decode lengths (GQA keeps the draft's own there, which its
        # DCP decode does not read).
        reads = window.actual_windowed[:N].tolist()
        if attention == "MLA":
            assert md.decode.seq_lens_list[:N] == reads
        # The draft's device lengths share the actual length's start.
        device = torch.tensor(batch.seq_lens) - rejected_of(batch.seq_lens)
        for i, length in enumerate(batch.seq_lens):
            assert int(window.seq_lens[i]) == int(device[i]) - (length - reads[i])
        ranks.append((reads, *kernel_reads(md, attention, rank)))
    reads = ranks[0][0]
    assert all(r[0] == reads for r in ranks)  # one window per request on every rank
    k, v = true_kv(SEQ_LENS, heads=NUM_KV_HEADS, dim=HEAD_SIZE)
    caches = reference_caches(cp_size, interleave, batch.block_ids, k, v, block_size=block)
    assert_ranks_read_the_window(
        caches,
        SEQ_LENS,
        reads,
        [(table, local) for _, table, local in ranks],
        s.draft_window.spec.sink_size,
        W,
        cp_size * block,
        k,
        v,
        num_queries=Q,
        causal=False,
        block_ids=batch.block_ids,
    )
