# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""EAGLE and EAGLE3 on the Ascend pairing: the installed vllm-ascend release's own
``AscendEagleSpeculator`` on its vLLM's ``AutoRegressiveSpeculator``, through vllm-ascend's
real GQA metadata builder and its own host-length code.

For a draft decode step vllm-ascend tells FIA the target's length plus the step
(``_calc_next_seq_lens_cpu``: the rejected tokens included) as ``seq_lens_list``, and, for a
FULL ACL graph replay, the same per step as ``actual_seq_lengths_kv`` (``build_fia_params``).
The window takes its start from that actual length on both sides, so what FIA is told and the
cropped table always describe the same tokens: checked at every step, eager and FULL, with
rejections, padded batches and two block sizes, by the reference paged attention against
dense attention over exactly the window of the actual length. The draft prefill goes through
vllm-ascend's ``AscendModelState.prepare_attn`` and must leave the model state as it was.
"""

import dataclasses
import re

import numpy as np
import pytest
import torch
from vllm.config import set_current_vllm_config
from vllm.config.compilation import CUDAGraphMode

from testbed.reference import (
    dense_attention,
    positions_read,
)
from tests.ascend.npu_testbed.compat import fia_params_before_replay
from tests.ascend.npu_testbed.eagle import (
    MAX_NUM_REQS,
    TARGET_LENS,
    W,
    assert_fia_reads_the_window_of_the_told_length,
    at_step,
    build,
    draft_prefill_seen,
    full_graph_params,
    refused,
    setup_decode,
)
from tests.ascend.npu_testbed.pairing import draft_build_path, installed_release
from tests.ascend.npu_testbed.wiring import (
    HEAD_SIZE,
    MAX_MODEL_LEN,
    NUM_KV_HEADS,
)

pytestmark = pytest.mark.usefixtures("registered")


@pytest.mark.parametrize(
    ("method", "block_size", "num_spec", "min_context"),
    [
        *[(m, b, k, 0) for m in ("eagle", "eagle3") for b in (16, 128) for k in (2, 4)],
        # Actual lengths 256 -> 258 and 255 -> 258 cross the threshold between steps.
        ("eagle3", 128, 4, 258),
        ("eagle", 16, 4, 258),
    ],
)
def test_every_eager_decode_step_reads_the_window_of_what_fia_is_told(
    method, block_size, num_spec, min_context, model_dir
):
    additional = {"draft_window_size": W, "draft_window_min_context": min_context}
    d = setup_decode(model_dir, method, block_size, num_spec, additional)
    assert d.s.draft_window.spec.min_context == min_context
    window = d.s.draft_window
    for step in range(1, num_spec):
        at_step(d, step)
        md = build(d, step)
        assert md.block_tables.data_ptr() == window.windows[0].block_table.data_ptr()
        # vllm-ascend's builder keeps the host lengths as seq_lens/seq_lens_cpu; its decode
        # update writes the actual lengths into both.
        assert md.seq_lens.tolist()[: len(TARGET_LENS)] == md.seq_lens_list[: len(TARGET_LENS)]
        assert_fia_reads_the_window_of_the_told_length(d, step, md.seq_lens_list, md.block_tables)
        # vllm-ascend's `_generate_draft` updates the step's metadata once more after the
        # forward (with step 1): still inside the same window.
        d.s._update_decode_attn_metadata({"draft.0": md}, 1, len(TARGET_LENS))
        assert max(md.seq_lens_list) <= window.spec.max_read_len
    assert window.path_check.num_checks >= 1


@pytest.mark.parametrize(
    ("block_size", "num_spec", "min_context"),
    [
        (16, 3, 0),
        (16, 5, 0),
        (128, 3, 0),
        (128, 5, 0),
        (128, 5, 258),
    ],
)
def test_every_full_graph_replay_step_reads_the_window_of_what_fia_is_told(
    block_size, num_spec, min_context, model_dir
):
    """A FULL ACL graph replay: before it, vllm-ascend builds the per-step metadata once
    (step 1) and hands the graph every step's `actual_seq_lengths_kv` and block table
    (`build_fia_params`); the graph then replays each recorded step's build, which refreshes
    the window's persistent table. Each step's actual lengths must match that step's table."""
    additional = {"draft_window_size": W, "draft_window_min_context": min_context}
    d = setup_decode(model_dir, "eagle3", block_size, num_spec, additional)
    window = d.s.draft_window
    padded = MAX_NUM_REQS
    metadatas, fia = full_graph_params(d, padded)
    for step, params in enumerate(fia, start=1):
        at_step(d, step)
        recorded = build(d, step, CUDAGraphMode.FULL, padded)  # the recorded build of this step
        table = params["block_table"]
        assert table.data_ptr() == window.windows[0].block_table.data_ptr()
        # What the step's eager build would tell FIA (vllm-ascend 0.30 builds the replay's
        # metadata before it; 0.29 builds none).
        per_step = recorded if metadatas is None else metadatas[step - 1]["draft.0"]
        assert params["actual_seq_lengths_kv"] == per_step.seq_lens_list
        assert len(params["actual_seq_lengths_kv"]) == padded
        assert_fia_reads_the_window_of_the_told_length(
            d, step, params["actual_seq_lengths_kv"], table
        )


