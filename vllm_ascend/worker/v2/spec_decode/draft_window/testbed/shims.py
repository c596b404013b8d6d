"""The shims vLLM's Model Runner V2 classes need to build on a CPU-only host."""

import vllm.platforms
import vllm.platforms.cpu
import vllm.utils.torch_utils as torch_utils
import vllm.v1.worker.gpu.buffer_utils as buffer_utils


def apply_cpu_shims() -> None:
    # The vllm wheel detects no platform on a CPU-only host, and BlockTables needs a device type.
    vllm.platforms._current_platform = vllm.platforms.cpu.CpuPlatform()
    # UVA buffers and the staged host-to-device writes (BlockTables.apply_staged_writes)
    # want pinned memory, which a CPU-only torch cannot give; plain tensors do here.
    buffer_utils.is_uva_available = lambda: False
    torch_utils.PIN_MEMORY = False
    # vLLM's MLA builders bound the flag at their import.
    import vllm.model_executor.layers.attention.mla_attention as mla_attention

    mla_attention.PIN_MEMORY = False
