# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Start-up with graphs on vLLM 0.33: every draft graph capture runs through the real host
code (the speculators' ``__init__``, ``set_attn``, ``init_cudagraph_manager`` and
``capture``, vLLM's graph managers and ``CudaGraphManager.capture``, the capture input
preparation and the builders), with only the device boundary stood in (``startup.py``,
``tests.cpu_testbed.graphs``). Then the speculator's own ``propose`` replays the captured
graph, and every attention launch it recorded must read exactly its window."""

import re

import pytest
from vllm.config.compilation import CUDAGraphMode

from testbed.vllm_line import RELEASE
from tests.cpu_testbed import graphs
from tests.cpu_testbed.startup import (
    Verified,
    assert_launch_reads,
    capture,
    propose,
    replayed,
    started,
    verify_step,
)

pytestmark = pytest.mark.usefixtures("window_hooks")

W = 64
# Target lengths after the verify step (its query included), around the window (64) and
# block (16) edges; 7 requests replay the graph captured for 8 (vLLM 0.34 captures an
# EAGLE draft's decode graphs at every request count up to 6).
TARGET_LENS = [40, 64, 79, 80, 81, 300, 900]
GRAPH_MODES = [CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.FULL, CUDAGraphMode.FULL_AND_PIECEWISE]


def run(drafts, method, num_spec, mode, additional, monkeypatch, backend=None):
    graphs.cuda_graphs_on_cpu(monkeypatch)
    st = started(drafts, method, num_spec, mode, additional, monkeypatch, backend=backend)
    capture(st.s, mode)
    window = st.s.draft_window
    if window is not None:
        assert st.s.input_buffers is window.input_buffers.base  # restored after capture
    t = verify_step(st, TARGET_LENS)
    propose(st.s, t)
    return st, t


def assert_reads(t: Verified, launch, ends: list[int], num_queries: int, window) -> None:
    assert_launch_reads(t, launch, ends, num_queries, None if window is None else window.spec)


@pytest.mark.parametrize("mode", GRAPH_MODES)
@pytest.mark.parametrize("window", [W, None])
def test_eagle_captures_and_every_replayed_decode_step_reads_its_window(
    mode, window, drafts, monkeypatch
):
    num_spec = 4
    additional = {} if window is None else {"draft_window_size": window}
    st, t = run(drafts, "eagle3", num_spec, mode, additional, monkeypatch)
    s = st.s
    launches = replayed(s.decode_cudagraph_manager, st.model, num_spec - 1)
    for step, launch in enumerate(launches, start=1):
        # The draft's own length at the step: the tokens kept after rejection, then one per
        # step.
        ends = [target - int(r) + step for target, r in zip(TARGET_LENS, t.rejected, strict=True)]
        assert_reads(t, launch, ends, 1, s.draft_window)


@pytest.mark.parametrize("method", ["dflash", "dspark"])
@pytest.mark.parametrize("window", [W, None])
def test_dflash_and_dspark_capture_and_the_replayed_query_pass_reads_its_window(
    method, window, drafts, monkeypatch
):
    additional = {} if window is None else {"draft_window_size": window}
    st, t = run(drafts, method, 3, CUDAGraphMode.FULL_DECODE_ONLY, additional, monkeypatch)
    s = st.s
    n = len(TARGET_LENS)
    ends = s.input_buffers.seq_lens[:n].tolist()
    # The draft's own lengths, as vLLM's input prep kernel wrote them: the tokens kept after
    # rejection, then the query.
    assert ends == [
        target - int(r) + s.num_query_per_req
        for target, r in zip(TARGET_LENS, t.rejected, strict=True)
    ]
    (launch,) = replayed(s.query_cudagraph_manager, st.model, 1)
    assert_reads(t, launch, ends, s.num_query_per_req, s.draft_window)


@pytest.mark.parametrize("method", ["eagle3", "dflash"])
def test_flash_attention_captures_and_replays_read_the_window(method, drafts, monkeypatch):
    """The same start-up, capture and replay with the draft on vLLM's flash attention backend
    (its builder runs on CPU; the kernel launch is recorded like Triton's)."""
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

    num_spec = 3
    st, t = run(
        drafts,
        method,
        num_spec,
        CUDAGraphMode.FULL_DECODE_ONLY,
        {"draft_window_size": W},
        monkeypatch,
        backend=FlashAttentionBackend,
    )
    s = st.s
    assert {g.backend for gs in s.attn_groups for g in gs} == {FlashAttentionBackend}
    if method == "eagle3":
        launches = replayed(s.decode_cudagraph_manager, st.model, num_spec - 1)
        for step, launch in enumerate(launches, start=1):
            ends = [
                target - int(r) + step for target, r in zip(TARGET_LENS, t.rejected, strict=True)
            ]
            assert_reads(t, launch, ends, 1, s.draft_window)
    else:
        ends = s.input_buffers.seq_lens[: len(TARGET_LENS)].tolist()
        (launch,) = replayed(s.query_cudagraph_manager, st.model, 1)
        assert_reads(t, launch, ends, s.num_query_per_req, s.draft_window)


def test_a_draft_backend_defined_outside_vllm_is_refused_at_start_up(drafts, monkeypatch):
    """This release's table lists no backends: vLLM's own are served, and a platform plugin's
    (which may tell its kernel host lengths of its own) stops start-up by name, with the
    fix."""
    import types

    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

    platform = types.ModuleType("some_platform.attention")
    exec(
        "class PlatformAttentionBackend(Base):\n    pass\n",
        {"Base": TritonAttentionBackend, "__name__": platform.__name__},
        vars(platform),
    )
    foreign = platform.PlatformAttentionBackend
    assert foreign.__module__ == "some_platform.attention"
    graphs.cuda_graphs_on_cpu(monkeypatch)
    refused = (
        rf"draft_window_size=64 is not supported on {re.escape(RELEASE.name)} for dflash with "
        r"group 0 \(FullAttentionSpec, block size 16\) on attention backend "
        r"PlatformAttentionBackend from some_platform.attention, defined outside vLLM: "
        + (
            r".*for that platform, run Model Runner V1 \(VLLM_USE_V2_MODEL_RUNNER=0\), "
            if RELEASE.model_runner_v1
            else r".*for that platform, "
        )
        + r"or remove "
        r"draft_window_size"
    )
    with pytest.raises(ValueError, match=refused):
        started(
            drafts,
            "dflash",
            3,
            CUDAGraphMode.FULL_DECODE_ONLY,
            {"draft_window_size": W},
            monkeypatch,
            backend=foreign,
        )
    # Without the key the same start-up goes on, as without this package.
    st = started(
        drafts, "dflash", 3, CUDAGraphMode.FULL_DECODE_ONLY, {}, monkeypatch, backend=foreign
    )
    assert st.s.draft_window is None
