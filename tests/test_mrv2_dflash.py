# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""DFlash and DSpark on Model Runner V2 build their draft attention metadata from windowed
inputs (with and without attention sinks): real speculators, real buffers, vLLM's real
`_build_attn_metadata` and `build_attn_metadata`, and vLLM's real Triton attention metadata
builder."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from vllm.config.compilation import CUDAGraphMode

from testbed.buffers import (
    fill_input_block_tables,
    prepare_dflash_step,
)
from testbed.mrv1_adapter import load_mrv1_adapter_module
from testbed.speculators import (
    GroupLayout,
)
from tests.cpu_testbed.dflash import (
    LAYOUTS,
    MAX_MODEL_LEN,
    MAX_NUM_REQS,
    NUM_SPEC,
    SINKS,
    Q,
    W,
    assert_reads_exactly_the_window,
    build,
    capture_on_cpu,
    compare_cams,
    draft_groups,
    make_batch,
    move_batch_into,
    wire,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import plugin
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.fused import enable_fused

# Every test here runs with the plugin installed, as vLLM loads it.
pytestmark = pytest.mark.usefixtures("window_hooks")


@pytest.mark.parametrize("method", ["dflash", "dspark"])
@pytest.mark.parametrize("layout_name", list(LAYOUTS))
@pytest.mark.parametrize("cg_mode", [CUDAGraphMode.NONE, CUDAGraphMode.FULL], ids=str)
@pytest.mark.parametrize("sinks", SINKS)
def test_draft_attention_reads_exactly_the_window(
    method, layout_name, cg_mode, sinks, model_dir, monkeypatch
):
    layouts = LAYOUTS[layout_name]
    batch = make_batch(layouts, num_reqs_padded=MAX_NUM_REQS)
    wired = wire(method, layouts, batch, model_dir, monkeypatch, sinks=sinks)
    assert wired.speculator.draft_window.spec.sink_size == (
        0 if not sinks else max(32, wired.speculator.draft_window.spec.alignment)
    )
    metadata = build(wired, cg_mode)
    assert_reads_exactly_the_window(wired, layouts, metadata)
    assert {name.split(".")[0] for name in metadata} == {"draft"}


@pytest.mark.parametrize("layout_name", list(LAYOUTS))
@pytest.mark.parametrize("sinks", SINKS)
def test_builders_receive_windowed_inputs_and_untouched_slot_mappings(
    layout_name, sinks, model_dir, monkeypatch
):
    layouts = LAYOUTS[layout_name]
    batch = make_batch(layouts, num_reqs_padded=MAX_NUM_REQS)
    wired = wire("dspark", layouts, batch, model_dir, monkeypatch, sinks=sinks)
    s = wired.speculator
    seq_lens_before = batch.input_buffers.seq_lens.clone()
    tables_before = [t.clone() for t in batch.block_tables.input_block_tables]
    slots_before = batch.block_tables.slot_mappings.clone()
    build(wired, CUDAGraphMode.FULL, slack=3)
    window = s.draft_window
    num_tokens = batch.num_reqs_padded * Q
    for g, received in wired.received.items():
        (cam,) = received
        # The builder reads the persistent windowed buffers...
        assert cam.seq_lens.data_ptr() == window.seq_lens.data_ptr()
        if layouts[g].kernel_block_size is None:
            assert cam.block_table_tensor.data_ptr() == window.windows[g].block_table.data_ptr()
        # ...a host bound that holds for every windowed length, and a capped max_seq_len...
        assert bool((cam.seq_lens_cpu_upper_bound >= cam.seq_lens).all())
        assert int(cam.seq_lens.max()) <= cam.max_seq_len <= window.spec.max_read_len
        # ...and the absolute slot mapping, same storage, same values.
        assert cam.slot_mapping.data_ptr() == batch.block_tables.slot_mappings[g].data_ptr()
        assert torch.equal(cam.slot_mapping, slots_before[g, :num_tokens])
    # The shared inputs are never written, and the speculator gets its own objects back.
    assert torch.equal(batch.input_buffers.seq_lens, seq_lens_before)
    for table, before in zip(batch.block_tables.input_block_tables, tables_before, strict=True):
        assert torch.equal(table, before)
    assert torch.equal(batch.block_tables.slot_mappings, slots_before)
    assert s.input_buffers is batch.input_buffers and s.block_tables is batch.block_tables
    assert s.draft_max_seq_len == MAX_MODEL_LEN
    assert wired.speculator.draft_window.propose.num_builds == 1


def test_groups_the_draft_does_not_read_are_not_windowed(model_dir, monkeypatch):
    layouts = LAYOUTS["target_group_and_two_draft_groups"]
    batch = make_batch(layouts)
    wired = wire("dflash", layouts, batch, model_dir, monkeypatch)
    assert set(wired.speculator.draft_window.windows) == {1, 2}
    assert set(wired.received) == {1, 2}


@pytest.mark.parametrize("additional_config", [{}, {"draft_window_size": None}])
def test_window_off_builders_receive_exactly_what_vllm_gives_them(
    additional_config, model_dir, monkeypatch
):
    layouts = LAYOUTS["target_group_and_two_draft_groups"]
    batch = make_batch(layouts, num_reqs_padded=MAX_NUM_REQS)
    plugin.unregister()
    plain = wire("dspark", layouts, batch, model_dir, monkeypatch, additional_config)
    build(plain, CUDAGraphMode.FULL)
    plugin.register()
    ours = wire("dspark", layouts, batch, model_dir, monkeypatch, additional_config)
    assert ours.speculator.draft_window is None
    build(ours, CUDAGraphMode.FULL)
    for g in plain.received:
        compare_cams(plain.received[g][0], ours.received[g][0])


@pytest.mark.parametrize("sinks", SINKS)
def test_persistent_buffers_are_reused_across_steps(sinks, model_dir, monkeypatch):
    layouts = LAYOUTS["target_group_and_two_draft_groups"]
    batch = make_batch(layouts, num_reqs_padded=MAX_NUM_REQS)
    wired = wire("dflash", layouts, batch, model_dir, monkeypatch, sinks=sinks)
    first = build(wired, CUDAGraphMode.FULL)
    # A later step: other lengths and fewer requests, written into the same buffers.
    later = make_batch(layouts, seq_lens=[700, 64, 5, 150], num_reqs_padded=5, seed=5)
    move_batch_into(later, batch)
    second = build(wired, CUDAGraphMode.FULL)
    for name in first:
        assert first[name].seq_lens.data_ptr() == second[name].seq_lens.data_ptr()
        assert first[name].block_table.data_ptr() == second[name].block_table.data_ptr()
    assert_reads_exactly_the_window(wired, layouts, second)


@pytest.mark.parametrize("sinks", SINKS)
def test_window_refresh_allocates_nothing_after_the_first_step(sinks, model_dir, monkeypatch):
    layouts = LAYOUTS["target_group_and_two_draft_groups"]
    batch = make_batch(layouts, num_reqs_padded=MAX_NUM_REQS)
    wired = wire("dflash", layouts, batch, model_dir, monkeypatch, sinks=sinks)
    window = wired.speculator.draft_window
    bound = torch.tensor(batch.seq_lens, dtype=torch.int32)
    window.refresh(MAX_NUM_REQS)
    window.host_upper_bound(bound, batch.num_reqs, Q)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    ) as prof:
        window.refresh(MAX_NUM_REQS)
        window.host_upper_bound(bound, batch.num_reqs, Q)
    # A Python scalar operand (`x.add_(3)`) is wrapped as a 0-dim tensor; on an accelerator
    # that stays a host value, on this CPU it shows as an allocation of at most 8 bytes.
    # Any per-request temporary of these 12 rows would take at least 48 bytes.
    sizes = [e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0]
    assert max(sizes, default=0) <= 8, sorted(set(sizes))


