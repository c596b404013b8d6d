# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The installed vllm-ascend release's own DFlash and DSpark speculators on CPU, wired to
vllm-ascend's real GQA attention metadata builder (``AscendAttentionMetadataBuilder``, the FIA
path) and its ``AscendBlockTables``, as vllm-ascend's own unit tests build such objects
(``object.__new__`` plus the state the metadata paths read)."""

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from vllm.config import CacheConfig, set_current_vllm_config
from vllm.v1.kv_cache_interface import KVCacheConfig, UniformTypeKVCacheSpecs
from vllm.v1.worker.gpu.input_batch import InputBuffers
from vllm.v1.worker.utils import AttentionGroup

from testbed.buffers import verify_step
from testbed.configs import set_method, speculative_vllm_config
from tests.ascend.npu_testbed import kv_specs
from vllm_ascend.attention.attention_v1 import AscendAttentionBackend
from vllm_ascend.attention.mla_v1 import AscendMLABackend
from vllm_ascend.worker.v2.block_table import AscendBlockTables
from vllm_ascend.worker.v2.spec_decode.dflash.speculator import AscendDFlashSpeculator
from vllm_ascend.worker.v2.spec_decode.dflash2.speculator import AscendDFlash2Speculator
from vllm_ascend.worker.v2.spec_decode.dspark.speculator import AscendDSparkSpeculator

CPU = torch.device("cpu")
NUM_KV_HEADS, HEAD_SIZE = 2, 16
NUM_SPEC = 3
Q = NUM_SPEC + 1
MAX_MODEL_LEN = 2048
# By drafter: DFlash2 drafts are method "dflash" with a DFlash2 draft model, drawn by
# vllm-ascend's AscendDFlash2Speculator (AscendDFlashSpeculator's metadata paths).
CLASSES = {
    "dflash": AscendDFlashSpeculator,
    "dflash2": AscendDFlash2Speculator,
    "dspark": AscendDSparkSpeculator,
}
METHODS = {"dflash2": "dflash"}

# The GQA builder pins its host copies; a CPU-only torch has no pinned memory.
torch.Tensor.pin_memory = lambda self, *args, **kwargs: self


@dataclass
class Batch:
    """What the draft's kernels and the target runner leave in the persistent buffers."""

    seq_lens: list[int]
    # per request: the kernel-block ids of its whole context (0 is the null block)
    block_ids: list[list[int]]
    num_reqs_padded: int
    block_size: int


@dataclass
class InputBatchSeen:
    """The fields of vLLM's InputBatch that the DSpark/DFlash metadata paths read."""

    num_reqs: int
    seq_lens_cpu_upper_bound: torch.Tensor


def vllm_config(
    model_dir,
    method: str,
    additional_config: dict,
    model_type: str | None = None,
    num_spec: int = NUM_SPEC,
    parallel_drafting: bool = True,
    draft=None,
    **configs,
):
    """A real VllmConfig (``configs``: more of its parts, such as ``compilation_config``); the
    speculative method is set after construction, as vLLM 0.30's config refuses
    DFlash/DSpark drafts without their draft model, or, with a draft checkpoint of the
    method's own layout (``draft``, a folder: ``tiny_models.write_draft_dir``), validated by
    vLLM as a host validates it."""
    # Half-precision KV, as a host runs (vllm-ascend 0.29's GQA layers refuse any other
    # unquantized KV dtype); the block size is the draft group's (``draft_group``).
    configs.setdefault("cache_config", CacheConfig(cache_dtype="bfloat16"))
    if draft is None:
        config = speculative_vllm_config(
            model_dir, MAX_MODEL_LEN, num_spec, "draft_model", **configs
        )
        set_method(config, METHODS.get(method, method), parallel_drafting=parallel_drafting)
    else:
        config = speculative_vllm_config(
            model_dir, MAX_MODEL_LEN, num_spec, METHODS.get(method, method), draft=draft, **configs
        )
    config.additional_config = additional_config
    if model_type is not None:
        config.model_config.hf_text_config.model_type = model_type
    return config


