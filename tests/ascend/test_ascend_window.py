# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The window on the Ascend pairing: the installed vllm-ascend release's own DFlash and DSpark
speculators, through vllm-ascend's real GQA metadata builder, at the per-propose build and
the ACL graph replay build (``build_draft_attn_metadatas``); their graph captures run for
real in ``test_ascend_capture.py``. What FIA would receive (``seq_lens_list`` as
``actual_seq_lengths_kv``, ``block_tables``) is read by the reference paged attention and
must equal dense attention over exactly the window. Paths the window does not serve there
yet stop at start-up with their name."""

import dataclasses

import pytest
import torch

from tests.ascend.npu_testbed.dcp_ranks import dcp_builders  # noqa: F401 (a fixture)
from tests.ascend.npu_testbed.dflash import (
    BLOCK,
    EAGER,
    FIA_CASES,
    MAX_NUM_REQS,
    REPLAY,
    SEQ_LENS,
    W,
    assert_fia_reads_exactly_the_window,
    per_propose_build,
    window_config,
    wired,
)
from tests.ascend.npu_testbed.pairing import IN_TREE, draft_build_path, installed_release
from tests.ascend.npu_testbed.wiring import (
    Q,
    fill,
    make_batch,
    vllm_config,
)
from tests.ascend.npu_testbed.wiring import speculator as make_speculator

pytestmark = pytest.mark.usefixtures("registered")


@pytest.mark.parametrize(("method", "build", "block", "min_context"), FIA_CASES)
def test_fia_inputs_read_exactly_the_window(method, build, block, min_context, model_dir):
    s, batch = wired(model_dir, method, window_config(min_context), block=block)
    md = build(s)
    window = s.draft_window
    assert md.block_tables.data_ptr() == window.windows[0].block_table.data_ptr()
    assert md.seq_lens.data_ptr() == window.seq_lens.data_ptr()
    assert window.path_check.num_checks >= 1
    assert_fia_reads_exactly_the_window(s, batch, md.seq_lens_list, md.block_tables)


@pytest.mark.overlay
def test_without_the_window_builders_get_what_vllm_ascend_gives_them(model_dir):
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import plugin

    s, batch = wired(model_dir, "dspark", additional_config={})
    assert s.draft_window is None
    ours = per_propose_build(s)
    plugin.unregister()
    plain, _ = wired(model_dir, "dspark", additional_config={})
    theirs = per_propose_build(plain)
    assert ours.seq_lens_list == theirs.seq_lens_list == batch.seq_lens
    assert torch.equal(ours.block_tables, theirs.block_tables)


@pytest.mark.parametrize(
    ("build", "block", "min_context"),
    [
        (EAGER, 16, 0),
        (EAGER, 128, 0),
        (REPLAY, 16, 0),
        (REPLAY, 128, 0),
        (EAGER, 128, 258),
        (REPLAY, 16, 258),
    ],
)
def test_dspark_on_a_glm_family_target_reads_the_window_of_what_fia_is_told(
    build, block, min_context, model_dir
):
    """On GLM-family targets vllm-ascend's FIA takes the host bound plus the query stretch
    (`_select_seq_lens` keeps the host copy) as the exact length, which counts the rejected
    tokens the device length does not. The window start comes from that actual length on both
    sides: FIA reads exactly the window of what it is told, and the device length shares
    its start."""
    s, batch = wired(
        model_dir, "dspark", window_config(min_context), model_type="glm_moe_dsa", block=block
    )
    n = len(batch.seq_lens)
    actual = torch.tensor(batch.seq_lens, dtype=torch.int32)  # the target's length + Q
    rejected = torch.tensor(
        [min(i % Q, length - Q) for i, length in enumerate(batch.seq_lens)], dtype=torch.int32
    )
    # The target's device lengths (what vllm-ascend's host bound mirrors) and the draft's.
    s.target_input_buffers.seq_lens[:n] = actual - Q
    s.input_buffers.seq_lens[:n] = actual - rejected
    md = build(s)
    window = s.draft_window
    assert md.block_tables.data_ptr() == window.windows[0].block_table.data_ptr()
    if "glm" not in installed_release().dspark_host_length_targets:
        # vllm-ascend 0.29 has no GLM branch: FIA takes the draft's own device lengths, as
        # for any DSpark target, and the window starts from them.
        assert window.actual is None
        own = dataclasses.replace(batch, seq_lens=(actual - rejected).tolist())
        # (The query's slots are those of the actual lengths: not checked against these.)
        assert_fia_reads_exactly_the_window(s, own, md.seq_lens_list, md.block_tables, False)
        return
    assert window.actual is not None and window.actual.from_bound
    assert_fia_reads_exactly_the_window(s, batch, md.seq_lens_list, md.block_tables)
    for i in range(n):
        start = int(actual[i]) - md.seq_lens_list[i]
        assert int(window.seq_lens[i]) == int(actual[i] - rejected[i]) - start


@pytest.mark.parametrize(
    ("method", "build", "min_context"),
    [
        ("dflash", EAGER, 0),
        ("dflash", REPLAY, 0),
        ("dspark", EAGER, 0),
        ("dspark", REPLAY, 0),
        ("dflash", REPLAY, 258),
        ("dspark", EAGER, 258),
        # A GLM-family DSpark draft (vllm-ascend's glm5_dspark): its MLA layers decode their
        # query block non-causally (``non_causal_multi_token_decode``).
        ("glm-dspark", EAGER, 0),
        ("glm-dspark", REPLAY, 258),
    ],
)
def test_mla_drafts_read_the_window_of_the_host_lengths_mla_takes(
    method, build, min_context, mla_model_dir
):
    """vllm-ascend's MLA takes host lengths as exact (`seq_lens_list` of its decode part).
    DSpark hands it an exact copy of the draft's device lengths, taken before any hook
    (`_prepare_draft_dcp_metadata_inputs`): windowed like the device. DFlash hands it the
    host bound plus the query stretch, which counts rejected tokens: windowed as a told
    length, with the start on both sides from it. Either way MLA reads exactly the window of
    what it is told, through the cropped table, and the device length shares its start.
    A release whose MLA builder hands every request one host length (vllm-ascend 0.29's
    draft_max_seq_len) refuses the draft by name instead."""
    from tests.ascend.npu_testbed.wiring import speculator as make
    from vllm_ascend.attention.mla_v1 import AscendMLABackend

    glm = method == "glm-dspark"
    method = "dspark" if glm else method
    config = vllm_config(
        mla_model_dir, method, window_config(min_context), model_type="glm_moe_dsa" if glm else None
    )
    mla = {"backend": AscendMLABackend, "non_causal_multi_token_decode": glm}
    if "AscendMLABackend" not in installed_release().backends_for(method):
        with pytest.raises(
            ValueError,
            match=r"on attention backend AscendMLABackend: its "
            r"builder hands the kernel one host length for every request",
        ):
            make(config, method, BLOCK, MAX_NUM_REQS, **mla)
        return
    s = make(config, method, BLOCK, MAX_NUM_REQS, **mla)
    # The spec vllm-ascend's start-up built for the draft's layer, and its decision.
    (group,) = s.kv_cache_config.kv_cache_groups
    assert type(group.kv_cache_spec).__name__ == "AscendMLAAttentionSpec"
    assert group.kv_cache_spec.non_causal_multi_token_decode is glm
    (decision,) = s.draft_window.plan.decisions
    assert decision.windowed
    assert ("query block attends within itself" in decision.reason) is glm
    batch = make_batch(SEQ_LENS, BLOCK, MAX_NUM_REQS)
    fill(s, batch)
    n = len(batch.seq_lens)
    actual = torch.tensor(batch.seq_lens, dtype=torch.int32)
    rejected = torch.zeros(n, dtype=torch.int32)
    if method == "dflash":
        # DFlash's actual length counts the rejected tokens its device length does not.
        rejected = torch.tensor(
            [min(i % Q, length - Q) for i, length in enumerate(SEQ_LENS)], dtype=torch.int32
        )
        s.target_input_buffers.seq_lens[:n] = actual - Q
        s.input_buffers.seq_lens[:n] = actual - rejected
    md = build(s)
    window = s.draft_window
    assert (window.actual is not None and window.actual.from_bound) is (method == "dflash")
    decode = md.decode
    assert decode.block_table.data_ptr() == window.windows[0].block_table.data_ptr()
    assert_fia_reads_exactly_the_window(s, batch, decode.seq_lens_list, decode.block_table)
    for i in range(n):
        start = int(actual[i]) - decode.seq_lens_list[i]
        assert int(window.seq_lens[i]) == int(actual[i] - rejected[i]) - start


def test_an_eagle_draft_on_mla_stops_at_start_up(mla_model_dir):
    from tests.ascend.npu_testbed.wiring import eagle_config, eagle_speculator
    from vllm_ascend.attention.mla_v1 import AscendMLABackend

    config = eagle_config(mla_model_dir, "eagle3", {"draft_window_size": W}, 3)
    with pytest.raises(
        ValueError,
        match=r"for eagle3 with group 0 \(AscendMLAAttentionSpec, block "
        r"size 128\) on attention backend AscendMLABackend: "
        # 0.30: EAGLE's decode state on MLA is not windowed; 0.29: one host length for all.
        r"its (kernel takes host lengths|builder hands the kernel one host length)",
    ):
        eagle_speculator(config, BLOCK, MAX_NUM_REQS, 3, backend=AscendMLABackend)
    if not IN_TREE:
        from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import install

        assert install.installation().release is installed_release()


def test_fia_lengths_that_escape_the_window_are_stopped_with_the_path(model_dir, monkeypatch):
    """If vllm-ascend's builder took its FIA lengths from elsewhere (its GLM branch keeps a
    host copy, the MLA path a copy taken before any hook), the path check stops it: here
    the builder is made to take vLLM's own, unwindowed device lengths after the check of
    what it was handed."""
    from vllm_ascend.attention.attention_v1 import AscendAttentionMetadataBuilder
    from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import WindowNotInPathError

    vllms = {}
    real = AscendAttentionMetadataBuilder.build

    def build_from_vllms_lengths(self, common_prefix_len, common_attn_metadata, *args, **kwargs):
        cm = common_attn_metadata
        cm = dataclasses.replace(cm, seq_lens=vllms["seq_lens"][: cm.num_reqs])
        return real(self, common_prefix_len, cm, *args, **kwargs)

    monkeypatch.setattr(AscendAttentionMetadataBuilder, "build", build_from_vllms_lengths)
    s, _ = wired(model_dir, "dspark")
    vllms["seq_lens"] = s.input_buffers.seq_lens
    with pytest.raises(WindowNotInPathError) as error:
        per_propose_build(s)
    message = str(error.value)
    assert f"under the window's calls {draft_build_path(s)}" in message
    assert "the built metadata's seq_lens is not the window's windowed seq_lens" in message
    assert "the built seq_lens_list reaches 2000, past the window's 255" in message


@pytest.mark.parametrize("method", ["dflash", "dspark"])
def test_fia_inputs_equal_vllm_ascends_own_model_runner_v1_window(method, model_dir):
    """The same batch through the installed vllm-ascend release's own MRV1
    `SlidingWindowAdapter` (future offset 0, as its V1 proposer uses for DFlash and DSpark) and
    through the MRV2 window: the same lengths and the same columns."""
    from types import SimpleNamespace

    from vllm_ascend.spec_decode.utils import SlidingWindowAdapter

    s, batch = wired(model_dir, method)
    md = per_propose_build(s)
    n = len(batch.seq_lens)
    adapter = SlidingWindowAdapter(W, BLOCK, MAX_NUM_REQS, 0, torch.device("cpu"))
    common = SimpleNamespace(
        block_table_tensor=s.block_tables.input_block_tables[0][:n],
        seq_lens=s.input_buffers.seq_lens[:n].clone(),
    )
    adapter.apply(common)
    assert md.seq_lens_list[:n] == common.seq_lens.tolist()
    ours, theirs = md.block_tables[:n], common.block_table_tensor
    width = max(ours.shape[1], theirs.shape[1])
    pad = torch.nn.functional.pad
    assert torch.equal(
        pad(ours, (0, width - ours.shape[1])), pad(theirs, (0, width - theirs.shape[1]))
    )


@pytest.mark.parametrize("method", ["dflash", "dspark"])
@pytest.mark.usefixtures("dcp_builders")
def test_decode_context_parallelism_is_served_or_refused_by_name(method, model_dir, monkeypatch):
    """Where the release's drafts have a DCP path (vllm-ascend 0.30), a rank's window is one
    column of every rank (the DCP tests check its reads); where they have none (0.29), the
    window stops start-up naming the layout and the reason."""
    from tests.ascend.npu_testbed.dcp_ranks import on_rank
    from tests.ascend.npu_testbed.wiring import with_dcp

    on_rank(monkeypatch, 2, 0)
    config = with_dcp(vllm_config(model_dir, method, {"draft_window_size": W}), 2, 1)
    release = installed_release()
    if release.dcp_unserved is not None:
        with pytest.raises(ValueError) as error:
            make_speculator(config, method, BLOCK, MAX_NUM_REQS, cp=(2, 0, 1))
        assert (
            f"draft_window_size={W} with decode_context_parallel_size=2 (rank 0), "
            f"cp_kv_cache_interleave_size=1 is not supported on {release.name}: "
            f"{release.dcp_unserved}. Use decode_context_parallel_size=1"
        ) in str(error.value)
        return
    s = make_speculator(config, method, BLOCK, MAX_NUM_REQS, cp=(2, 0, 1))
    assert s.draft_window.dcp.cp_size == 2 and s.draft_window.spec.alignment == 2 * BLOCK