@pytest.mark.parametrize("sinks", SINKS)
def test_window_refresh_never_reads_a_device_value_on_the_host(sinks):
    """On the meta device a tensor has no values, so `.item()`, `.tolist()`, `.cpu()` or a
    data-dependent branch would raise: the refresh runs there, so it never syncs."""
    from testbed.plans import plan_over
    from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import DraftWindow

    meta = torch.device("meta")
    input_buffers = SimpleNamespace(seq_lens=torch.zeros(8, dtype=torch.int32, device=meta))
    block_tables = SimpleNamespace(
        block_sizes=[16, 32],
        input_block_tables=[torch.zeros(8, 40, dtype=torch.int32, device=meta)] * 2,
    )
    window = DraftWindow(
        plan_over(64, block_tables, [0, 1], max_chunk_len=300, sink_tokens=sinks),
        input_buffers,
        block_tables,
        8,
        meta,
    )
    window.refresh(8)
    # The multi-token pass of an EAGLE draft prefill, over the target's lengths.
    target_seq_lens = torch.zeros(8, dtype=torch.int32, device=meta)
    query_start_loc = torch.zeros(9, dtype=torch.int32, device=meta)
    window.refresh(8, seq_lens=target_seq_lens, query_start_loc=query_start_loc)
    assert window.seq_lens.device == meta


