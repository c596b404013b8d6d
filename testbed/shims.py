# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The shims vLLM's Model Runner V2 classes need to build on a CPU-only host."""

from collections.abc import Callable
from typing import TypeVar

import vllm.platforms
import vllm.platforms.cpu
import vllm.utils.torch_utils as torch_utils
import vllm.v1.worker.gpu.buffer_utils as buffer_utils

from testbed.engine.triton_interpreter import set_up_interpreter

T = TypeVar("T")


def inspect_in_process(inspect: Callable[[], T]) -> T:
    """vLLM inspects a model class its cache lacks in a subprocess kept clear of CUDA, which
    imports vLLM again (10 to 14 s of CPU); a CPU-only process has no CUDA to keep clear:
    vLLM's own inspection, here (vLLM's subprocess: ``inspect_in_process.in_subprocess``)."""
    return inspect()


def apply_cpu_shims() -> None:
    # The vllm wheel detects no platform on a CPU-only host, and BlockTables needs a device type.
    vllm.platforms._current_platform = vllm.platforms.cpu.CpuPlatform()
    # UVA buffers and the staged host-to-device writes (BlockTables.apply_staged_writes)
    # want pinned memory, which a CPU-only torch cannot give; plain tensors do here.
    buffer_utils.is_uva_available = lambda: False
    # vLLM 0.34's non-UVA buffers ask for pinned host memory where the platform has it.
    buffer_utils.is_pin_memory_available = lambda: False
    if not hasattr(buffer_utils, "NonUvaBuffer"):
        # vLLM 0.29's staged-write pools take UVA buffers only: here the device view of
        # the host buffer is the host tensor itself.
        buffer_utils.UvaBuffer = _HostUvaBuffer
    torch_utils.PIN_MEMORY = False
    # vLLM's MLA builders bound the flag at their import.
    import vllm.model_executor.layers.attention.mla_attention as mla_attention

    mla_attention.PIN_MEMORY = False
    set_up_interpreter()
    from vllm.model_executor.models import registry

    if registry._run_in_subprocess is not inspect_in_process:
        inspect_in_process.in_subprocess = registry._run_in_subprocess
        registry._run_in_subprocess = inspect_in_process


class _HostUvaBuffer:
    """A UVA buffer on a CPU-only host (vLLM 0.29): host memory, and its device view."""

    def __init__(self, size, dtype) -> None:
        import torch

        self.cpu = torch.zeros(size, dtype=dtype)
        self.np = self.cpu.numpy()
        self.uva = self.cpu
