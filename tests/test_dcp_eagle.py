# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""EAGLE3 under decode context parallelism on vLLM 0.33, through the real speculator and
vLLM's flash attention builder (DCP-sharded draft cache, interleave 1 as vLLM requires for
speculative decoding), per rank: the draft prefill and every decode step hand each rank's
kernel its share of the window's context, and the ranks' partial attention plus the step's
own tokens, combined by log-sum-exp, equal dense attention over exactly the window.

Flash attention under DCP attends to a pass's context over each rank's cached share
(``dcp_context_kv_lens``) and to the pass's own tokens from their K/V, then combines both;
the reference does the same from what the builders hand it.
"""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
from vllm.v1.attention.backends.utils import get_dcp_local_seq_lens

from testbed.dcp import (
    B,
    assert_ranks_read_the_window,
    dcp_group,
    reference_caches,
)
from testbed.reference import (
    unified_attention_read,
)
from testbed.speculators import (
    GroupLayout,
    make_vllm_config,
)
from tests.cpu_testbed.eagle import (
    MAX_MODEL_LEN,
    MAX_NUM_REQS,
    W,
    run_decode,
    run_prefill,
    setup_eagle,
)

pytestmark = pytest.mark.usefixtures("window_hooks")

NUM_SPEC = 4
CHUNK = 300  # a prompt chunk longer than the window, prefilling beside the verify chunks


def eagle_rank(model_dir, monkeypatch, cp_size: int, rank: int, sinks: int = 0):
    dcp_group(monkeypatch, cp_size, rank)
    additional = {"draft_window_size": W}
    if sinks:
        additional["draft_attention_sinks"] = sinks
    config = make_vllm_config(model_dir, MAX_MODEL_LEN, MAX_NUM_REQS, additional)
    config.parallel_config.decode_context_parallel_size = cp_size
    layouts = [GroupLayout(16, backend=FlashAttentionBackend)]
    return setup_eagle(
        model_dir,
        monkeypatch,
        NUM_SPEC,
        layouts,
        seed=2,
        prefill_chunk=CHUNK,
        sinks=sinks,
        vllm_config=config,
        cp=(cp_size, rank, 1),
    )


def caches_of(e, cp_size):
    return reference_caches(cp_size, 1, e.batch.req_block_ids[0], e.k, e.v)


@pytest.mark.parametrize("cp_size", [2, 4, 8])
@pytest.mark.parametrize("sinks", [0, 20])
def test_draft_prefill_and_every_decode_step_read_each_ranks_share(
    cp_size, sinks, model_dir, monkeypatch
):
    ranks = []
    for rank in range(cp_size):
        e = eagle_rank(model_dir, monkeypatch, cp_size, rank, sinks)
        builder = e.wired.attn_groups[0][0].metadata_builders[0]
        assert (builder.dcp_world_size, builder.dcp_rank) == (cp_size, rank)
        # vLLM's flash attention updates no draft metadata in place under DCP: every step
        # is rebuilt (and windowed) by its own build.
        assert not builder.supports_draft_decode_metadata_update
        md = run_prefill(e)["draft.0"]
        # Copies: the builder's and the window's buffers are persistent, and the decode
        # steps below write them again.
        prefill = SimpleNamespace(
            seq_lens=md.seq_lens.clone(),
            block_table=md.block_table.clone(),
            dcp_context_kv_lens=md.dcp_context_kv_lens.clone(),
        )
        cam = e.wired.received[0][-1]
        window = e.s.draft_window
        n = e.batch.num_reqs
        # The prefill's DCP-local lengths are the rank's share of the window, not of the
        # target's context (vLLM's own split of the windowed lengths).
        assert cam.dcp_local_seq_lens.data_ptr() == window.dcp_local_seq_lens.data_ptr()
        share = get_dcp_local_seq_lens(prefill.seq_lens[:n], cp_size, rank, 1)
        assert torch.equal(cam.dcp_local_seq_lens[:n], share)
        steps = run_decode(e, monkeypatch, fused=False)
        assert len(steps) == NUM_SPEC - 1
        ranks.append((e, prefill, steps))
    e0 = ranks[0][0]
    spec = e0.s.draft_window.spec
    assert spec.alignment == cp_size * B
    caches = caches_of(e0, cp_size)
    n = e0.batch.num_reqs

    # The draft prefill: each row's query chunk over the window's context and itself.
    lengths = e0.batch.seq_lens.tolist()
    query_lens = e0.batch.query_lens
    reads = ranks[0][1].seq_lens[:n]
    rank_reads = {
        r: (prefill.block_table, prefill.dcp_context_kv_lens)
        for r, (_, prefill, _) in enumerate(ranks)
    }
    for _, prefill, _ in ranks:
        assert torch.equal(prefill.seq_lens[:n], reads)
    assert_ranks_read_the_window(
        caches,
        lengths,
        reads,
        rank_reads,
        spec.sink_size,
        [max(W, q) for q in query_lens],
        spec.alignment,
        e0.k,
        e0.v,
        num_queries=query_lens,
        new_tokens=query_lens,
    )

    # Every decode step: one query token per request over the window's context and itself.
    for s in range(NUM_SPEC - 1):
        lengths = [int(x) for x in ranks[0][2][s]["lengths"]]
        reads = ranks[0][2][s]["draft.0"][0][:n]
        rank_reads = {
            r: (steps[s]["draft.0"][1], steps[s]["dcp"]["draft.0"])
            for r, (_, _, steps) in enumerate(ranks)
        }
        assert_ranks_read_the_window(
            caches,
            lengths,
            reads,
            rank_reads,
            spec.sink_size,
            W,
            spec.alignment,
            e0.k,
            e0.v,
            new_tokens=[1] * n,
        )


def test_vllms_paged_kernel_reads_each_ranks_share_as_the_reference(model_dir, monkeypatch):
    """The first decode step's context reads of every rank through vLLM's own Triton paged
    attention kernel (on the rank's cache, its cropped table, its local lengths) equal the
    reference's partial reads."""
    cp_size = 2
    for rank in range(cp_size):
        e = eagle_rank(model_dir, monkeypatch, cp_size, rank)
        run_prefill(e)
        step = run_decode(e, monkeypatch, fused=False)[0]
        caches = caches_of(e, cp_size)
        n = e.batch.num_reqs
        table, local = step["draft.0"][1], step["dcp"]["draft.0"]
        lengths = [int(x) for x in step["lengths"]]
        queries = [e.k[i][length - 1 : length] * 0.5 for i, length in enumerate(lengths)]
        rows = [i for i in range(n) if int(local[i]) > 0]
        # The reference first: it checks the inputs stay inside the rank's table and cache,
        # which the interpreted kernel would not (it would read stray memory).
        wants = []
        for i in rows:
            want, _, pos = caches.read(
                rank, table[i], int(local[i]), queries[i], torch.tensor([lengths[i] - 1])
            )
            assert int(pos.max()) < lengths[i] - 1  # the context: before the step's token
            wants.append(want)
        cache = _rank_cache(caches, rank)
        got = unified_attention_read(cache, [queries[i] for i in rows], table[rows], local[rows])
        for out, want in zip(got, wants, strict=True):
            torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=1e-4)


