# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Unit tests for the MRV2 draft KV window in vllm-ascend's autoregressive (EAGLE/EAGLE3) speculator: each
call site hands its callee the window's buffers and windowed lengths, and behaves as before when the window is off.
"""

from contextlib import nullcontext
from types import SimpleNamespace
from unittest.mock import MagicMock

import numpy as np
import pytest
import torch
from vllm.config.compilation import CUDAGraphMode
from vllm.v1.worker.gpu.spec_decode.autoregressive import speculator as vllm_ar_speculator
from vllm.v1.worker.gpu.spec_decode.autoregressive.speculator import AutoRegressiveSpeculator
from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

import vllm_ascend.worker.v2.spec_decode.autoregressive.speculator as ar_module
from tests.ut.worker.v2.spec_decode.draft_window.test_draft_window import (
    CPU,
    MAX_MODEL_LEN,
    MAX_NUM_REQS,
    MAX_NUM_TOKENS,
    TARGET_LENS,
    _assert_built_through_the_window,
    _assert_windowed,
    _block_tables,
    _build,
    _build_arguments,
    _host_block_tables,  # noqa: F401
    _record_build,
    _window,
)
from vllm_ascend.attention.attention_v1 import AscendAttentionBackend, AscendAttentionState
from vllm_ascend.worker.v2.input_batch import AscendInputBuffers
from vllm_ascend.worker.v2.spec_decode.autoregressive.speculator import (
    AscendAutoRegressiveSpeculator,
)
from vllm_ascend.worker.v2.spec_decode.draft_window import autoregressive as draft_window_ar
from vllm_ascend.worker.v2.spec_decode.draft_window import speculator as draft_window
from vllm_ascend.worker.v2.spec_decode.draft_window.release import VLLM_0_30_ASCEND


def _ar_speculator(window) -> AscendAutoRegressiveSpeculator:
    spec = object.__new__(AscendAutoRegressiveSpeculator)
    spec.draft_window = window
    spec.max_model_len = MAX_MODEL_LEN
    spec.replicated_pcp = False
    return spec


def _ar_build_speculator(monkeypatch, window, seen: dict, use_dcp=False):
    """A speculator whose _build_attn_metadata runs with vLLM's build recorded."""
    input_buffers = window.input_buffers.base if window else AscendInputBuffers(4, 64, CPU)
    block_tables = window.block_tables.base if window else _block_tables()
    input_buffers.seq_lens[:2] = torch.tensor(TARGET_LENS, dtype=torch.int32)
    spec = _ar_speculator(window)
    spec.input_buffers = input_buffers
    spec.block_tables = block_tables
    spec.draft_max_seq_len = MAX_MODEL_LEN
    spec.attn_groups = [[]]
    spec.input_batch = SimpleNamespace(is_prefilling_np=np.zeros(2, dtype=bool))
    spec.model_state = object()
    spec.use_dcp = use_dcp
    spec.draft_vllm_config = SimpleNamespace(parallel_config=None)
    spec._sparse_kv_offload_metadata = SimpleNamespace(build_kwargs=lambda *args: None)
    spec._update_decode_attn_metadata = MagicMock()

    def factory(*args, **kwargs):
        seen["factory_seq_lens_cpu"] = kwargs["seq_lens_cpu"]
        return nullcontext()

    monkeypatch.setattr(ar_module, "build_attn_metadata_factory", factory)
    monkeypatch.setattr(DraftModelSpeculator, "_build_attn_metadata", _record_build(seen))
    return spec


def test_ar_set_attn_creates_and_stores_the_draft_window(monkeypatch):
    spec = _ar_speculator(None)
    spec.vllm_config = SimpleNamespace()
    spec.attn_groups = [[]]
    created = object()
    create = MagicMock(return_value=created)
    monkeypatch.setattr(AutoRegressiveSpeculator, "set_attn", lambda self, *args: None)
    monkeypatch.setattr(ar_module, "set_current_vllm_config", lambda config: nullcontext())
    monkeypatch.setattr(ar_module, "_get_graph_update_backend", lambda groups: AscendAttentionBackend)
    monkeypatch.setattr(draft_window, "create_draft_window", create)

    spec.set_attn(object(), object(), object(), object(), [[]])

    create.assert_called_once_with(spec, VLLM_0_30_ASCEND)
    assert spec.draft_window is created
    assert spec.attn_architecture == "GQA"


