# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The DFlash family on vLLM 0.33 (method ``dflash``, the class chosen by the draft's
architecture): ``XPressSpeculator``, ``DFlash2Speculator`` and ``LiLiCorrSpeculator``,
each through its own ``__init__``, ``set_attn``, ``init_cudagraph_manager``, ``capture`` and
``propose`` (``startup.py``), eager and with a FULL graph replayed. They share DFlash's
query pass, which must read exactly the window; their own passes (XPress's Jacobi
refinement, DFlash2's candidate scoring and walk, LiLiCorr's context anchor and scorer) run
on the draft's hidden states and token ids after the draft forward, where no forward context
(and so no attention metadata) is set: they read nothing the window crops."""

import pytest
from vllm.config.compilation import CUDAGraphMode
from vllm.v1.worker.gpu.spec_decode.dflash2.speculator import DFlash2Speculator
from vllm.v1.worker.gpu.spec_decode.lilicorr.speculator import LiLiCorrSpeculator
from vllm.v1.worker.gpu.spec_decode.xpress.speculator import XPressSpeculator

from tests.cpu_testbed import graphs
from tests.cpu_testbed.startup import (
    assert_launch_reads,
    capture,
    propose,
    replayed,
    started,
    verify_step,
)

pytestmark = pytest.mark.usefixtures("window_hooks")

W = 64
NUM_SPEC = 3
TARGET_LENS = [40, 79, 80, 81, 300, 900]
# Each class's own heads, called after the draft forward.
FAMILY = {
    XPressSpeculator: {"xpress_head"},
    DFlash2Speculator: {"compute_candidates", "candidate_selector"},
    LiLiCorrSpeculator: {"compute_candidates", "lilicorr", "hidden_norm"},
}
MODES = [CUDAGraphMode.NONE, CUDAGraphMode.FULL_DECODE_ONLY]


def run(drafts, cls, mode, additional, monkeypatch):
    graphs.cuda_graphs_on_cpu(monkeypatch)
    st = started(drafts, "dflash", NUM_SPEC, mode, additional, monkeypatch, cls=cls)
    assert type(st.s) is cls
    capture(st.s, mode)
    t = verify_step(st, TARGET_LENS)
    propose(st.s, t)
    return st, t


@pytest.mark.parametrize("mode", MODES, ids=str)
@pytest.mark.parametrize("window", [W, None])
@pytest.mark.parametrize("cls", FAMILY, ids=lambda c: c.__name__)
def test_the_query_pass_reads_its_window_and_the_own_passes_no_metadata(
    cls, window, mode, drafts, monkeypatch
):
    additional = {} if window is None else {"draft_window_size": window}
    st, t = run(drafts, cls, mode, additional, monkeypatch)
    s = st.s
    assert (s.draft_window is None) == (window is None)
    n = len(TARGET_LENS)
    # The draft's own lengths, as vLLM's input prep kernel wrote them: the tokens kept after
    # rejection, then the query pass of K + 1 tokens (XPress's anchor and its slots too).
    assert s.num_query_per_req == NUM_SPEC + 1
    ends = [
        target - int(r) + s.num_query_per_req
        for target, r in zip(TARGET_LENS, t.rejected, strict=True)
    ]
    assert s.input_buffers.seq_lens[:n].tolist() == ends
    if mode == CUDAGraphMode.NONE:
        (launch,) = st.model.launches
    else:
        (launch,) = replayed(s.query_cudagraph_manager, st.model, 1)
    spec = None if s.draft_window is None else s.draft_window.spec
    assert_launch_reads(t, launch, ends, s.num_query_per_req, spec)
    # The class's own passes ran, every time outside the draft forward's context.
    heads = st.model.model.calls
    assert {head for head, _ in heads} == FAMILY[cls]
    assert not any(in_forward for _, in_forward in heads)


def test_an_xpress_draft_with_sinks_and_a_threshold_reads_its_window(drafts, monkeypatch):
    additional = {
        "draft_window_size": W,
        "draft_attention_sinks": 16,
        "draft_window_min_context": 200,
    }
    st, t = run(drafts, XPressSpeculator, CUDAGraphMode.FULL_DECODE_ONLY, additional, monkeypatch)
    s = st.s
    assert s.draft_window.spec.sink_size == 16 and s.draft_window.spec.min_context == 200
    ends = s.input_buffers.seq_lens[: len(TARGET_LENS)].tolist()
    (launch,) = replayed(s.query_cudagraph_manager, st.model, 1)
    assert_launch_reads(t, launch, ends, s.num_query_per_req, s.draft_window.spec)
