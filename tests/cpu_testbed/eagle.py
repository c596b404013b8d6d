# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""EAGLE/EAGLE3 through vLLM's real speculator (0.33 or 0.34) on CPU: a target verify step,
the draft prefill and every decode step, and what each reads through the reference paged
attention."""

import dataclasses

import numpy as np
import torch
from vllm.config.compilation import CUDAGraphMode
from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend
from vllm.v1.attention.backends.utils import get_dcp_local_seq_lens
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor
from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers
from vllm.v1.worker.gpu.model_states.default import DefaultModelState
from vllm.v1.worker.gpu.spec_decode.eagle.speculator import EagleSpeculator
from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator
from vllm.v1.worker.gpu.spec_decode.target_dependent_ar import speculator as ar_module
from vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator import (
    TargetDependentARSpeculator,
    update_draft_inputs,
)
from vllm.v1.worker.utils import AttentionGroup

from testbed.buffers import (
    CPU,
    Mrv2Batch,
    fill_query_inputs,
    fill_slot_mappings,
    make_mrv2_batch,
)
from testbed.reference import (
    PagedKVCache,
    dense_attention,
    positions_read,
)
from testbed.speculators import (
    HEAD_SIZE,
    NUM_KV_HEADS,
    GroupLayout,
    Wired,
    make_vllm_config,
    wire_speculator,
)

W = 64
MAX_MODEL_LEN = 1024
MAX_NUM_REQS = 12
# draft_attention_sinks: 20 rounds up to 32 (one group of 16-token blocks, or 16 and 32).
SINKS = [0, 20]
# Contexts before the verify chunk, around block (16) and window (64) boundaries, and
# around where sinks of 32 and the window part (96 + 16).
CONTEXTS = [2, 47, 48, 57, 63, 64, 65, 200, 700, 105, 120]
LAYOUTS = EAGLE_LAYOUTS = {
    "one_group": [GroupLayout(16)],
    "two_groups": [GroupLayout(16), GroupLayout(32)],
}


# Where vLLM 0.33 and 0.34 drive an EAGLE draft differently, asked of the installed vLLM.
# 0.34 builds an EAGLE draft prefill's metadata in one method of its own.
DRAFTER_PREFILL_METHOD = hasattr(DraftModelSpeculator, "_build_drafter_attn_metadata")
# The autoregressive draft's per-step forward, which the tests stand in for (0.33's
# ``_generate_draft``, 0.34's ``_decode``), and the fused multi-step decode's driver (0.33's
# ``_fused_multi_step_decode``, which 0.34 renamed ``_run_fused_multi_step_decode``, giving
# the old name to its inner loop).
_AR = TargetDependentARSpeculator
DRAFT_STEP = "_decode" if hasattr(_AR, "_decode") else "_generate_draft"
FUSED_DECODE = (
    "_run_fused_multi_step_decode"
    if hasattr(_AR, "_run_fused_multi_step_decode")
    else "_fused_multi_step_decode"
)


def draft_prefill(speculator, input_batch, target_metadata, num_tokens: int) -> None:
    """An EAGLE draft prefill over the target's verify batch, as ``propose`` runs it (the
    caller stands in for its forward): vLLM 0.34 takes the prefill's metadata from
    ``_build_drafter_attn_metadata`` (the window's hook there); 0.33 hands ``_prefill`` the
    target's, which the window's ``_prefill`` hook replaces, from the batch the window's
    ``propose`` hook keeps."""
    if DRAFTER_PREFILL_METHOD:
        metadata, slot_mappings = speculator._build_drafter_attn_metadata(
            input_batch, target_metadata, None, CUDAGraphMode.NONE
        )
        speculator._prefill(
            input_batch.num_reqs, num_tokens, metadata, slot_mappings, None, skip_sample=True
        )
        return
    state = speculator.draft_window.propose
    state.prefill_batch = input_batch
    try:
        speculator._prefill(
            input_batch.num_reqs,
            num_tokens,
            target_metadata,
            None,
            num_tokens_across_dp=None,
            skip_sample=True,
        )
    finally:
        state.prefill_batch = None


def prepare_decode_inputs(
    speculator, input_batch, target_seq_lens, num_rejected, max_model_len: int
) -> None:
    """vLLM's own decode-input kernel after an EAGLE draft prefill (first draft tokens zero),
    from the target's lengths ``target_seq_lens``: 0.33's module function, 0.34's speculator
    method (which reads them from the batch)."""
    import dataclasses

    import torch

    n = input_batch.num_reqs
    if hasattr(_AR, "_prepare_decode_inputs"):
        speculator.draft_tokens = torch.zeros(
            speculator.max_num_reqs, speculator.num_speculative_steps, dtype=torch.int64
        )
        speculator.sample_src_positions = torch.zeros(speculator.max_num_reqs, dtype=torch.int64)
        batch = dataclasses.replace(input_batch, seq_lens=target_seq_lens)
        speculator._prepare_decode_inputs(batch, num_rejected, n, False, None)
        return
    ar_module.prepare_decode_inputs(
        torch.zeros(n, speculator.num_speculative_steps, dtype=torch.int64),
        target_seq_lens,
        num_rejected,
        speculator.input_buffers,
        torch.zeros(speculator.max_num_reqs, dtype=torch.int64),
        max_model_len,
        speculator.max_num_reqs,
    )


def max_model_len_arg(speculator, max_model_len: int):
    """What vLLM's ``update_draft_inputs`` takes as the length limit: 0.33 an integer, 0.34
    the speculator's device scalar (``max_model_len_gpu``)."""
    import torch

    if hasattr(DraftModelSpeculator, "update_max_model_len"):
        if getattr(speculator, "max_model_len_gpu", None) is None:
            speculator.max_model_len_gpu = torch.tensor(max_model_len, dtype=torch.int32)
        return speculator.max_model_len_gpu
    return max_model_len


@dataclasses.dataclass
class Eagle:
    wired: Wired
    batch: Mrv2Batch  # the target's verify batch; its buffers are the target's
    input_batch: InputBatch
    target_metadata: dict
    num_spec: int
    num_rejected: np.ndarray
    k: list[torch.Tensor]
    v: list[torch.Tensor]
    caches: dict[int, PagedKVCache]

    @property
    def s(self):
        return self.wired.speculator


def _target_input_batch(
    batch: Mrv2Batch, query_lens: list[int], seq_lens: list[int], decoding: int, cp
) -> InputBatch:
    """The target runner's batch; vLLM's make_dummy writes dummy values into the target
    buffers, so the kernels' real values are written again afterwards. Requests past
    ``decoding`` are prompts still prefilling (their host lengths exact)."""
    n = len(seq_lens)
    input_batch = InputBatch.make_dummy(n, batch.num_tokens, batch.input_buffers)
    fill_query_inputs(batch)
    fill_slot_mappings(batch)
    input_batch = dataclasses.replace(
        input_batch,
        num_scheduled_tokens=np.array(query_lens, dtype=np.int32),
        query_start_loc_np=batch.query_start_loc_np,
        seq_lens_cpu_upper_bound=torch.tensor(seq_lens, dtype=torch.int32),
        max_query_len=max(query_lens),
        idx_mapping_np=batch.idx_mapping,
        idx_mapping=torch.from_numpy(batch.idx_mapping),
        is_prefilling_np=np.array([False] * decoding + [True] * (n - decoding)),
    )
    if cp[0] > 1:
        # The target runner's DCP-local lengths of its batch, in its own buffer.
        local = batch.input_buffers.dcp_local_seq_lens
        local[:n] = get_dcp_local_seq_lens(batch.input_buffers.seq_lens[:n], cp[0], cp[1], cp[2])
        input_batch = dataclasses.replace(input_batch, dcp_local_seq_lens=local[:n])
    return input_batch


def _target_groups(layouts: list[GroupLayout], config) -> list[list[AttentionGroup]]:
    """The target runner's groups, which hold the draft layers too (same backend and spec)."""
    groups = []
    for g, layout in enumerate(layouts):
        spec = FullAttentionSpec(
            block_size=layout.block_size,
            num_kv_heads=NUM_KV_HEADS,
            head_size=HEAD_SIZE,
            dtype=torch.float32,
        )
        group = AttentionGroup(TritonAttentionBackend, [f"target.{g}", f"draft.{g}"], spec, g)
        group.create_metadata_builders(config, CPU)
        groups.append([group])
    return groups


def _true_kv(batch: Mrv2Batch, layouts: list[GroupLayout], ends: list[int], seed: int, cp):
    """True K/V of every position a step can read (up to ``ends``), written through the
    full tables; under DCP every rank's cache is the DCP tests' (test_dcp_eagle.py)."""
    gen = torch.Generator().manual_seed(seed)
    k = [torch.randn(e, NUM_KV_HEADS, HEAD_SIZE, generator=gen, dtype=torch.float64) for e in ends]
    v = [torch.randn(e, NUM_KV_HEADS, HEAD_SIZE, generator=gen, dtype=torch.float64) for e in ends]
    caches = {}
    bt = batch.block_tables
    for g, layout in enumerate(layouts if cp[0] == 1 else ()):
        b = layout.block_size
        cache = PagedKVCache(bt.block_tables[g].gpu.numel() + 1, b, NUM_KV_HEADS, HEAD_SIZE)
        for i, e in enumerate(ends):
            row = torch.tensor(batch.req_block_ids[g][i], dtype=torch.int32)
            cache.write(row, torch.arange(e), k[i], v[i])
        caches[g] = cache
    return k, v, caches


def setup_eagle(
    model_dir,
    monkeypatch,
    num_spec,
    layouts,
    contexts=CONTEXTS,
    seed=0,
    prefill_chunk=None,
    window=W,
    sinks=0,
    min_context=0,
    vllm_config=None,
    cp=(1, 0, 1),
) -> Eagle:
    """A target verify batch (each request: context + num_spec + 1 query tokens; optionally
    one request prefilling a long chunk), its real target metadata, and a wired draft;
    ``cp``: one rank of decode context parallelism (ranks, rank, interleave)."""
    rng = np.random.default_rng(seed)
    contexts = contexts[: MAX_NUM_REQS - (prefill_chunk is not None)]
    query_lens = [num_spec + 1] * len(contexts)
    seq_lens = [c + num_spec + 1 for c in contexts]
    if prefill_chunk is not None:
        query_lens.append(prefill_chunk)
        seq_lens.append(prefill_chunk + 30)
    n = len(seq_lens)
    batch = make_mrv2_batch(
        [g.block_size for g in layouts],
        seq_lens,
        num_spec + 1,
        n,
        MAX_NUM_REQS,
        MAX_MODEL_LEN,
        rng,
        lookahead_tokens=num_spec,
        query_lens=query_lens,
        cp=cp,
    )
    additional = {"draft_window_size": window}
    if sinks:
        additional["draft_attention_sinks"] = sinks
    if min_context:
        additional["draft_window_min_context"] = min_context
    config = vllm_config or make_vllm_config(model_dir, MAX_MODEL_LEN, MAX_NUM_REQS, additional)
    model_state = DefaultModelState(config, torch.nn.Module(), None, CPU)
    draft_buffers = InputBuffers(MAX_NUM_REQS, batch.block_tables.max_num_batched_tokens, CPU)
    wired = wire_speculator(
        EagleSpeculator,
        batch,
        layouts,
        config,
        "eagle3",
        num_spec,
        dcp_size=cp[0],
        draft_input_buffers=draft_buffers,
        model_state=model_state,
    )
    s = wired.speculator
    s.kv_cache_config = s.kv_cache_config  # set by set_attn
    s.target_input_buffers = batch.input_buffers
    s.last_token_indices = torch.zeros(MAX_NUM_REQS, dtype=torch.int64)
    s.current_draft_step = torch.tensor(0, dtype=torch.int64)
    s.idx_mapping = torch.full((MAX_NUM_REQS,), -1, dtype=torch.int64)
    s.idx_mapping[:n] = torch.from_numpy(batch.idx_mapping)
    s.pcp_manager = None

    input_batch = _target_input_batch(batch, query_lens, seq_lens, len(contexts), cp)
    s.target_attn_groups = _target_groups(layouts, config)
    bt = batch.block_tables
    target_metadata = model_state.prepare_attn(
        input_batch,
        CUDAGraphMode.NONE,
        tuple(t[:n] for t in bt.input_block_tables),
        bt.slot_mappings[:, : batch.num_tokens],
        s.target_attn_groups,
        s.kv_cache_config,
    )
    k, v, caches = _true_kv(batch, layouts, [length + num_spec for length in seq_lens], seed, cp)
    num_rejected = rng.integers(0, num_spec + 1, n)
    if prefill_chunk is not None:
        num_rejected[-1] = 0
    return Eagle(wired, batch, input_batch, target_metadata, num_spec, num_rejected, k, v, caches)


def run_prefill(e: Eagle, num_tokens_padded: int | None = None) -> dict:
    """The draft prefill as `propose` runs it (``draft_prefill``); a PIECEWISE
    dispatch may pad the token count."""
    seen = {}

    def run_model(num_tokens, attn_metadata, slot_mappings, *args, **kwargs):
        # No draft weights on CPU: record what the draft layers would read.
        seen.update(attn_metadata)
        hidden = torch.zeros(num_tokens, 4)
        return hidden, hidden

    e.s._run_model = run_model
    draft_prefill(e.s, e.input_batch, e.target_metadata, num_tokens_padded or e.batch.num_tokens)
    return seen


def prepare_decode(e: Eagle) -> None:
    """vLLM's own decode-input kernel after the prefill (which leaves each request's position
    at its last accepted token): the first draft step sits right after it. Runs under
    Triton's interpreter on CPU."""
    ib, n = e.s.input_buffers, e.batch.num_reqs
    accepted = torch.from_numpy(e.batch.seq_lens - e.num_rejected).to(torch.int32)
    ib.positions[:n] = accepted.long() - 1
    prepare_decode_inputs(
        e.s,
        e.input_batch,
        torch.from_numpy(e.batch.seq_lens.astype(np.int32)),
        torch.from_numpy(e.num_rejected.astype(np.int32)),
        MAX_MODEL_LEN,
    )


def update_inputs(e: Eagle, num_spec: int) -> None:
    """vLLM's own `update_draft_inputs` kernel after a draft step (the draft forward itself
    is not run on CPU: zero tokens and hidden states stand in for its output)."""
    s, n = e.s, e.batch.num_reqs
    hidden = torch.zeros(n, 4)
    update_draft_inputs(
        torch.zeros(n, dtype=torch.int64),
        s.current_draft_step,
        hidden,
        torch.zeros(n, num_spec, dtype=torch.int64),
        torch.zeros(MAX_NUM_REQS, 4),
        s.input_buffers,
        torch.zeros(MAX_NUM_REQS, dtype=torch.int64),
        n,
        max_model_len_arg(s, MAX_MODEL_LEN),
        num_spec,
    )


def run_decode(e: Eagle, monkeypatch, fused: bool) -> list[dict]:
    """The real multi-step decode loop; each step's draft forward is replaced by a record
    of what its draft layers read, then `update_draft_inputs`' increments."""
    if e.num_spec <= 1:
        return []  # propose returns after the prefill
    prepare_decode(e)
    s, ib, n = e.s, e.s.input_buffers, e.batch.num_reqs
    steps = []

    def generate_draft(num_reqs, num_tokens_padded, attn_metadata, slot_mappings, *args, **kwargs):
        steps.append(
            {
                "lengths": ib.seq_lens[:n].clone(),
                "slots": e.batch.block_tables.slot_mappings[:, :n].clone(),
                **{
                    name: (md.seq_lens.clone(), md.block_table.clone())
                    for name, md in attn_metadata.items()
                },
                # Under DCP, flash attention's DCP-local context lengths.
                "dcp": {
                    name: md.dcp_context_kv_lens.clone()
                    for name, md in attn_metadata.items()
                    if getattr(md, "dcp_context_kv_lens", None) is not None
                },
                "md_slots": {
                    name: md.slot_mapping[:n].clone() for name, md in attn_metadata.items()
                },
            }
        )
        update_inputs(e, e.num_spec)

    setattr(s, DRAFT_STEP, generate_draft)
    s.supports_decode_metadata_update = fused
    decode = getattr(s, FUSED_DECODE) if fused else s._multi_step_decode
    desc = BatchExecutionDescriptor(cg_mode=CUDAGraphMode.NONE, num_tokens=n, num_reqs=None)
    decode(n, False, desc, None, e.input_batch.seq_lens_cpu_upper_bound, e.num_spec)
    return steps


def read_step(e: Eagle, g: int, block_size: int, lengths, read_lens, tables, i: int):
    """Reference read of request i's single query at the step's last position, through a
    table whose columns are blocks of `block_size` tokens, and dense attention over what
    that read must cover: the sinks and [start, L)."""
    length, read = int(lengths[i]), int(read_lens[i])
    sinks = e.s.draft_window.spec.sink_size
    start, _ = positions_read(length, read, sinks)
    q = e.k[i][length - 1 : length] * 0.5
    got, touched = e.caches[g].read(q, tables[i], read, block_size=block_size)
    expected = dense_attention(q, e.k[i], e.v[i], start, length, sinks)
    return got, expected, touched


def expected_blocks(e: Eagle, g: int, b: int, i: int, length: int, read: int) -> set[int]:
    """Block ids of the full table that hold the positions a read must cover."""
    _, kept = positions_read(length, read, e.s.draft_window.spec.sink_size)
    return {e.batch.req_block_ids[g][i][p // b] for p in kept.tolist()}
