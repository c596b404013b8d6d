# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Unit tests for the MRV2 draft KV window (``draft_window_size``) in vllm-ascend's DFlash and DSpark speculators.

The window's arithmetic is checked against the property it promises, not against its own
formula: a draft pass reads ``[start, L)`` of a request of ``L`` tokens, which holds at least
the last ``draft_window_size`` tokens (the whole context when shorter), starts on a block
boundary, and starts as late as that allows. Each call site in the DFlash and DSpark
speculators is checked to hand its callee the window's buffers and windowed lengths, and to
behave as before when the window is off; the config key is checked through ``init_ascend_config``.
"""

from contextlib import nullcontext
from types import SimpleNamespace
from unittest.mock import MagicMock, patch

import numpy as np
import pytest
import torch
import vllm.v1.worker.gpu.buffer_utils as buffer_utils
from vllm.config import VllmConfig
from vllm.config.compilation import CUDAGraphMode
from vllm.v1.worker.gpu.block_table import BlockTables
from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor
from vllm.v1.worker.gpu.input_batch import InputBuffers
from vllm.v1.worker.gpu.spec_decode.dflash import speculator as vllm_dflash_speculator
from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator
from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

import vllm_ascend.worker.v2.spec_decode.dspark.speculator as dspark_module
from vllm_ascend.ascend_config import clear_ascend_config, init_ascend_config
from vllm_ascend.attention.mla_v1 import AscendMLABackend
from vllm_ascend.core.kv_cache_interface import AscendMLAAttentionSpec, AscendSFAIndexerCacheSpec
from vllm_ascend.worker.v2.input_batch import AscendInputBuffers
from vllm_ascend.worker.v2.spec_decode.dflash.speculator import AscendDFlashSpeculator
from vllm_ascend.worker.v2.spec_decode.draft_window import speculator as draft_window
from vllm_ascend.worker.v2.spec_decode.draft_window.groups import classify
from vllm_ascend.worker.v2.spec_decode.draft_window.release import VLLM_0_30_ASCEND
from vllm_ascend.worker.v2.spec_decode.draft_window.window import WindowSpec, window_seq_lens
from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import DraftWindow, Plan
from vllm_ascend.worker.v2.spec_decode.dspark.speculator import AscendDSparkSpeculator

CPU = torch.device("cpu")
BLOCK_SIZE = 16
# Not a multiple of the block size: the window start is rounded down to a block boundary.
WINDOW = 50
MAX_NUM_REQS = 4
MAX_NUM_TOKENS = 64
MAX_MODEL_LEN = 1024
# One request far past the window, one inside it.
TARGET_LENS = [301, 21]


class _HostBuffer:
    """vLLM's staging buffer without pinned memory, which needs an accelerator."""

    def __init__(self, size, dtype):
        self.cpu = torch.zeros(size, dtype=dtype)
        self.np = self.cpu.numpy()

    def uva(self, n=None):
        return self.cpu if n is None else self.cpu[:n]


@pytest.fixture(autouse=True)
def _host_block_tables(monkeypatch):
    # vLLM's BlockTables stages its writes through UVA buffers; plain host tensors here.
    monkeypatch.setattr(buffer_utils, "is_uva_available", lambda: False)
    monkeypatch.setattr(buffer_utils, "NonUvaBuffer", _HostBuffer)