def draft_group(
    config, backend: type, block_size: int, non_causal_multi_token_decode: bool = False
) -> tuple[AttentionGroup, KVCacheConfig]:
    """The draft's attention group with vllm-ascend's real metadata builder, GQA (FIA) or MLA
    for an MLA model config (``mla_model_dir``), and the KV-cache config vllm-ascend's
    start-up makes of every layer registered in ``config`` (``kv_specs``: the draft's own and
    any a test registered for the target), the draft's in group 0. As vLLM's
    ``init_attn_backend`` does, the attention group holds the draft layer's own spec."""
    config.cache_config.block_size = block_size
    if backend is AscendMLABackend:
        import vllm_ascend.ops.rotary_embedding as rope

        mla = config.model_config.hf_text_config
        # Stand-in for the rotary caches the draft model's rotary embedding fills at load
        # (the MLA builder gathers cos/sin by position; their values do not matter here).
        if rope._cos_cache is None:
            rope._cos_cache = torch.ones(MAX_MODEL_LEN, mla.qk_rope_head_dim)
            rope._sin_cache = torch.zeros(MAX_MODEL_LEN, mla.qk_rope_head_dim)
        kv_specs.mla_layer(
            config,
            "draft.0",
            non_causal_multi_token_decode=non_causal_multi_token_decode,
            dcp_manager=mla_dcp_manager(config, mla),
        )
    else:
        kv_specs.gqa_layer(config, "draft.0", 4, HEAD_SIZE, NUM_KV_HEADS)
    kv_cache_config = kv_specs.start_up_kv_cache_config(config)
    (kv_cache_group,) = kv_cache_config.kv_cache_groups
    spec = kv_cache_group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        spec = spec.kv_cache_specs["draft.0"]
    group = AttentionGroup(backend, ["draft.0"], spec, 0)
    with set_current_vllm_config(config):
        group.create_metadata_builders(config, CPU)
    return group, kv_cache_config


def mla_dcp_manager(config, mla) -> Any:
    """The registered MLA layer's DCP collective manager under decode context parallelism
    (vLLM's own, over the stood-in DCP group; the builders only keep it), else None."""
    if config.parallel_config.decode_context_parallel_size == 1:
        return None
    from vllm.v1.attention.ops.dcp import MLADCPManager

    return MLADCPManager(
        config,
        CPU,
        mla.num_attention_heads,
        mla.kv_lora_rank + mla.qk_rope_head_dim,
        mla.kv_lora_rank,
        torch.float32,
        torch.float32,
        None,
        True,
        False,
    )


def speculator(
    config,
    method: str,
    block_size: int,
    max_num_reqs: int,
    backend: type = AscendAttentionBackend,
    cp: tuple[int, int, int] | None = None,
    non_causal_multi_token_decode: bool = False,
) -> Any:
    """A real vllm-ascend speculator with one draft KV-cache group of ``block_size``-token
    blocks, and its window made as the ``set_attn`` hook makes it (``set_attn`` itself needs
    the draft model's registered attention layers). ``cp``: (ranks, this rank, interleave)
    under decode context parallelism (``config`` set by ``with_dcp``, the DCP group stood in
    by ``dcp_ranks.on_rank``): the rank's tables, and DSpark's DCP manager;
    ``non_causal_multi_token_decode``: a GLM-family DSpark draft's MLA layer (its query block
    attends within itself)."""
    group, kv_cache_config = draft_group(config, backend, block_size, non_causal_multi_token_decode)
    names = group.layer_names
    max_tokens = max_num_reqs * Q
    s = object.__new__(CLASSES[method])
    s.vllm_config, s.speculative_config, s.method, s.device = (
        config,
        config.speculative_config,
        METHODS.get(method, method),
        CPU,
    )
    s.num_speculative_steps, s.num_query_per_req = NUM_SPEC, Q
    s.max_num_reqs, s.max_num_tokens = max_num_reqs, max_tokens
    s.max_model_len = s.draft_max_seq_len = MAX_MODEL_LEN
    s.input_buffers = InputBuffers(max_num_reqs, max_tokens, CPU)
    # Under DCP DSpark's manager reads the target's host lengths (vllm-ascend's buffers).
    from vllm_ascend.worker.v2.input_batch import AscendInputBuffers

    target_buffers = InputBuffers if cp is None else AscendInputBuffers
    s.target_input_buffers = target_buffers(max_num_reqs, max_tokens, CPU)
    s.block_tables = block_tables(block_size, max_num_reqs, max_tokens, cp)
    s.attn_groups = [[group]]
    s.draft_attn_layer_names = set(names)
    s.kv_cache_config = kv_cache_config
    s.arange_np = np.arange(max_num_reqs + 1, dtype=np.int32)
    s.arange = torch.from_numpy(s.arange_np)  # vLLM 0.29's query layout reads this one
    s.draft_is_prefilling = torch.zeros(max_num_reqs, dtype=torch.bool)
    s._group_causal, s.requires_non_causal = False, True
    if method == "dspark":
        s.attn_architecture = "MLA" if backend is AscendMLABackend else "GQA"
        s.use_dcp, s.dcp_manager = False, None
        if cp is not None and hasattr(s, "_init_dcp"):  # 0.29's drafts have no DCP manager
            with set_current_vllm_config(config):
                s._init_dcp()  # vllm-ascend's own: its DCP manager for this rank
    with set_current_vllm_config(config):
        s.draft_window = window_as_set_attn_makes_it(s)
    return s


