# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""DFlash and DSpark through vLLM 0.33's real build path on CPU: the layouts, batches and
builds the tests share, and the checks of what a build hands the kernel against dense
attention over exactly the window."""

import numpy as np
import torch
from vllm.config.compilation import CUDAGraphMode
from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor

from testbed.buffers import (
    Mrv2Batch,
    make_mrv2_batch,
    prepare_dflash_step,
)
from testbed.reference import (
    PagedKVCache,
    assert_kernel_reads,
    dense_attention,
    positions_read,
)
from testbed.speculators import (
    HEAD_SIZE,
    NUM_KV_HEADS,
    SPECULATOR_CLASSES,
    GroupLayout,
    Wired,
    make_vllm_config,
    wire_speculator,
)
from tests.cpu_testbed.graphs import (
    capturing,
    cuda_graphs_on_cpu,
    set_capture_sizes,
)

W = 64
NUM_SPEC = 3
Q = NUM_SPEC + 1
MAX_MODEL_LEN = 2048
MAX_NUM_REQS = 12
# Contexts (each counts its Q query tokens, as DFlash's seq_lens do) shorter than, equal
# to and far longer than W, and on both sides of block boundaries and of where sinks and
# window part (S + W + a: 112 to 192 for the sinks below).
SEQ_LENS = [5, 63, 64, 65, 79, 80, 1000, 2000, 129, 111, 160]
# draft_attention_sinks: 20 rounds up to 32 (alignments 16 and 32) or 64 (alignment 64).
SINKS = [0, 20]

LAYOUTS = {
    "one_group": [GroupLayout(16)],
    "target_group_and_two_draft_groups": [
        GroupLayout(16, draft=False),
        GroupLayout(16),
        GroupLayout(32),
    ],
    "draft_group_with_smaller_kernel_blocks": [GroupLayout(64, kernel_block_size=32)],
}


def make_batch(layouts, seq_lens=SEQ_LENS, num_reqs_padded=None, seed=0) -> Mrv2Batch:
    """A DFlash step: the tables gathered, then DFlash's own input prep after a target verify
    step with rejected tokens (vLLM's kernels, interpreted)."""
    rng = np.random.default_rng(seed)
    batch = make_mrv2_batch(
        block_sizes=[layout.block_size for layout in layouts],
        seq_lens=seq_lens,
        num_query_per_req=Q,
        num_reqs_padded=num_reqs_padded or len(seq_lens),
        max_num_reqs=MAX_NUM_REQS,
        max_model_len=MAX_MODEL_LEN,
        rng=rng,
    )
    prepare_dflash_step(batch, NUM_SPEC, rng, draft_groups(layouts))
    return batch


def draft_groups(layouts) -> list[int]:
    return [g for g, layout in enumerate(layouts) if layout.draft]


def wire(
    method, layouts, batch, model_dir, monkeypatch, additional_config=None, sinks=None
) -> Wired:
    if additional_config is None:
        additional_config = {"draft_window_size": W}
        if sinks is not None:
            additional_config["draft_attention_sinks"] = sinks
    config = make_vllm_config(model_dir, MAX_MODEL_LEN, MAX_NUM_REQS, additional_config)
    return wire_speculator(SPECULATOR_CLASSES[method], batch, layouts, config, method, NUM_SPEC)


def build(wired: Wired, cg_mode=CUDAGraphMode.NONE, slack=0):
    """What `DFlashSpeculator.propose` asks for: uniform queries, `step = Q`, and the
    target's host bound of each context (here the exact context plus `slack`)."""
    batch = wired.batch
    n, n_pad = batch.num_reqs, batch.num_reqs_padded
    full = cg_mode == CUDAGraphMode.FULL
    desc = BatchExecutionDescriptor(
        cg_mode=cg_mode, num_tokens=(n_pad if full else n) * Q, num_reqs=n_pad if full else None
    )
    bound = torch.tensor(batch.seq_lens - Q + slack, dtype=torch.int32)
    return wired.speculator._build_uniform_attn_metadata(
        batch_desc=desc, num_reqs=n, num_query_per_req=Q, seq_lens_cpu_upper_bound=bound, step=Q
    )


def true_kv(batch: Mrv2Batch, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shape = (NUM_KV_HEADS, HEAD_SIZE)
    k = [torch.randn(int(n), *shape, generator=gen, dtype=torch.float64) for n in batch.seq_lens]
    v = [torch.randn(int(n), *shape, generator=gen, dtype=torch.float64) for n in batch.seq_lens]
    return k, v


def kv_block_ids(full_ids: list[int], b: int, kb: int, positions: torch.Tensor) -> set[int]:
    """Ids of the blocks holding `positions` in a table of b-token blocks, or in its map
    to kb-token kernel blocks (block x holds kernel blocks x * b / kb + j)."""
    ids = torch.tensor(full_ids)[positions // b] * (b // kb) + (positions % b) // kb
    return set(ids.tolist())


def assert_reads_exactly_the_window(wired: Wired, layouts, metadata, window_size=W, min_context=0):
    """Each draft group's metadata, read by the reference paged attention, equals dense
    attention over the sinks [0, S) and [start, L), with start block-aligned for every
    draft group (everything when the two meet); a context below ``min_context`` reads all
    of itself."""
    batch = wired.batch
    k, v = true_kv(batch)
    window = wired.speculator.draft_window
    sinks = window.spec.sink_size
    # The window serves exactly the draft's full-attention groups (policy.py).
    windowed = {g for g, layout in enumerate(layouts) if layout.draft and layout.full_attention}
    assert set(window.windows) == windowed
    expected_reads = []
    for g, layout in enumerate(layouts):
        if g not in window.windows:
            continue
        md = metadata[f"draft.{g}"]
        b, kb = layout.block_size, layout.kernel_block_size or layout.block_size
        cache = PagedKVCache(MAX_NUM_REQS * (MAX_MODEL_LEN // b) + 1, b, NUM_KV_HEADS, HEAD_SIZE)
        for i, length in enumerate(batch.seq_lens.tolist()):
            full_row = torch.tensor(batch.req_block_ids[g][i], dtype=torch.int32)
            cache.write(full_row, torch.arange(length), k[i], v[i])
        for i, length in enumerate(batch.seq_lens.tolist()):
            read_len = int(md.seq_lens[i])
            start, kept = positions_read(length, read_len, sinks)
            assert start % window.spec.alignment == 0
            if length < min_context:
                assert read_len == length  # below the threshold: the whole context
            else:
                reach = sinks + window_size + window.spec.alignment
                assert min(length, sinks + window_size) <= read_len <= reach - 1
            q = k[i][length - Q : length] * 0.5
            got, touched = cache.read(q, md.block_table[i], read_len, block_size=kb)
            expected = dense_attention(q, k[i], v[i], start, length, sinks)
            torch.testing.assert_close(got, expected)
            assert touched == kv_block_ids(batch.req_block_ids[g][i], b, kb, kept)
            expected_reads.append(expected)
        # The same metadata through vLLM's own Triton paged attention kernel.
        n = batch.num_reqs
        queries = [k[i][length - Q : length] * 0.5 for i, length in enumerate(batch.seq_lens)]
        assert_kernel_reads(
            cache, queries, md.block_table, md.seq_lens[:n], expected_reads[-n:], kb
        )
        # Padded rows read nothing.
        assert not md.seq_lens[batch.num_reqs :].any()


# Views of persistent buffers; the other tensors are host tensors made per build.
PERSISTENT = {"query_start_loc", "seq_lens", "block_table_tensor", "slot_mapping", "positions"}


def compare_cams(a, b, same_storage=True):
    """Field by field equal; with `same_storage`, the persistent ones also the same buffers."""
    assert type(a) is type(b)
    for name, value in vars(a).items():
        other = getattr(b, name)
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, other), name
            if same_storage and name in PERSISTENT:
                assert value.data_ptr() == other.data_ptr(), name
        elif name != "_token_to_req_indices_cache":
            assert value == other, name


def move_batch_into(src: Mrv2Batch, dst: Mrv2Batch) -> None:
    """What the kernels of a later step write into the same persistent buffers."""
    for name in ("seq_lens", "query_start_loc", "positions"):
        d, s = getattr(dst.input_buffers, name), getattr(src.input_buffers, name)
        width = min(d.shape[0], s.shape[0])
        d[:width].copy_(s[:width])
    for d, s in zip(
        dst.block_tables.input_block_tables, src.block_tables.input_block_tables, strict=True
    ):
        d.copy_(s)
    width = min(dst.block_tables.slot_mappings.shape[1], src.block_tables.slot_mappings.shape[1])
    dst.block_tables.slot_mappings[:, :width].copy_(src.block_tables.slot_mappings[:, :width])
    for name in (
        "seq_lens",
        "idx_mapping",
        "req_block_ids",
        "num_reqs",
        "num_reqs_padded",
        "query_lens",
    ):
        setattr(dst, name, getattr(src, name))


def capture_on_cpu(speculator, monkeypatch) -> dict:
    """Ready a wired DFlash speculator for its real capture: vLLM's own DFlash graph manager
    (``init_cudagraph_manager``) for one graph of this module's batch shape, captured by
    vLLM's ``CudaGraphManager.capture`` with only the device boundary stood in (``graphs``).
    The draft forward (the graph's context step and ``_generate_draft``: no weights on CPU)
    keeps the metadata its layers are handed in the capture, which is
    what the graph records; returns that dict (layer name -> metadata)."""
    cuda_graphs_on_cpu(monkeypatch)
    compilation = speculator.vllm_config.compilation_config
    set_capture_sizes(monkeypatch, compilation, (MAX_NUM_REQS,), (Q,))
    captured = {}

    def generate_draft(num_reqs, num_tokens, attn_metadata, *args, **kwargs):
        if capturing() is not None:
            captured.update(attn_metadata)

    speculator._generate_draft = generate_draft
    speculator._prepare_graph_forward = lambda num_reqs, attn_metadata: None
    # The buffers DFlash's __init__ makes, which its capture resets.
    for name in ("sample_indices", "sample_pos", "sample_idx_mapping"):
        setattr(speculator, name, torch.zeros(MAX_NUM_REQS * NUM_SPEC, dtype=torch.int64))
    speculator._speculator_name = "DFlash"
    speculator._group_causal = True
    speculator.init_cudagraph_manager(CUDAGraphMode.FULL_DECODE_ONLY)
    assert speculator.query_cudagraph_manager.needs_capture()
    return captured