class _Manager:
    def __init__(self, vllm_config, device, cudagraph_mode, *args, **kwargs):
        self.cudagraph_mode = cudagraph_mode
        self.made_with = (vllm_config, device, cudagraph_mode, args, kwargs)


def _ar_graph_speculator(monkeypatch, window) -> AscendAutoRegressiveSpeculator:
    monkeypatch.setattr(vllm_ar_speculator, "SpeculatorCudaGraphManager", _Manager)
    spec = _ar_speculator(window)
    spec.speculative_config = SimpleNamespace(enforce_eager=False)
    spec.vllm_config = SimpleNamespace()
    spec.device = CPU
    spec.num_speculative_steps = 3
    spec.update_stream = object()
    return spec


@pytest.mark.parametrize(
    "mode,prefill_mode",
    [
        (CUDAGraphMode.FULL_AND_PIECEWISE, CUDAGraphMode.PIECEWISE),
        (CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.NONE),
    ],
)
def test_ar_init_cudagraph_manager_drops_full_graphs_from_the_prefill_only(monkeypatch, mode, prefill_mode):
    spec = _ar_graph_speculator(monkeypatch, _window())

    spec.init_cudagraph_manager(mode)

    assert spec.prefill_cudagraph_manager.cudagraph_mode == prefill_mode
    assert spec.decode_cudagraph_manager.cudagraph_mode == CUDAGraphMode.FULL_DECODE_ONLY
    assert spec.prefill_cudagraph_manager.speculator is spec
    assert spec.decode_cudagraph_manager.speculator is spec


def _ar_capture_speculator(monkeypatch, window, seen: dict) -> AscendAutoRegressiveSpeculator:
    spec = _ar_speculator(window)
    spec.input_buffers = window.input_buffers.base if window else AscendInputBuffers(4, 64, CPU)
    spec.block_tables = window.block_tables.base if window else _block_tables()
    spec.target_input_buffers = AscendInputBuffers(MAX_NUM_REQS, MAX_NUM_TOKENS, CPU)
    spec.last_token_indices = torch.ones(MAX_NUM_REQS, dtype=torch.int64)
    spec.num_speculative_steps = 3
    spec.model_state = object()
    spec.attn_groups = spec.target_attn_groups = [[]]
    spec.kv_cache_config = object()
    monkeypatch.setattr(ar_module, "disable_target_pcp_for_replicated_draft", lambda s: nullcontext())
    monkeypatch.setattr(ar_module, "build_attn_metadata_wrapper", nullcontext)

    def capture_prefill(fn, model_state, input_buffers, block_tables, *args, **kwargs):
        seen["prefill_capturing"] = window.propose.capturing if window else None
        seen["prefill_input_buffers"] = input_buffers
        seen["prefill_graph_inputs"] = (model_state, input_buffers, block_tables, *args)

    def capture_decode(fn, model_state, input_buffers, block_tables, *args, **kwargs):
        seen["decode_graph_inputs"] = (model_state, input_buffers, block_tables, *args)
        seen["decode_input_buffers"] = input_buffers
        seen["decode_block_tables"] = block_tables
        seen["decode_path"] = list(window.path) if window else None

    spec.prefill_cudagraph_manager = SimpleNamespace(use_breakable_cg=False, capture=capture_prefill)
    spec.decode_cudagraph_manager = SimpleNamespace(capture=capture_decode)
    return spec


@pytest.mark.parametrize("checked", [True, False])
def test_ar_capture_records_the_decode_graphs_on_the_window_buffers(monkeypatch, checked):
    window, seen = _window(), {}
    check = window.path_check
    if not checked:
        window.path_check = None
    spec = _ar_capture_speculator(monkeypatch, window, seen)

    spec.capture()

    decode = "AscendAutoRegressiveSpeculator.capture (decode)"
    assert seen["decode_input_buffers"] is window.input_buffers
    assert seen["decode_block_tables"] is window.block_tables
    assert seen["decode_path"] == [decode]
    if checked:
        check.capture_on.assert_called_once_with(decode)
    else:
        check.capture_on.assert_not_called()
    # The prefill graphs are captured on the target's buffers, with the prefill marked as
    # a capture's (its metadata is the target's dummy one).
    assert seen["prefill_capturing"] is True
    assert seen["prefill_input_buffers"] is spec.target_input_buffers
    assert spec.draft_window.propose.capturing is False


