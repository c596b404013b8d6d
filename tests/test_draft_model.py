# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Draft models (method ``draft_model``, vLLM's ``StandaloneARSpeculator``): a separate
small LM with a KV cache of its own, started as a server starts it (``startup.py``: its own
``__init__``, ``set_attn`` through the window's hook, ``init_cudagraph_manager`` and
``capture``, eager here), then a target verify step and its own ``propose``: a
prefill over the target's batch and one correction token per request, built through
``_build_attn_metadata`` with its own slot mappings, then a decode step per further draft
token through ``_build_uniform_attn_metadata`` (on vLLM 0.34 built once, then updated in
place at each step). Every attention launch it makes must read exactly its window, against
dense attention over the window and vLLM's Triton kernel, and its KV writes must stay where
they are without the window."""

import pytest
import torch
from vllm.config.compilation import CUDAGraphMode
from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

from testbed.reference import (
    assert_kernel_reads,
    dense_attention,
    positions_read,
)
from testbed.vllm_line import RELEASE
from tests.cpu_testbed import graphs
from tests.cpu_testbed.backends import wire_mla
from tests.cpu_testbed.startup import (
    BLOCK,
    assert_launch_reads,
    capture,
    draft_model_decode_paths,
    draft_model_is_autoregressive,
    propose,
    started,
    verify_step,
)

pytestmark = pytest.mark.usefixtures("window_hooks")
BUILD_PATH = DraftModelSpeculator._build_attn_metadata.__qualname__

NUM_SPEC = 4
W = 64
# Target lengths after the verify step (its query included), around the window and block
# edges, and long contexts.
TARGET_LENS = [40, 79, 80, 81, 300, 900]
SETTINGS = {
    "window": {"draft_window_size": W},
    "sinks": {"draft_window_size": W, "draft_attention_sinks": 16},
    "threshold": {"draft_window_size": W, "draft_window_min_context": 200},
}


def run(
    drafts, additional, monkeypatch, target_lens=TARGET_LENS, prompt_chunks=None, **started_with
):
    """The draft model started, a verify step, and its propose: (started, verified)."""
    st = started(
        drafts, "draft_model", NUM_SPEC, CUDAGraphMode.NONE, additional, monkeypatch, **started_with
    )
    capture(st.s, CUDAGraphMode.NONE)
    t = verify_step(st, target_lens, prompt_chunks=prompt_chunks)
    propose(st.s, t)
    return st, t


def expected_reads(t) -> list[tuple[list[int], list[int]]]:
    """Per launch, each request's (end, query tokens): the prefill reads to one past the
    verified tokens (its query and the correction token), decode step s one more per step
    from the accepted length."""
    query = torch.diff(torch.from_numpy(t.input_batch.query_start_loc_np)).tolist()
    prefill = ([e + 1 for e in t.target_lens], [q + 1 for q in query])
    rejected = t.rejected.tolist()
    steps = [
        ([e - r + 1 + s for e, r in zip(t.target_lens, rejected, strict=True)], [1] * len(query))
        for s in range(1, NUM_SPEC)
    ]
    return [prefill, *steps]


def assert_launches_read_their_windows(st, t, spec) -> None:
    launches = st.model.launches
    reads = expected_reads(t)
    assert len(launches) == len(reads) == NUM_SPEC
    for launch, (ends, queries) in zip(launches, reads, strict=True):
        assert_launch_reads(t, launch, ends, queries, spec)


@pytest.mark.parametrize("setting", SETTINGS)
def test_prefill_and_every_decode_step_read_exactly_the_window(setting, drafts, monkeypatch):
    st, t = run(drafts, SETTINGS[setting], monkeypatch)
    window = st.s.draft_window
    assert window is not None
    assert_launches_read_their_windows(st, t, window.spec)
    # Every path went through the path check: the prefill (its own slot mappings, the wider
    # tables) and the decode steps (on vLLM 0.34 their in-place updates too).
    assert {path for path, _, _ in window.path_check.checked} == {
        (f"{BUILD_PATH} (over query chunks)",),
        *draft_model_decode_paths(),
    }


def test_without_the_window_every_launch_reads_the_whole_context(drafts, monkeypatch):
    st, t = run(drafts, {}, monkeypatch)
    assert st.s.draft_window is None
    assert_launches_read_their_windows(st, t, None)


@pytest.mark.parametrize(
    "mode",
    [CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.FULL, CUDAGraphMode.FULL_AND_PIECEWISE],
    ids=str,
)
def test_with_graphs_on_every_launch_of_a_propose_reads_exactly_the_window(
    mode, drafts, monkeypatch
):
    """Started with graphs on and captured as a server does (vLLM 0.34 captures a draft
    model's decode steps, and its prefill without FULL graphs under the window; 0.33 runs it
    eagerly): every launch of the propose after the capture, replayed or not, reads exactly
    its window. On 0.34 the 7 requests replay the decode graph captured for 8."""
    graphs.cuda_graphs_on_cpu(monkeypatch)
    st = started(drafts, "draft_model", NUM_SPEC, mode, SETTINGS["sinks"], monkeypatch)
    capture(st.s, mode)
    num_captured = len(st.model.launches)
    t = verify_step(st, [40, 64, 79, 80, 81, 300, 900])
    propose(st.s, t)
    launches = st.model.launches[num_captured:]
    reads = expected_reads(t)
    assert len(launches) == len(reads) == NUM_SPEC
    replayed = [launch.replayed_in is not None for launch in launches]
    assert replayed == [False] + [draft_model_is_autoregressive()] * (NUM_SPEC - 1)
    for launch, (ends, queries) in zip(launches, reads, strict=True):
        assert_launch_reads(t, launch, ends, queries, st.s.draft_window.spec)


def test_a_prompt_chunk_longer_than_the_window_is_kept_whole(drafts, monkeypatch):
    """A request prefilling 150 prompt tokens: its draft prefill's queries reach back past
    the window, and each must read at least itself, through the wider tables."""
    st, t = run(drafts, SETTINGS["window"], monkeypatch, prompt_chunks={5: 150})
    window = st.s.draft_window
    assert_launches_read_their_windows(st, t, window.spec)
    prefill = st.model.launches[0]
    (ends, queries) = expected_reads(t)[0]
    start, _ = positions_read(ends[5], int(prefill.seq_lens[5]))
    assert start <= ends[5] - queries[5] < start + window.spec.alignment
    # The kernel's launch bound covers the longest read (the whole chunk and its window).
    assert prefill.max_seq_len >= int(prefill.seq_lens.max()) > window.spec.max_read_len
    # The launch read the chunk tables, which the decode steps after it do not.
    assert prefill.table_ptr == window.chunk_windows[0].block_table.data_ptr()
    assert st.model.launches[1].table_ptr == window.windows[0].block_table.data_ptr()


def test_vllms_triton_kernel_reads_the_window_of_the_prefill(drafts, monkeypatch):
    """The prefill launch's lengths and table, through vLLM's Triton ``unified_attention``
    (interpreted), equal dense attention over the sinks and the window of every request."""
    additional = SETTINGS["sinks"]
    st, t = run(drafts, additional, monkeypatch, prompt_chunks={5: 150})
    spec = st.s.draft_window.spec
    prefill = st.model.launches[0]
    ends, queries = expected_reads(t)[0]
    qs, expected = [], []
    for i, (end, q) in enumerate(zip(ends, queries, strict=True)):
        start, _ = positions_read(end, int(prefill.seq_lens[i]), spec.sink_size)
        query = t.k[i][end - q : end] * 0.5
        qs.append(query.float())
        expected.append(dense_attention(query, t.k[i], t.v[i], start, end, spec.sink_size))
    assert_kernel_reads(t.cache, qs, prefill.table, prefill.seq_lens, expected)


def test_the_draft_writes_its_kv_where_it_would_without_the_window(drafts, monkeypatch):
    """The prefill's own slot mappings and the last decode step's are vLLM's, identical with
    and without the window, and each is the query token's absolute slot."""
    written = []
    for additional in (SETTINGS["window"], {}):
        st, t = run(drafts, additional, monkeypatch, prompt_chunks={5: 150})
        s = st.s
        total = t.input_batch.num_tokens + len(TARGET_LENS)
        written.append(
            (s.expanded_slot_mappings[0, :total].clone(), s.expanded_positions[:total].clone())
        )
    (windowed, positions), (plain, _) = written
    assert torch.equal(windowed, plain)
    qsl = t.input_batch.query_start_loc_np
    for i, ids in enumerate(t.block_ids):
        rows = slice(int(qsl[i]) + i, int(qsl[i + 1]) + i + 1)
        truth = [ids[int(p) // BLOCK] * BLOCK + int(p) % BLOCK for p in positions[rows]]
        assert windowed[rows].tolist() == truth


def test_a_draft_model_on_an_mla_backend_is_refused_by_name(mla_dir, monkeypatch):
    """An MLA backend served for DFlash, refused for a draft model with the reason."""
    from vllm.v1.attention.backends.mla.triton_mla import TritonMLABackend

    with pytest.raises(ValueError) as error:
        wire_mla(mla_dir, "draft_model", TritonMLABackend, monkeypatch)
    message = str(error.value)
    assert message.startswith(
        f"draft_window_size=64 is not supported on {RELEASE.name} for draft_model with group 0 "
    )
    assert "on attention backend TritonMLABackend: vLLM's draft-model prefill hands" in message
    assert "(supported for draft_model on this release: FlashAttentionBackend, " in message


@pytest.mark.parametrize("cp_size", [2, 4])
def test_under_dcp_every_rank_reads_its_share_of_each_window(cp_size, drafts, monkeypatch):
    """Decode context parallelism on flash attention (which vLLM runs under DCP), every rank
    in one process: each rank's prefill and decode steps read exactly its tokens of the
    window (and its sinks), and the ranks' partial attention, combined by log-sum-exp with
    the step's own tokens, equals dense attention over the window."""
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

    from testbed.dcp import assert_ranks_read_the_window, reference_caches

    ranks = []
    for rank in range(cp_size):
        st, t = run(
            drafts,
            SETTINGS["sinks"],
            monkeypatch,
            prompt_chunks={5: 150},
            backend=FlashAttentionBackend,
            cp=(cp_size, rank),
        )
        assert st.s.block_tables.cp_rank == rank
        ranks.append((st, t))
    st0, t0 = ranks[0]
    spec = st0.s.draft_window.spec
    assert spec.alignment == cp_size * BLOCK
    caches = reference_caches(cp_size, 1, t0.batch.req_block_ids[0], t0.k, t0.v)
    n = len(TARGET_LENS)
    for i, (ends, queries) in enumerate(expected_reads(t0)):
        launches = [st.model.launches[i] for st, _ in ranks]
        reads = launches[0].seq_lens[:n]
        # One window per request: every rank is told the same global windowed length.
        assert all(launch.seq_lens[:n].tolist() == reads.tolist() for launch in launches)
        assert_ranks_read_the_window(
            caches,
            ends,
            reads,
            {r: (launch.table, launch.dcp_context_kv_lens) for r, launch in enumerate(launches)},
            spec.sink_size,
            [max(W, q) for q in queries],
            spec.alignment,
            t0.k,
            t0.v,
            num_queries=queries,
            new_tokens=queries,
        )


def test_a_draft_model_says_its_window_once_at_start_up_and_once_at_its_first_build(
    drafts, monkeypatch, window_log
):
    run(drafts, SETTINGS["sinks"], monkeypatch)
    assert window_log == [
        (
            "info",
            "Draft KV window on for draft_model: draft_window_size=64 with the first 16 tokens "
            "as attention sinks, the draft reads at most 95 tokens per request (a draft "
            "prefill chunk longer than the window: the chunk and at most 31 more); block sizes "
            "per KV-cache group {0: 16}, alignment 16.",
        ),
        ("info", "Draft KV window active: the first draft metadata build is windowed."),
    ]