class _rank_cache:
    """One rank's slice of the reference caches, shaped as ``unified_attention_read``
    takes a paged cache."""

    def __init__(self, caches, rank: int) -> None:
        self.block_size = caches.unit
        self.k, self.v = caches.k[rank], caches.v[rank]


def test_no_rank_reads_the_same_position_twice_and_together_they_read_all(model_dir, monkeypatch):
    """The ranks' shares of a decode step partition the window's context."""
    cp_size = 4
    shares = []
    for rank in range(cp_size):
        e = eagle_rank(model_dir, monkeypatch, cp_size, rank)
        run_prefill(e)
        step = run_decode(e, monkeypatch, fused=False)[0]
        shares.append((e, step))
    caches = caches_of(shares[0][0], cp_size)
    n = shares[0][0].batch.num_reqs
    q = torch.zeros(1, *shares[0][0].k[0].shape[1:], dtype=torch.float64)
    for i in range(n):
        read = []
        for rank, (_, step) in enumerate(shares):
            table, local = step["draft.0"][1], step["dcp"]["draft.0"]
            _, _, pos = caches.read(rank, table[i], int(local[i]), q, torch.tensor([1 << 30]))
            read += pos.tolist()
        length = int(shares[0][1]["lengths"][i])
        windowed = int(shares[0][1]["draft.0"][0][i])
        assert len(read) == len(set(read)) == windowed - 1
        assert max(read, default=-1) == length - 2
        assert np.all(np.diff(sorted(read)) >= 1)


