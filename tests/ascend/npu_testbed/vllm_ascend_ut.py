# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""vllm-ascend's own unit tests (its ``tests/ut``, on its own ``conftest.py`` stand-ins), run on
a vllm-ascend source tree in this environment: the check that the upstream patch changes no
outcome of theirs with the window off (``tests/ascend/test_upstream_patch.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

# Their unit tests of what the patch touches or builds on: Model Runner V2's speculators,
# graphs and DCP metadata, and the config (about 750 tests, 40 s on one core).
SUBSET = (
    "tests/ut/spec_decode",
    "tests/ut/worker/v2/test_spec_decode.py",
    "tests/ut/worker/v2/test_speculator.py",
    "tests/ut/worker/v2/test_aclgraph.py",
    "tests/ut/worker/test_dcp_speculator_metadata_v2.py",
    "tests/ut/worker/test_mla_dcp_metadata_v2.py",
    "tests/ut/worker/test_mtp_pcp_speculator_v2.py",
    "tests/ut/attention/test_gqa_dcp_split.py",
    "tests/ut/test_ascend_config.py",
    "tests/ut/test_v2_sparse_offload_config.py",
    "tests/ut/model_loader/rfork/test_identity_validation.py",
)
# Where `make setup` puts the torchvision their conftest imports (vllm-ascend's requirements
# name it; kept outside the environment, which the window's own tests run without it).
UT_EXTRA = Path(sys.prefix) / "vllm-ascend-ut-extra"
# pytest as their CI runs it, with the plugin that lets torchvision import on CPU torch.
PYTEST = (
    sys.executable,
    *("-m", "pytest", "-p", "ut_cpu_torchvision", "-p", "no:cacheprovider", "-q"),
)


def environment(tree: Path, out: Path, first: tuple[Path, ...] = ()) -> dict[str, str]:
    """Their own environment, as their CI runs them: none of what the window's tests set for
    themselves (Triton's interpreter, the plugins vLLM loads, the tree form); ``first`` on
    ``PYTHONPATH`` before the tree."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("VLLM_", "TRITON_", "DRAFT_WINDOW_"))
        and key != "CUDA_VISIBLE_DEVICES"
    }
    env.update(
        # The tree first, also for the subprocesses their config tests start.
        PYTHONPATH=os.pathsep.join(map(str, [*first, tree, UT_EXTRA, Path(__file__).parent])),
        PYTHONDONTWRITEBYTECODE="1",
        NUMBA_CACHE_DIR=str(out / "numba"),
    )
    return env


def run(tree: Path, out: Path, paths: tuple[str, ...] = SUBSET) -> dict[str, str]:
    """Each test's outcome (``passed``, ``failed``, ``error``, ``skipped``) by its id, from
    a pytest run of ``paths`` in ``tree`` (which imports vllm-ascend from ``tree``)."""
    report = out / "junit.xml"
    command = [*PYTEST, f"--junitxml={report}", *paths]
    done = subprocess.run(
        command, cwd=tree, env=environment(tree, out), capture_output=True, text=True
    )
    if not report.exists():
        raise AssertionError(f"no test report from {tree}:\n{done.stdout[-4000:]}")
    return outcomes(report)


def outcomes(report: Path) -> dict[str, str]:
    results = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        if "failure" in kinds:
            results[name] = "failed"
        elif "error" in kinds:
            results[name] = "error"
        elif "skipped" in kinds:
            results[name] = "skipped"
        else:
            results[name] = "passed"
    return results