@pytest.mark.parametrize("sinks", SINKS)
def test_full_graph_capture_and_in_place_update_read_the_window(sinks, model_dir, monkeypatch):
    """The FULL graph records the builder's tensors at capture; capture must hand it the
    persistent windowed buffers, which the in-graph update then refreshes every step."""
    layouts = [GroupLayout(16), GroupLayout(32), GroupLayout(64, kernel_block_size=32)]
    batch = make_batch(layouts, num_reqs_padded=MAX_NUM_REQS)
    wired = wire("dflash", layouts, batch, model_dir, monkeypatch, sinks=sinks)
    s = wired.speculator
    captured = capture_on_cpu(s, monkeypatch)
    s.capture()
    window = s.draft_window
    for g in (0, 1, 2):
        md = captured[f"draft.{g}"]
        assert md.seq_lens.data_ptr() == window.seq_lens.data_ptr()
        # A kernel-block group reads its own persistent kernel table, mapped from ours.
        table = window.windows[g].block_table
        if g == 2:
            table = wired.attn_groups[g][0].kernel_block_table
        assert md.block_table.data_ptr() == table.data_ptr()
    assert s.input_buffers is batch.input_buffers and s.block_tables is batch.block_tables

    # A replay step: the kernels write the real batch, then the recorded update runs.
    fill_input_block_tables(batch)
    prepare_dflash_step(batch, NUM_SPEC, np.random.default_rng(1), draft_groups(layouts))
    s._update_draft_decode_metadata(captured, MAX_NUM_REQS)
    assert_reads_exactly_the_window(wired, layouts, captured)


@pytest.mark.parametrize(
    "layouts",
    [[GroupLayout(16)], [GroupLayout(32), GroupLayout(32)]],
    ids=["one_draft_group", "two_draft_groups"],
)
@pytest.mark.parametrize("method", ["dflash", "dspark"])
@pytest.mark.parametrize("sinks", [None, 0], ids=["no_sinks_key", "zero_sinks"])
def test_mrv2_metadata_equals_the_released_mrv1_adapter(
    method, layouts, sinks, model_dir, monkeypatch
):
    """Same batch through MRV1's adapter (given the table's block size, K = 0 as MRV1
    uses for DFlash/DSpark) and through the MRV2 path: same lengths, same columns."""
    mrv1 = load_mrv1_adapter_module()
    batch = make_batch(layouts, num_reqs_padded=MAX_NUM_REQS)
    wired = wire(method, layouts, batch, model_dir, monkeypatch, sinks=sinks)
    metadata = build(wired, CUDAGraphMode.FULL)
    n_pad = batch.num_reqs_padded
    for g, layout in enumerate(layouts):
        adapter = mrv1.SlidingWindowAdapter(
            W, layout.block_size, MAX_NUM_REQS, 0, torch.device("cpu")
        )
        cam = SimpleNamespace(
            block_table_tensor=batch.block_tables.input_block_tables[g][:n_pad],
            seq_lens=batch.input_buffers.seq_lens[:n_pad].clone(),
        )
        adapter.apply(cam)
        md = metadata[f"draft.{g}"]
        assert torch.equal(md.seq_lens, cam.seq_lens)
        width = max(md.block_table.shape[1], cam.block_table_tensor.shape[1])
        pad = torch.nn.functional.pad
        assert torch.equal(
            pad(md.block_table, (0, width - md.block_table.shape[1])),
            pad(cam.block_table_tensor, (0, width - cam.block_table_tensor.shape[1])),
        )


