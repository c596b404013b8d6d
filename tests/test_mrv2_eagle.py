# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""EAGLE/EAGLE3 on Model Runner V2 read only the window (and the attention sinks, when set)
at the draft prefill and at every draft decode step: the real `EagleSpeculator` methods,
vLLM's real `DefaultModelState` and Triton attention metadata builders, read by the
reference paged attention."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from vllm.config.compilation import CUDAGraphMode
from vllm.v1.attention.backends.utils import PAD_SLOT_ID
from vllm.v1.worker.gpu.spec_decode.eagle.speculator import EagleSpeculator

from testbed.buffers import (
    fill_input_block_tables,
)
from testbed.mrv1_adapter import load_mrv1_adapter_module
from testbed.reference import (
    dense_attention,
    positions_read,
    unified_attention_read,
)
from testbed.speculators import (
    HEAD_SIZE,
    NUM_KV_HEADS,
    GroupLayout,
    make_vllm_config,
)
from tests.cpu_testbed import graphs
from tests.cpu_testbed.eagle import (
    DRAFT_STEP,
    FUSED_DECODE,
    LAYOUTS,
    MAX_MODEL_LEN,
    MAX_NUM_REQS,
    SINKS,
    W,
    expected_blocks,
    prepare_decode,
    read_step,
    run_decode,
    run_prefill,
    setup_eagle,
    update_inputs,
)
from tests.cpu_testbed.graphs import cuda_graphs_on_cpu
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import plugin

# Every test here runs with the plugin installed, as vLLM loads it.
pytestmark = pytest.mark.usefixtures("window_hooks")


@pytest.mark.parametrize("num_spec", [2, 3, 5, 7])
@pytest.mark.parametrize("layout_name", list(LAYOUTS))
@pytest.mark.parametrize("fused", [False, True], ids=["rebuild_each_step", "in_place_update"])
@pytest.mark.parametrize("sinks", SINKS)
def test_every_draft_decode_step_reads_exactly_its_window(
    num_spec, layout_name, fused, sinks, model_dir, monkeypatch
):
    layouts = LAYOUTS[layout_name]
    e = setup_eagle(model_dir, monkeypatch, num_spec, layouts, seed=num_spec, sinks=sinks)
    steps = run_decode(e, monkeypatch, fused)
    assert len(steps) == num_spec - 1
    spec = e.s.draft_window.spec
    assert spec.sink_size == (32 if sinks else 0)
    assert e.s.draft_window.block_tables.windows is e.s.draft_window.windows  # the narrow ones
    for record in steps:
        for g, layout in enumerate(layouts):
            read_lens, tables = record[f"draft.{g}"]
            for i in range(e.batch.num_reqs):
                length, read = int(record["lengths"][i]), int(read_lens[i])
                assert min(length, spec.sink_size + W) <= read <= spec.max_read_len
                assert positions_read(length, read, spec.sink_size)[0] % spec.alignment == 0
                got, expected, touched = read_step(
                    e, g, layout.block_size, record["lengths"], read_lens, tables, i
                )
                torch.testing.assert_close(got, expected)
                assert touched == expected_blocks(e, g, layout.block_size, i, length, read)
    # The first and the last step (sampled: the interpreter is slow) through vLLM's own
    # Triton paged attention kernel, one launch per step and group.
    for record in {id(r): r for r in (steps[0], steps[-1])}.values():
        lengths = record["lengths"]
        for g, layout in enumerate(layouts):
            read_lens, tables = record[f"draft.{g}"]
            n = e.batch.num_reqs
            queries = [e.k[i][int(lengths[i]) - 1 : int(lengths[i])] * 0.5 for i in range(n)]
            kernel = unified_attention_read(
                e.caches[g], queries, tables, read_lens, layout.block_size
            )
            for i, got in enumerate(kernel):
                _, expected, _ = read_step(e, g, layout.block_size, lengths, read_lens, tables, i)
                torch.testing.assert_close(got.double(), expected, atol=2e-5, rtol=1e-4)
    # The host bound the builders got holds for every step its metadata serves: one
    # build per step when rebuilt, one build for all steps when updated in place.
    for g, received in e.wired.received.items():
        served = [[r] for r in steps] if not fused else [steps] * bool(steps)
        assert len(received) == len(served)
        for cam, records in zip(received, served, strict=True):
            for record in records:
                assert bool((cam.seq_lens_cpu_upper_bound >= record[f"draft.{g}"][0]).all())


