# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Start-up with graphs on the Ascend pairing: every draft graph capture runs through the real
host code (the speculators' ``__init__``, ``set_attn``, ``init_cudagraph_manager`` and
``capture``, vllm-ascend's graph managers, vLLM's ``CudaGraphManager.capture``, the capture
input preparation with ``AscendInputBatch.make_dummy``, the builders' capture builds), with
only the device boundary stood in (``graphs.py``, ``startup.py``). Then the speculator's own
``propose`` replays the captured graph, and every recorded FIA launch, with the parameters
the graph-task update gives it, must read exactly its window: the window of the length FIA
is told, from the same start as the table it reads."""

import inspect

import pytest
import torch
from vllm.config.compilation import CUDAGraphMode

from testbed.reference import assert_window_reads
from tests.ascend.npu_testbed.acl_graphs import acl_graphs_on_cpu
from tests.ascend.npu_testbed.npu_startup import (
    DRAFT_EXTRA,
    MAX_MODEL_LEN,
    MAX_NUM_REQS,
    Verified,
    capture,
    propose,
    replayed,
    started,
    verify_step,
)
from tests.ascend.npu_testbed.pairing import IN_TREE, draft_build_method, installed_release

pytestmark = pytest.mark.usefixtures("registered")

W = 128
# Target lengths after the verify step (its query tokens included), around the window and
# block edges and near max_model_len; 6 requests replay the graph captured for 8.
TARGET_LENS = [130, 255, 256, 257, 700, MAX_MODEL_LEN - 8]
GRAPH_MODES = [CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.FULL, CUDAGraphMode.FULL_AND_PIECEWISE]


def _draft_dir(tmp_path_factory, config: dict):
    import json

    root = tmp_path_factory.mktemp("tiny-draft")
    (root / "config.json").write_text(json.dumps({**config, **DRAFT_EXTRA}))
    return root


@pytest.fixture(scope="session")
def draft_dir(tmp_path_factory):
    """A tiny draft config that DFlash and DSpark drafts accept (a mask token)."""
    from testbed.tiny_models import TINY_LLAMA

    return _draft_dir(tmp_path_factory, TINY_LLAMA)


@pytest.fixture(scope="session")
def mla_draft_dir(tmp_path_factory):
    """The same on a tiny MLA model (DeepSeek-V2 layout)."""
    from testbed.tiny_models import TINY_MLA

    return _draft_dir(tmp_path_factory, TINY_MLA)


def assert_reads(
    t: Verified, lengths: list[int], table: torch.Tensor, ends: list[int], num_queries: int, window
) -> None:
    """FIA told ``lengths`` over ``table`` reads, for each request, exactly the window of the
    length ``ends[i]`` it should read (all of it without a window); the graph's padded rows
    read nothing."""
    spec = None if window is None else window.spec
    assert_window_reads(t.cache, t.k, t.v, t.block_ids, lengths, table, ends, num_queries, spec)
    assert not any(lengths[len(ends) :])


def eagle_ends(t: Verified, step: int) -> list[int]:
    """vllm-ascend's EAGLE decode step tells FIA the target's length plus the step."""
    return [min(target + step, MAX_MODEL_LEN) for target in t.target_lens]


def told_bound_plus_query(method: str, model_type: str | None, backend: str) -> bool:
    """Whether vllm-ascend tells FIA the host bound plus the query (the target's length,
    rejected tokens included) rather than the draft's own length: DFlash on MLA, and DSpark on
    a GLM-family target on releases with that branch (0.30)."""
    glm = model_type is not None and "glm" in installed_release().dspark_host_length_targets
    return (method, backend) == ("dflash", "mla") or glm


def mla_unserved(method: str, backend: str) -> bool:
    """An MLA draft the installed release refuses (0.29: one host length for every row)."""
    return backend == "mla" and "AscendMLABackend" not in installed_release().backends_for(method)


def run(draft_dir, method, num_spec, mode, additional, monkeypatch, model_type=None, backend="gqa"):
    s, kernel = started(
        draft_dir, method, num_spec, mode, additional, monkeypatch, model_type, backend
    )
    with acl_graphs_on_cpu(monkeypatch, kernel):
        capture(s, mode)
        window = s.draft_window
        if window is not None:
            assert s.input_buffers is window.input_buffers.base  # restored after capture
        t = verify_step(s, TARGET_LENS)
        propose(s, t)
    return s, kernel, t


@pytest.mark.parametrize("mode", GRAPH_MODES)
@pytest.mark.parametrize("num_spec", [3, 5])
def test_eagle_captures_and_every_replayed_decode_step_reads_its_window(
    mode, num_spec, draft_dir, monkeypatch
):
    s, kernel, t = run(draft_dir, "eagle3", num_spec, mode, {"draft_window_size": W}, monkeypatch)
    manager = s.decode_cudagraph_manager
    assert {d.num_reqs for d in manager.graphs} >= {4, MAX_NUM_REQS}
    reads = replayed(manager, kernel, num_spec - 1)
    for step, (lengths, table) in enumerate(reads, start=1):
        assert_reads(t, lengths, table, eagle_ends(t, step), 1, s.draft_window)
    assert s.draft_window.path_check.num_checks >= 1


def test_eagle_without_the_window_replays_each_whole_actual_length(draft_dir, monkeypatch):
    """The same start-up and replay with the window off: each step reads its whole told
    length through vLLM's full table."""
    mode = CUDAGraphMode.FULL_DECODE_ONLY
    s, kernel, t = run(draft_dir, "eagle3", 4, mode, {}, monkeypatch)
    assert s.draft_window is None
    full_width = s.block_tables.input_block_tables[0].shape[1]
    for step, (lengths, table) in enumerate(replayed(s.decode_cudagraph_manager, kernel, 3), 1):
        assert_reads(t, lengths, table, eagle_ends(t, step), 1, None)
        assert table.shape[1] == full_width


@pytest.mark.parametrize(
    "method,model_type,backend",
    [
        ("dflash", None, "gqa"),
        ("dspark", None, "gqa"),
        ("dspark", "glm4_moe", "gqa"),
        ("dflash", None, "mla"),
        ("dspark", None, "mla"),
    ],
)
@pytest.mark.parametrize("window", [W, None])
def test_dflash_and_dspark_capture_and_the_replayed_query_pass_reads_its_window(
    method, model_type, backend, window, draft_dir, mla_draft_dir, monkeypatch
):
    """One query pass per propose, replayed from the graph captured at start-up: FIA reads
    each request's window of the length it is told, all of it without a window. That is the
    draft's own length, except for DFlash on MLA, which vllm-ascend tells the host bound plus
    the query (the target's length, rejected tokens included), and for DSpark on a
    GLM-family target, which vllm-ascend tells the same."""
    additional = {} if window is None else {"draft_window_size": window}
    mode = CUDAGraphMode.FULL_DECODE_ONLY
    model_dir = mla_draft_dir if backend == "mla" else draft_dir
    if window is not None and mla_unserved(method, backend):
        with pytest.raises(ValueError, match="its builder hands the kernel one host length"):
            run(model_dir, method, 3, mode, additional, monkeypatch, model_type, backend)
        return
    s, kernel, t = run(model_dir, method, 3, mode, additional, monkeypatch, model_type, backend)
    n = len(TARGET_LENS)
    # The draft's own lengths, as vLLM's input prep kernel wrote them: the tokens kept after
    # rejection, then the query.
    nq = s.num_query_per_req
    ends = s.input_buffers.seq_lens[:n].tolist()
    assert ends == [target - int(r) + nq for target, r in zip(TARGET_LENS, t.rejected, strict=True)]
    if told_bound_plus_query(method, model_type, backend):
        ends = [min(target + nq, MAX_MODEL_LEN) for target in TARGET_LENS]
    ((lengths, table),) = replayed(s.query_cudagraph_manager, kernel, 1)
    if mla_unserved(method, backend):
        # Why the window refuses it: without it, vllm-ascend 0.29 tells every row one length.
        assert len(set(lengths[:n])) == 1 and lengths[0] > min(ends)
        return
    assert_reads(t, lengths, table, ends, s.num_query_per_req, s.draft_window)


def test_a_capture_that_goes_around_the_build_hook_stops_start_up_naming_the_path(
    draft_dir, monkeypatch
):
    """A vllm-ascend speculator whose draft decode builds its metadata without vLLM's
    ``_build_attn_metadata`` (an override without super()) captures graphs that would read
    the whole context: the path check stops the capture, naming vllm-ascend's classes."""
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import WindowNotInPathError
    from vllm_ascend.worker.v2.spec_decode.eagle.speculator import AscendEagleSpeculator

    build = draft_build_method()  # _build_attn_metadata; 0.29: _build_draft_attn_metadata
    vllms_build = inspect.unwrap(getattr(DraftModelSpeculator, build))

    def build_without_super(self, *args, **kwargs):
        return vllms_build(self, *args, **kwargs)

    mode = CUDAGraphMode.FULL_DECODE_ONLY
    s, kernel = started(draft_dir, "eagle3", 3, mode, {"draft_window_size": W}, monkeypatch)
    monkeypatch.setattr(AscendEagleSpeculator, build, build_without_super, raising=False)
    # The decode capture: the graph manager's hooked capture, or vllm-ascend's call.
    decode = (
        "AscendAutoRegressiveSpeculator.capture (decode)"
        if IN_TREE
        else "AscendAutoRegressiveSpeculator.capture -> AutoRegressiveAclGraphManager.capture"
    )
    path = f"under the window's calls {decode}, and its device seq_lens is not the window's"
    with acl_graphs_on_cpu(monkeypatch, kernel), pytest.raises(WindowNotInPathError) as error:
        capture(s, mode)
    assert path in str(error.value)


# draft_window_min_context between the actual lengths of one request's decode steps (its
# target length is 700): whole up to the step that reaches it, the window from there.
MIN_CONTEXT = 702


@pytest.mark.parametrize("mode", [CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.FULL_AND_PIECEWISE])
def test_eagle_replays_read_whole_below_the_threshold_and_the_window_from_it(
    mode, draft_dir, monkeypatch
):
    """One graph captured at start-up (dummy lengths) serves, in one replay, steps on both
    sides of the threshold: FIA's actual lengths and the table follow each row."""
    additional = {"draft_window_size": W, "draft_window_min_context": MIN_CONTEXT}
    s, kernel, t = run(draft_dir, "eagle3", 5, mode, additional, monkeypatch)
    assert s.draft_window.spec.min_context == MIN_CONTEXT
    reads = replayed(s.decode_cudagraph_manager, kernel, 4)
    for step, (lengths, table) in enumerate(reads, start=1):
        ends = eagle_ends(t, step)
        assert_reads(t, lengths, table, ends, 1, s.draft_window)
        # The request whose actual length crosses the threshold at step 2.
        assert lengths[TARGET_LENS.index(700)] == (701 if step == 1 else 128 + (700 + step) % 128)


@pytest.mark.parametrize(
    "method,model_type,backend",
    [
        ("dflash", None, "gqa"),
        ("dspark", "glm4_moe", "gqa"),
        ("dflash", None, "mla"),
    ],
)
def test_dflash_and_dspark_replays_read_whole_below_the_threshold(
    method, model_type, backend, draft_dir, mla_draft_dir, monkeypatch
):
    """The same for one query pass per propose, on the draft's own lengths (GQA), the host
    bound plus the query (DSpark on GLM) and the target's length plus the query (DFlash on
    MLA): rows on both sides of the threshold in one replay."""
    min_context = 258
    additional = {"draft_window_size": W, "draft_window_min_context": min_context}
    model_dir = mla_draft_dir if backend == "mla" else draft_dir
    if mla_unserved(method, backend):
        with pytest.raises(ValueError, match="its builder hands the kernel one host length"):
            mode = CUDAGraphMode.FULL_DECODE_ONLY
            run(model_dir, method, 3, mode, additional, monkeypatch, model_type, backend)
        return
    s, kernel, t = run(
        model_dir,
        method,
        3,
        CUDAGraphMode.FULL_DECODE_ONLY,
        additional,
        monkeypatch,
        model_type,
        backend,
    )
    nq, n = s.num_query_per_req, len(TARGET_LENS)
    ends = s.input_buffers.seq_lens[:n].tolist()
    if told_bound_plus_query(method, model_type, backend):
        ends = [min(target + nq, MAX_MODEL_LEN) for target in TARGET_LENS]
    assert min(ends) < min_context <= max(ends)
    ((lengths, table),) = replayed(s.query_cudagraph_manager, kernel, 1)
    assert_reads(t, lengths, table, ends, nq, s.draft_window)
    assert [length == end for length, end in zip(lengths, ends, strict=False)] == [
        end < min_context for end in ends
    ]


@pytest.mark.parametrize("window", [W, None])
def test_vllm_ascends_dflash2_reads_its_window_eagerly(window, draft_dir, monkeypatch):
    """vllm-ascend's ``AscendDFlash2Speculator`` (method dflash, a DFlash2 draft), which
    vllm-ascend runs eagerly only: its own ``__init__``, ``set_attn``,
    ``init_cudagraph_manager`` (graphs off with ``enforce_eager``) and ``propose``. Its
    query pass reads exactly the window; its candidate scoring and walk run after the draft
    forward, where no forward context (no attention metadata) is set."""
    from vllm_ascend.worker.v2.spec_decode.dflash2.speculator import AscendDFlash2Speculator

    additional = {} if window is None else {"draft_window_size": window}
    s, kernel, t = run(draft_dir, "dflash2", 3, CUDAGraphMode.NONE, additional, monkeypatch)
    assert type(s) is AscendDFlash2Speculator
    n = len(TARGET_LENS)
    nq = s.num_query_per_req
    ends = s.input_buffers.seq_lens[:n].tolist()
    assert ends == [target - int(r) + nq for target, r in zip(TARGET_LENS, t.rejected, strict=True)]
    (launch,) = kernel.launches
    assert not launch.captured
    assert_reads(t, launch.lengths, launch.table, ends, nq, s.draft_window)
    heads = s.model.model.calls
    assert {head for head, _ in heads} == {"compute_candidates", "candidate_selector"}
    assert not any(in_forward for _, in_forward in heads)
