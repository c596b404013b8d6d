# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""vLLM 0.33.0's real Model Runner V2 draft build path, run on CPU.

For the window inspector (``make demo``) and the tests: the shims that let vLLM's GPU
classes build on a CPU, real ``InputBuffers``/``BlockTables`` written by vLLM's own Triton
kernels (under Triton's interpreter), real speculators wired to real attention metadata
builders, and a reference paged attention to check what the draft reads. Nothing in the
serving path imports this package.
"""

import os

from tools.cpu_engine import model_info_cache


def use_triton_interpreter() -> None:
    """Run vLLM's own Triton kernels (and the window's) on CPU under Triton's interpreter:
    an empty CUDA_VISIBLE_DEVICES keeps vLLM's Triton on without a GPU (else it logs "Model
    Runner V2 requires Triton; using the V1 model runner instead"). Only for this CPU
    package's users (the inspector, the benchmarks, the tests), and only before vLLM's first
    import; existing settings are kept."""
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    os.environ.setdefault("TRITON_INTERPRET", "1")


def use_model_info_cache() -> None:
    """This process uses vLLM's model-class cache of the engines it starts
    (``tools.cpu_engine.model_info_cache``), an existing setting kept; only before vLLM's
    first import."""
    os.environ.setdefault("VLLM_CACHE_ROOT", str(model_info_cache()))