def _block_tables(max_num_reqs: int = MAX_NUM_REQS) -> BlockTables:
    """vLLM's block tables of one group; request ``i``'s column ``c`` holds block ``1000 i + c``."""
    block_tables = BlockTables(
        block_sizes=[BLOCK_SIZE],
        max_num_reqs=max_num_reqs,
        max_num_batched_tokens=MAX_NUM_TOKENS,
        max_num_blocks_per_group=[MAX_MODEL_LEN // BLOCK_SIZE],
        device=CPU,
        kernel_block_sizes=[BLOCK_SIZE],
    )
    table = block_tables.input_block_tables[0]
    rows = torch.arange(max_num_reqs, dtype=torch.int32).unsqueeze(1) * 1000
    table.copy_(rows + torch.arange(table.shape[1], dtype=torch.int32))
    return block_tables


def _window(input_buffers=None, max_num_reqs: int = MAX_NUM_REQS, max_query_len: int = 1) -> DraftWindow:
    """A window of ``WINDOW`` tokens over vLLM's real block tables and input buffers."""
    block_tables = _block_tables(max_num_reqs)
    if input_buffers is None:
        input_buffers = AscendInputBuffers(max_num_reqs, MAX_NUM_TOKENS, CPU)
    window = DraftWindow(
        Plan(WindowSpec.derive(WINDOW, [BLOCK_SIZE]), {0: BLOCK_SIZE}, max_query_len=max_query_len),
        input_buffers,
        block_tables,
        max_num_reqs,
        CPU,
        host_mirror=VLLM_0_30_ASCEND.host_mirror,
    )
    # A check of the builders may be attached to the window (none by default); record the
    # calls it gets.
    window.path_check = MagicMock()
    return window


def _assert_windowed(lengths, windowed, window_size=WINDOW, alignment=BLOCK_SIZE, sinks=0):
    """Each ``windowed[i]`` is what a pass reads of ``lengths[i]`` tokens: the sinks
    ``[0, sinks)`` and ``[start, L)``, where ``start`` is a multiple of ``alignment``, the
    read holds at least the last ``window_size`` tokens (all of them when ``L <= sinks +
    window_size``), and ``start`` is the latest such multiple."""
    lengths, windowed = [int(x) for x in lengths], [int(x) for x in windowed]
    for length, read in zip(lengths, windowed, strict=True):
        skipped = length - read  # the tokens between the sinks and the window
        start = sinks + skipped
        assert 0 <= skipped <= length, (length, read)
        assert skipped % alignment == 0, (length, read)
        if length <= sinks + window_size:
            assert skipped == 0, (length, read)
        elif skipped:
            assert length - start >= window_size, (length, read)
            assert start + alignment > length - window_size, (length, read)
        else:
            # Nothing skipped: a start one block later would cut into the window.
            assert sinks + alignment > length - window_size, (length, read)


# ---- the window's arithmetic ----


@pytest.mark.parametrize("window_size,alignment", [(WINDOW, BLOCK_SIZE), (64, 16), (128, 128), (1, 1), (100, 48)])
def test_window_seq_lens_reads_the_last_window_tokens_from_a_block_boundary(window_size, alignment):
    lengths = torch.arange(0, 400, dtype=torch.int32)
    skip = torch.empty_like(lengths)
    out = torch.empty_like(lengths)

    window_seq_lens(lengths, WindowSpec(window_size, alignment), skip_out=skip, out=out)

    _assert_windowed(lengths, out, window_size, alignment)
    # Without sinks the tokens left out are the window start.
    assert torch.equal(skip, lengths - out)
    assert out[0] == 0


# ---- which draft KV-cache specs are windowed ----


def test_kv_cache_specs_are_windowed_by_their_fields_not_their_class_name():
    mla = {"block_size": BLOCK_SIZE, "num_kv_heads": 1, "head_size": 576, "dtype": torch.bfloat16}
    assert classify(AscendMLAAttentionSpec(**mla))[0]
    # A GLM-family DSpark draft: its query block attends within itself, inside the window.
    assert classify(AscendMLAAttentionSpec(**mla, non_causal_multi_token_decode=True))[0]
    assert not classify(AscendMLAAttentionSpec(**mla, store_on_host=True))[0]
    assert not classify(AscendMLAAttentionSpec(**mla, cache_sparse_sfa_c8=True))[0]
    assert not classify(AscendMLAAttentionSpec(**mla, tokens_per_state=4))[0]
    assert not classify(AscendSFAIndexerCacheSpec(**{**mla, "head_size": 128}))[0]


def test_window_actual_seq_lens_windows_in_place_and_keeps_padded_rows_zero():
    window = _window(max_num_reqs=512)
    lengths = torch.arange(0, 400, dtype=torch.int32)
    lengths[::7] = 0  # padded rows
    expected_zero = lengths == 0
    original = lengths.clone()

    result = window.window_actual_seq_lens(lengths)

    assert result is lengths
    _assert_windowed(original, lengths)
    assert torch.equal(lengths == 0, expected_zero)
    assert window.spec.alignment == BLOCK_SIZE


# ---- vLLM's draft metadata build, recorded ----


def _record_build(seen: dict):
    """vLLM's DraftModelSpeculator._build_attn_metadata, recording what it reads."""

    def build(
        self,
        num_reqs,
        batch_desc,
        query_start_loc_np,
        seq_lens_cpu_upper_bound,
        step,
        causal=True,
        dcp_local_seq_lens=None,
    ):
        seen["input_buffers"] = self.input_buffers
        seen["seq_lens"] = self.input_buffers.seq_lens
        seen["seq_lens_values"] = self.input_buffers.seq_lens[:num_reqs].clone()
        seen["block_tables"] = self.block_tables
        seen["table"] = self.block_tables.input_block_tables[0][:num_reqs].clone()
        seen["upper_bound_values"] = seq_lens_cpu_upper_bound[:num_reqs].clone()
        return {"draft.0": SimpleNamespace()}

    return build


def _build_arguments(step=1, num_reqs=2, query_per_req=1, cg_mode=CUDAGraphMode.NONE) -> dict:
    return dict(
        num_reqs=num_reqs,
        batch_desc=BatchExecutionDescriptor(cg_mode=cg_mode, num_tokens=num_reqs * query_per_req, num_reqs=num_reqs),
        query_start_loc_np=np.arange(num_reqs + 1, dtype=np.int32) * query_per_req,
        seq_lens_cpu_upper_bound=torch.tensor(TARGET_LENS, dtype=torch.int32),
        step=step,
    )


def _build(spec, **kwargs):
    return spec._build_attn_metadata(**_build_arguments(**kwargs))


def _assert_built_through_the_window(seen: dict, window: DraftWindow, step: int):
    """vLLM's build read the window's persistent buffers and a windowed host bound."""
    assert seen["input_buffers"] is window.input_buffers
    assert seen["seq_lens"] is window.seq_lens
    _assert_windowed(TARGET_LENS, seen["seq_lens_values"])
    assert seen["block_tables"] is window.block_tables
    # The cropped table starts at each request's window start.
    starts = [length - int(read) for length, read in zip(TARGET_LENS, seen["seq_lens_values"], strict=True)]
    assert seen["table"][:, 0].tolist() == [1000 * i + s // BLOCK_SIZE for i, s in enumerate(starts)]
    bound = seen["upper_bound_values"]
    # At most the window's longest read once vLLM adds the step, and still a bound.
    assert int(bound.max()) <= window.spec.max_read_len - step
    assert bool((bound + step >= seen["seq_lens_values"]).all())
    # The long request's bound is cut from the target's; the short one's is the target's.
    assert int(bound[0]) < TARGET_LENS[0]
    assert int(bound[1]) == TARGET_LENS[1]


# ---- AscendDFlashSpeculator and AscendDSparkSpeculator ----

QUERY_PER_REQ = 4  # num_speculative_tokens + 1: the query stretch of every DFlash pass


def _dflash_family(cls, window, seen: dict | None = None, monkeypatch=None):
    """A DFlash-family speculator on the window's (or its own) vLLM buffers."""
    spec = object.__new__(cls)
    spec.draft_window = window
    spec.input_buffers = window.input_buffers.base if window else InputBuffers(4, 64, CPU)
    spec.block_tables = window.block_tables.base if window else _block_tables()
    spec.input_buffers.seq_lens[:2] = torch.tensor(TARGET_LENS, dtype=torch.int32)
    spec.draft_max_seq_len = spec.max_model_len = MAX_MODEL_LEN
    spec.attn_groups = [[]]
    spec.kv_cache_config = object()
    spec._group_causal = False
    spec.num_query_per_req = QUERY_PER_REQ
    spec.sample_indices = torch.ones(MAX_NUM_REQS, dtype=torch.int64)
    spec.sample_pos = torch.ones(MAX_NUM_REQS, dtype=torch.int64)
    spec.sample_idx_mapping = torch.zeros(MAX_NUM_REQS, dtype=torch.int32)
    if seen is not None:
        monkeypatch.setattr(DraftModelSpeculator, "_build_attn_metadata", _record_build(seen))
    return spec


def _dflash_window() -> DraftWindow:
    return _window(InputBuffers(MAX_NUM_REQS, MAX_NUM_TOKENS, CPU), max_query_len=QUERY_PER_REQ)


def _recording_query_graphs(spec, seen: dict):
    """The query graph manager upstream's capture hands its buffers to."""

    def capture(fn, input_buffers, block_tables, *args, **kwargs):
        seen["input_buffers"] = input_buffers
        seen["block_tables"] = block_tables
        seen["seq_lens"] = input_buffers.seq_lens

    spec.query_cudagraph_manager = SimpleNamespace(capture=capture)


def _dflash_before_set_attn(monkeypatch) -> AscendDFlashSpeculator:
    spec = object.__new__(AscendDFlashSpeculator)
    spec.vllm_config = SimpleNamespace(cache_config=SimpleNamespace(block_size=BLOCK_SIZE))
    spec.draft_kv_cache_group_ids = [0]
    spec.max_num_tokens = MAX_NUM_TOKENS
    spec.device = CPU
    spec.draft_attn_layer_names = set()
    return spec


def _dspark_before_set_attn(monkeypatch) -> AscendDSparkSpeculator:
    spec = object.__new__(AscendDSparkSpeculator)
    spec.vllm_config = SimpleNamespace(cache_config=SimpleNamespace(block_size=BLOCK_SIZE))
    spec._context_slot_mappings = torch.zeros(1, MAX_NUM_TOKENS, dtype=torch.int64)
    spec.draft_attn_layer_names = set()
    spec.attn_groups = [[]]
    monkeypatch.setattr(AscendDSparkSpeculator, "attn_vllm_config", property(lambda self: self.vllm_config))
    monkeypatch.setattr(dspark_module, "set_current_vllm_config", lambda config: nullcontext())
    monkeypatch.setattr(dspark_module, "_get_graph_update_backend", lambda groups: AscendMLABackend)
    return spec


@pytest.mark.parametrize("before_set_attn", [_dflash_before_set_attn, _dspark_before_set_attn])
def test_dflash_family_set_attn_creates_and_stores_the_draft_window(before_set_attn, monkeypatch):
    spec = before_set_attn(monkeypatch)
    created = object()
    create = MagicMock(return_value=created)
    monkeypatch.setattr(DFlashSpeculator, "set_attn", lambda self, *args: None)
    monkeypatch.setattr(draft_window, "create_draft_window", create)
    # set_attn rebinds vLLM's module-level input prep; restored after the test.
    monkeypatch.setattr(
        vllm_dflash_speculator,
        "prepare_dflash_inputs",
        vllm_dflash_speculator.prepare_dflash_inputs,
    )

    spec.set_attn(object(), SimpleNamespace(kv_cache_groups=[]), object(), object(), [[]])

    create.assert_called_once_with(spec, VLLM_0_30_ASCEND)
    assert spec.draft_window is created


def test_dflash_build_attn_metadata_builds_through_the_window(monkeypatch):
    window, seen = _dflash_window(), {}
    spec = _dflash_family(AscendDFlashSpeculator, window, seen, monkeypatch)

    _build(spec, step=QUERY_PER_REQ, query_per_req=QUERY_PER_REQ)

    _assert_built_through_the_window(seen, window, QUERY_PER_REQ)
    assert spec.input_buffers is window.input_buffers.base


def test_dflash_without_window_is_upstream(monkeypatch):
    seen, captured = {}, {}
    spec = _dflash_family(AscendDFlashSpeculator, None, seen, monkeypatch)
    _recording_query_graphs(spec, captured)

    _build(spec, step=QUERY_PER_REQ, query_per_req=QUERY_PER_REQ)
    spec.capture()

    assert seen["input_buffers"] is spec.input_buffers
    assert seen["block_tables"] is spec.block_tables
    assert seen["upper_bound_values"].tolist() == TARGET_LENS
    assert captured["input_buffers"] is spec.input_buffers
    assert captured["block_tables"] is spec.block_tables


def _dspark(window, monkeypatch, seen: dict | None = None, architecture="MLA"):
    spec = _dflash_family(AscendDSparkSpeculator, window, seen, monkeypatch)
    spec.attn_architecture = architecture
    spec.use_dcp = False
    spec.vllm_config = SimpleNamespace(parallel_config=object())
    monkeypatch.setattr(AscendDSparkSpeculator, "attn_vllm_config", property(lambda self: self.vllm_config))
    return spec


@pytest.mark.parametrize("checked", [True, False])
@pytest.mark.parametrize("cls", [AscendDFlashSpeculator, AscendDSparkSpeculator])
def test_dflash_family_capture_records_the_graphs_on_the_window_buffers(cls, checked, monkeypatch):
    window, seen = _dflash_window(), {}
    check = window.path_check
    if not checked:
        window.path_check = None
    if cls is AscendDSparkSpeculator:
        spec = _dspark(window, monkeypatch)
    else:
        spec = _dflash_family(cls, window)
    _recording_query_graphs(spec, seen)

    spec.capture()

    assert seen["input_buffers"] is window.input_buffers
    assert seen["seq_lens"] is window.seq_lens
    assert seen["block_tables"] is window.block_tables
    if checked:
        check.capture_on.assert_called_once_with(f"{cls.__name__}.capture")
    else:
        check.capture_on.assert_not_called()
    assert spec.input_buffers is window.input_buffers.base


def test_dspark_mla_host_copy_of_the_lengths_is_windowed(monkeypatch):
    window = _dflash_window()
    spec = _dspark(window, monkeypatch)

    seq_lens_cpu, _ = spec._prepare_draft_dcp_metadata_inputs(2, 4, QUERY_PER_REQ)

    _assert_windowed(TARGET_LENS, seq_lens_cpu[:2])
    assert int(seq_lens_cpu[0]) < TARGET_LENS[0]
    assert seq_lens_cpu[2:].tolist() == [0, 0]
    # The draft's own lengths are read, never written.
    assert spec.input_buffers.seq_lens[:2].tolist() == TARGET_LENS


@pytest.mark.parametrize("architecture", ["MLA", "GQA", None])
def test_dspark_build_attn_metadata_builds_through_the_window(monkeypatch, architecture):
    window, seen = _dflash_window(), {}
    spec = _dspark(window, monkeypatch, seen, architecture)
    factory_seen = {}

    def factory(*args, **kwargs):
        factory_seen["seq_lens_cpu"] = kwargs["seq_lens_cpu"]
        return nullcontext()

    monkeypatch.setattr(dspark_module, "build_attn_metadata_wrapper", nullcontext)
    monkeypatch.setattr(dspark_module, "build_attn_metadata_factory", factory)

    _build(spec, step=QUERY_PER_REQ, query_per_req=QUERY_PER_REQ)

    _assert_built_through_the_window(seen, window, QUERY_PER_REQ)
    if architecture == "MLA":
        # The exact host lengths handed to FIA are the device's windowed ones.
        assert factory_seen["seq_lens_cpu"][:2].tolist() == seen["seq_lens_values"].tolist()


def test_dspark_without_window_is_upstream(monkeypatch):
    seen, captured = {}, {}
    spec = _dspark(None, monkeypatch, seen)
    _recording_query_graphs(spec, captured)
    monkeypatch.setattr(dspark_module, "build_attn_metadata_wrapper", nullcontext)
    monkeypatch.setattr(dspark_module, "build_attn_metadata_factory", lambda *a, **k: nullcontext())

    seq_lens_cpu, _ = spec._prepare_draft_dcp_metadata_inputs(2, 4, QUERY_PER_REQ)
    _build(spec, step=QUERY_PER_REQ, query_per_req=QUERY_PER_REQ)
    spec.capture()

    assert seq_lens_cpu.tolist() == [*TARGET_LENS, 0, 0]
    assert seen["input_buffers"] is spec.input_buffers
    assert seen["block_tables"] is spec.block_tables
    assert seen["upper_bound_values"].tolist() == TARGET_LENS
    assert captured["input_buffers"] is spec.input_buffers
    assert captured["block_tables"] is spec.block_tables


# ---- additional_config keys ----


def _vllm_config(additional_config: dict, speculative: bool = False) -> VllmConfig:
    """A bare config with the model metadata AscendConfig reads (as test_ascend_config.py)."""
    with patch("vllm_ascend.platform.NPUPlatform.check_and_update_config"):
        config = VllmConfig()
    config.model_config = SimpleNamespace(
        is_moe=False,
        is_deepseek_mla=False,
        use_mla=False,
        enforce_eager=True,
        architectures=[],
        hf_text_config=SimpleNamespace(),
        get_total_num_kv_heads=lambda: 0,
        get_num_experts=lambda: 0,
        get_hidden_size=lambda: 0,
    )
    if speculative:
        config.speculative_config = SimpleNamespace(
            method="eagle3", num_speculative_tokens=3, num_speculative_tokens_per_batch_size=None
        )
    config.additional_config = additional_config
    return config


@pytest.fixture
def _clean_ascend_config():
    yield
    clear_ascend_config()


@pytest.mark.usefixtures("_clean_ascend_config")
def test_ascend_config_accepts_a_number_of_tokens_for_the_window_size():
    config = init_ascend_config(_vllm_config({"draft_window_size": 4096}))

    assert config.draft_window_size == 4096


@pytest.mark.usefixtures("_clean_ascend_config")
@pytest.mark.parametrize("value", ["Auto", "auto ", "big"])
def test_ascend_config_rejects_any_other_word_for_the_window_size(value):
    with pytest.raises(ValueError, match="draft_window_size"):
        init_ascend_config(_vllm_config({"draft_window_size": value}))
