# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""ACL graph capture and replay on CPU for the Ascend pairing, with only the device boundary
stood in (on top of ``tests.cpu_testbed.graphs``, shared with the upstream release).

On a host, vllm-ascend's model runner enters ``torch_cuda_wrapper()`` at start-up, which
makes vLLM's ``CudaGraphManager.capture`` create vllm-ascend's ``UpdatableGraph`` and capture
through ``torch_npu_graph_wrapper``; its worker patches (``vllm_ascend/patch/worker``) make
vLLM's speculators create vllm-ascend's graph managers and input batches. Here all of that
host code runs for real: the speculators' ``capture``, the graph managers' ``capture`` and
``run_fullgraph``, vLLM's ``CudaGraphManager.capture``, ``prepare_inputs_to_capture`` with
``AscendInputBatch.make_dummy``, the builders' capture builds, and ``UpdatableGraph``'s task
registration, ``resolve_tasks`` and ``update``. Stood in, each because it needs a device:

- the graph object's capture and replay (``torch.npu.NPUGraph``, ``npu_stand_ins.py``, which
  ``UpdatableGraph`` subclasses) and ``torch.npu.graph``, the capture context that hands it
  the forward to replay (``tests.cpu_testbed.graphs``);
- the graph tasks' handles and their update brackets (``torch.npu.graph_task_group_end``,
  ``graph_task_update_begin``/``_end``); streams and events stay ``torch_npu`` stand-ins;
- the process groups, the graph memory pool and the platform's graph support
  (``tests.cpu_testbed.graphs``);
- the draft model (``DraftModel``): no weights on CPU. Each draft layer launches FIA as
  vllm-ascend's full-graph attention does (``register_task`` with the layer's
  ``block_tables`` and ``seq_lens_list``, ``FIAParamProvider``);
- the FIA kernel (``FiaKernel``): it records each launch, with the table contents and
  lengths the kernel would read then, and each graph-task update of its parameters.
"""

from __future__ import annotations

import contextlib
import types
from dataclasses import dataclass, field
from typing import Any

import torch

from tests.cpu_testbed.family_heads import FAMILY_TOP_K, FamilyHeads, candidates
from tests.cpu_testbed.graphs import (
    capturing,
    graph_context,
    process_groups_on_cpu,
)


@dataclass
class Launch:
    """One FIA execution: the layer, the table contents at that moment (what the kernel
    reads), the table's address, and the lengths it was launched with."""

    layer: str
    table: torch.Tensor
    table_ptr: int
    lengths: list[int]
    captured: bool


@dataclass
class FiaKernel:
    """Stand-in for ``torch_npu.npu_fused_infer_attention_score.out``."""

    launches: list[Launch] = field(default_factory=list)
    # task handle -> the parameters a graph-task update gave it
    updates: dict[int, dict[str, Any]] = field(default_factory=dict)
    updating: int | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        # GQA's FIA names the lengths actual_seq_lengths_kv, MLA's FIA v2 actual_seq_kvlen.
        lengths = list(kwargs.get("actual_seq_lengths_kv", kwargs.get("actual_seq_kvlen")))
        if self.updating is not None:
            self.updates[self.updating] = {**kwargs, "lengths": lengths}
            return
        table = kwargs["block_table"]
        self.launches.append(
            Launch(
                kwargs.get("layer"),
                table.clone(),
                table.data_ptr(),
                lengths,
                capturing() is not None,
            )
        )


