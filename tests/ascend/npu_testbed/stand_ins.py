# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Test-only stand-ins for torch_npu and the other NPU-only modules vllm-ascend imports.

There is no NPU and no CANN here, so ``torch_npu`` cannot load. vllm-ascend's own unit tests
replace it the same way (``tests/ut/conftest.py``); this is written fresh. Every attribute of a
stand-in module is a ``MagicMock``: the tests never run an NPU kernel, they drive vllm-ascend's
Python code (configs, plugins, speculators' metadata paths) and its Triton kernels (under
Triton's interpreter) on CPU. triton-ascend's CANN extension module gets plain functions
instead, each raising if called (``TRITON_ASCEND_OPS``). Installed into the test
environment's site-packages by ``tools/setup_ascend.sh`` and loaded by a ``.pth`` file in
every Python process there (vLLM inspects models in subprocesses): each Ascend environment
(.venv-030, .venv-029) is an Ascend host without an NPU.
"""

import contextlib
import importlib.util
import sys
import types
from unittest.mock import MagicMock

NPU_ONLY_MODULES = (
    "torch_npu",
    "torch_npu._C",
    "torch_npu._C._distributed_c10d",
    "torch_npu._inductor",
    "torch_npu.op_plugin",
    "torch_npu.op_plugin.atb",
    "torch_npu.op_plugin.atb._atb_ops",
    "torch_npu.profiler",
    "acl",
    "acl.rt",
    "fla_npu",
    "fla_npu.ops",
    "fla_npu.ops.ascendc",
    "mooncake",
    "mooncake.engine",
)

# triton-ascend's CANN extension ops that vllm-ascend resolves when it imports its Triton
# helpers (``vllm_ascend/ops/triton/triton_utils.py``); upstream Triton has none. No kernel
# on the draft path uses them, so each stand-in raises if a kernel ever calls it.
TRITON_ASCEND_OPS = ("insert_slice", "extract_slice", "get_element")


class StandIn(types.ModuleType):
    """A module whose every public attribute is a MagicMock, made on first use."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = MagicMock(name=f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


def _module(name: str, **attrs) -> types.ModuleType:
    module = StandIn(name)
    module.__spec__ = importlib.util.spec_from_loader(name, loader=None)
    module.__path__ = []
    module.__dict__.update(attrs)
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], child, module)
    return module


def _triton_ascend_op(name: str):
    def op(*args, **kwargs):
        raise NotImplementedError(f"triton-ascend's {name} has no stand-in on CPU")

    op.__name__ = name
    return op


class _OpsBeforeWorker:
    """Stand-in for the NPU platform plugin's import order. On a host, vLLM resolves its
    platform (vllm-ascend's, which needs the NPU runtime and is left out here) before it
    loads general plugins, and that imports ``vllm_ascend.ops``; vllm-ascend 0.29's worker
    and device modules import ``ops`` and each other in a cycle that only resolves in that
    order. So the first import of ``vllm_ascend.worker`` here imports ``ops`` first."""

    def find_spec(self, name: str, path, target=None):
        if name != "vllm_ascend.worker" or "vllm_ascend.ops" in sys.modules:
            return None
        importlib.import_module("vllm_ascend.ops")
        return None  # the worker package itself is imported as usual


def install() -> None:
    sys.meta_path.insert(0, _OpsBeforeWorker())
    for name in NPU_ONLY_MODULES:
        _module(name)
    cann = types.ModuleType("triton.language.extra.cann")
    cann.__path__ = []
    extension = types.ModuleType("triton.language.extra.cann.extension")
    extension.__dict__.update({name: _triton_ascend_op(name) for name in TRITON_ASCEND_OPS})
    cann.extension = extension
    sys.modules[cann.__name__] = cann
    sys.modules[extension.__name__] = extension
    import torch

    with contextlib.suppress(RuntimeError):  # already renamed
        torch.utils.rename_privateuse1_backend("npu")
    torch.npu = MagicMock(name="torch.npu")
    torch.npu.is_available = MagicMock(return_value=False)
    torch.npu.current_device = MagicMock(return_value="cpu")
    sys.modules["torch.npu"] = torch.npu
    torch.version.cann = None
    torch.distributed.is_hccl_available = lambda: True