@pytest.mark.parametrize("fused", [False, True], ids=["rebuild_each_step", "in_place_update"])
def test_slot_mappings_are_identical_with_and_without_the_window(fused, model_dir, monkeypatch):
    layouts = LAYOUTS["two_groups"]
    with_window = run_decode(setup_eagle(model_dir, monkeypatch, 4, layouts), monkeypatch, fused)
    plugin.unregister()
    plain = setup_eagle(model_dir, monkeypatch, 4, layouts)
    without = run_decode(plain, monkeypatch, fused)
    assert getattr(plain.s, "draft_window", None) is None
    assert len(with_window) == 3
    for a, b in zip(with_window, without, strict=True):
        assert torch.equal(a["lengths"], b["lengths"])
        # What each draft layer's metadata hands the KV write: absolute and unchanged.
        for name, slots in b["md_slots"].items():
            assert torch.equal(a["md_slots"][name], slots), name


@pytest.mark.parametrize("layout_name", list(LAYOUTS))
@pytest.mark.parametrize("prefill_chunk", [None, 40, 300], ids=["decodes", "short", "long"])
@pytest.mark.parametrize("num_spec", [1, 3, 7])
@pytest.mark.parametrize("sinks", SINKS)
def test_draft_prefill_reads_the_window_and_leaves_the_target_metadata_alone(
    num_spec, layout_name, prefill_chunk, sinks, model_dir, monkeypatch
):
    layouts = LAYOUTS[layout_name]
    e = setup_eagle(
        model_dir, monkeypatch, num_spec, layouts, prefill_chunk=prefill_chunk, sinks=sinks
    )
    target_before = {
        name: (md, md.seq_lens.clone(), md.block_table.clone())
        for name, md in e.target_metadata.items()
    }
    slots = e.batch.block_tables.slot_mappings
    slots[:, e.batch.num_tokens :] = 12345  # stale slots of an earlier, larger step
    padded = e.batch.num_tokens + 5
    seen = run_prefill(e, padded)
    # Slots past the target's tokens up to the prefill's padded count write nowhere.
    assert bool((slots[:, e.batch.num_tokens : padded] == PAD_SLOT_ID).all())
    # The host bound the builders got: exact on prefill rows, a bound elsewhere.
    prefilling = torch.from_numpy(e.input_batch.is_prefilling_np)
    for received in e.wired.received.values():
        (cam,) = received
        assert bool((cam.seq_lens_cpu_upper_bound >= cam.seq_lens).all())
        assert torch.equal(cam.seq_lens_cpu_upper_bound[prefilling], cam.seq_lens[prefilling])
    spec = e.s.draft_window.spec
    for name, (md, lengths, table) in target_before.items():
        assert e.target_metadata[name] is md
        assert torch.equal(md.seq_lens, lengths) and torch.equal(md.block_table, table)
        if name.startswith("target"):
            assert seen[name] is md  # the target's layers are not the draft's business
        else:
            assert seen[name] is not md
    qsl = e.batch.query_start_loc_np
    window = e.s.draft_window
    for g, layout in enumerate(layouts):
        b = layout.block_size
        md = seen[f"draft.{g}"]
        # The prefill reads its own wide tables; the per-step tables stay window-narrow.
        assert md.block_table.data_ptr() == window.chunk_windows[g].block_table.data_ptr()
        assert window.windows[g].max_window_blocks * b < spec.sink_size + W + spec.alignment + 128
        assert window.chunk_windows[g].max_window_blocks * b >= max(np.diff(qsl))
        assert md.slot_mapping.data_ptr() == e.batch.block_tables.slot_mappings[g].data_ptr()
        sinks = spec.sink_size
        for i, length in enumerate(e.batch.seq_lens.tolist()):
            q_len, read = int(qsl[i + 1] - qsl[i]), int(md.seq_lens[i])
            start, _ = positions_read(length, read, sinks)
            # Every query token reads at least itself; a chunk longer than the window keeps
            # its whole chunk.
            assert start <= length - q_len and start % spec.alignment == 0
            assert read >= min(length, sinks + max(W, q_len))
            assert read <= sinks + max(W, q_len) + spec.alignment - 1
            q = e.k[i][length - q_len : length] * 0.5
            got, touched = e.caches[g].read(q, md.block_table[i], read)
            expected = dense_attention(q, e.k[i], e.v[i], start, length, sinks)
            torch.testing.assert_close(got, expected)
            assert touched == expected_blocks(e, g, b, i, length, read)
    # After the prefill the views hand out the per-step tables again (a capture's dummies;
    # vLLM zeroes its own dummy rows, so this comes last).
    assert window.block_tables.windows is window.windows
    for g, dummy in enumerate(window.block_tables.get_dummy_block_tables(2)):
        assert dummy.data_ptr() == window.windows[g].block_table.data_ptr()


