# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""DFlash and DSpark MLA drafts under decode context parallelism on vLLM 0.33, through the
real speculators and vLLM's FlashAttention MLA builder (varlen under DCP with interleave
1, so their query passes stay on the decode path, which reads the DCP-local lengths), per
rank, eager and through a FULL graph; and the refusals by name of what DCP does not serve.
"""

import numpy as np
import pytest
import torch
import vllm.distributed.parallel_state as parallel_state
import vllm.v1.attention.backends.fa_utils as fa_utils
from vllm.config.compilation import CUDAGraphMode
from vllm.v1.attention.backends.mla.triton_mla import TritonMLABackend
from vllm.v1.attention.ops.dcp import MLADCPManager

from testbed.buffers import (
    fill_input_block_tables,
    make_mrv2_batch,
    prepare_dflash_step,
)
from testbed.dcp import assert_ranks_read_the_window, dcp_group, reference_caches, true_kv
from testbed.speculators import (
    SPECULATOR_CLASSES,
    GroupLayout,
    wire_speculator,
)
from tests.cpu_testbed.backends import MLA_SPEC, mla_config
from tests.cpu_testbed.dflash import (
    MAX_MODEL_LEN,
    MAX_NUM_REQS,
    NUM_SPEC,
    Q,
    W,
    build,
    capture_on_cpu,
)


def _no_kernel(*args, **kwargs):
    raise AssertionError("a FlashAttention kernel was launched on CPU")


# Stand-ins for FlashAttention's kernels (device code absent from vLLM's CPU build), so that
# its MLA backend imports: its metadata builder is host code and runs for real.
for _name in ("flash_attn_varlen_func", "get_scheduler_metadata"):
    if not hasattr(fa_utils, _name):
        setattr(fa_utils, _name, _no_kernel)
from vllm.v1.attention.backends.mla.flashattn_mla import FlashAttnMLABackend  # noqa: E402

pytestmark = pytest.mark.usefixtures("window_hooks")

# DFlash lengths (each counts its Q query tokens) around the window, and around virtual
# block edges up to 8 * 16.
SEQ_LENS = [5, 64, 65, 128, 129, 200, 256, 257, 700, 1000, 1500]


def wire_rank(
    mla_dir,
    monkeypatch,
    method,
    cp_size,
    rank,
    backend=FlashAttnMLABackend,
    num_reqs_padded=None,
    interleave=1,
    seed=0,
):
    """One rank's DFlash/DSpark MLA draft: vLLM's BlockTables for the rank, DFlash's own
    input prep, a real speculator whose builders see the rank's DCP group."""
    rng = np.random.default_rng(seed)
    batch = make_mrv2_batch(
        [16],
        SEQ_LENS,
        Q,
        num_reqs_padded or len(SEQ_LENS),
        MAX_NUM_REQS,
        MAX_MODEL_LEN,
        rng,
        cp=(cp_size, rank, interleave),
    )
    prepare_dflash_step(batch, NUM_SPEC, rng, [0])
    config = mla_config(mla_dir, method, monkeypatch)
    config.parallel_config.decode_context_parallel_size = cp_size
    config.parallel_config.cp_kv_cache_interleave_size = interleave
    dcp_group(monkeypatch, cp_size, rank)
    # Stand-in for the MLA layer's DCP collectives (process-group operations the forward
    # runs): the builder only checks that the layer has them.
    layer = config.compilation_config.static_forward_context["draft.0"]
    layer.dcp_manager = object.__new__(MLADCPManager)
    layer.dcp_manager.group, layer.dcp_manager.num_ubatches = parallel_state._DCP, 1
    layouts = [GroupLayout(16, spec=MLA_SPEC, backend=backend)]
    return wire_speculator(
        SPECULATOR_CLASSES[method], batch, layouts, config, method, NUM_SPEC, dcp_size=cp_size
    )


def assert_decode_reads(per_rank: list, cp_size: int) -> None:
    """What each rank's MLA decode kernel is handed (``metadata.decode``: its table and its
    DCP-local lengths) reads its share of the window; combined, the window."""
    wired = per_rank[0][0]
    window = wired.speculator.draft_window
    n = wired.batch.num_reqs
    reads = window.seq_lens[:n].clone()
    rank_reads = {}
    for rank, (w, metadata) in enumerate(per_rank):
        decode = metadata["draft.0"].decode
        # vLLM keeps the global lengths beside the local ones: the window's, on every rank.
        assert torch.equal(decode.dcp_tot_seq_lens[:n], reads)
        assert decode.seq_lens.data_ptr() in {
            b.data_ptr() for b in w.speculator.draft_window.dcp_local_buffers
        }
        rank_reads[rank] = (decode.block_table, decode.seq_lens)
    lengths = wired.batch.seq_lens.tolist()
    k, v = true_kv(lengths)
    caches = reference_caches(cp_size, 1, wired.batch.req_block_ids[0], k, v)
    spec = window.spec
    assert spec.alignment == cp_size * 16
    assert_ranks_read_the_window(
        caches, lengths, reads, rank_reads, spec.sink_size, W, spec.alignment, k, v, num_queries=Q
    )