def test_zero_sinks_build_exactly_what_the_plain_window_builds(model_dir, monkeypatch):
    """draft_attention_sinks = 0 is the plain window: builders get equal inputs, field by
    field, for every draft group."""
    layouts = LAYOUTS["target_group_and_two_draft_groups"]
    batch = make_batch(layouts, num_reqs_padded=MAX_NUM_REQS)
    plain = wire("dspark", layouts, batch, model_dir, monkeypatch)
    build(plain, CUDAGraphMode.FULL)
    zero = wire("dspark", layouts, batch, model_dir, monkeypatch, sinks=0)
    build(zero, CUDAGraphMode.FULL)
    for g in plain.received:
        # Two windows, so two sets of persistent buffers: equal values, not storage.
        compare_cams(plain.received[g][0], zero.received[g][0], same_storage=False)


def test_sinks_change_only_what_is_read(model_dir, monkeypatch):
    """With sinks the builders still get the persistent buffers and vLLM's own slot
    mapping; lengths grow by the sinks exactly where the window has left them."""
    layouts = LAYOUTS["one_group"]
    batch = make_batch(layouts, num_reqs_padded=MAX_NUM_REQS)
    plain = wire("dspark", layouts, batch, model_dir, monkeypatch)
    build(plain, CUDAGraphMode.FULL)
    with_sinks = wire("dspark", layouts, batch, model_dir, monkeypatch, sinks=32)
    build(with_sinks, CUDAGraphMode.FULL)
    (a,), (b,) = plain.received[0], with_sinks.received[0]
    assert torch.equal(a.slot_mapping, b.slot_mapping)
    assert b.slot_mapping.data_ptr() == batch.block_tables.slot_mappings[0].data_ptr()
    lengths = torch.tensor(batch.seq_lens, dtype=torch.int32)
    n = batch.num_reqs
    # Where the plain window reads less than W + S, the sinks' window reads everything.
    short = a.seq_lens[:n] + 32 > lengths
    assert torch.equal(b.seq_lens[:n][short], lengths[short])
    assert torch.equal(b.seq_lens[:n][~short], a.seq_lens[:n][~short] + 32)


@pytest.mark.parametrize("layout_name", list(LAYOUTS))
@pytest.mark.parametrize("cg_mode", [CUDAGraphMode.NONE, CUDAGraphMode.FULL], ids=str)
def test_the_one_launch_refresh_builds_what_the_torch_path_builds(
    layout_name, cg_mode, model_dir, monkeypatch
):
    """Through vLLM's real build path: with the fused refresh (the window's Triton kernel,
    here under the interpreter) the builders get the same lengths and tables, in the same
    persistent buffers, and the draft reads exactly the window."""
    layouts = LAYOUTS[layout_name]
    batch = make_batch(layouts, num_reqs_padded=MAX_NUM_REQS)
    wired = wire("dspark", layouts, batch, model_dir, monkeypatch, sinks=20)
    torch_path = {
        name: (md.seq_lens.clone(), md.block_table.clone())
        for name, md in build(wired, cg_mode).items()
    }
    window = wired.speculator.draft_window
    enable_fused(window)
    for buffer in (window.seq_lens, *(w.block_table for w in window.windows.values())):
        buffer.fill_(-1)  # what the kernel does not write would show
    metadata = build(wired, cg_mode)
    for name, md in metadata.items():
        assert torch.equal(md.seq_lens, torch_path[name][0])
        assert torch.equal(md.block_table, torch_path[name][1])
    assert_reads_exactly_the_window(wired, layouts, metadata)
