# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""CPU shims and fixtures for testing against the real vLLM 0.33.0 Model Runner V2.

The shims run at import time, before any test builds a vLLM object.
"""

# First, before any vLLM import: vLLM's Triton kernels run under Triton's interpreter.
from testbed import use_model_info_cache, use_triton_interpreter

use_triton_interpreter()
use_model_info_cache()


import numpy as np  # noqa: E402
import pytest  # noqa: E402
from vllm.triton_utils import HAS_TRITON  # noqa: E402

from testbed.shims import (  # noqa: E402
    apply_cpu_shims,
)

if not HAS_TRITON:
    raise pytest.UsageError(
        "the tests run vLLM's Triton kernels under Triton's interpreter: install triton "
        "(make setup does) and leave CUDA_VISIBLE_DEVICES empty"
    )
apply_cpu_shims()

from testbed.buffers import (  # noqa: E402
    Mrv2Batch,
    make_mrv2_batch,
)
from testbed.mrv1_adapter import load_mrv1_adapter_module  # noqa: E402

# tests/ascend runs in .venv-030 (the Ascend pairing), with its own conftest (make test).
collect_ignore = ["ascend"]


def pytest_collection_modifyitems(config, items):
    """A test of what one vLLM line has and another lacks (its runner choice, a hooked
    method) runs on the lines that have it, and is deselected on the others: the release
    table of the installed vLLM says which."""
    from testbed.vllm_line import RELEASE
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.supported import hooks_for

    hooked = {hook.method for hook in hooks_for(RELEASE)}
    applies = {
        "model_runner_v1": lambda marker: RELEASE.model_runner_v1,
        "without_model_runner_v1": lambda marker: not RELEASE.model_runner_v1,
        "hooks": lambda marker: set(marker.args) <= hooked,
        "release": lambda marker: RELEASE.name in marker.args,
    }
    keep, drop = [], []
    for item in items:
        ok = all(
            applies[marker.name](marker) for marker in item.iter_markers() if marker.name in applies
        )
        (keep if ok else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture
def one_group_batch() -> Mrv2Batch:
    """Real InputBuffers and BlockTables, one KV-cache group of 16-token blocks."""
    return make_mrv2_batch(
        block_sizes=[16],
        seq_lens=[10, 60, 200, 64],
        num_query_per_req=1,
        num_reqs_padded=6,
        max_num_reqs=8,
        max_model_len=512,
        rng=np.random.default_rng(0),
    )


@pytest.fixture
def two_group_batch() -> Mrv2Batch:
    """Two KV-cache groups with different block sizes (16 and 64 tokens)."""
    return make_mrv2_batch(
        block_sizes=[16, 64],
        seq_lens=[10, 300, 129, 1000, 64],
        num_query_per_req=4,
        num_reqs_padded=8,
        max_num_reqs=8,
        max_model_len=1024,
        rng=np.random.default_rng(1),
    )


@pytest.fixture(scope="session")
def mrv1():
    """The released vllm-ascend 0.26.0rc1 `spec_decode/utils.py`, loaded standalone."""
    return load_mrv1_adapter_module()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """A tiny model config written locally (no weights), for vLLM's configs and builders."""
    from testbed.speculators import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def drafts(tmp_path_factory):
    """A tiny draft config every MRV2 draft family here accepts (``startup.draft_dir``)."""
    from tests.cpu_testbed.startup import draft_dir

    return draft_dir(tmp_path_factory.mktemp("tiny-draft"))


@pytest.fixture(scope="session")
def mla_dir(tmp_path_factory):
    """A tiny MLA model config written locally (no weights), for vLLM's MLA builders."""
    from testbed.tiny_models import TINY_MLA_576, write_model_dir

    return write_model_dir(tmp_path_factory.mktemp("tiny-mla-576"), TINY_MLA_576)


@pytest.fixture
def vllm_log_records():
    """What reaches vLLM's "vllm" logger at INFO and above, as a server configures it."""
    import logging

    from tests.cpu_testbed.logs import recorded

    with recorded("vllm", logging.INFO) as records:
        yield records


@pytest.fixture
def window_log():
    """What the draft window logs at INFO and above: [(level, message)], as "info" and
    "warning"."""
    import logging

    from tests.cpu_testbed.logs import recorded

    with recorded(
        "vllm.draft_window", logging.INFO, lambda r: (r.levelname.lower(), r.getMessage())
    ) as records:
        yield records


@pytest.fixture
def window_hooks():
    """The plugin installed for one test, as vLLM loads it; vLLM's own methods after."""
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import plugin

    plugin.register()
    yield
    plugin.unregister()