@pytest.mark.parametrize("cp_size", [2, 4, 8])
@pytest.mark.parametrize("method", ["dflash", "dspark"])
@pytest.mark.parametrize("cg_mode", [CUDAGraphMode.NONE, CUDAGraphMode.FULL], ids=str)
def test_mla_draft_ranks_read_their_share_of_the_window(
    cp_size, method, cg_mode, mla_dir, monkeypatch
):
    per_rank = []
    for rank in range(cp_size):
        wired = wire_rank(mla_dir, monkeypatch, method, cp_size, rank, num_reqs_padded=MAX_NUM_REQS)
        builder = wired.attn_groups[0][0].metadata_builders[0]
        assert builder.dcp_world_size == cp_size
        metadata = build(wired, cg_mode, slack=3)
        assert metadata["draft.0"].num_prefills == 0  # every query pass on the decode path
        per_rank.append((wired, metadata))
    assert_decode_reads(per_rank, cp_size)


@pytest.mark.parametrize("cp_size", [2, 4])
def test_a_full_graph_captured_per_rank_replays_each_ranks_share(cp_size, mla_dir, monkeypatch):
    """Each rank's FULL graph, captured by vLLM's own capture through the window: what it
    recorded holds, after a replay step's build, that rank's share of the new step's window."""
    per_rank = []
    for rank in range(cp_size):
        wired = wire_rank(
            mla_dir, monkeypatch, "dflash", cp_size, rank, num_reqs_padded=MAX_NUM_REQS
        )
        s = wired.speculator
        captured = capture_on_cpu(s, monkeypatch)
        s.capture()
        recorded = captured["draft.0"].decode
        window = s.draft_window
        assert recorded.block_table.data_ptr() == window.windows[0].block_table.data_ptr()
        # A replay step: the batch's kernels, then the eager build this builder needs (it
        # has no in-place update under DCP), into the buffers the graph recorded.
        fill_input_block_tables(wired.batch)
        prepare_dflash_step(wired.batch, NUM_SPEC, np.random.default_rng(1), [0])
        metadata = build(wired, CUDAGraphMode.FULL, slack=3)
        decode = metadata["draft.0"].decode
        assert decode.seq_lens.data_ptr() == recorded.seq_lens.data_ptr()
        per_rank.append((wired, {"draft.0": metadata["draft.0"]}))
    assert_decode_reads(per_rank, cp_size)


def test_an_interleave_that_does_not_divide_a_column_is_refused_by_name(mla_dir, monkeypatch):
    with pytest.raises(
        ValueError,
        match=(
            r"draft_window_size=64 with decode_context_parallel_size=2 \(rank 0\), "
            r"cp_kv_cache_interleave_size=32: the interleave does not divide the 16 tokens one "
            r"column of group 0 \(MLAAttentionSpec, block size 16\) holds on each rank.* Use a "
            r"cp_kv_cache_interleave_size that divides 16"
        ),
    ):
        # NOTE: vLLM's config check (block size % interleave) runs before; this is the
        # window's own refusal of a table whose columns are kernel blocks smaller than I.
        wire_rank(mla_dir, monkeypatch, "dflash", 2, 0, interleave=32)


@pytest.mark.parametrize(
    ("backend", "interleave"), [(TritonMLABackend, 1), (FlashAttnMLABackend, 2)]
)
def test_mla_builders_that_send_draft_queries_to_their_prefill_path_under_dcp_are_refused(
    backend, interleave, mla_dir, monkeypatch
):
    with pytest.raises(
        ValueError,
        match=(
            rf"draft_window_size=64 with decode_context_parallel_size=2 \(rank 0\), "
            rf"cp_kv_cache_interleave_size={interleave} is not supported for dflash with group 0 "
            rf"\(MLAAttentionSpec, block size 16\) on attention backend {backend.__name__}: under "
            rf"decode context parallelism its builder declares .*prefill path, which takes the "
            rf"host bound as the exact context length"
        ),
    ):
        wire_rank(mla_dir, monkeypatch, "dflash", 2, 0, backend=backend, interleave=interleave)


@pytest.mark.parametrize("method", ["dflash", "dspark"])
def test_a_replicated_gqa_draft_reads_its_window_in_blocks(method, model_dir, monkeypatch):
    """vLLM keeps a DFlash/DSpark GQA draft's cache whole on every rank under the target's
    DCP (``dcp_sharded=False``, the draft's DCP size 1): on each rank it is windowed in
    blocks, as without DCP, and reads exactly the window."""
    from tests.cpu_testbed.dflash import assert_reads_exactly_the_window, wire

    layouts = [GroupLayout(16)]
    for rank in range(2):
        rng = np.random.default_rng(0)
        batch = make_mrv2_batch(
            [16],
            SEQ_LENS,
            Q,
            len(SEQ_LENS),
            MAX_NUM_REQS,
            MAX_MODEL_LEN,
            rng,
            cp=(2, rank, 1),
            dcp_sharded=[False],
        )
        prepare_dflash_step(batch, NUM_SPEC, rng, [0])
        wired = wire(method, layouts, batch, model_dir, monkeypatch)
        window = wired.speculator.draft_window
        assert window.dcp.sharded == (False,) and window.spec.alignment == 16
        assert_reads_exactly_the_window(wired, layouts, build(wired, slack=3))
