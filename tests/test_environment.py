# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The ground this project stands on: vLLM's Model Runner V2 as installed (0.33.0 in .venv,
0.34.0 in .venv-034).

These fail loudly when a vLLM upgrade moves something the window relies on.
"""

import inspect

import numpy as np
import pytest
import torch
import vllm
from vllm.v1.attention.backends.utils import PAD_SLOT_ID
from vllm.v1.worker.gpu.block_table import BlockTables
from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor
from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator
from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator
from vllm.v1.worker.gpu.spec_decode.eagle.speculator import EagleSpeculator
from vllm.v1.worker.gpu.spec_decode.mtp.speculator import MTPSpeculator
from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

from testbed.buffers import Mrv2Batch
from testbed.vllm_line import RELEASE

SPECULATORS = [DFlashSpeculator, DSparkSpeculator, EagleSpeculator, MTPSpeculator]


def test_vllm_is_the_release_the_environment_is_built_for():
    expected = {"vLLM 0.33.x": "0.33.0", "vLLM 0.34.x": "0.34.0"}[RELEASE.name]
    assert vllm.__version__ == expected, vllm.__version__


@pytest.mark.parametrize("cls", SPECULATORS, ids=lambda c: c.__name__)
def test_speculators_are_draft_model_speculators(cls):
    assert issubclass(cls, DraftModelSpeculator)


def test_dspark_subclasses_dflash():
    assert issubclass(DSparkSpeculator, DFlashSpeculator)


def test_build_attn_metadata_has_the_parameters_the_window_relies_on():
    params = inspect.signature(DraftModelSpeculator._build_attn_metadata).parameters
    assert list(params) == [
        "self",
        "num_reqs",
        "batch_desc",
        "query_start_loc_np",
        "seq_lens_cpu_upper_bound",
        "step",
        "causal",
        "dcp_local_seq_lens",
        "slot_mappings",
    ]


def test_build_uniform_attn_metadata_has_the_parameters_the_window_relies_on():
    params = inspect.signature(DraftModelSpeculator._build_uniform_attn_metadata).parameters
    assert list(params) == [
        "self",
        "batch_desc",
        "num_reqs",
        "num_query_per_req",
        "seq_lens_cpu_upper_bound",
        "step",
        "causal",
        "dcp_local_seq_lens",
    ]


@pytest.mark.parametrize("cls", SPECULATORS, ids=lambda c: c.__name__)
def test_no_speculator_overrides_the_choke_point(cls):
    """Every speculator builds through DraftModelSpeculator's methods."""
    for name in ("_build_attn_metadata", "_build_uniform_attn_metadata"):
        assert getattr(cls, name) is getattr(DraftModelSpeculator, name), (cls, name)


def test_uniform_build_forwards_to_build_attn_metadata():
    """`_build_uniform_attn_metadata` only adds uniform query offsets and forwards."""
    speculator = object.__new__(DSparkSpeculator)
    speculator.arange_np = np.arange(9, dtype=np.int32)
    calls = []
    speculator._build_attn_metadata = lambda **kwargs: calls.append(kwargs) or {"ok": 1}
    bound = torch.tensor([10, 20, 30], dtype=torch.int32)
    desc = BatchExecutionDescriptor(cg_mode=None, num_tokens=12, num_reqs=4)
    result = speculator._build_uniform_attn_metadata(
        batch_desc=desc,
        num_reqs=3,
        num_query_per_req=4,
        seq_lens_cpu_upper_bound=bound,
        step=4,
        causal=False,
    )
    assert result == {"ok": 1}
    (call,) = calls
    assert call["query_start_loc_np"].tolist() == [0, 4, 8, 12]
    assert call["num_reqs"] == 3 and call["batch_desc"] is desc and call["step"] == 4
    assert call["seq_lens_cpu_upper_bound"] is bound and call["causal"] is False


def test_block_table_columns_are_kv_cache_manager_blocks():
    """0.33.0 (and 0.34.0, whose block_table.py is the same file) keep one block size per
    group and no kernel block sizes in BlockTables."""
    params = inspect.signature(BlockTables.__init__).parameters
    assert "block_sizes" in params and "kernel_block_sizes" not in params


@pytest.mark.parametrize("fixture", ["one_group_batch", "two_group_batch"])
def test_fixture_buffers_have_the_documented_shapes_and_dtypes(fixture, request):
    batch: Mrv2Batch = request.getfixturevalue(fixture)
    bt, ib = batch.block_tables, batch.input_buffers
    max_num_reqs = bt.max_num_reqs
    assert bt.block_sizes == batch.block_sizes
    for g, b in enumerate(bt.block_sizes):
        table = bt.input_block_tables[g]
        assert table.dtype == torch.int32
        assert table.shape[0] == max_num_reqs
        assert table.shape[1] * b >= batch.max_model_len and table.shape[1] * b % 128 == 0
    assert bt.slot_mappings.dtype == torch.int64
    assert tuple(bt.slot_mappings.shape) == (len(bt.block_sizes), bt.max_num_batched_tokens)
    assert ib.seq_lens.dtype == torch.int32 and tuple(ib.seq_lens.shape) == (max_num_reqs,)
    assert ib.query_start_loc.dtype == torch.int32
    assert tuple(ib.query_start_loc.shape) == (max_num_reqs + 1,)
    assert ib.positions.dtype == torch.int64


@pytest.mark.parametrize("fixture", ["one_group_batch", "two_group_batch"])
def test_fixture_buffers_hold_what_the_kernels_write(fixture, request):
    batch: Mrv2Batch = request.getfixturevalue(fixture)
    bt, ib, q = batch.block_tables, batch.input_buffers, batch.query_lens[0]
    n, n_pad = batch.num_reqs, batch.num_reqs_padded
    assert ib.seq_lens[:n].tolist() == batch.seq_lens.tolist()
    assert not ib.seq_lens[n:n_pad].any()  # padded rows read nothing
    assert ib.query_start_loc[: n_pad + 1].tolist() == [min(i, n) * q for i in range(n_pad + 1)]
    for g, b in enumerate(bt.block_sizes):
        for i in range(n):
            ids = batch.req_block_ids[g][i]
            assert bt.input_block_tables[g][i, : len(ids)].tolist() == ids
            # Slots are absolute: the block holding each query position, at its offset.
            for t in range(i * q, (i + 1) * q):
                pos = int(ib.positions[t])
                assert int(bt.slot_mappings[g, t]) == ids[pos // b] * b + pos % b
        assert not bt.input_block_tables[g][n:n_pad].any()
        assert bool((bt.slot_mappings[g, batch.num_tokens :] == PAD_SLOT_ID).all())
