# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""vLLM 0.33's speculators started as a server starts them, on CPU: a config validated with
graphs on, the speculator's own ``__init__``, real attention layers (target and draft) on
vLLM's Triton backend, the target runner's attention groups and block tables, the
speculator's own ``set_attn`` (through the window's hook), ``init_cudagraph_manager`` and
``capture``; then a target verify step written by vLLM's own kernels and the speculator's
own ``propose``, which replays the captured graph. The device boundary is stood in by
``tests.cpu_testbed.graphs``; the draft model (no weights on CPU) by ``DraftModel``, whose
layers record what the attention kernel would read at each launch.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import torch
from vllm.config import (
    CompilationConfig,
    SchedulerConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.config.compilation import CompilationMode, CUDAGraphMode

from testbed.buffers import (
    fill_persistent_block_tables,
    fill_query_inputs,
    fill_slot_mappings,
    make_mrv2_batch,
)
from testbed.configs import set_method, speculative_vllm_config
from testbed.reference import PagedKVCache, assert_window_reads
from testbed.speculators import (
    HEAD_SIZE,
    NUM_KV_HEADS,
    TINY_LLAMA,
    propose_after_verify,
)
from tests.cpu_testbed import graphs
from tests.cpu_testbed.family_heads import FAMILY_TOP_K, FamilyHeads, candidates

CPU = torch.device("cpu")
BLOCK = 16
MAX_NUM_REQS = 8
MAX_MODEL_LEN = 1024
# Requests per captured graph (sized down for a CPU).
GRAPH_REQS = (4, MAX_NUM_REQS)
EAGLE = ("eagle", "eagle3")


def draft_dir(root):
    """A tiny draft config that EAGLE, DFlash, DSpark and the DFlash family accept (a mask
    token; DFlash2's and LiLiCorr's candidate counts)."""
    root.mkdir(parents=True, exist_ok=True)
    dflash = {
        "mask_token_id": 250,
        "selector_top_k": FAMILY_TOP_K,
        "lilicorr_candidate_topk": FAMILY_TOP_K,
    }
    config = {**TINY_LLAMA, "dflash_config": dflash}
    (root / "config.json").write_text(json.dumps(config))
    return root


@dataclasses.dataclass
class Launch:
    """One attention launch of a draft layer: the addresses of the lengths and table the
    kernel reads, and their contents at that moment."""

    layer: str
    seq_lens_ptr: int
    table_ptr: int
    seq_lens: torch.Tensor
    table: torch.Tensor
    # The graph capturing or replaying this launch, if any.
    captured_in: object
    replayed_in: object
    # The longest length the kernel is told it reads (its launch bound), where it has one.
    max_seq_len: int | None = None
    # Under DCP (flash attention): the rank's local lengths of the context it reads.
    dcp_context_kv_lens: torch.Tensor | None = None


def _cloned(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.clone()


class DraftModel(torch.nn.Module):
    """Stand-in for the draft model (no weights on CPU): each draft layer's attention launch
    is recorded with what vLLM's Triton attention reads (``seq_lens``, ``block_table``)."""

    def __init__(self, layer_names, hidden_size, vocab_size, pair: bool, top_k: int = 4) -> None:
        super().__init__()
        self.layer_names, self.hidden_size, self.vocab_size = layer_names, hidden_size, vocab_size
        self.pair = pair
        self.launches: list[Launch] = []
        # The DFlash family's own heads (XPress, DFlash2, LiLiCorr), called after the draft
        # forward: ``model.model.<head>``.
        self.model = FamilyHeads(hidden_size, top_k)

    def forward(self, input_ids=None, positions=None, **kwargs):
        from vllm.forward_context import get_forward_context

        attn_metadata = get_forward_context().attn_metadata or {}
        for name in self.layer_names:
            md = attn_metadata.get(name)
            if md is None:
                continue
            self.launches.append(
                Launch(
                    name,
                    md.seq_lens.data_ptr(),
                    md.block_table.data_ptr(),
                    md.seq_lens.clone(),
                    md.block_table.clone(),
                    graphs.capturing(),
                    graphs.replaying(),
                    getattr(md, "max_seq_len", None),
                    _cloned(getattr(md, "dcp_context_kv_lens", None)),
                )
            )
        out = torch.zeros(input_ids.shape[0], self.hidden_size)
        return (out, out) if self.pair else out

    # The draft heads the speculators sample through: zeros of the right shapes.
    def combine_hidden_states(self, hidden_states):
        return torch.zeros(hidden_states.shape[0], self.hidden_size)

    def compute_logits(self, hidden_states):
        return torch.zeros(*hidden_states.shape[:-1], self.vocab_size)

    def compute_candidates(self, hidden_states):
        """DFlash2's and LiLiCorr's candidate tokens and their unary scores."""
        return candidates(self, hidden_states)

    compute_draft_logits = compute_logits

    def markov_embed(self, token_ids):
        return torch.zeros(token_ids.shape[0], self.hidden_size)

    def markov_bias(self, markov_embed):
        return torch.zeros(markov_embed.shape[0], self.vocab_size)

    def map_draft_to_target(self, draft_ids):
        return draft_ids

    def precompute_and_store_context_kv(self, *args, **kwargs) -> None:
        """The draft's context K/V writes: the reference cache holds the true K/V."""


def host_config(
    model_dir,
    method: str,
    num_spec: int,
    cudagraph_mode: CUDAGraphMode,
    additional: dict,
    monkeypatch,
    draft=None,
) -> VllmConfig:
    """A VllmConfig validated with graphs on. The model runner hands the speculator its
    resolved cudagraph mode later (``init_cudagraph_manager``); PIECEWISE graphs also need
    torch.compile, which vLLM's CPU platform turns off, so the config keeps that mode's FULL
    part (the stood-in draft model runs uncompiled where a server runs its piecewise
    graphs). The speculative method (and the window's keys with it) is set after validation,
    as a DFlash/DSpark config needs its draft model's own checkpoint to validate; with a
    draft checkpoint of the method's own layout (``draft``, a folder:
    ``tiny_models.write_draft_dir``), vLLM validates the method itself, as a server does."""
    graphs.platform_with_graphs(monkeypatch)
    query_len = num_spec if method == "dspark" else num_spec + 1
    config = speculative_vllm_config(
        model_dir,
        MAX_MODEL_LEN,
        num_spec,
        "draft_model" if draft is None else method,
        draft=draft,
        compilation_config=CompilationConfig(
            mode=CompilationMode.NONE,
            cudagraph_mode=cudagraph_mode.without_piecewise(),
            **graphs.capture_sizes(GRAPH_REQS, (1, query_len)),
        ),
        scheduler_config=SchedulerConfig(
            max_num_seqs=MAX_NUM_REQS, max_model_len=MAX_MODEL_LEN, is_encoder_decoder=False
        ),
    )
    if draft is None:
        set_method(config, method, parallel_drafting=method in ("dflash", "dspark"))
    config.additional_config = additional
    return config


@dataclasses.dataclass
class Started:
    s: object
    model: DraftModel
    model_state: object


def started(
    model_dir,
    method,
    num_spec,
    cudagraph_mode,
    additional,
    monkeypatch,
    backend: type | None = None,
    cls: type | None = None,
    cp: tuple[int, int] = (1, 0),
    draft=None,
) -> Started:
    """The speculator (``cls``, default the method's own) through ``set_attn``, beside the
    target runner's state; the layers on ``backend`` (default: vLLM's Triton backend);
    ``cp``: one rank of decode context parallelism (ranks, rank; interleave 1), its process
    group stood in (``testbed.dcp``); ``draft``: a draft checkpoint folder of the
    method's own (``host_config``)."""
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.worker.gpu.attn_utils import init_attn_backend
    from vllm.v1.worker.gpu.block_table import BlockTables
    from vllm.v1.worker.gpu.input_batch import InputBuffers
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState
    from vllm.v1.worker.gpu.spec_decode import init_speculator

    from testbed.vllm_line import get_block_table_width

    config = host_config(
        model_dir, method, num_spec, cudagraph_mode, additional, monkeypatch, draft=draft
    )
    # Every speculator's init_cudagraph_manager makes graph managers, which ask for the
    # pipeline group (vLLM 0.34's draft model too, with graphs off).
    graphs.process_groups_on_cpu(monkeypatch)
    cp_size, cp_rank = cp
    if cp_size > 1:
        from testbed.dcp import dcp_group

        dcp_group(monkeypatch, cp_size, cp_rank)
        config.parallel_config.decode_context_parallel_size = cp_size
    with set_current_vllm_config(config):
        # The method's own speculator as the model runner picks it (vLLM's init_speculator).
        s = cls(config, CPU) if cls else init_speculator(config, CPU, None)
        for name in ("target.0", "draft.0"):
            Attention(
                4,
                HEAD_SIZE,
                HEAD_SIZE**-0.5,
                num_kv_heads=NUM_KV_HEADS,
                prefix=name,
                attn_backend=backend or TritonAttentionBackend,
            )
    spec = FullAttentionSpec(
        block_size=BLOCK, num_kv_heads=NUM_KV_HEADS, head_size=HEAD_SIZE, dtype=torch.float32
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=1,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["target.0", "draft.0"], spec)],
    )
    # Under DCP a column holds each rank's share of cp_size * BLOCK tokens.
    max_blocks = get_block_table_width(-(-MAX_MODEL_LEN // (BLOCK * cp_size)), BLOCK)
    block_tables = BlockTables(
        block_sizes=[BLOCK],
        max_num_reqs=MAX_NUM_REQS,
        max_num_batched_tokens=s.max_num_tokens,
        max_num_blocks_per_group=[max_blocks],
        device=CPU,
        cp_size=cp_size,
        cp_rank=cp_rank,
    )
    with set_current_vllm_config(config):
        target_groups, _, _ = init_attn_backend(kv_cache_config, config, CPU)
    model_state = DefaultModelState(config, torch.nn.Module(), None, CPU)
    # What the model runner's load_model leaves: the draft's model and its own layers.
    model = DraftModel(
        ["draft.0"], s.hidden_size, s.vocab_size, pair=method in EAGLE, top_k=FAMILY_TOP_K
    )
    s.model = model
    # What LiLiCorr's load_draft_model takes from the target: its input embedding.
    s.target_embeddings = torch.nn.Embedding(s.vocab_size, s.hidden_size)
    s.draft_attn_layer_names = {"draft.0"}
    target_buffers = InputBuffers(MAX_NUM_REQS, s.max_num_tokens, CPU)
    with set_current_vllm_config(config):
        s.set_attn(model_state, kv_cache_config, block_tables, target_buffers, target_groups)
    return Started(s, model, model_state)


def draft_model_is_autoregressive() -> bool:
    """Where vLLM 0.33 and 0.34 drive a draft model differently, asked of the installed
    vLLM: 0.34's is an autoregressive speculator as EAGLE is, which captures graphs of its
    decode steps, builds the first step's metadata and updates it in place at every step
    (``_run_fused_multi_step_decode``, on backends that support it, as Triton's does);
    0.33's runs eagerly and builds the metadata at every step."""
    from vllm.v1.worker.gpu.spec_decode.standalone_ar.speculator import StandaloneARSpeculator

    return hasattr(StandaloneARSpeculator, "_run_fused_multi_step_decode")


def draft_model_decode_paths() -> set[tuple[str, ...]]:
    """The paths the path check sees a draft model's decode steps take (see
    ``draft_model_is_autoregressive``)."""
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    paths = {(DraftModelSpeculator._build_attn_metadata.__qualname__,)}
    if draft_model_is_autoregressive():
        paths.add((DraftModelSpeculator._update_draft_decode_metadata.__qualname__,))
    return paths


def capture(s, cudagraph_mode: CUDAGraphMode) -> None:
    with set_current_vllm_config(s.vllm_config):
        s.init_cudagraph_manager(cudagraph_mode)
        s.capture()


@dataclasses.dataclass
class Verified:
    """A target verify step and the true K/V of every position a draft can read."""

    target_lens: list[int]
    batch: object
    input_batch: object
    metadata: dict
    slot_mappings: dict
    rejected: torch.Tensor
    cache: PagedKVCache
    k: list
    v: list

    @property
    def block_ids(self) -> list[list[int]]:
        return self.batch.req_block_ids[0]


def verify_step(
    st: Started, target_lens: list[int], seed: int = 0, prompt_chunks: dict[int, int] | None = None
) -> Verified:
    """Each request verifies num_spec + 1 tokens ending at its target length, with random
    rejected tokens: its tables through vLLM's staged writes, its lengths, positions and slot
    mappings by vLLM's own kernels, and the target's metadata by the runner's model state.
    ``prompt_chunks``: requests that prefill a prompt chunk of that many tokens instead (none
    rejected)."""
    from vllm.v1.worker.gpu.attn_utils import build_slot_mappings_by_layer
    from vllm.v1.worker.gpu.input_batch import InputBatch

    s = st.s
    rng = np.random.default_rng(seed)
    n, q = len(target_lens), s.num_speculative_steps + 1
    chunks = prompt_chunks or {}
    query_lens = [chunks.get(i, q) for i in range(n)]
    bt = s.block_tables
    batch = make_mrv2_batch(
        [BLOCK],
        target_lens,
        q,
        n,
        MAX_NUM_REQS,
        MAX_MODEL_LEN,
        rng,
        lookahead_tokens=q,
        query_lens=query_lens,
        cp=(bt.cp_size, bt.cp_rank, bt.cp_interleave),
    )
    # The speculator shares the runner's persistent tables; the batch's own are not read.
    batch.block_tables = s.block_tables
    batch.input_buffers = s.target_input_buffers
    fill_persistent_block_tables(batch)
    idx_mapping = torch.from_numpy(batch.idx_mapping.astype(np.int32))
    s.block_tables.gather_block_tables(idx_mapping, n)
    input_batch = InputBatch.make_dummy(n, batch.num_tokens, batch.input_buffers)
    fill_query_inputs(batch)
    fill_slot_mappings(batch)
    target = torch.tensor(target_lens, dtype=torch.int32)
    prefilling = np.array([i in chunks for i in range(n)])
    input_batch = dataclasses.replace(
        input_batch,
        num_scheduled_tokens=np.array(query_lens, dtype=np.int32),
        query_start_loc_np=batch.query_start_loc_np,
        seq_lens_cpu_upper_bound=target.clone(),
        idx_mapping_np=batch.idx_mapping,
        idx_mapping=idx_mapping.long(),
        is_prefilling_np=prefilling,
        has_prefill=bool(prefilling.any()),
    )
    metadata = st.model_state.prepare_attn(
        input_batch,
        CUDAGraphMode.NONE,
        tuple(t[:n] for t in bt.input_block_tables),
        bt.slot_mappings[:, : batch.num_tokens],
        s.target_attn_groups,
        s.kv_cache_config,
    )
    rejected = torch.from_numpy(rng.integers(0, q, n).astype(np.int32))
    rejected[list(chunks)] = 0
    gen = torch.Generator().manual_seed(seed)
    ends = [t + q for t in target_lens]
    cache = PagedKVCache(bt.block_tables[0].gpu.numel() + 1, BLOCK, NUM_KV_HEADS, HEAD_SIZE)
    k, v = [], []
    for i, e in enumerate(ends):
        k.append(torch.randn(e, NUM_KV_HEADS, HEAD_SIZE, generator=gen, dtype=torch.float64))
        v.append(torch.randn(e, NUM_KV_HEADS, HEAD_SIZE, generator=gen, dtype=torch.float64))
        if bt.cp_size == 1:  # under DCP the test writes every rank's share (testbed.dcp)
            row = torch.tensor(batch.req_block_ids[0][i], dtype=torch.int32)
            cache.write(row, torch.arange(e), k[i], v[i])
    by_layer = build_slot_mappings_by_layer(
        bt.slot_mappings[:, : batch.num_tokens], s.kv_cache_config
    )
    return Verified(
        list(target_lens), batch, input_batch, metadata, by_layer, rejected, cache, k, v
    )


def assert_launch_reads(t: Verified, launch: Launch, ends: list[int], num_queries, spec) -> None:
    """What a launch reads (its lengths over its table, as they were when it ran) is, for
    each request, exactly the window (``spec``; all of it when None) of ``ends[i]`` for its
    last ``num_queries`` (per request, or one count) queries; padded rows read only the null
    block."""
    lengths = launch.seq_lens.tolist()
    assert_window_reads(
        t.cache, t.k, t.v, t.block_ids, lengths, launch.table, ends, num_queries, spec
    )
    assert not launch.table[len(ends) :].any()


def propose(s, t: Verified) -> None:
    propose_after_verify(s, t.input_batch, t.metadata, t.slot_mappings, t.rejected)


def replayed(manager, model: DraftModel, num_launches: int) -> list[Launch]:
    """The launches of the one replay of the graph captured for MAX_NUM_REQS requests: each
    must read the addresses its launch in the capture recorded (with the contents the
    replay wrote there)."""
    (desc,) = [d for d in manager.graphs if d.num_reqs == MAX_NUM_REQS]
    graph = manager.graphs[desc]
    assert graph.replays == 1
    at_capture = [x for x in model.launches if x.captured_in is graph]
    replay = [x for x in model.launches if x.replayed_in is graph]
    assert len(at_capture) == len(replay) == num_launches
    for launch, recorded in zip(replay, at_capture, strict=True):
        assert (launch.seq_lens_ptr, launch.table_ptr) == (
            recorded.seq_lens_ptr,
            recorded.table_ptr,
        )
    return replay
