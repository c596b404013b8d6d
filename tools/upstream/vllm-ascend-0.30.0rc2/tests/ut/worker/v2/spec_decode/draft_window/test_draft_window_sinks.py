# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Unit tests for the draft KV window's attention sinks (``draft_attention_sinks``) and
threshold (``draft_window_min_context``): a windowed read keeps the first tokens of each
request besides its window, a request shorter than the threshold is read whole, and both
keys are validated through ``init_ascend_config``."""

import pytest
import torch

from tests.ut.worker.v2.spec_decode.draft_window.test_draft_window import (
    BLOCK_SIZE,
    CPU,
    MAX_NUM_REQS,
    WINDOW,
    _assert_windowed,
    _block_tables,
    _clean_ascend_config,  # noqa: F401
    _host_block_tables,  # noqa: F401
    _vllm_config,
)
from vllm_ascend.ascend_config import init_ascend_config
from vllm_ascend.worker.v2.input_batch import AscendInputBuffers
from vllm_ascend.worker.v2.spec_decode.draft_window.window import WindowSpec, window_seq_lens
from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import DraftWindow, Plan


def test_window_seq_lens_keeps_the_attention_sinks():
    lengths = torch.arange(0, 400, dtype=torch.int32)
    out = torch.empty_like(lengths)
    spec = WindowSpec(WINDOW, BLOCK_SIZE, sink_size=32)

    window_seq_lens(lengths, spec, skip_out=torch.empty_like(lengths), out=out)

    _assert_windowed(lengths, out, sinks=32)
    assert int(out[-1]) > 32 + WINDOW  # past the window, the sinks are still read


def test_the_window_reads_the_sinks_and_the_last_tokens_from_the_threshold_on():
    block_tables = _block_tables()
    # 20 sinks become 32 (whole blocks); the threshold 200 is above S + W + a = 98.
    spec = WindowSpec.derive(WINDOW, [BLOCK_SIZE], sink_tokens=20, min_context=200)
    plan = Plan(spec, {0: BLOCK_SIZE}, sink_tokens=20)
    assert (plan.spec.sink_size, plan.spec.min_context) == (32, 200)
    input_buffers = AscendInputBuffers(MAX_NUM_REQS, 64, CPU)
    window = DraftWindow(plan, input_buffers, block_tables, MAX_NUM_REQS, CPU)
    lengths = [301, 200, 199, 21]
    input_buffers.seq_lens[:4] = torch.tensor(lengths, dtype=torch.int32)

    window.refresh(4)

    read = window.seq_lens[:4].tolist()
    _assert_windowed(lengths[:2], read[:2], sinks=32)
    assert read[2:] == lengths[2:]  # below the threshold: the whole context
    # The cropped table: the sink blocks, then the window's from the block of its start.
    start = 32 + lengths[0] - read[0]
    table = window.block_tables.input_block_tables[0][0].tolist()
    needed = -(-read[0] // BLOCK_SIZE)
    expected = [0, 1, *range(start // BLOCK_SIZE, start // BLOCK_SIZE + needed - 2)]
    assert table[:needed] == expected
    assert not any(table[needed:])


@pytest.mark.usefixtures("_clean_ascend_config")
def test_ascend_config_accepts_the_window_keys():
    config = init_ascend_config(
        _vllm_config(
            {
                "draft_window_size": 4096,
                "draft_attention_sinks": 64,
                "draft_window_min_context": "8192",
            }
        )
    )

    assert config.draft_window_size == 4096
    assert config.draft_attention_sinks == 64
    assert config.draft_window_min_context == 8192


@pytest.mark.usefixtures("_clean_ascend_config")
@pytest.mark.parametrize("key", ["draft_attention_sinks", "draft_window_min_context"])
@pytest.mark.parametrize("value", [-1, "abc", True])
def test_ascend_config_rejects_a_bad_window_key(key, value):
    with pytest.raises(ValueError, match=key):
        init_ascend_config(_vllm_config({"draft_window_size": 64, key: value}))


@pytest.mark.usefixtures("_clean_ascend_config")
@pytest.mark.parametrize("key", ["draft_attention_sinks", "draft_window_min_context"])
def test_a_window_key_needs_the_window(key):
    with pytest.raises(ValueError, match=rf'{key}.*needs additional_config\["draft_window_size"\]'):
        init_ascend_config(_vllm_config({key: 64}))


@pytest.mark.usefixtures("_clean_ascend_config")
@pytest.mark.parametrize("v2", [False, True])
def test_attention_sinks_need_model_runner_v2(monkeypatch, v2):
    config = _vllm_config({"draft_window_size": 64, "draft_attention_sinks": 32}, speculative=True)
    # Read by VllmConfig.use_v2_model_runner (set once the config is built: MRV2 needs Triton).
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1" if v2 else "0")
    assert config.use_v2_model_runner is v2

    if v2:
        assert init_ascend_config(config).draft_attention_sinks == 32
    else:
        with pytest.raises(ValueError, match="VLLM_USE_V2_MODEL_RUNNER"):
            init_ascend_config(config)
