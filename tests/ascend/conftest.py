# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The Ascend pairings on CPU: a supported vllm-ascend release's real Python package on its
vLLM, and this project installed into its tree (``make test`` runs this folder in each of
.venv-030 and .venv-029).

vllm-ascend's general plugins are loaded as vLLM loads them; its platform plugin is left
out (``VLLM_PLUGINS``): the NPU platform needs the NPU runtime, and these tests run vLLM's
CPU platform, as the 0.33 tests do.

With ``DRAFT_WINDOW_IN_TREE=1`` (``make test-upstream``) the window tests run against the
second form instead: vllm-ascend's tree with the upstream patch applied (first on
``PYTHONPATH``), the window made and called by vllm-ascend's own speculators, this
project's plugin absent. The tests of the plugin itself (``test_pairing.py``) are the
overlay's and are not collected there.
"""

import os
import sys
from importlib.metadata import entry_points, version

import pytest

from testbed.tiny_models import TINY_LLAMA, TINY_MLA, TINY_SFA, write_model_dir
from tests.ascend.npu_testbed.pairing import IN_TREE, check_every_tree_window, check_in_tree
from tools.cpu_engine import model_info_cache

# First, before anything imports vLLM (vllm-ascend's package __init__ files do): vLLM's and
# vllm-ascend's Triton kernels run under Triton's interpreter, set up as
# ``testbed.use_triton_interpreter`` does for the 0.33 tests.
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TRITON_INTERPRET", "1")
# vLLM's cache of the model classes it inspected: this line's, the engines'.
os.environ.setdefault("VLLM_CACHE_ROOT", str(model_info_cache()))

if type(sys.modules.get("torch_npu")).__name__ != "StandIn":
    raise pytest.UsageError(
        "tests/ascend runs in .venv-030 or .venv-029 (an Ascend host without an NPU): "
        "use `make test`"
    )

os.environ["VLLM_PLUGINS"] = ",".join(
    p.name
    for p in entry_points(group="vllm.general_plugins")
    if not (IN_TREE and p.value.startswith("vllm_ascend.worker.v2.spec_decode.draft_window"))
)

import torch
from vllm.triton_utils import HAS_TRITON

import vllm_ascend.ops.triton.triton_utils as ascend_triton
from testbed.shims import (
    apply_cpu_shims,
)
from tests.cpu_testbed.graphs import CpuGraph

# Test modules of what only some releases have (vllm-ascend 0.30's draft DCP path, by vLLM
# minor version): the releases without it refuse it by name (test_pairing.py).
_ONLY_ON = {
    "test_ascend_dcp_eagle.py": (0, 30),
    "test_ascend_dcp_window.py": (0, 30),
    # vllm-ascend 0.29 serves no DSpark on MLA, and cannot group a sparse target's layers
    # with a dense draft's (its MLA spec's merge reads fields its indexer spec lacks).
    "test_ascend_sparse_target.py": (0, 30),
    # The upstream patch is made for vllm-ascend 0.30.0rc2.
    "test_upstream_patch.py": (0, 30),
    "test_upstream_e2e.py": (0, 30),
}
_MINOR = tuple(int(x) for x in version("vllm").split(".")[:2])
collect_ignore = [name for name, minor in _ONLY_ON.items() if minor != _MINOR]
if IN_TREE:
    check_in_tree()
    collect_ignore += ["test_pairing.py", "test_upstream_patch.py", "test_upstream_e2e.py"]

# Stand-in for the NPU's graph object (tests.cpu_testbed.graphs), set before vllm-ascend's
# UpdatableGraph subclasses it, so that UpdatableGraph is a real class here.
assert "vllm_ascend.compilation.updatable_graph" not in sys.modules
torch.npu.NPUGraph = CpuGraph

if not HAS_TRITON:
    raise pytest.UsageError(
        "tests/ascend run vLLM's and vllm-ascend's Triton kernels under Triton's interpreter: "
        "install triton (make setup does) and leave CUDA_VISIBLE_DEVICES empty"
    )
# Stand-in for what triton-ascend's NPU driver reports (get_device_properties), which
# vllm-ascend's kernel launchers size their grids by: an Atlas A2 910B1/B2's cores.
ascend_triton._NUM_AICORE, ascend_triton._NUM_VECTORCORE = 24, 48
apply_cpu_shims()


def pytest_collection_modifyitems(config, items):
    """The tree form (``make test-upstream``) runs the window's own source, which .venv-030's
    suite runs whole; what only it has is vllm-ascend's call sites. There each test function
    runs its cases in order while one brings a parameter value not yet run (every family,
    backend, graph mode and size at least once), not every combination of them."""
    if not IN_TREE:
        return
    kept, dropped, covered = [], [], {}
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None:
            kept.append(item)
            continue
        seen = covered.setdefault((item.path, item.originalname), set())
        values = {(name, repr(value)) for name, value in callspec.params.items()}
        (kept if values - seen else dropped).append(item)
        seen |= values
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(scope="session", autouse=True)
def tree_windows_checked():
    """In the tree form, the path check on every window vllm-ascend's call sites make (the
    overlay's set_attn attaches it in the plugin form)."""
    if IN_TREE:
        check_every_tree_window()


@pytest.fixture(scope="session")
def mla_model_dir(tmp_path_factory):
    """A tiny MLA model config written locally (no weights)."""
    return write_model_dir(tmp_path_factory.mktemp("tiny-mla"), TINY_MLA)


@pytest.fixture(scope="session")
def sfa_model_dir(tmp_path_factory):
    """A tiny sparse-attention (SFA/DSA) MLA model config written locally (no weights)."""
    return write_model_dir(tmp_path_factory.mktemp("tiny-sfa"), TINY_SFA)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """A tiny model config written locally (no weights)."""
    return write_model_dir(tmp_path_factory.mktemp("tiny-llama"), TINY_LLAMA)


@pytest.fixture(scope="session")
def loaded_plugins():
    """vLLM's real ``load_general_plugins()``, once, as vLLM runs it once per process
    (vllm-ascend's connector registration is not idempotent). Returns what it changed: the
    speculator methods before and after, and the draft window's debug lines."""
    import logging

    import vllm.plugins

    from tests.ascend.npu_testbed.pairing import hooked_methods
    from tests.cpu_testbed.logs import recorded

    with recorded("vllm.draft_window", logging.DEBUG, lambda r: r.getMessage()) as lines:
        before = hooked_methods()
        vllm.plugins.load_general_plugins()
    return {"before": before, "after": hooked_methods(), "lines": lines}


@pytest.fixture
def registered(loaded_plugins):
    """The draft window as vLLM's plugin loading left it; registered again after a test
    that unregistered it. In the tree form there is nothing to register."""
    if IN_TREE:
        yield
        return
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import plugin

    yield
    plugin.register()


@pytest.fixture
def model_runner_v2(monkeypatch):
    """VLLM_USE_V2_MODEL_RUNNER=1 (vLLM 0.30's config takes it: Triton is on here, under
    its interpreter, as triton-ascend is on an Ascend host)."""
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