def _ar_prefill_speculator(monkeypatch, window, received: dict):
    spec = _ar_speculator(window)
    spec.input_batch = SimpleNamespace(num_reqs=2)
    spec.draft_attn_layer_names = {"draft.0"}

    def prefill(self, num_reqs, num_tokens, attn_metadata, *args, **kwargs):
        received["attn_metadata"] = attn_metadata

    monkeypatch.setattr(AutoRegressiveSpeculator, "_prefill", prefill)
    return spec


def test_ar_prefill_hands_upstream_the_windowed_metadata(monkeypatch):
    window, received = _window(), {}
    spec = _ar_prefill_speculator(monkeypatch, window, received)
    draft_metadata, target_only = object(), object()
    windowed = {"draft.0": object()}
    prefill_attn_metadata = MagicMock(return_value=windowed)
    monkeypatch.setattr(draft_window_ar, "prefill_attn_metadata", prefill_attn_metadata)

    spec._prefill(2, 16, {"draft.0": draft_metadata, "target.0": target_only}, None, None)

    prefill_attn_metadata.assert_called_once_with(
        spec,
        window,
        spec.input_batch,
        {"draft.0": draft_metadata},
        16,
        "AscendAutoRegressiveSpeculator._prefill",
        VLLM_0_30_ASCEND,
    )
    assert received["attn_metadata"] is windowed


def test_ar_prefill_during_capture_keeps_the_target_metadata(monkeypatch):
    window, received = _window(), {}
    spec = _ar_prefill_speculator(monkeypatch, window, received)
    prefill_attn_metadata = MagicMock()
    monkeypatch.setattr(draft_window_ar, "prefill_attn_metadata", prefill_attn_metadata)
    draft_metadata = object()
    spec.draft_window.propose.capturing = True

    spec._prefill(2, 16, {"draft.0": draft_metadata, "target.0": object()}, None, None)

    prefill_attn_metadata.assert_not_called()
    assert received["attn_metadata"] == {"draft.0": draft_metadata}


@pytest.mark.parametrize("step", [1, 2])
def test_ar_build_attn_metadata_builds_through_the_window(monkeypatch, step):
    window, seen = _window(), {}
    spec = _ar_build_speculator(monkeypatch, window, seen)

    metadata = _build(spec, step=step)

    _assert_built_through_the_window(seen, window, step)
    assert metadata["draft.0"].attn_state == AscendAttentionState.DecodeOnly
    # The speculator's own buffers are back once the build is done.
    assert spec.input_buffers is window.input_buffers.base
    assert spec.block_tables is window.block_tables.base


def test_ar_calc_next_seq_lens_cpu_is_windowed():
    spec = _ar_speculator(_window())
    spec.max_model_len = 300
    seq_lens_cpu = torch.tensor([299, 150, 20, 77], dtype=torch.int32)

    result = spec._calc_next_seq_lens_cpu(seq_lens_cpu, num_reqs=3, num_reqs_padded=4, step=2)

    # Each request's next length (clamped at max_model_len), read through the window.
    _assert_windowed([300, 152, 22], result[:3])
    assert int(result[0]) < 300
    assert int(result[3]) == 0
    assert seq_lens_cpu.tolist() == [299, 150, 20, 77]


def _fia_speculator(window) -> AscendAutoRegressiveSpeculator:
    spec = _ar_speculator(window)
    spec.use_dcp = False
    spec.num_speculative_steps = 3
    spec.input_batch = SimpleNamespace(num_reqs=2, seq_lens_np=np.array(TARGET_LENS))
    spec.draft_attn_layer_names = ["draft.0", "draft.1"]
    return spec


def test_ar_build_fia_params_windows_each_decode_step():
    spec = _fia_speculator(_window())
    block_table = torch.zeros(4, 8, dtype=torch.int32)
    metadata = {"draft.0": SimpleNamespace(block_tables=block_table)}

    params = spec.build_fia_params(4, metadata, False)

    # Steps 1 and 2 of the decode graph, each for both draft layers.
    assert [p["layer_name"] for p in params] == ["draft.0", "draft.1"] * 2
    for index, param in enumerate(params):
        step = 1 + index // 2
        lengths = param["actual_seq_lengths_kv"]
        _assert_windowed([length + step for length in TARGET_LENS], lengths[:2])
        assert lengths[0] < TARGET_LENS[0] + step
        assert lengths[2:] == [0, 0]
        assert param["block_table"] is block_table


