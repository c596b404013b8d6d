# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The draft attention backends of vLLM 0.33 (design doc, section 4.2): the ones the window
serves, driven through their real builders on CPU, read exactly the window; the ones whose
builders take the window's host bound as an exact length are refused by name at start-up,
and the path check stops such a build if one is served anyway."""

import re

import pytest
import torch
from vllm.config.compilation import CUDAGraphMode
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
from vllm.v1.attention.backends.flex_attention import FlexAttentionBackend
from vllm.v1.attention.backends.mla.cpu_mla import CPUMLABackend
from vllm.v1.attention.backends.mla.triton_mla import TritonMLABackend

from testbed.speculators import (
    GroupLayout,
)
from testbed.vllm_line import RELEASE
from tests.cpu_testbed.backends import (
    MLA_SPEC,
    decode_view,
    foreign_named,
    mla_config,
    refused,
    wire_mla,
)
from tests.cpu_testbed.dflash import (
    MAX_NUM_REQS,
    NUM_SPEC,
    assert_reads_exactly_the_window,
    build,
    make_batch,
    wire,
)
from vllm_ascend.worker.v2.spec_decode.draft_window import policy
from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import WindowNotInPathError

pytestmark = pytest.mark.usefixtures("window_hooks")


@pytest.mark.parametrize("method", ["dflash", "dspark"])
@pytest.mark.parametrize("cg_mode", [CUDAGraphMode.NONE, CUDAGraphMode.FULL], ids=str)
def test_flash_attention_drafts_read_exactly_the_window(method, cg_mode, model_dir, monkeypatch):
    layouts = [
        GroupLayout(16, backend=FlashAttentionBackend),
        GroupLayout(32, backend=FlashAttentionBackend),
    ]
    batch = make_batch(layouts, num_reqs_padded=MAX_NUM_REQS)
    wired = wire(method, layouts, batch, model_dir, monkeypatch)
    metadata = build(wired, cg_mode, slack=3)
    assert {type(md).__name__ for md in metadata.values()} == {"FlashAttentionMetadata"}
    assert_reads_exactly_the_window(wired, layouts, metadata)


@pytest.mark.parametrize("fused", [False, True], ids=["rebuild_each_step", "in_place_update"])
def test_flash_attention_eagle_steps_get_what_the_triton_builder_gets(
    fused, model_dir, monkeypatch
):
    """Every EAGLE3 decode step and the draft prefill hand flash attention's kernel the same
    lengths and tables as the Triton builder's (whose reads test_mrv2_eagle.py checks
    against dense attention)."""
    from tests.cpu_testbed.eagle import run_decode, run_prefill, setup_eagle

    records = {}
    for backend in (FlashAttentionBackend, None):
        layouts = [GroupLayout(16, backend=backend)]
        e = setup_eagle(model_dir, monkeypatch, 4, layouts, seed=2, prefill_chunk=300)
        seen = run_prefill(e)
        steps = run_decode(e, monkeypatch, fused)
        records[backend] = (seen, steps)
    (fa_prefill, fa_steps), (triton_prefill, triton_steps) = records.values()
    assert type(fa_prefill["draft.0"]).__name__ == "FlashAttentionMetadata"
    for name in ("seq_lens", "block_table"):
        assert torch.equal(
            getattr(fa_prefill["draft.0"], name), getattr(triton_prefill["draft.0"], name)
        )
    assert len(fa_steps) == len(triton_steps) == 3
    for ours, theirs in zip(fa_steps, triton_steps, strict=True):
        for a, b in zip(ours["draft.0"], theirs["draft.0"], strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("method", ["dflash", "dspark"])
@pytest.mark.parametrize("cg_mode", [CUDAGraphMode.NONE, CUDAGraphMode.FULL], ids=str)
def test_triton_mla_query_passes_stay_on_the_decode_path_and_read_the_window(
    method, cg_mode, mla_dir, monkeypatch
):
    """Triton MLA's decode threshold is 1 + K: a DFlash/DSpark pass of K + 1 or K tokens per
    request goes to its decode path, which reads the window's device lengths and table."""
    wired, layouts = wire_mla(mla_dir, method, TritonMLABackend, monkeypatch)
    builder = wired.attn_groups[0][0].metadata_builders[0]
    assert builder.reorder_batch_threshold == NUM_SPEC + 1
    metadata = build(wired, cg_mode, slack=3)
    md = metadata["draft.0"]
    assert md.num_prefills == 0 and md.prefill is None
    assert md.decode.seq_lens.data_ptr() == wired.speculator.draft_window.seq_lens.data_ptr()
    assert_reads_exactly_the_window(wired, layouts, decode_view(metadata))


