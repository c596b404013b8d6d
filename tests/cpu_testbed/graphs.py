# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Graph capture and replay on CPU, with only the device boundary stood in (for the tests).

vLLM's ``CudaGraphManager.capture`` prepares each graph's inputs outside the graph, runs a
warmup, then runs the forward once more inside ``torch.cuda.graph(graph, ...)``; a replay
runs the recorded device work again on the same tensors. Everything on that path runs for
real here except what needs a device:

- the graph object (``CpuGraph``): a CPU records no device work, so the graph keeps the
  forward run inside its capture, and ``replay()`` runs that forward again on the same
  persistent tensors: the device work it recorded (vLLM's kernels, the window's refresh, the
  attention launches) reads and writes exactly what the graph would;
- the capture context (``torch.cuda.graph``, or on Ascend ``torch.npu.graph``): it hands
  the graph that forward (``bind_forward``);
- vLLM's ``graph_capture`` (the tensor-parallel group's capture context and stream), the
  pipeline-parallel group (one rank) and the platform's graph memory pool;
- the platform's support for static graphs (``platform_with_graphs``): vLLM's CPU platform
  turns graphs off in every config it validates.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from vllm.config import CompilationConfig
from vllm.config.compilation import CUDAGraphMode


class CpuGraph:
    """Stand-in for the device's graph object (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.work: Callable[[], Any] | None = None
        self.replays = 0

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        pass

    def capture_end(self) -> None:
        pass

    def replay(self) -> None:
        if self.work is None:
            raise RuntimeError("the stand-in graph recorded no work to replay")
        self.replays += 1
        _state["replaying"] = self
        try:
            self.work()
        finally:
            _state["replaying"] = None

    def reset(self) -> None:
        self.work = None

    def pool(self) -> None:
        return None


def bind_forward(graph: Any) -> None:
    """Give ``graph`` the forward that vLLM's ``CudaGraphManager.capture`` runs inside the
    capture context: the capturing frame's ``forward_fn``, run with ``CUDAGraphMode.NONE``
    as the manager runs it there."""
    frame = sys._getframe(1)
    while frame is not None and "forward_fn" not in frame.f_locals:
        frame = frame.f_back
    if frame is None:
        raise RuntimeError("no forward_fn in the frames capturing the graph")
    forward_fn = frame.f_locals["forward_fn"]
    graph.work = lambda: forward_fn(CUDAGraphMode.NONE)


# The stand-in graph capturing or replaying now, for the tests' kernel stand-ins.
_state: dict[str, Any] = {"capturing": None, "replaying": None}


def capturing() -> Any:
    """The graph capturing now, or None."""
    return _state["capturing"]


def replaying() -> Any:
    """The ``CpuGraph`` replaying now, or None."""
    return _state["replaying"]


@contextlib.contextmanager
def graph_context(graph: Any, pool: Any = None, stream: Any = None, **kwargs: Any) -> Iterator:
    """Stand-in for ``torch.cuda.graph`` / ``torch.npu.graph``."""
    bind_forward(graph)
    graph.capture_begin(pool)
    _state["capturing"] = graph
    try:
        yield
    finally:
        _state["capturing"] = None
        graph.capture_end()


def platform_with_graphs(monkeypatch: Any) -> None:
    """The platform runs static graphs and keeps the configured graph sizes and KV block
    size, as a GPU or NPU platform does; vLLM's CPU platform, which stands in for it, turns
    graphs off in every config it validates and gives MLA models its own CPU kernel's
    block size. Call before building the config."""
    from vllm.platforms import current_platform

    platform = type(current_platform)
    update = platform.check_and_update_config

    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        sizes = vllm_config.compilation_config.cudagraph_capture_sizes
        block_size = vllm_config.cache_config.block_size
        update(vllm_config)
        vllm_config.compilation_config.cudagraph_capture_sizes = sizes
        vllm_config.cache_config.block_size = block_size

    monkeypatch.setattr(platform, "support_static_graph_mode", classmethod(lambda cls: True))
    monkeypatch.setattr(platform, "check_and_update_config", classmethod(check_and_update_config))


# Where vLLM 0.33 and 0.34 size their graphs differently, asked of the installed vLLM: 0.34
# sizes decode graphs by request counts and the others by token counts (its
# ``cudagraph_capture_sizes`` is deprecated); 0.33 sizes every graph by token counts.
SIZES_BY_KIND = hasattr(CompilationConfig, "decode_cudagraph_capture_request_sizes")


def capture_sizes(request_sizes: Sequence[int], query_lens: Sequence[int]) -> dict[str, Any]:
    """The settings of a ``CompilationConfig`` whose graphs hold ``request_sizes`` requests
    of each of ``query_lens`` tokens: on vLLM 0.34 the decode graphs' request counts
    (``decode_cudagraph_capture_request_sizes``) and the others' token counts
    (``prefill_cudagraph_capture_token_sizes``), on 0.33 the token counts
    (``cudagraph_capture_sizes``)."""
    token_sizes = sorted({n * q for n in request_sizes for q in query_lens})
    if SIZES_BY_KIND:
        return {
            "prefill_cudagraph_capture_token_sizes": token_sizes,
            "decode_cudagraph_capture_request_sizes": sorted(set(request_sizes)),
        }
    return {"cudagraph_capture_sizes": token_sizes}


def set_capture_sizes(
    monkeypatch: Any,
    compilation_config: Any,
    request_sizes: Sequence[int],
    query_lens: Sequence[int],
) -> None:
    """``capture_sizes`` on a config already validated, with what its validation derives
    from them: every graph's token count and the widest (``max_cudagraph_capture_size``,
    which bounds the decode graphs), and on vLLM 0.34 the largest of each kind."""
    sizes = capture_sizes(request_sizes, query_lens)
    token_sizes = sorted({n * q for n in request_sizes for q in query_lens})
    derived = {
        "cudagraph_capture_sizes": token_sizes,
        "max_cudagraph_capture_size": token_sizes[-1],
    }
    if SIZES_BY_KIND:
        derived["max_prefill_cudagraph_capture_tokens"] = token_sizes[-1]
        derived["max_decode_cudagraph_capture_requests"] = max(request_sizes)
    for name, value in {**sizes, **derived}.items():
        monkeypatch.setattr(compilation_config, name, value)


def process_groups_on_cpu(monkeypatch: Any) -> None:
    """One process, no torch.distributed: vLLM's graph-capture context of the
    tensor-parallel group, a single-rank pipeline group, and no graph memory pool."""
    import vllm.v1.worker.gpu.cudagraph_utils as cudagraph_utils
    from vllm.distributed.parallel_state import GraphCaptureContext

    single_rank = types.SimpleNamespace(is_first_rank=True, is_last_rank=True, world_size=1)
    monkeypatch.setattr(cudagraph_utils, "get_pp_group", lambda: single_rank)
    monkeypatch.setattr(
        cudagraph_utils,
        "graph_capture",
        lambda device, *args, **kwargs: contextlib.nullcontext(GraphCaptureContext(stream=None)),
    )
    platform = type(cudagraph_utils.current_platform)
    monkeypatch.setattr(platform, "graph_pool_handle", lambda *args: None, raising=False)
    monkeypatch.setattr(platform, "get_global_graph_pool", lambda *args: None, raising=False)


def cuda_graphs_on_cpu(monkeypatch: Any) -> None:
    """vLLM's CUDA graph capture and replay on CPU (the upstream release): ``CpuGraph`` as
    ``torch.cuda.CUDAGraph``, ``graph_context`` as ``torch.cuda.graph``, and
    ``process_groups_on_cpu``."""
    import torch

    monkeypatch.setattr(torch.cuda, "CUDAGraph", CpuGraph)
    monkeypatch.setattr(torch.cuda, "graph", graph_context)
    process_groups_on_cpu(monkeypatch)