def block_tables(
    block_size: int, max_num_reqs: int, max_tokens: int, cp: tuple[int, int, int] | None = None
) -> AscendBlockTables:
    """vllm-ascend's block tables of one group; under DCP a rank's, whose columns each cover
    ``cp_size * block_size`` tokens of a request (as vLLM's model runner sizes them)."""
    cp_size, rank, interleave = cp or (1, 0, 1)
    return AscendBlockTables(
        [block_size],
        max_num_reqs,
        max_tokens,
        [-(-MAX_MODEL_LEN // (block_size * cp_size))],
        CPU,
        kernel_block_sizes=[block_size],
        cp_size=cp_size,
        cp_rank=rank,
        cp_interleave=interleave,
    )


def with_dcp(config, cp_size: int, interleave: int):
    """``config`` under decode context parallelism: ``cp_size`` ranks, ``interleave``."""
    config.parallel_config.decode_context_parallel_size = cp_size
    config.parallel_config.cp_kv_cache_interleave_size = interleave
    return config


def load_tables(
    s, block_ids: list[list[int]], num_reqs_padded: int, rng: np.random.Generator
) -> torch.Tensor:
    """Each request's block ids into a random request-state row of the persistent table
    (vLLM's own ``append_block_ids`` and ``apply_staged_writes``), then vLLM's own
    ``gather_block_tables`` kernel into the input table the builders read, over stale
    entries of an earlier step (padded rows zeroed). Returns ``idx_mapping``."""
    n = len(block_ids)
    idx_mapping = torch.from_numpy(rng.permutation(s.max_num_reqs)[:n].astype(np.int32))
    bt = s.block_tables
    for i, ids in enumerate(block_ids):
        bt.append_block_ids(int(idx_mapping[i]), (ids,), overwrite=True)
    bt.apply_staged_writes()
    for table in bt.input_block_tables:
        table.copy_(torch.from_numpy(rng.integers(1, 1 << 20, tuple(table.shape), np.int32)))
    bt.gather_block_tables(idx_mapping, num_reqs_padded)
    return idx_mapping


def fill(s, batch: Batch, seed: int = 0, cp: tuple[int, int, int] | None = None) -> None:
    """A draft step's inputs as the real kernels write them: the tables (``load_tables``),
    then vllm-ascend's own ``prepare_dflash_inputs`` (the kernel its DFlash and DSpark both
    run; its sampling outputs are not read here) after a target verify step with rejected
    tokens (``verify_step``): lengths counting the query stretch (``batch.seq_lens``), query
    layout, positions and the query slot mappings; padded rows zero. The host bound is the
    exact length kept after rejection. ``cp``: (ranks, this rank, interleave) under DCP."""
    from tests.ascend.npu_testbed.compat import prepare_dflash_inputs

    rng = np.random.default_rng(seed)
    cp_size, rank, interleave = cp or (1, 0, 1)
    n, m, tokens = len(batch.seq_lens), s.max_num_reqs, s.max_num_tokens
    idx_mapping = load_tables(s, batch.block_ids, batch.num_reqs_padded, rng)
    target, rejected = verify_step(np.asarray(batch.seq_lens), Q, idx_mapping.numpy(), rng)
    i64 = lambda size: torch.zeros(size, dtype=torch.int64)  # noqa: E731
    prepare_dflash_inputs(batch.block_size)(
        s.input_buffers,
        s.block_tables.slot_mappings[0],
        i64(tokens),
        i64(tokens),
        i64(m * NUM_SPEC),
        i64(m * NUM_SPEC),
        torch.zeros(m * NUM_SPEC, dtype=torch.int32),
        torch.zeros(m),
        i64(m),
        target,
        torch.from_numpy(Q - rejected),
        torch.from_numpy(rejected),
        i64(m),
        i64(m),
        torch.zeros(m),
        i64(m),
        s.block_tables.input_block_tables[0],
        batch.block_size,
        rank,
        cp_size,
        interleave,
        0,
        Q,
        NUM_SPEC,
        m,
        tokens,
        MAX_MODEL_LEN,
    )
    # The kernel's lengths are the batch's (a check of this setup, not of the window).
    assert s.input_buffers.seq_lens[:n].tolist() == list(batch.seq_lens)
    s.input_batch = InputBatchSeen(n, torch.tensor(batch.seq_lens, dtype=torch.int32) - Q)


def make_batch(
    seq_lens: list[int], block_size: int, num_reqs_padded: int, seed: int = 0, cp_size: int = 1
):
    """Block ids for each request: one per ``cp_size * block_size`` tokens (a DCP table's
    column covers every rank's share; the same ids on every rank)."""
    rng = np.random.default_rng(seed)
    pool = rng.permutation(np.arange(1, 1 + len(seq_lens) * (MAX_MODEL_LEN // block_size + 1)))
    ids, used = [], 0
    for length in seq_lens:
        count = -(-length // (block_size * cp_size))
        ids.append([int(x) for x in pool[used : used + count]])
        used += count
    return Batch(list(seq_lens), ids, num_reqs_padded, block_size)


def eagle_config(model_dir, method: str, additional_config: dict, num_spec: int, **configs):
    """A real VllmConfig for an EAGLE/EAGLE3 draft (no parallel drafting)."""
    return vllm_config(
        model_dir, method, additional_config, num_spec=num_spec, parallel_drafting=False, **configs
    )


def eagle_speculator(
    config,
    block_size: int,
    max_num_reqs: int,
    num_spec: int,
    max_num_tokens: int | None = None,
    backend: type = AscendAttentionBackend,
    cp: tuple[int, int, int] | None = None,
) -> Any:
    """vllm-ascend's real ``AscendEagleSpeculator`` with one draft KV-cache group on its GQA
    builder, the target's ``AscendInputBuffers`` beside the draft's, and its window made as
    the ``set_attn`` hook makes it (``set_attn`` itself needs the draft model's layers).
    ``cp``: as for ``speculator``; the rank's tables and vllm-ascend's own DCP manager."""
    from vllm_ascend.worker.v2.input_batch import AscendInputBuffers
    from vllm_ascend.worker.v2.spec_decode.eagle.speculator import AscendEagleSpeculator

    group, kv_cache_config = draft_group(config, backend, block_size)
    names = group.layer_names
    max_tokens = max_num_tokens or max_num_reqs * (num_spec + 1)
    s = object.__new__(AscendEagleSpeculator)
    s.vllm_config = s.draft_vllm_config = config
    s.speculative_config, s.device = config.speculative_config, CPU
    s.method = config.speculative_config.method
    s.num_speculative_steps = num_spec
    s.max_num_reqs, s.max_num_tokens = max_num_reqs, max_tokens
    s.max_model_len = s.draft_max_seq_len = MAX_MODEL_LEN
    s.input_buffers = AscendInputBuffers(max_num_reqs, max_tokens, CPU)
    s.input_buffers.draft_seq_lens_cpus = [
        torch.zeros(max_num_reqs, dtype=torch.int32) for _ in range(num_spec - 1)
    ]
    s.target_input_buffers = AscendInputBuffers(max_num_reqs, max_tokens, CPU)
    s.block_tables = block_tables(block_size, max_num_reqs, max_tokens, cp)
    s.attn_groups = s.target_attn_groups = [[group]]
    s.draft_attn_layer_names = set(names)
    s.kv_cache_config = kv_cache_config
    s.arange_np = np.arange(max_num_reqs + 1, dtype=np.int32)
    s.draft_is_prefilling = torch.zeros(max_num_reqs, dtype=torch.bool)
    s.attn_architecture = "MLA" if backend is AscendMLABackend else "GQA"
    s.attn_backend = backend
    s.use_dcp, s.dcp_manager, s.replicated_pcp, s.pcp_manager = False, None, False, None
    if cp is not None:
        with set_current_vllm_config(config):
            s._init_dcp()  # vllm-ascend's own: its DCP manager for this rank
    s.use_fused_multi_step_decode = False
    s.model_state = ascend_model_state(config)
    s.arange = torch.from_numpy(s.arange_np)  # vLLM 0.29's query layout reads this one
    try:  # vllm-ascend 0.30's sparse KV offload state (off), which its builds read
        from vllm_ascend.worker.v2.spec_decode.autoregressive.sparse_kv_offload import (
            SparseKVOffloadMetadata,
        )
    except ImportError:
        pass
    else:
        s._sparse_kv_offload_metadata = SparseKVOffloadMetadata(
            enabled=False,
            num_steps=num_spec,
            max_num_reqs=max_num_reqs,
            max_num_tokens=max_tokens,
            device=CPU,
        )
    with set_current_vllm_config(config):
        s.draft_window = window_as_set_attn_makes_it(s)
    return s


def ascend_model_state(config) -> Any:
    """vllm-ascend's real ``AscendModelState`` with the state its ``prepare_attn`` reads (no
    model, no PCP, no KV offload)."""
    from vllm_ascend.worker.v2.model_states.default import AscendModelState

    state = object.__new__(AscendModelState)
    state.vllm_config, state.max_model_len = config, MAX_MODEL_LEN
    state.kvpp_runtime = state.pcp_manager = state.device_metadata = None
    state.attn_metadata = {}
    return state


def window_as_set_attn_makes_it(s) -> Any:
    """The speculator's window as ``set_attn`` makes it: through the hook's function, with
    the path check and the fused refresh's self-check (none while uninstalled), or in the
    tree form vllm-ascend's own call (the path check attached by the test bed)."""
    from tests.ascend.npu_testbed.pairing import IN_TREE, installed_release

    if IN_TREE:
        from vllm_ascend.worker.v2.spec_decode.draft_window import speculator

        return speculator.create_draft_window(s, installed_release())
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import install
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.hooks.speculator import (
        create_checked_window,
    )

    installed = install.installation()
    return create_checked_window(s, installed.release) if installed is not None else None


def sparse_target_config(sfa_model_dir, **impl_fields):
    """A GLM-family DSpark config whose target layer is sparse (vllm-ascend's SFA backend)
    with its indexer cache, registered after vllm-ascend's platform validated the config
    (``init_ascend_config``); ``impl_fields``: as for ``kv_specs.mla_layer``. Returns (config,
    the indexer's layer name)."""
    from vllm_ascend.ascend_config import init_ascend_config
    from vllm_ascend.attention.sfa_v1 import AscendSFABackend

    config = vllm_config(
        sfa_model_dir, "dspark", {"draft_window_size": 128}, model_type="glm_moe_dsa"
    )
    config.cache_config.block_size = 128
    init_ascend_config(config)
    kv_specs.mla_layer(config, "target.0.attn", backend=AscendSFABackend, **impl_fields)
    return config, kv_specs.sfa_indexer_layer(config, "target.0.attn")