@pytest.mark.hooks("propose", "_prefill")
def test_propose_hands_the_target_batch_to_the_prefill_and_forgets_it(model_dir, monkeypatch):
    import vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator as ar_module

    e = setup_eagle(model_dir, monkeypatch, 3, LAYOUTS["one_group"])
    seen = []

    class Stop(Exception):
        pass

    def prepare_prefill_inputs(*args, **kwargs):
        # The first Triton kernel of propose; what the draft window holds then is recorded.
        seen.append(e.s.draft_window.propose.prefill_batch)
        raise Stop

    monkeypatch.setattr(ar_module, "prepare_prefill_inputs", prepare_prefill_inputs)
    e.s.temperature = torch.zeros(MAX_NUM_REQS)
    e.s.seeds = torch.zeros(MAX_NUM_REQS, dtype=torch.int64)
    e.s.num_speculative_steps = 3
    e.s.draft_max_seq_len = MAX_MODEL_LEN
    e.s.method = "eagle"
    e.s.hidden_states = torch.zeros(64, 4)
    e.s.model = SimpleNamespace()
    n = e.batch.num_reqs
    zeros = torch.zeros(n, dtype=torch.int64)
    with pytest.raises(Stop):
        e.s.propose(
            e.input_batch,
            e.target_metadata,
            {},
            torch.zeros(64, 4),
            None,
            zeros,
            zeros,
            zeros,
            zeros,
            e.s.temperature,
            e.s.seeds,
        )
    assert seen == [e.input_batch]
    assert e.s.draft_window.propose.prefill_batch is None


@pytest.mark.hooks("_build_drafter_attn_metadata")
def test_propose_hands_the_draft_prefill_the_window_through_vllms_own_method(
    model_dir, monkeypatch
):
    """vLLM 0.34's ``propose`` takes the draft prefill's metadata from
    ``_build_drafter_attn_metadata`` (the window's one hook of the EAGLE prefill): run for
    real up to the draft prefill (its input kernel interpreted), the prefill gets the
    window's metadata for the draft layers and the target's own for the target's, and
    vLLM's slot mappings."""
    e = setup_eagle(model_dir, monkeypatch, 3, LAYOUTS["one_group"])
    seen = []

    class Stop(Exception):
        pass

    def prefill(self, num_reqs, num_tokens, attn_metadata, slot_mappings, *args, **kwargs):
        seen.append((attn_metadata, slot_mappings))
        raise Stop

    monkeypatch.setattr(EagleSpeculator, "_prefill", prefill, raising=False)
    s, n = e.s, e.batch.num_reqs
    s.temperature = torch.zeros(MAX_NUM_REQS)
    s.seeds = torch.zeros(MAX_NUM_REQS, dtype=torch.int64)
    s.method = "eagle"
    s.hidden_states = torch.zeros(e.batch.num_tokens + 8, 4)
    s.model = SimpleNamespace()
    s.eplb_state = None
    s.prefill_cudagraph_manager = None  # eager (is_profile below)
    s.dp_size, s.dp_rank = 1, 0
    zeros = torch.zeros(n, dtype=torch.int64)
    target_slot_mappings = {"target.0": torch.zeros(1), "draft.0": torch.zeros(1)}
    with pytest.raises(Stop):
        s.propose(
            e.input_batch,
            e.target_metadata,
            target_slot_mappings,
            torch.zeros(e.batch.num_tokens, 4),
            None,
            zeros,
            zeros,
            torch.zeros(MAX_NUM_REQS, dtype=torch.int64),
            torch.zeros(MAX_NUM_REQS, dtype=torch.int32),
            s.temperature,
            s.seeds,
            is_profile=True,  # no prefill graph manager on a wired speculator: eager
        )
    ((metadata, slot_mappings),) = seen
    assert slot_mappings is target_slot_mappings
    assert metadata["target.0"] is e.target_metadata["target.0"]
    draft = metadata["draft.0"]
    assert draft is not e.target_metadata["draft.0"]
    window = s.draft_window
    assert draft.seq_lens.data_ptr() == window.seq_lens.data_ptr()
    assert draft.block_table.data_ptr() == window.chunk_windows[0].block_table.data_ptr()
    spec = window.spec
    query_lens = np.diff(e.batch.query_start_loc_np)
    for i, length in enumerate(e.batch.seq_lens.tolist()):
        read, q_len = int(draft.seq_lens[i]), int(query_lens[i])
        assert min(length, W) <= read <= max(W, q_len) + spec.alignment - 1
        start = positions_read(length, read, 0)[0]
        assert start % spec.alignment == 0 and start <= length - q_len