def test_without_the_window_fia_is_told_the_target_length_plus_the_step(model_dir):
    """The premise, on vllm-ascend's own code: with the window off, FIA is told the target's
    length plus the step (rejected tokens included) through the full table."""
    d = setup_decode(model_dir, "eagle3", 16, 4, additional={})
    assert d.s.draft_window is None
    at_step(d, 2)
    md = build(d, 2)
    told = [min(t + 2, MAX_MODEL_LEN) for t in TARGET_LENS]
    if getattr(installed_release(), "fia_table_from_target", False):  # the plugin's 0.29
        # vllm-ascend 0.29 hands the build one host length for every request, and writes
        # the actual lengths after the step's forward (its _generate_draft).
        assert len(set(md.seq_lens_list)) == 1
        d.s._update_decode_attn_metadata({"draft.0": md}, 2, len(TARGET_LENS))
    assert md.seq_lens_list[: len(TARGET_LENS)] == told
    assert md.block_tables.data_ptr() == d.s.block_tables.input_block_tables[0].data_ptr()
    fia = fia_params_before_replay(d.s, MAX_NUM_REQS)[1]
    assert fia[0]["actual_seq_lengths_kv"][: len(TARGET_LENS)] == [
        min(t + 1, MAX_MODEL_LEN) for t in TARGET_LENS
    ]


