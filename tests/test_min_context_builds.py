# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""``draft_window_min_context`` through vLLM 0.33's real build paths: DFlash and DSpark
speculators, vLLM's `_build_uniform_attn_metadata`, its Triton attention metadata builder
and Triton paged attention kernel (interpreted), eager and FULL graphs.

Rows below the threshold must read exactly their whole context; rows at or above it exactly
what the window without a threshold reads (that window is pinned to dense attention and to
the released MRV1 adapter in test_mrv2_dflash.py).
"""

import numpy as np
import pytest
import torch
from vllm.config.compilation import CUDAGraphMode

from testbed.buffers import prepare_dflash_step
from testbed.reference import dense_attention
from testbed.speculators import GroupLayout
from tests.cpu_testbed.dflash import (
    LAYOUTS,
    MAX_NUM_REQS,
    NUM_SPEC,
    SINKS,
    W,
    assert_reads_exactly_the_window,
    build,
    capture_on_cpu,
    draft_groups,
    make_batch,
    move_batch_into,
    wire,
)

pytestmark = pytest.mark.usefixtures("window_hooks")

# Around a threshold on block edges (1024) and one between them (1001): just below, at,
# just above, a block further, and far on both sides; each counts its Q query tokens.
THRESHOLDS = {
    1024: [5, 160, 1000, 1022, 1023, 1024, 1025, 1040, 2000, 1088, 129],
    1001: [5, 160, 999, 1000, 1001, 1002, 1008, 1024, 2000, 511, 129],
}


def config(min_context, sinks=0):
    return {
        "draft_window_size": W,
        "draft_attention_sinks": sinks,
        "draft_window_min_context": min_context,
    }


def snapshot(metadata):
    return {name: (md.seq_lens.clone(), md.block_table.clone()) for name, md in metadata.items()}


def assert_whole_below_window_above(wired, plain, layouts, metadata, plain_metadata, min_context):
    """Below: the whole context (dense attention and vLLM's kernel over it); at or above:
    the plain window's lengths and cropped tables, row for row."""
    assert_reads_exactly_the_window(wired, layouts, metadata, min_context=min_context)
    lengths = wired.batch.seq_lens.tolist()
    assert any(length < min_context for length in lengths)
    assert any(length >= min_context for length in lengths)
    for name, (seq_lens, table) in snapshot(metadata).items():
        plain_seq_lens, plain_table = plain_metadata[name]
        width = plain_table.shape[1]
        for i, length in enumerate(lengths):
            if length < min_context:
                continue
            assert int(seq_lens[i]) == int(plain_seq_lens[i]) < length, (name, i)
            # Every column read lies inside the plain window's table, equal to it.
            assert torch.equal(table[i, :width], plain_table[i]), (name, i)


NONE, FULL = CUDAGraphMode.NONE, CUDAGraphMode.FULL


# Each method, layout, mode, threshold and sinks value in at least two combinations.
@pytest.mark.parametrize(
    ("method", "layout_name", "cg_mode", "min_context", "sinks"),
    [
        ("dflash", "one_group", NONE, 1024, 0),
        ("dspark", "one_group", FULL, 1001, 20),
        ("dspark", "target_group_and_two_draft_groups", NONE, 1001, 0),
        ("dflash", "target_group_and_two_draft_groups", FULL, 1024, 20),
        ("dspark", "draft_group_with_smaller_kernel_blocks", FULL, 1024, 0),
        ("dflash", "draft_group_with_smaller_kernel_blocks", NONE, 1001, 20),
    ],
)
def test_rows_below_the_threshold_read_whole_the_others_their_window(
    method, layout_name, cg_mode, min_context, sinks, model_dir, monkeypatch
):
    layouts = LAYOUTS[layout_name]
    batch = make_batch(layouts, seq_lens=THRESHOLDS[min_context], num_reqs_padded=MAX_NUM_REQS)
    plain = wire(method, layouts, batch, model_dir, monkeypatch, config(0, sinks))
    plain_metadata = snapshot(build(plain, cg_mode))
    wired = wire(method, layouts, batch, model_dir, monkeypatch, config(min_context, sinks))
    window = wired.speculator.draft_window
    assert window.spec.min_context == min_context
    metadata = build(wired, cg_mode, slack=3)
    assert_whole_below_window_above(wired, plain, layouts, metadata, plain_metadata, min_context)
    # What the builder is told on the host bounds every read, whole or windowed.
    for g, (cam,) in wired.received.items():
        assert bool((cam.seq_lens_cpu_upper_bound >= cam.seq_lens).all()), g
        assert int(cam.seq_lens.max()) <= cam.max_seq_len <= min_context - 1


@pytest.mark.parametrize("sinks", SINKS)
def test_one_full_graph_serves_rows_crossing_the_threshold_between_replays(
    sinks, model_dir, monkeypatch
):
    """Captured once; replayed for a step whose rows sit just below the threshold, then for
    one where they have crossed it: the in-graph update follows each row."""
    min_context = 1024
    layouts = [GroupLayout(16), GroupLayout(32), GroupLayout(64, kernel_block_size=32)]
    before = [1000, 1020, 1023, 1021, 5, 2000, 700, 1010, 1022, 1015, 160]
    after = [length + 4 if length > 900 and length < 1030 else length for length in before]
    batch = make_batch(layouts, seq_lens=before, num_reqs_padded=MAX_NUM_REQS)
    wired = wire("dflash", layouts, batch, model_dir, monkeypatch, config(min_context, sinks))
    s = wired.speculator
    captured = capture_on_cpu(s, monkeypatch)
    s.capture()
    plain_batch = make_batch(layouts, seq_lens=before, num_reqs_padded=MAX_NUM_REQS)
    plain = wire("dflash", layouts, plain_batch, model_dir, monkeypatch, config(0, sinks))
    for step, lengths in enumerate((before, after)):
        later = make_batch(layouts, seq_lens=lengths, num_reqs_padded=MAX_NUM_REQS, seed=step)
        for target in (batch, plain_batch):
            move_batch_into(later, target)
            # The same verify step for both (vLLM's DFlash input prep, interpreted).
            prepare_dflash_step(
                target, NUM_SPEC, np.random.default_rng(step), draft_groups(layouts)
            )
        s._update_draft_decode_metadata(captured, MAX_NUM_REQS)
        plain_metadata = snapshot(build(plain, CUDAGraphMode.FULL))
        assert_whole_below_window_above(
            wired, plain, layouts, captured, plain_metadata, min_context
        )
    crossed = [
        i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a < min_context <= b
    ]
    assert crossed and all(int(captured["draft.0"].seq_lens[i]) < after[i] for i in crossed)


def test_without_the_key_or_with_zero_every_build_equals_todays(model_dir, monkeypatch):
    layouts = LAYOUTS["target_group_and_two_draft_groups"]
    batch = make_batch(layouts, seq_lens=THRESHOLDS[1024], num_reqs_padded=MAX_NUM_REQS)
    builds = []
    # The draft groups' alignment is 32: a threshold of W + 32 = S + W + a changes nothing.
    for additional in ({"draft_window_size": W}, config(0), config(None), config(W + 32)):
        wired = wire("dspark", layouts, batch, model_dir, monkeypatch, additional)
        builds.append(snapshot(build(wired, CUDAGraphMode.FULL)))
        assert wired.speculator.draft_window.spec.min_context == 0
    for other in builds[1:]:
        for name, (seq_lens, table) in builds[0].items():
            assert torch.equal(other[name][0], seq_lens) and torch.equal(other[name][1], table)


# EAGLE3 on vLLM 0.33: the draft prefill and every decode step, eager and updated in place.
EAGLE_CONTEXTS = [300, 308, 310, 312, 313, 314, 315, 316, 318, 2, 700]


@pytest.mark.parametrize(
    ("min_context", "layout_name", "sinks"),
    [
        (320, "two_groups", 0),
        (317, "one_group", 20),
        (320, "one_group", 20),
    ],
)
@pytest.mark.parametrize("fused", [False, True], ids=["rebuild_each_step", "in_place_update"])
def test_every_eagle_step_reads_whole_below_the_threshold_and_its_window_above(
    min_context, layout_name, sinks, fused, model_dir, monkeypatch
):
    """Rows cross the threshold from one draft step to the next inside one propose."""
    from tests.cpu_testbed.eagle import EAGLE_LAYOUTS, read_step, run_decode, setup_eagle

    layouts, num_spec = EAGLE_LAYOUTS[layout_name], 5
    plain = setup_eagle(
        model_dir, monkeypatch, num_spec, layouts, EAGLE_CONTEXTS, seed=3, sinks=sinks
    )
    plain_steps = run_decode(plain, monkeypatch, fused)
    e = setup_eagle(
        model_dir,
        monkeypatch,
        num_spec,
        layouts,
        EAGLE_CONTEXTS,
        seed=3,
        sinks=sinks,
        min_context=min_context,
    )
    steps = run_decode(e, monkeypatch, fused)
    assert e.s.draft_window.spec.min_context == min_context
    assert len(steps) == len(plain_steps) == num_spec - 1
    below = torch.stack([r["lengths"] < min_context for r in steps])
    assert bool((below[0] & ~below[-1]).any())  # a row crossed it during the propose
    for record, plain_record in zip(steps, plain_steps, strict=True):
        assert torch.equal(record["lengths"], plain_record["lengths"])
        for g, layout in enumerate(layouts):
            read_lens, tables = record[f"draft.{g}"]
            plain_lens, plain_tables = plain_record[f"draft.{g}"]
            width = plain_tables.shape[1]
            for i in range(e.batch.num_reqs):
                length = int(record["lengths"][i])
                if length >= min_context:
                    assert int(read_lens[i]) == int(plain_lens[i]) < length
                    assert torch.equal(tables[i, :width], plain_tables[i, :width])
                    continue
                assert int(read_lens[i]) == length
                got, expected, touched = read_step(
                    e, g, layout.block_size, record["lengths"], read_lens, tables, i
                )
                torch.testing.assert_close(got, expected)
                b = layout.block_size
                assert touched == {e.batch.req_block_ids[g][i][p // b] for p in range(length)}
    # The host bound each build got holds for every step its metadata serves.
    for g, received in e.wired.received.items():
        served = [[r] for r in steps] if not fused else [steps]
        for cam, records in zip(received, served, strict=True):
            for record in records:
                assert bool((cam.seq_lens_cpu_upper_bound >= record[f"draft.{g}"][0]).all())


@pytest.mark.parametrize("prefill_chunk", [None, 300], ids=["decodes", "long_chunk"])
def test_the_eagle_draft_prefill_reads_whole_below_the_threshold(
    prefill_chunk, model_dir, monkeypatch
):
    from tests.cpu_testbed.eagle import EAGLE_LAYOUTS, run_prefill, setup_eagle

    layouts, min_context = EAGLE_LAYOUTS["two_groups"], 320
    kwargs = dict(seed=4, prefill_chunk=prefill_chunk, sinks=20)
    plain = setup_eagle(model_dir, monkeypatch, 3, layouts, EAGLE_CONTEXTS, **kwargs)
    plain_seen = snapshot(run_prefill(plain))
    e = setup_eagle(
        model_dir, monkeypatch, 3, layouts, EAGLE_CONTEXTS, min_context=min_context, **kwargs
    )
    seen = run_prefill(e)
    lengths = e.batch.seq_lens.tolist()
    assert min(lengths) < min_context <= max(lengths)
    qsl = e.batch.query_start_loc_np
    for g in range(len(layouts)):
        md = seen[f"draft.{g}"]
        plain_lens, plain_table = plain_seen[f"draft.{g}"]
        for i, length in enumerate(lengths):
            if length >= min_context:
                assert int(md.seq_lens[i]) == int(plain_lens[i])
                width = plain_table.shape[1]
                assert torch.equal(md.block_table[i, :width], plain_table[i])
                assert not md.block_table[i, width:].any()
                continue
            q_len = int(qsl[i + 1] - qsl[i])
            assert int(md.seq_lens[i]) == length
            q = e.k[i][length - q_len : length] * 0.5
            got, _ = e.caches[g].read(q, md.block_table[i], length)
            torch.testing.assert_close(got, dense_attention(q, e.k[i], e.v[i], 0, length))
    for (cam,) in e.wired.received.values():
        assert bool((cam.seq_lens_cpu_upper_bound >= cam.seq_lens).all())