@pytest.mark.parametrize(
    ("method", "backend", "why"),
    [
        (
            "eagle3",
            TritonMLABackend,
            "its builder sends every row from the first query of another length on to its "
            "prefill path, which takes the host bound as the exact context length; an EAGLE "
            "draft prefill's verify rows have only a bound there",
        ),
        (
            "dflash",
            CPUMLABackend,
            "its builder takes single-token queries only, so every draft "
            "query of several tokens goes to its prefill path, which takes the host bound as the "
            "exact context length",
        ),
        (
            "dspark",
            foreign_named(
                CPUMLABackend, "CutlassMLABackend", "vllm.v1.attention.backends.mla.cutlass_mla"
            ),
            "its builder takes single-token queries only",
        ),
    ],
)
def test_mla_backends_that_take_the_bound_as_exact_are_refused_by_name(
    method, backend, why, mla_dir, monkeypatch
):
    name = backend.__name__
    with refused(
        rf"draft_window_size=64 is not supported on {re.escape(RELEASE.name)} for {method} with "
        rf"group 0 \(MLAAttentionSpec, block size 16\) on attention backend {name}: "
        rf"{why}.* \(supported for {method} on this release: .*\)\. Use one of those "
        rf"attention backends, or remove draft_window_size\."
    ):
        wire_mla(mla_dir, method, backend, monkeypatch)


def test_flex_attention_is_refused_by_name(model_dir, monkeypatch):
    layouts = [GroupLayout(16, backend=FlexAttentionBackend)]
    with refused(
        r"on attention backend FlexAttentionBackend: its builder copies the lengths "
        r"into buffers of its own"
    ):
        wire("dflash", layouts, make_batch(layouts), model_dir, monkeypatch)


@pytest.mark.release("vLLM 0.34.x")
def test_flashinfer_ts_is_refused_by_name(model_dir, monkeypatch):
    """vLLM 0.34's task-scheduled FlashInfer decode (FLASHINFER_TS, for DFlash and DSpark
    drafts) copies the lengths and the table into buffers of its own at every build."""
    from vllm.v1.attention.backends.flashinfer_ts import FlashInferTSBackend

    layouts = [GroupLayout(16, backend=FlashInferTSBackend)]
    with refused(
        r"on attention backend FlashInferTSBackend: its builder copies the lengths and the "
        r"block table into buffers of its own at each build"
    ):
        wire("dflash", layouts, make_batch(layouts), model_dir, monkeypatch)


def test_a_builder_taking_the_bound_as_exact_is_stopped_by_the_proof(mla_dir, monkeypatch):
    """Served anyway (the refusal switched off), vLLM's common MLA builder sends a DFlash
    pass to its prefill path, whose context lengths come from the host bound: the run-time
    proof stops that build, naming the rows."""
    monkeypatch.setattr(policy, "refuse_backends", lambda *args, **kwargs: None)
    wired, _ = wire_mla(mla_dir, "dflash", CPUMLABackend, monkeypatch)
    with pytest.raises(WindowNotInPathError) as error:
        build(wired, CUDAGraphMode.NONE, slack=3)
    message = str(error.value)
    assert "its prefill path takes the host bound of rows 0, 1, 2, 3, 4, 5, 6, 7, ..." in message
    assert "the window handed it only a bound there" in message


def test_prefilling_rows_of_an_eagle_draft_prefill_get_their_exact_windowed_length(
    mla_dir, monkeypatch
):
    """A builder whose prefill path takes the bound as exact, served the draft prefill of a
    verify batch whose prefilling row comes last: the verify rows stay on its decode path,
    and the prefilling row's context is exactly its windowed length minus its chunk (the
    window made that bound exact), which the path check lets through."""
    from tests.cpu_testbed.eagle import run_prefill, setup_eagle

    monkeypatch.setattr(policy, "refuse_backends", lambda *args, **kwargs: None)
    config = mla_config(mla_dir, "eagle3", monkeypatch)
    layouts = [GroupLayout(16, spec=MLA_SPEC, backend=TritonMLABackend)]
    e = setup_eagle(mla_dir, monkeypatch, NUM_SPEC, layouts, prefill_chunk=300, vllm_config=config)
    md = run_prefill(e)["draft.0"]
    n = e.batch.num_reqs
    assert (md.num_decodes, md.num_prefills) == (n - 1, 1)
    windowed = int(e.s.draft_window.seq_lens[n - 1])
    assert windowed < int(e.batch.seq_lens[n - 1])  # the chunk's context is cropped
    assert md.prefill.chunked_context.context_lens_list == [windowed - 300]