@pytest.mark.parametrize("min_context", [0, 257])
def test_the_draft_prefill_reads_the_window_and_leaves_vllm_ascends_model_state_alone(
    min_context, model_dir
):
    """The draft prefill over the target's verify batch (one request prefilling a chunk
    longer than the window) through vllm-ascend's `_prefill` and `AscendModelState
    .prepare_attn`: FIA's host lengths (from `seq_lens_np`) and the chunk tables read exactly
    each request's window, and the model state keeps the target's metadata and its
    max_model_len."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm.v1.worker.utils import AttentionGroup

    from vllm_ascend.attention.attention_v1 import AscendAttentionBackend, AscendAttentionState
    from vllm_ascend.worker.v2.input_batch import AscendInputBatch

    num_spec, block_size = 3, 16
    additional = {"draft_window_size": W, "draft_window_min_context": min_context}
    d = setup_decode(model_dir, "eagle3", block_size, num_spec, additional, max_num_tokens=512)
    s, n = d.s, len(TARGET_LENS)
    # Every request verifies num_spec + 1 tokens, but the last prefills a 300-token chunk.
    query_lens = [min(num_spec + 1, t) for t in TARGET_LENS[:-1]] + [300]
    qsl = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    num_tokens = int(qsl[-1])
    tib = s.target_input_buffers
    batch = AscendInputBatch.make_dummy(n, num_tokens, tib)
    tib.seq_lens[:n] = d.target
    tib.seq_lens_cpu[:n] = d.target
    tib.query_start_loc[: n + 1] = torch.from_numpy(qsl)
    batch = dataclasses.replace(
        batch,
        num_scheduled_tokens=np.array(query_lens, dtype=np.int32),
        query_start_loc_np=qsl,
        query_start_loc=tib.query_start_loc[: n + 1],
        seq_lens=tib.seq_lens[:n],
        seq_lens_np=tib.seq_lens_np[:n],
        seq_lens_cpu_upper_bound=d.target.clone(),
        is_prefilling_np=np.array([False] * (n - 1) + [True]),
        attn_state=AscendAttentionState.ChunkedPrefill,
    )
    bt = s.block_tables
    target_group = AttentionGroup(
        AscendAttentionBackend,
        ["target.0", "draft.0"],
        FullAttentionSpec(
            block_size=block_size,
            num_kv_heads=NUM_KV_HEADS,
            head_size=HEAD_SIZE,
            dtype=torch.float32,
        ),
        0,
    )
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(s.vllm_config):
        target_group.create_metadata_builders(s.vllm_config, torch.device("cpu"))
    model_state = s.model_state
    target_metadata = model_state.prepare_attn(
        batch,
        CUDAGraphMode.NONE,
        (bt.input_block_tables[0][:n],),
        bt.slot_mappings[:, :num_tokens],
        [[target_group]],
        s.kv_cache_config,
    )
    kept = dict(vars(model_state))
    assert model_state.attn_metadata is target_metadata

    seen = draft_prefill_seen(s, batch, n, num_tokens, target_metadata)
    assert set(seen) == {"draft.0"}  # vllm-ascend keeps only the draft's layers
    md = seen["draft.0"]
    assert md is not target_metadata["draft.0"]
    assert vars(model_state) == kept and model_state.attn_metadata is target_metadata
    assert md.block_tables.data_ptr() == s.draft_window.chunk_windows[0].block_table.data_ptr()
    spec = s.draft_window.spec
    for i, length in enumerate(TARGET_LENS):
        q_len, read = query_lens[i], int(md.seq_lens_list[i])
        start, kept_positions = positions_read(length, read)
        assert start % spec.alignment == 0 and start <= length - q_len
        if length < min_context:
            assert read == length  # below draft_window_min_context: the whole context
        else:
            assert min(length, max(W, q_len)) <= read <= max(W, q_len) + spec.alignment - 1
        q = d.k[i][length - q_len : length] * 0.5
        got, touched = d.cache.read(q, md.block_tables[i], read)
        torch.testing.assert_close(got, dense_attention(q, d.k[i], d.v[i], start, length))
        assert touched == {d.block_ids[i][p // block_size] for p in kept_positions.tolist()}
        assert int(s.draft_window.seq_lens[i]) == read  # device and host: one start


@pytest.mark.parametrize("num_spec", [3, 5])
def test_final_step_equals_vllm_ascends_mrv1_window_and_earlier_steps_avoid_its_defect(
    num_spec, model_dir
):
    """The installed vllm-ascend release's own MRV1 `SlidingWindowAdapter`, with the future
    offset its V1 proposer uses for EAGLE (num_speculative_tokens), windows context-only
    lengths once and reuses the table for every step. Without rejections, its last step has
    the MRV2 window's start and length at the last step; but its table keeps only the
    context's columns, so a step whose newest tokens cross a block reads the null block, which
    the MRV2 window, one window per step, never does."""
    from types import SimpleNamespace

    from vllm_ascend.spec_decode.utils import SlidingWindowAdapter

    b = 16
    d = setup_decode(model_dir, "eagle3", b, num_spec)
    d.rejected.zero_()
    n = len(TARGET_LENS)
    adapter = SlidingWindowAdapter(W, b, MAX_NUM_REQS, num_spec, torch.device("cpu"))
    full = d.s.block_tables.input_block_tables[0][:n].clone()
    # MRV1's context-only lengths: its last step reads seq_lens + K, our last actual length.
    last = num_spec - 1
    context = torch.clamp(d.target + last, max=MAX_MODEL_LEN) - num_spec
    cam = SimpleNamespace(block_table_tensor=full, seq_lens=context.clone())
    adapter.apply(cam)
    mrv1_table, mrv1_start = cam.block_table_tensor, context - cam.seq_lens
    defects = 0
    for step in range(1, num_spec):
        at_step(d, step)
        md = build(d, step)
        for i, target in enumerate(TARGET_LENS):
            actual = min(target + step, MAX_MODEL_LEN)
            if step == last:
                # The same start and length; MRV1 keeps only its context's columns.
                assert md.seq_lens_list[i] == int(cam.seq_lens[i]) + num_spec
                cols = -(-int(cam.seq_lens[i]) // b)
                assert torch.equal(md.block_tables[i, :cols], mrv1_table[i, :cols])
            mrv1_read = actual - int(mrv1_start[i])
            q = d.k[i][actual - 1 : actual] * 0.5
            got, touched = d.cache.read(q, mrv1_table[i], mrv1_read)
            if 0 in touched:
                defects += 1
                expected = dense_attention(q, d.k[i], d.v[i], actual - mrv1_read, actual)
                assert not torch.allclose(got, expected)
            _, ours_touched = d.cache.read(q, md.block_tables[i], md.seq_lens_list[i])
            assert 0 not in ours_touched
    assert defects > 0


def test_eagle_layouts_the_actual_lengths_cannot_serve_stop_at_start_up(model_dir, monkeypatch):
    """Each names itself: vllm-ascend's sparse KV offload, its replicated draft under
    prefill context parallelism, a DeepSeek-V4.1 target (its host lengths are not synced
    after rejection), a draft group the window does not window (vllm-ascend writes one host
    length list into every draft layer), and a model state with KV prefetch."""
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec, SlidingWindowSpec
    from vllm.v1.worker.utils import AttentionGroup

    from vllm_ascend.attention.attention_v1 import AscendAttentionBackend
    from vllm_ascend.worker.v2.spec_decode.draft_window.speculator import (
        create_draft_window,
    )

    release = installed_release()
    d = setup_decode(model_dir, "eagle3", 16, 3)
    if hasattr(d.s, "_sparse_kv_offload_metadata"):  # vllm-ascend 0.30's
        import vllm_ascend.worker.v2.spec_decode.autoregressive.sparse_kv_offload as offload

        # A CPU has no pinned memory for the offload's host buffers.
        monkeypatch.setattr(offload, "is_pin_memory_available", lambda: False)
        kept = d.s._sparse_kv_offload_metadata
        d.s._sparse_kv_offload_metadata = offload.SparseKVOffloadMetadata(
            enabled=True,
            num_steps=3,
            max_num_reqs=MAX_NUM_REQS,
            max_num_tokens=64,
            device=torch.device("cpu"),
        )
        refused(d, "with vllm-ascend's sparse_kv_offload_config enabled")
        d.s._sparse_kv_offload_metadata = kept

    d.s.replicated_pcp = True
    refused(
        d,
        rf"not supported on {re.escape(installed_release().name)} with vllm-ascend.s "
        r"replicated draft under prefill_context_parallel_size > 1",
    )
    d.s.replicated_pcp = False

    hf_config = d.s.vllm_config.model_config.hf_config
    monkeypatch.setattr(hf_config, "model_type", "deepseek_v41")
    if release.unsynced_target is not None:
        refused(d, "with a DeepSeek-V4.1 target: vllm-ascend does not sync its host lengths")
    else:  # vllm-ascend 0.29's runner syncs every target's host lengths after rejection
        with set_current_vllm_config(d.s.vllm_config):
            assert create_draft_window(d.s, release) is not None
    monkeypatch.setattr(hf_config, "model_type", "llama")

    swa = SlidingWindowSpec(
        block_size=16,
        num_kv_heads=NUM_KV_HEADS,
        head_size=HEAD_SIZE,
        dtype=torch.float32,
        sliding_window=64,
    )
    d.s.kv_cache_config.kv_cache_groups.append(KVCacheGroupSpec(["draft.1"], swa))
    d.s.attn_groups = [
        *d.s.attn_groups,
        [AttentionGroup(AscendAttentionBackend, ["draft.1"], swa, 1)],
    ]
    refused(d, r"with draft KV-cache groups the window does not window \(not windowed: group 1")


def test_vllm_ascend_itself_refuses_kv_layer_parallelism_with_an_eagle_draft(mla_model_dir):
    """KV layer parallelism (``enable_kvpp``) schedules its layer prefetch in the target's
    ``prepare_attn``, which the window's EAGLE draft prefill would run a second time per step;
    the window leaves it unrefused because vllm-ascend's own start-up check
    (``platform._validate_parallel_config``) refuses KVPP with an EAGLE draft. A release
    that served it would fail here, and the window would need its own refusal back."""
    from tests.ascend.npu_testbed.wiring import eagle_config
    from vllm_ascend.platform import _validate_parallel_config

    config = eagle_config(mla_model_dir, "eagle3", {"draft_window_size": W, "enable_kvpp": True}, 3)
    config.parallel_config.tensor_parallel_size = 2
    config.model_config.enforce_eager = True
    with pytest.raises(ValueError, match=r"KVPP .*speculative decoding only with method='mtp'"):
        _validate_parallel_config(config)


def test_a_build_handed_vllm_ascends_unwindowed_host_mirror_is_stopped(model_dir, monkeypatch):
    """If vllm-ascend's builder took its lengths from the host mirror of the target's
    lengths (`seq_lens_cpu`) instead of what the window hands it, the path check names
    the path."""
    import vllm_ascend.attention.attention_v1 as attention_v1
    from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import WindowNotInPathError

    d = setup_decode(model_dir, "eagle3", 16, 3)
    mirror = d.s.target_input_buffers.seq_lens_cpu
    if hasattr(attention_v1, "_select_seq_lens"):  # vllm-ascend 0.30's choice of lengths
        monkeypatch.setattr(
            attention_v1,
            "_select_seq_lens",
            lambda common, *args, **kwargs: mirror[: common.num_reqs],
        )
    else:  # vllm-ascend 0.29 takes the host lengths it is handed: hand it the mirror
        from vllm_ascend.attention.attention_v1 import AscendAttentionMetadataBuilder

        real = AscendAttentionMetadataBuilder.build

        def build_from_mirror(self, common_prefix_len, common_attn_metadata, *args, **kwargs):
            host = mirror[: common_attn_metadata.num_reqs]
            cm = dataclasses.replace(common_attn_metadata, seq_lens_cpu=host, _seq_lens_cpu=host)
            return real(self, common_prefix_len, cm, *args, **kwargs)

        monkeypatch.setattr(AscendAttentionMetadataBuilder, "build", build_from_mirror)
        d = setup_decode(model_dir, "eagle3", 16, 3)  # its builders wrapped by the window
    at_step(d, 1)
    with pytest.raises(WindowNotInPathError) as error:
        build(d, 1)
    message = str(error.value)
    assert f"under the window's calls {draft_build_path(d.s)}" in message
    # 0.30 keeps the mirror itself as the built seq_lens; 0.29 a copy, whose list then reaches
    # past the window.
    assert (
        "the built metadata's seq_lens is not the window's windowed seq_lens" in message
        or "the built seq_lens_list reaches 2047, past the window's 143" in message
    )


@pytest.mark.overlay
@pytest.mark.parametrize("block_size", [16, 128])
def test_the_one_launch_refresh_gives_fia_the_same_inputs_at_every_step(block_size, model_dir):
    """The window's own Triton kernel (under Triton's interpreter) through vllm-ascend's real
    EAGLE decode: every step's FIA inputs equal the torch path's and read exactly the window
    of the actual length."""
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.fused import enable_fused

    num_spec = 4
    plain = setup_decode(model_dir, "eagle3", block_size, num_spec)
    d = setup_decode(model_dir, "eagle3", block_size, num_spec)
    enable_fused(d.s.draft_window)
    for step in range(1, num_spec):
        at_step(plain, step)
        at_step(d, step)
        expected = build(plain, step)
        md = build(d, step)
        assert md.seq_lens_list == expected.seq_lens_list
        assert torch.equal(md.block_tables, expected.block_tables)
        assert torch.equal(d.s.draft_window.seq_lens, plain.s.draft_window.seq_lens)
        assert_fia_reads_the_window_of_the_told_length(d, step, md.seq_lens_list, md.block_tables)
