# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Unit tests for the draft KV window under decode context parallelism: the global lengths are
windowed before vllm-ascend splits them per rank, and a rank's share of a windowed length is
the count of its own tokens in the read."""

from types import SimpleNamespace
from unittest.mock import MagicMock

import pytest
import torch

from tests.ut.worker.v2.spec_decode.draft_window.test_draft_window import (
    CPU,
    MAX_NUM_REQS,
    MAX_NUM_TOKENS,
    QUERY_PER_REQ,
    TARGET_LENS,
    _assert_windowed,
    _build,
    _dflash_window,
    _dspark,
    _host_block_tables,  # noqa: F401
    _window,
)
from tests.ut.worker.v2.spec_decode.draft_window.test_draft_window_eagle import _ar_build_speculator
from vllm_ascend.worker.v2.input_batch import AscendInputBuffers
from vllm_ascend.worker.v2.spec_decode.draft_window.dcp import DcpLayout, dcp_local_lengths
from vllm_ascend.worker.v2.spec_decode.draft_window.window import WindowSpec, window_seq_lens


@pytest.mark.parametrize("cp_size,interleave,block_size", [(2, 1, 16), (4, 16, 16), (8, 4, 32)])
def test_a_ranks_share_is_its_own_tokens_of_the_windowed_read(cp_size, interleave, block_size):
    # The window starts on a column of the sharded table: cp_size * block_size tokens.
    spec = WindowSpec(100, cp_size * block_size)
    lengths = torch.arange(0, 700, dtype=torch.int32)
    windowed = torch.empty_like(lengths)
    window_seq_lens(lengths, spec, skip_out=torch.empty_like(lengths), out=windowed)
    starts = (lengths - windowed).tolist()
    assert max(starts) > 0
    for rank in range(cp_size):
        layout = DcpLayout(cp_size, rank, interleave, (True,))
        out = dcp_local_lengths(windowed, layout, scratch=torch.empty_like(lengths), out=torch.empty_like(lengths))
        # Token p of a request lives on rank (p // interleave) % cp_size; the rank reads its own
        # tokens of [start, L).
        owned = [
            sum(1 for p in range(start, length) if (p // interleave) % cp_size == rank)
            for start, length in zip(starts, lengths.tolist(), strict=True)
        ]
        assert out.tolist() == owned


def test_ar_build_attn_metadata_windows_the_dcp_lengths(monkeypatch):
    window, seen = _window(), {}
    spec = _ar_build_speculator(monkeypatch, window, seen, use_dcp=True)
    spec.target_input_buffers = AscendInputBuffers(MAX_NUM_REQS, MAX_NUM_TOKENS, CPU)
    # The DCP manager's global lengths of the step: the target's plus the step.
    actual = torch.tensor([length + 1 for length in TARGET_LENS] + [0, 0], dtype=torch.int32)
    prepare = MagicMock(return_value=(actual.clone(), torch.zeros(4, dtype=torch.bool)))
    spec.dcp_manager = SimpleNamespace(prepare_draft_dcp_metadata_inputs=prepare)

    _build(spec, step=1)

    handed = seen["factory_seq_lens_cpu"]
    _assert_windowed(actual, handed)
    assert int(handed[0]) < int(actual[0])
    assert handed[2:].tolist() == [0, 0]


def test_dspark_dcp_lengths_are_windowed(monkeypatch):
    spec = _dspark(_dflash_window(), monkeypatch)
    spec.use_dcp = True
    spec.target_input_buffers = SimpleNamespace(seq_lens_cpu=object())
    lengths = torch.tensor([*TARGET_LENS, 0, 0], dtype=torch.int32)
    prepare = MagicMock(return_value=(lengths.clone(), torch.zeros(4, dtype=torch.bool)))
    spec.dcp_manager = SimpleNamespace(prepare_draft_dcp_metadata_inputs=prepare)

    seq_lens_cpu, _ = spec._prepare_draft_dcp_metadata_inputs(2, 4, QUERY_PER_REQ)

    _assert_windowed(lengths, seq_lens_cpu)
    assert int(seq_lens_cpu[0]) < TARGET_LENS[0]
