# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""CPU shims and fixtures for testing against the real vLLM 0.33.0 Model Runner V2.

The shims run at import time, before any test builds a vLLM object.
"""

# First, before any vLLM import: vLLM's Triton kernels run under Triton's interpreter.
from tests.testbed import use_triton_interpreter

use_triton_interpreter()

import json  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from vllm.triton_utils import HAS_TRITON  # noqa: E402

from tests.testbed.shims import (  # noqa: E402
    apply_cpu_shims,
)

if not HAS_TRITON:
    raise pytest.UsageError(
        "the tests run vLLM's Triton kernels under Triton's interpreter: install triton "
        "(make setup does) and leave CUDA_VISIBLE_DEVICES empty"
    )
apply_cpu_shims()

from tests.testbed.buffers import (  # noqa: E402
    Mrv2Batch,
    make_mrv2_batch,
)
from tests.testbed.mrv1_adapter import load_mrv1_adapter_module  # noqa: E402

# tests/ascend runs in .venv-030 (the Ascend pairing), with its own conftest (make test).
collect_ignore = ["ascend"]


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
    from tests.testbed.speculators import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("tiny-llama"))


# A tiny DeepSeek-V2 (MLA) config: vLLM 0.33's MLA metadata takes head size 576 only
# (kv_lora_rank 512 + rope 64).
TINY_MLA = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 64,
    "v_head_dim": 16,
    "num_hidden_layers": 2,
    "vocab_size": 256,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 2,
}


@pytest.fixture(scope="session")
def mla_dir(tmp_path_factory):
    """A tiny MLA model config written locally (no weights), for vLLM's MLA builders."""
    root = tmp_path_factory.mktemp("tiny-mla-576")
    (root / "config.json").write_text(json.dumps(TINY_MLA))
    return root


@pytest.fixture
def vllm_log_records():
    """What reaches vLLM's "vllm" logger at INFO and above, as a server configures it."""
    import logging

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    vllm_logger = logging.getLogger("vllm")
    level = vllm_logger.level
    # setLevel, not the attribute: it also clears the loggers' cached isEnabledFor answers.
    vllm_logger.setLevel(logging.INFO)
    vllm_logger.addHandler(handler)
    yield records
    vllm_logger.removeHandler(handler)
    vllm_logger.setLevel(level)


@pytest.fixture
def window_log():
    """What the draft window logs at INFO and above: [(level, message)], as "info" and
    "warning"."""
    import logging

    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append((record.levelname.lower(), record.getMessage()))
    logger = logging.getLogger("vllm.draft_window")
    level = logger.level
    # setLevel, not the attribute: it also clears the loggers' cached isEnabledFor answers.
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.fixture
def window_hooks():
    """The plugin installed for one test, as vLLM loads it; vLLM's own methods after."""
    from vllm_ascend.worker.v2.spec_decode.draft_window import plugin

    plugin.register()
    yield
    plugin.unregister()