@pytest.mark.parametrize("cp_size", [2, 4])
def test_a_full_decode_graph_replays_each_ranks_share_of_every_step(
    cp_size, model_dir, monkeypatch
):
    """FULL_DECODE_ONLY per rank: flash attention updates nothing in place under DCP, so vLLM
    captures one decode step and rebuilds each step's metadata (through the window) into the
    buffers the graph recorded before replaying it. What the replays read is each rank's
    share of every step's window."""
    contexts = [2, 60, 64, 130, 200, 700]
    ranks = []
    for rank in range(cp_size):
        dcp_group(monkeypatch, cp_size, rank)
        config = make_vllm_config(model_dir, MAX_MODEL_LEN, MAX_NUM_REQS, {"draft_window_size": W})
        config.parallel_config.decode_context_parallel_size = cp_size
        layouts = [GroupLayout(16, backend=FlashAttentionBackend)]
        e = setup_eagle(
            model_dir,
            monkeypatch,
            NUM_SPEC,
            layouts,
            contexts=contexts,
            seed=5,
            vllm_config=config,
            cp=(cp_size, rank, 1),
        )
        ranks.append((e, replay_full_decode(e, monkeypatch)))
    e0 = ranks[0][0]
    caches = caches_of(e0, cp_size)
    n, spec = e0.batch.num_reqs, e0.s.draft_window.spec
    for s in range(NUM_SPEC - 1):
        record = ranks[0][1][s]
        lengths = [int(x) for x in record["lengths"]]
        rank_reads = {r: (steps[s]["table"], steps[s]["dcp"]) for r, (_, steps) in enumerate(ranks)}
        assert_ranks_read_the_window(
            caches,
            lengths,
            record["reads"],
            rank_reads,
            spec.sink_size,
            W,
            spec.alignment,
            e0.k,
            e0.v,
            new_tokens=[1] * n,
        )


def replay_full_decode(e, monkeypatch) -> list[dict]:
    """Capture the decode graph (vLLM's managers and ``CudaGraphManager.capture``, the device
    boundary stood in by ``tests.cpu_testbed.graphs``), then replay one propose's decode
    steps; returns what the draft layers read at each replay."""
    from vllm.config.compilation import CUDAGraphMode

    from testbed.buffers import (
        fill_input_block_tables,
    )
    from tests.cpu_testbed import graphs
    from tests.cpu_testbed.eagle import DRAFT_STEP, prepare_decode, update_inputs
    from tests.cpu_testbed.graphs import cuda_graphs_on_cpu

    s, n = e.s, e.batch.num_reqs
    assert not s.supports_decode_metadata_update
    cuda_graphs_on_cpu(monkeypatch)
    compilation = s.vllm_config.compilation_config
    graphs.set_capture_sizes(monkeypatch, compilation, (MAX_NUM_REQS,), (1,))
    speculative = SimpleNamespace(
        num_speculative_tokens=NUM_SPEC,
        uses_dynamic_speculative_decoding=lambda: False,
        method="eagle3",
        use_multi_module_mtp=lambda: False,
    )
    s.speculative_config = speculative
    monkeypatch.setattr(s.vllm_config, "speculative_config", speculative)
    s.init_cudagraph_manager(CUDAGraphMode.FULL_DECODE_ONLY)
    steps = []

    def generate_draft(num_reqs, num_tokens_padded, attn_metadata, *args, **kwargs):
        if graphs.replaying() is not None:
            md = attn_metadata["draft.0"]
            steps.append(
                {
                    "lengths": s.input_buffers.seq_lens[:n].clone(),
                    "reads": md.seq_lens[:n].clone(),
                    "table": md.block_table.clone(),
                    "dcp": md.dcp_context_kv_lens.clone(),
                }
            )
        update_inputs(e, NUM_SPEC)

    setattr(s, DRAFT_STEP, generate_draft)
    s.capture()
    # vLLM 0.34 captures its own grid of request counts for draft decodes: the one of
    # MAX_NUM_REQS, as configured on 0.33.
    (desc,) = [d for d in s.decode_cudagraph_manager.graphs if d.num_reqs == MAX_NUM_REQS]
    fill_input_block_tables(e.batch)
    s.idx_mapping[:n] = torch.from_numpy(e.batch.idx_mapping)
    s.idx_mapping[n:] = -1
    prepare_decode(e)
    s._multi_step_decode(n, False, desc, None, e.input_batch.seq_lens_cpu_upper_bound, NUM_SPEC)
    assert len(steps) == NUM_SPEC - 1
    return steps