class DraftModel(torch.nn.Module):
    """Stand-in for the draft model (no weights on CPU): each draft layer launches FIA with
    what vllm-ascend's full-graph attention hands it (``attention_v1.full_graph_fia``)."""

    def __init__(
        self,
        layer_names: list[str],
        hidden_size: int,
        vocab_size: int,
        kernel: FiaKernel,
        pair: bool = False,
    ) -> None:
        """``pair``: the forward returns (last hidden states, hidden states), as EAGLE's
        drafts do; DFlash's and DSpark's return one tensor."""
        super().__init__()
        self.layer_names = layer_names
        self.hidden_size = hidden_size
        self.vocab_size = vocab_size
        self.kernel = kernel
        self.pair = pair
        # DFlash2's own heads, called after the draft forward: ``model.model.<head>``.
        self.model = FamilyHeads(hidden_size, FAMILY_TOP_K)

    def forward(self, input_ids=None, positions=None, hidden_states=None, **kwargs):
        from vllm.forward_context import get_forward_context

        from vllm_ascend.ascend_forward_context import _EXTRA_CTX
        from vllm_ascend.attention.attention_v1 import FIAParamProvider
        from vllm_ascend.compilation.updatable_graph import register_task

        attn_metadata = get_forward_context().attn_metadata
        num_tokens = input_ids.shape[0]
        for name in self.layer_names:
            md = attn_metadata[name] if attn_metadata else None
            if md is None:
                continue
            if getattr(md, "decode", None) is not None:
                self._mla_decode(md.decode, num_tokens)
                continue
            register_task(
                self.kernel,
                {
                    "layer": name,
                    "block_table": md.block_tables,
                    "actual_seq_lengths": md.actual_seq_lengths_q,
                    "actual_seq_lengths_kv": md.seq_lens_list,
                },
                FIAParamProvider(name, None, _EXTRA_CTX.is_draft_model),
            )
        out = torch.zeros(num_tokens, self.hidden_size)
        return (out, out) if self.pair else out

    def _mla_decode(self, decode: Any, num_tokens: int) -> None:
        """What vllm-ascend's MLA decode (``AscendMLAImpl._forward_decode``) does around its
        FIA v2 launch: in a capture, record the launch's parameters, task handle and event
        in the draft graph parameters, which ``update_graph_params`` updates at a replay."""
        import torch_npu

        from vllm_ascend.ascend_forward_context import _EXTRA_CTX
        from vllm_ascend.compilation.acl_graph import get_draft_graph_params

        kwargs = {
            "block_table": decode.block_table,
            "actual_seq_kvlen": decode.seq_lens_list,
            "actual_seq_qlen": decode.actual_seq_lengths_q,
        }
        if not _EXTRA_CTX.capturing:
            torch_npu.npu_fused_infer_attention_score_v2.out(**kwargs)
            return
        params = get_draft_graph_params()
        stream = torch.npu.current_stream()
        params.events[num_tokens].append(torch.npu.ExternalEvent())
        # The positions update_graph_params reads: block_table, block_size, seq_lens_list,
        # actual_seq_lengths (the rest are the kernel's tensors and scales).
        params.attn_params[num_tokens].append(
            (None,) * 10
            + (decode.block_table, None, decode.seq_lens_list, decode.actual_seq_lengths_q)
            + (None,) * 4
        )
        torch.npu.graph_task_group_begin(stream)
        torch_npu.npu_fused_infer_attention_score_v2.out(**kwargs)
        params.handles[num_tokens].append(torch.npu.graph_task_group_end(stream))

    # The draft heads the speculators sample through: zeros of the right shapes.
    def combine_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.zeros(hidden_states.shape[0], self.hidden_size)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.zeros(hidden_states.shape[0], self.vocab_size)

    compute_draft_logits = compute_logits

    def compute_candidates(self, hidden_states: torch.Tensor):
        """DFlash2's candidate tokens and their unary scores."""
        return candidates(self, hidden_states)

    def markov_embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros(token_ids.shape[0], self.hidden_size)

    def markov_bias(self, markov_embed: torch.Tensor) -> torch.Tensor:
        return torch.zeros(markov_embed.shape[0], self.vocab_size)

    def map_draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids

    def precompute_and_store_context_kv(self, *args, **kwargs) -> None:
        """The draft's context K/V writes: no cache to write on CPU (the reference cache
        holds the true K/V)."""


