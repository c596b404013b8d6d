# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The installed vllm-ascend release's speculators started as a host starts them, on CPU: a config
validated with graphs on, the speculator's own ``__init__``, real vLLM attention layers
(target and draft) on vllm-ascend's GQA backend, the target runner's attention groups from
vLLM's ``init_attn_backend``, the speculator's own ``set_attn`` (through the window's hook),
``init_cudagraph_manager`` and ``capture``; then a target verify step and the speculator's
own ``propose``, which replays the captured graphs. The device boundary is stood in by
``graphs.py``; what a model runner hands a speculator before its capture (the update stream,
the profiling run's dummy batch, the draft's layer names) is set as the runner sets it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from vllm.config import (
    CacheConfig,
    CompilationConfig,
    SchedulerConfig,
    set_current_vllm_config,
)
from vllm.config.compilation import CompilationMode, CUDAGraphMode
from vllm.v1.kv_cache_interface import KVCacheConfig

from testbed.reference import PagedKVCache
from testbed.speculators import propose_after_verify
from tests.ascend.npu_testbed import kv_specs
from tests.ascend.npu_testbed.acl_graphs import DraftModel, FiaKernel
from tests.ascend.npu_testbed.compat import without_piecewise
from tests.ascend.npu_testbed.wiring import ascend_model_state, load_tables, vllm_config
from tests.cpu_testbed.family_heads import FAMILY_TOP_K
from tests.cpu_testbed.graphs import platform_with_graphs

CPU = torch.device("cpu")
BLOCK = 128
NUM_KV_HEADS, HEAD_SIZE = 2, 16
MAX_NUM_REQS = 8
MAX_MODEL_LEN = 2048
# Requests per captured graph (sized down for a CPU).
GRAPH_REQS = (4, MAX_NUM_REQS)
# The tiny draft's config: a DFlash/DSpark draft names its mask token, a DFlash2 draft its
# candidates per position.
DRAFT_EXTRA = {"dflash_config": {"mask_token_id": 250, "selector_top_k": FAMILY_TOP_K}}


def _layers(config, backend: str) -> KVCacheConfig:
    """The target's and the draft's attention layers, registered as the models register them
    (vLLM's own on vllm-ascend's GQA backend, or vllm-ascend's MLA layers); returns the
    KV-cache config vllm-ascend's start-up makes of them (``kv_specs``)."""
    if backend == "gqa":
        for name in ("target.0", "draft.0"):
            kv_specs.gqa_layer(config, name, 4, HEAD_SIZE, NUM_KV_HEADS)
        return kv_specs.start_up_kv_cache_config(config)
    import vllm_ascend.ops.rotary_embedding as rope

    mla = config.model_config.hf_text_config
    # Stand-in for the rotary caches the draft model's rotary embedding fills at load (the
    # MLA builder gathers cos/sin by position; their values do not matter here).
    rope._cos_cache = torch.ones(MAX_MODEL_LEN, mla.qk_rope_head_dim)
    rope._sin_cache = torch.zeros(MAX_MODEL_LEN, mla.qk_rope_head_dim)
    for name in ("target.0", "draft.0"):
        kv_specs.mla_layer(config, name)
    return kv_specs.start_up_kv_cache_config(config)


def started(
    model_dir,
    method: str,
    num_spec: int,
    cudagraph_mode: CUDAGraphMode,
    additional: dict,
    monkeypatch,
    model_type: str | None = None,
    backend: str = "gqa",
    draft=None,
):
    """A speculator through ``set_attn``, on a config a host with graphs would validate,
    with its layers on vllm-ascend's GQA (FIA) or MLA backend (``backend``); ``draft``: a
    draft checkpoint folder of the method's own layout (``wiring.vllm_config``).

    The model runner hands the speculator its resolved cudagraph mode later
    (``init_cudagraph_manager``); PIECEWISE graphs also need torch.compile, which vLLM's CPU
    platform turns off, so the config keeps that mode's FULL part (the stood-in draft model
    runs uncompiled where a host runs its piecewise graphs)."""
    from vllm.v1.worker.gpu.attn_utils import init_attn_backend

    from vllm_ascend.ascend_config import init_ascend_config
    from vllm_ascend.worker.v2.block_table import AscendBlockTables
    from vllm_ascend.worker.v2.input_batch import AscendInputBuffers
    from vllm_ascend.worker.v2.spec_decode import init_speculator
    from vllm_ascend.worker.v2.spec_decode.dflash2.speculator import AscendDFlash2Speculator

    platform_with_graphs(monkeypatch)
    # Graph sizes in tokens: GRAPH_REQS requests of one query (EAGLE decode) or of a query
    # pass (EAGLE's draft prefill and DFlash: num_spec + 1 tokens; DSpark: num_spec).
    query_len = num_spec if method == "dspark" else num_spec + 1
    sizes = sorted({r * q for r in GRAPH_REQS for q in (1, query_len)})
    compilation = CompilationConfig(
        mode=CompilationMode.NONE,
        cudagraph_mode=without_piecewise(cudagraph_mode),
        cudagraph_capture_sizes=sizes,
    )
    scheduler = SchedulerConfig(
        max_num_seqs=MAX_NUM_REQS, max_model_len=MAX_MODEL_LEN, is_encoder_decoder=False
    )
    config = vllm_config(
        model_dir,
        method,
        additional,
        model_type=model_type,
        num_spec=num_spec,
        parallel_drafting=method not in ("eagle", "eagle3"),
        draft=draft,
        compilation_config=compilation,
        scheduler_config=scheduler,
        # Half-precision KV, as a host runs (vllm-ascend 0.29's GQA layers refuse any other
        # unquantized KV dtype).
        cache_config=CacheConfig(block_size=BLOCK, cache_dtype="bfloat16"),
    )
    # A host runs these speculators with VLLM_USE_V2_MODEL_RUNNER=1; set after the config
    # above, whose placeholder method vLLM 0.30 refuses on V2, and before the configs the
    # speculator derives from it (which check the window's keys against the runner).
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    if method == "dflash2":
        # vllm-ascend runs its DFlash2 draft eagerly only (its init_cudagraph_manager).
        object.__setattr__(config.speculative_config, "enforce_eager", True)
    init_ascend_config(config)
    with set_current_vllm_config(config):
        # The method's own speculator as vllm-ascend's model runner picks it; DFlash2, which
        # it picks by a DFlash2 checkpoint's architecture, by name over the tiny draft.
        s = (
            AscendDFlash2Speculator(config, CPU)
            if method == "dflash2"
            else init_speculator(config, CPU)
        )
    kv_cache_config = _layers(config, backend)
    block_tables = AscendBlockTables(
        [BLOCK],
        MAX_NUM_REQS,
        s.max_num_tokens,
        [MAX_MODEL_LEN // BLOCK],
        CPU,
        kernel_block_sizes=[BLOCK],
    )
    with set_current_vllm_config(config):
        target_groups, _, _ = init_attn_backend(kv_cache_config, config, CPU)
    # What the model runner's load_model leaves: the draft's model and its own layers.
    s.draft_attn_layer_names = {"draft.0"}
    kernel = FiaKernel()
    s.model = DraftModel(
        ["draft.0"], s.hidden_size, s.vocab_size, kernel, pair=method in ("eagle", "eagle3")
    )
    target_buffers = AscendInputBuffers(MAX_NUM_REQS, s.max_num_tokens, CPU)
    with set_current_vllm_config(config):
        s.set_attn(
            ascend_model_state(config), kv_cache_config, block_tables, target_buffers, target_groups
        )
    return s, kernel


def capture(s, cudagraph_mode: CUDAGraphMode) -> None:
    """The model runner's graph set-up for its speculator, then the speculator's capture."""
    from vllm_ascend.worker.v2.input_batch import AscendInputBatch

    # vllm-ascend's model runner shares its graph-update stream (a stand-in stream here).
    s.update_stream = torch.npu.Stream()
    # The runner's profiling run proposes once before any capture, and vllm-ascend's propose
    # keeps that dummy batch (``input_batch``), which the capture's builds read.
    s.input_batch = AscendInputBatch.make_dummy(MAX_NUM_REQS, MAX_NUM_REQS, s.target_input_buffers)
    with set_current_vllm_config(s.vllm_config):
        s.init_cudagraph_manager(cudagraph_mode)
        s.capture()


@dataclasses.dataclass
class Verified:
    """A target verify step: the target runner's batch, metadata and slot mappings, and the
    true K/V of every position a draft can read."""

    target_lens: list[int]
    num_spec: int
    batch: object
    metadata: dict
    slot_mappings: dict
    rejected: torch.Tensor
    block_ids: list
    cache: PagedKVCache
    k: list
    v: list


def verify_step(s, target_lens: list[int], seed: int = 0) -> Verified:
    """Each request verifies num_spec + 1 tokens ending at its target length, with random
    rejected tokens. The tables go through vLLM's staged writes and gather, the slot
    mappings through vllm-ascend's own kernel, and the target's metadata through its model
    state's ``prepare_attn`` (the target runner's build). The batch's host bound is the
    target's exact length: vllm-ascend's runner computes it as the host's computed tokens
    plus the scheduled ones, exact where it syncs its host counts after rejection (every
    target but DeepSeek-V4.1, which the window refuses where a kernel is told the bound)."""
    from vllm.v1.worker.gpu.attn_utils import build_slot_mappings_by_layer

    from vllm_ascend.attention.attention_v1 import AscendAttentionState
    from vllm_ascend.worker.v2.input_batch import AscendInputBatch

    rng = np.random.default_rng(seed)
    num_spec = s.num_speculative_steps
    n, q = len(target_lens), num_spec + 1
    target = torch.tensor(target_lens, dtype=torch.int32)
    rejected = torch.from_numpy(rng.integers(0, q, n).astype(np.int32))
    # Every position a draft can read: up to the target length plus a query stretch.
    ends = [min(t + q, MAX_MODEL_LEN) for t in target_lens]
    pool = rng.permutation(np.arange(1, 1 + sum(-(-e // BLOCK) for e in ends)))
    block_ids, used = [], 0
    for e in ends:
        count = -(-e // BLOCK)
        block_ids.append([int(x) for x in pool[used : used + count]])
        used += count
    idx_mapping = load_tables(s, block_ids, n, rng)
    tib = s.target_input_buffers
    qsl = np.arange(n + 1, dtype=np.int32) * q
    num_tokens = n * q
    batch = AscendInputBatch.make_dummy(n, num_tokens, tib)
    tib.seq_lens.zero_()
    tib.seq_lens[:n] = target
    tib.seq_lens_cpu.zero_()
    tib.seq_lens_cpu[:n] = target
    tib.query_start_loc[: n + 1] = torch.from_numpy(qsl)
    tib.positions[:num_tokens] = torch.cat([torch.arange(t - q, t) for t in target_lens])
    batch = dataclasses.replace(
        batch,
        idx_mapping=idx_mapping,
        idx_mapping_np=idx_mapping.numpy(),
        num_scheduled_tokens=np.full(n, q, dtype=np.int32),
        query_start_loc_np=qsl,
        query_start_loc=tib.query_start_loc[: n + 1],
        seq_lens=tib.seq_lens[:n],
        seq_lens_np=tib.seq_lens_np[:n],
        seq_lens_cpu_upper_bound=target.clone(),
        positions=tib.positions[:num_tokens],
        is_prefilling_np=np.zeros(n, dtype=bool),
        has_prefill=False,
        attn_state=AscendAttentionState.SpecDecoding,
        is_dummy=False,
    )
    bt = s.block_tables
    slot_mappings = bt.compute_slot_mappings(
        idx_mapping, batch.query_start_loc, batch.positions, num_tokens
    )
    metadata = s.model_state.prepare_attn(
        batch,
        CUDAGraphMode.NONE,
        tuple(t[:n] for t in bt.input_block_tables),
        slot_mappings,
        s.target_attn_groups,
        s.kv_cache_config,
    )
    gen = torch.Generator().manual_seed(seed)
    cache = PagedKVCache(used + 1, BLOCK, NUM_KV_HEADS, HEAD_SIZE)
    k, v = [], []
    for i, e in enumerate(ends):
        k.append(torch.randn(e, NUM_KV_HEADS, HEAD_SIZE, generator=gen, dtype=torch.float64))
        v.append(torch.randn(e, NUM_KV_HEADS, HEAD_SIZE, generator=gen, dtype=torch.float64))
        cache.write(torch.tensor(block_ids[i], dtype=torch.int32), torch.arange(e), k[i], v[i])
    by_layer = build_slot_mappings_by_layer(slot_mappings, s.kv_cache_config)
    return Verified(
        list(target_lens), num_spec, batch, metadata, by_layer, rejected, block_ids, cache, k, v
    )


def propose(s, t: Verified) -> None:
    propose_after_verify(s, t.batch, t.metadata, t.slot_mappings, t.rejected)


def replayed(manager, kernel: FiaKernel, num_tasks: int) -> list[tuple[list[int], torch.Tensor]]:
    """The replay of the graph captured for MAX_NUM_REQS requests: per recorded FIA launch,
    the lengths the graph-task update told it and the table contents at that launch (what
    the kernel reads). GQA's tasks are the graph's own (``UpdatableGraph``); MLA's are
    kept in vllm-ascend's draft graph parameters for the graph's token count."""
    from vllm_ascend.compilation.acl_graph import get_draft_graph_params

    (desc,) = [d for d in manager.graphs if d.num_reqs == MAX_NUM_REQS]
    graph = manager.graphs[desc]
    assert graph.replays == 1
    handles = [task.handle for task in graph.tasks] or get_draft_graph_params().handles.get(
        desc.num_tokens, []
    )
    assert len(handles) == num_tasks
    launches = [x for x in kernel.launches if not x.captured][-num_tasks:]
    reads = []
    for handle, launch in zip(handles, launches, strict=True):
        params = kernel.updates[handle.id]
        # The graph's recorded launch reads the table address it was captured with.
        assert params["block_table"].data_ptr() == launch.table_ptr
        reads.append((params["lengths"], launch.table))
    return reads