@pytest.mark.parametrize("num_spec", [2, 3, 4, 7])
def test_final_step_equals_mrv1_and_earlier_steps_avoid_its_needed_columns_defect(
    num_spec, model_dir, monkeypatch
):
    """MRV1 windows once with K = num_speculative_tokens on context-only lengths and reuses
    its table for every step. At the final step both windows coincide; at earlier steps
    MRV1's table lacks the columns of the newest tokens where they cross a block."""
    mrv1 = load_mrv1_adapter_module()
    layouts = [GroupLayout(16)]
    contexts = [61 - num_spec, 62 - num_spec, 64 - num_spec, 77 - num_spec, 300]
    e = setup_eagle(model_dir, monkeypatch, num_spec, layouts, contexts=contexts, seed=11)
    e.num_rejected[:] = 0
    steps = run_decode(e, monkeypatch, fused=False)
    final = steps[-1]
    final_lengths = final["lengths"]
    adapter = mrv1.SlidingWindowAdapter(W, 16, MAX_NUM_REQS, num_spec, torch.device("cpu"))
    n = e.batch.num_reqs
    full = e.batch.block_tables.input_block_tables[0][:n]
    # MRV1's context-only lengths: its last step reads seq_lens + K = our final lengths.
    cam = SimpleNamespace(block_table_tensor=full, seq_lens=(final_lengths - num_spec).int())
    adapter.apply(cam)
    read_lens, table = final["draft.0"]
    assert torch.equal(read_lens, cam.seq_lens + num_spec)
    mrv1_table = cam.block_table_tensor
    for i in range(n):
        cols = -(-int(cam.seq_lens[i]) // 16)
        assert torch.equal(table[i, :cols], mrv1_table[i, :cols])
    defects = 0
    for record in steps:
        lengths = record["lengths"]
        ours_lens, ours_table = record["draft.0"]
        for i in range(n):
            # MRV1 at this step: its table, its length grown by one per step.
            mrv1_read = int(cam.seq_lens[i]) + (int(lengths[i]) - int(final_lengths[i])) + num_spec
            got, expected, _ = read_step(e, 0, 16, lengths, ours_lens, ours_table, i)
            torch.testing.assert_close(got, expected)
            length = int(lengths[i])
            q = e.k[i][length - 1 : length] * 0.5
            mrv1_got, mrv1_touched = e.caches[0].read(q, mrv1_table[i], mrv1_read)
            mrv1_expected = dense_attention(q, e.k[i], e.v[i], length - mrv1_read, length)
            if 0 in mrv1_touched:
                defects += 1
                assert not torch.allclose(mrv1_got, mrv1_expected, equal_nan=True)
    # Contexts were chosen so that MRV1 hits its defect at least once for K >= 2.
    assert defects > 0


@pytest.mark.parametrize(("sinks", "min_context"), [(0, 0), (20, 0), (0, 206), (20, 206)])
def test_full_graphs_prefill_runs_without_them_and_decode_graphs_read_the_window(
    sinks, min_context, model_dir, monkeypatch
):
    """FULL_DECODE_ONLY, with a kernel-block group and sinks: the draft prefill manager loses
    its FULL graphs (they would read the target's captured buffers); the fused decode graph
    is captured through the window by vLLM's own graph managers and
    ``CudaGraphManager.capture`` (only the device boundary stood in,
    ``tests.cpu_testbed.graphs``) and, replayed, reads exactly each step's window.
    (FULL_AND_PIECEWISE, whose draft prefill keeps PIECEWISE graphs, starts through the
    speculators' own __init__ in test_capture.py.) With ``draft_window_min_context``, rows
    cross the threshold between the capture (dummy lengths) and the replay, and from step to
    step inside it."""
    num_spec = 4
    # A kernel-block group too, and fewer requests than the captured graph's size.
    layouts = [GroupLayout(16), GroupLayout(64, kernel_block_size=32)]
    e = setup_eagle(
        model_dir,
        monkeypatch,
        num_spec,
        layouts,
        contexts=[2, 60, 64, 130, 200, 700],
        seed=5,
        sinks=sinks,
        min_context=min_context,
    )
    s, n = e.s, e.batch.num_reqs
    s.supports_decode_metadata_update = True
    cuda_graphs_on_cpu(monkeypatch)
    compilation = s.vllm_config.compilation_config
    graphs.set_capture_sizes(monkeypatch, compilation, (4, MAX_NUM_REQS), (1,))
    # No speculative config in the tiny VllmConfig: a fixed number of speculative tokens.
    speculative = SimpleNamespace(
        num_speculative_tokens=num_spec,
        uses_dynamic_speculative_decoding=lambda: False,
        method="eagle3",
        use_multi_module_mtp=lambda: False,
    )
    s.speculative_config = speculative
    monkeypatch.setattr(s.vllm_config, "speculative_config", speculative)
    s.init_cudagraph_manager(CUDAGraphMode.FULL_DECODE_ONLY)
    assert s.prefill_cudagraph_manager.cudagraph_mode == CUDAGraphMode.NONE
    assert s.decode_cudagraph_manager.draft_window is s.draft_window
    steps = []

    def generate_draft(num_reqs, num_tokens_padded, attn_metadata, *args, **kwargs):
        # The draft forward (no weights on CPU): what its layers read when the graph
        # replays, then vLLM's update_draft_inputs kernel, which the graph records.
        if graphs.replaying() is not None:
            steps.append(
                {
                    "lengths": s.input_buffers.seq_lens[:n].clone(),
                    **{
                        name: (md.seq_lens.clone(), md.block_table.clone())
                        for name, md in attn_metadata.items()
                    },
                }
            )
        update_inputs(e, num_spec)

    setattr(s, DRAFT_STEP, generate_draft)
    s.capture()
    manager = s.decode_cudagraph_manager
    (desc,) = [d for d in manager.graphs if d.num_reqs == MAX_NUM_REQS]
    assert not s.prefill_cudagraph_manager.graphs
    assert s.input_buffers is not s.draft_window.input_buffers  # restored after capture

    # A replay: the target runner gathers this step's tables (capture zeroed them), the
    # decode kernels write the real batch, then the graph runs.
    fill_input_block_tables(e.batch)
    s.idx_mapping[:n] = torch.from_numpy(e.batch.idx_mapping)
    s.idx_mapping[n:] = -1
    prepare_decode(e)
    getattr(s, FUSED_DECODE)(n, False, desc, None, e.input_batch.seq_lens_cpu_upper_bound, num_spec)
    assert len(steps) == num_spec - 1
    window = s.draft_window
    for record_ in steps:
        for g, layout in enumerate(layouts):
            read_lens, tables = record_[f"draft.{g}"]
            assert not read_lens[n:].any()  # padded rows of the graph read nothing
            unit = layout.kernel_block_size or layout.block_size
            for i in range(n):
                got, expected, _ = read_step(e, g, unit, record_["lengths"], read_lens, tables, i)
                torch.testing.assert_close(got, expected)
                length, read = int(record_["lengths"][i]), int(read_lens[i])
                if length < min_context:
                    assert read == length  # below the threshold: the whole context
                else:
                    reach = window.spec.sink_size + W + window.spec.alignment
                    assert min(length, window.spec.sink_size + W) <= read <= reach - 1
    if min_context:
        # Both sides of the threshold were replayed, and a row crossed it between steps.
        first, last = steps[0]["lengths"], steps[-1]["lengths"]
        assert bool(((first < min_context) & (last >= min_context)).any()), (first, last)


@pytest.mark.parametrize("fused", [False, True], ids=["rebuild_each_step", "in_place_update"])
def test_a_group_not_windowed_reads_what_vllm_gives_it(fused, model_dir, monkeypatch):
    """A hybrid EAGLE draft (full attention and a sliding window): the sliding-window group
    keeps the target's prefill metadata and vLLM's own build at every decode step."""
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    from tests.cpu_testbed.dflash import compare_cams

    sliding = SlidingWindowSpec(
        block_size=32,
        sliding_window=128,
        num_kv_heads=NUM_KV_HEADS,
        head_size=HEAD_SIZE,
        dtype=torch.float32,
    )
    layouts = [GroupLayout(16), GroupLayout(32, spec=sliding)]
    e = setup_eagle(model_dir, monkeypatch, 4, layouts)
    assert sorted(e.s.draft_window.windows) == [0]
    prefill = run_prefill(e)
    assert prefill["draft.1"] is e.target_metadata["draft.1"]
    assert prefill["draft.0"] is not e.target_metadata["draft.0"]
    steps = run_decode(e, monkeypatch, fused)
    for record in steps:
        read_lens, _ = record["draft.1"]
        assert torch.equal(read_lens[: e.batch.num_reqs], record["lengths"])
    plugin.unregister()
    plain = setup_eagle(model_dir, monkeypatch, 4, layouts)
    run_decode(plain, monkeypatch, fused)
    mine, theirs = e.wired.received[1], plain.wired.received[1]
    assert len(mine) == len(theirs) == (1 if fused else 3)
    for a, b in zip(theirs, mine, strict=True):
        compare_cams(a, b, same_storage=False)
        assert b.seq_lens.data_ptr() == e.s.input_buffers.seq_lens.data_ptr()
        assert (
            b.block_table_tensor.data_ptr() == e.batch.block_tables.input_block_tables[1].data_ptr()
        )


def test_before_set_attn_there_is_no_window_yet_and_nothing_is_decided(model_dir):
    """vLLM's profiling run proposes before the KV cache exists (before set_attn)."""
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import hooks, install
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.hooks import autoregressive

    s = object.__new__(EagleSpeculator)
    s.vllm_config = make_vllm_config(
        model_dir, MAX_MODEL_LEN, MAX_NUM_REQS, {"draft_window_size": W}
    )
    calls = []
    installed = install.installation()
    if "propose" in installed.names:
        # vLLM's propose needs its Triton kernels; this stand-in only records the call.
        propose = autoregressive.propose(
            lambda self, batch, attn_metadata: calls.append(batch), installed
        )
        propose(s, "dummy batch", None)
    else:  # vLLM 0.34: the draft prefill's metadata comes from one method

        def build(self, input_batch, attn_metadata, slot_mappings, cg_mode=None):
            calls.append(input_batch)
            return attn_metadata, slot_mappings

        wrapped = autoregressive.build_drafter_attn_metadata(build, installed)
        assert wrapped(s, "dummy batch", "metadata", "slots") == ("metadata", "slots")
    assert calls == ["dummy batch"] and "draft_window" not in vars(s)
    assert hooks.window_of(s, install.installation()) is None and "draft_window" not in vars(s)


@pytest.mark.hooks("propose", "_prefill")
def test_a_propose_whose_draft_prefill_skips_the_hook_is_stopped(model_dir, monkeypatch):
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import install
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.hooks import autoregressive
    from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import WindowNotInPathError

    e = setup_eagle(model_dir, monkeypatch, 3, LAYOUTS["one_group"])
    e.s._run_model = lambda num_tokens, *args, **kwargs: (torch.zeros(num_tokens, 4),) * 2

    # vLLM's propose needs its Triton kernels; this stand-in runs the draft prefill as
    # vLLM's does, then returns.
    def vllms_propose(self, input_batch, attn_metadata):
        self._prefill(
            input_batch.num_reqs,
            input_batch.num_tokens,
            attn_metadata,
            None,
            None,
            skip_sample=True,
        )
        return "drafts"

    propose = autoregressive.propose(vllms_propose, install.installation())
    assert propose(e.s, e.input_batch, e.target_metadata) == "drafts"

    def own_prefill(self, num_reqs, num_tokens, attn_metadata, *args, **kwargs):
        """An override without super(): the model runs on the target's metadata as it is."""

    monkeypatch.setattr(EagleSpeculator, "_prefill", own_prefill, raising=False)
    skipped = r"EagleSpeculator.propose ran its draft prefill without the window's hook"
    with pytest.raises(WindowNotInPathError, match=skipped):
        propose(e.s, e.input_batch, e.target_metadata)


@pytest.mark.hooks("propose", "_prefill")
def test_a_draft_prefill_outside_propose_runs_only_in_a_graph_capture(model_dir, monkeypatch):
    from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import WindowNotInPathError

    e = setup_eagle(model_dir, monkeypatch, 3, LAYOUTS["one_group"])
    e.s._run_model = lambda num_tokens, *args, **kwargs: (torch.zeros(num_tokens, 4),) * 2
    args = (e.batch.num_reqs, e.batch.num_tokens, e.target_metadata, None, None)
    outside = r"_prefill ran with the target's metadata outside the window's propose hook"
    with pytest.raises(WindowNotInPathError, match=outside):
        e.s._prefill(*args, skip_sample=True)
    # As the speculator's capture hook marks it.
    e.s.draft_window.propose.capturing = True
    e.s._prefill(*args, skip_sample=True)