def test_ar_without_window_lengths_are_upstreams():
    spec = _fia_speculator(None)
    block_table = torch.zeros(4, 8, dtype=torch.int32)

    params = spec.build_fia_params(4, {"draft.0": SimpleNamespace(block_tables=block_table)}, False)
    next_lens = spec._calc_next_seq_lens_cpu(torch.tensor([299, 20, 5]), 2, 3, 2)

    assert [p["actual_seq_lengths_kv"] for p in params] == [[302, 22, 0, 0]] * 2 + [[303, 23, 0, 0]] * 2
    assert next_lens.tolist() == [301, 22, 0]


class _RecordingBuilder:
    """An attention backend's metadata builder keeping the common metadata vLLM hands it."""

    def __init__(self):
        self.common = []

    def build(self, common_prefix_len, common_attn_metadata, **kwargs):
        self.common.append(
            {
                name: value.clone() if isinstance(value, torch.Tensor) else value
                for name, value in vars(common_attn_metadata).items()
            }
        )
        return SimpleNamespace()


def _assert_same_common_metadata(built, reference):
    assert built.keys() == reference.keys()
    for name, value in reference.items():
        if isinstance(value, torch.Tensor):
            assert built[name].dtype == value.dtype and torch.equal(built[name], value), name
        else:
            assert built[name] == value, name


def test_ar_without_window_builds_and_graphs_are_upstreams(monkeypatch):
    """Without the window the speculator hands vLLM's own draft build, graph managers and
    captures what vLLM's code gives them: the common metadata its build hands a backend's
    builder (each decode step's lengths, bound, tables and slots) is that of vLLM's
    ``_build_attn_metadata`` called with the same arguments, as upstream's override calls
    it; the graph managers of every mode are those vLLM's ``init_cudagraph_manager`` makes;
    the graphs capture on the inputs vLLM's ``capture`` hands them."""
    vllm_build = DraftModelSpeculator._build_attn_metadata
    spec = _ar_build_speculator(monkeypatch, None, {})
    monkeypatch.setattr(DraftModelSpeculator, "_build_attn_metadata", vllm_build)
    builder = _RecordingBuilder()
    group = SimpleNamespace(get_metadata_builder=lambda i: builder, layer_names=["draft.0"])
    spec.attn_groups = [[group]]
    spec.kv_cache_config = SimpleNamespace(kv_cache_groups=[object()])
    spec.draft_is_prefilling = torch.zeros(MAX_NUM_REQS, dtype=torch.bool)
    for step in (1, 2):
        assert list(spec._build_attn_metadata(**_build_arguments(step=step))) == ["draft.0"]
        vllm_build(spec, **_build_arguments(step=step))
        built, reference = builder.common[-2:]
        _assert_same_common_metadata(built, reference)
        assert reference["seq_lens_cpu_upper_bound"].tolist() == [n + step for n in TARGET_LENS]

    graphs = _ar_graph_speculator(monkeypatch, None)
    for mode in CUDAGraphMode:
        AutoRegressiveSpeculator.init_cudagraph_manager(graphs, mode)
        upstream = graphs.prefill_cudagraph_manager, graphs.decode_cudagraph_manager
        graphs.init_cudagraph_manager(mode)
        assert graphs.prefill_cudagraph_manager.made_with == upstream[0].made_with, mode
        assert graphs.decode_cudagraph_manager.made_with == upstream[1].made_with, mode

    captured = {}
    capture = _ar_capture_speculator(monkeypatch, None, captured)
    capture.idx_mapping = torch.zeros(MAX_NUM_REQS, dtype=torch.int32)
    capture.max_num_reqs = MAX_NUM_REQS
    capture.use_fused_multi_step_decode = False
    capture.capture()
    ours = dict(captured)
    AutoRegressiveSpeculator.capture(capture)
    for graph in ("prefill_graph_inputs", "decode_graph_inputs"):
        theirs = captured[graph]
        assert len(ours[graph]) == len(theirs), graph
        assert all(a is b for a, b in zip(ours[graph], theirs, strict=True)), graph

    received = {}
    prefill = _ar_prefill_speculator(monkeypatch, None, received)
    prefill_attn_metadata = MagicMock()
    monkeypatch.setattr(draft_window_ar, "prefill_attn_metadata", prefill_attn_metadata)
    draft_metadata = object()
    prefill._prefill(2, 16, {"draft.0": draft_metadata, "target.0": object()}, None, None)
    prefill_attn_metadata.assert_not_called()
    assert received["attn_metadata"] == {"draft.0": draft_metadata}