class _Handle:
    """A graph task's handle (``torch.npu.graph_task_group_end``)."""

    count = 0

    def __init__(self) -> None:
        _Handle.count += 1
        self.id = _Handle.count


# vllm-ascend's worker patches on the capture path (``vllm_ascend/patch/worker/patch_v2``):
# the module attributes each sets, and the file that sets them.
_WORKER_PATCHES = {
    "patch_input_batch": (
        ("vllm.v1.worker.gpu.cudagraph_utils", "InputBatch"),
        ("vllm.v1.worker.gpu.model_runner", "InputBatch"),
    ),
    "patch_eagle_speculator": (
        ("vllm.v1.worker.gpu.spec_decode.autoregressive.speculator", "SpeculatorCudaGraphManager"),
    ),
    "patch_dflash_speculator": (
        ("vllm.v1.worker.gpu.spec_decode.dflash.cudagraph", "build_attn_metadata"),
        ("vllm.v1.worker.gpu.spec_decode.dflash.speculator", "DFlashCudaGraphManager"),
        ("vllm.v1.worker.gpu.spec_decode.dflash2.speculator", "_selector_walk_kernel"),
    ),
}


def run_worker_patches(monkeypatch) -> None:
    """Run vllm-ascend's own patch files for the capture path, as its NPU worker imports them
    at start-up; what they set is put back after the test. They run from their files: their
    package's ``__init__`` imports every model patch, and some need torchvision."""
    import importlib
    import importlib.util

    import vllm_ascend

    root = vllm_ascend.__path__[0]
    for name, targets in _WORKER_PATCHES.items():
        for module, attr in targets:
            owner = importlib.import_module(module)
            monkeypatch.setattr(owner, attr, getattr(owner, attr))
        path = f"{root}/patch/worker/patch_v2/{name}.py"
        spec = importlib.util.spec_from_file_location(f"_draft_window_test_{name}", path)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


@contextlib.contextmanager
def acl_graphs_on_cpu(monkeypatch, kernel: FiaKernel):
    """vllm-ascend's ``torch_cuda_wrapper`` in force, with the device boundary above stood in,
    for the duration of a test (torch.cuda's attributes are restored afterwards)."""
    from vllm_ascend.worker.v2.utils import torch_cuda_wrapper

    run_worker_patches(monkeypatch)
    # vllm-ascend's graph parameters, set once per process at a host's start-up: each test is
    # a start-up of its own.
    import vllm_ascend.compilation.acl_graph as acl_graph

    for name in ("_graph_params", "_draft_graph_params", "_draft_graph_prefill_params"):
        monkeypatch.setattr(acl_graph, name, None)

    for name in (
        "Event",
        "Stream",
        "stream",
        "default_stream",
        "current_stream",
        "graph_pool_handle",
        "CUDAGraph",
        "graph",
        "synchronize",
        "set_stream",
        "current_device",
        "mem_get_info",
    ):
        monkeypatch.setattr(torch.cuda, name, getattr(torch.cuda, name, None), raising=False)
    npu = torch.npu

    def task_update_begin(stream, handle):
        kernel.updating = handle.id

    def task_update_end(stream):
        kernel.updating = None

    monkeypatch.setattr(npu, "graph", graph_context, raising=False)
    monkeypatch.setattr(
        npu, "is_current_stream_capturing", lambda: capturing() is not None, raising=False
    )
    import torch_npu

    monkeypatch.setattr(
        torch_npu,
        "npu_fused_infer_attention_score_v2",
        types.SimpleNamespace(out=kernel),
        raising=False,
    )
    monkeypatch.setattr(npu, "graph_task_group_end", lambda stream: _Handle(), raising=False)
    monkeypatch.setattr(npu, "graph_task_update_begin", task_update_begin, raising=False)
    monkeypatch.setattr(npu, "graph_task_update_end", task_update_end, raising=False)
    process_groups_on_cpu(monkeypatch)
    with torch_cuda_wrapper():
        yield
