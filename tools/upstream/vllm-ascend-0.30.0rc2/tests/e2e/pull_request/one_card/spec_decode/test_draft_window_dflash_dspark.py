# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The draft KV sliding window on Model Runner V2 for DSpark and DFlash.

Greedy, ``draft_window_size=512`` and a prompt longer than the window, as in
test_dspark_kv_sliding_window (Model Runner V1). The window changes only what the draft
reads, so Model Runner V2 accepts per position as Model Runner V1 does on the same case.
DFlash2 is not here: its e2e model (z-lab/Qwen3.8-27B-DFlash2) runs on two cards.
"""

import os
from unittest.mock import patch

import pytest
from transformers import AutoTokenizer
from vllm import SamplingParams
from vllm.config import CompilationConfig
from vllm.v1.metrics.reader import Counter, Vector

from tests.e2e.conftest import VllmRunner
from tests.e2e.pull_request.one_card.spec_decode.utils import BASELINES, DFLASH, DSPARK, calculate_acceptance_per_pos

DRAFT_WINDOW_SIZE = 512
MODELS = {**DSPARK, **DFLASH}
# method -> (num_speculative_tokens, cudagraph_capture_sizes), as test_dspark.py and test_dflash.py use them.
CASES = {"dspark": (7, [7, 8]), "dflash": (8, [9, 18])}
# Model Runner V1 goldens of the same case: DSpark's is test_dspark_kv_sliding_window's.
MRV1_GOLDENS = {"dspark": BASELINES["dspark_sliding_window"]}


def draft_window_acceptance_per_pos(method: str, prompt: str) -> list[float]:
    """Acceptance per position of ``method`` on ``prompt``, served as test_dspark_kv_sliding_window
    serves it, on the model runner VLLM_USE_V2_MODEL_RUNNER selects."""
    num_speculative_tokens, capture_sizes = CASES[method]
    with VllmRunner(
        MODELS[method]["main"],
        max_model_len=4096,
        disable_log_stats=False,
        tensor_parallel_size=1,
        max_num_seqs=256,
        distributed_executor_backend="mp",
        gpu_memory_utilization=0.8,
        speculative_config={
            "method": method,
            "model": MODELS[method]["spec"],
            "num_speculative_tokens": num_speculative_tokens,
        },
        compilation_config=CompilationConfig(cudagraph_mode="PIECEWISE", cudagraph_capture_sizes=capture_sizes),
        enable_prefix_caching=False,
        additional_config={"draft_window_size": DRAFT_WINDOW_SIZE},
    ) as llm:
        outputs = llm.model.generate([prompt], SamplingParams(temperature=0, ignore_eos=False, max_tokens=256))
        metrics = llm.model.get_metrics()
    print(f"Generated text: {outputs[0].outputs[0].text!r}")
    return calculate_acceptance_per_pos(metrics, num_speculative_tokens, Counter, Vector)


@pytest.mark.parametrize("method", CASES.keys())
@patch.dict(os.environ, {"VLLM_USE_V2_MODEL_RUNNER": "1"})
def test_dflash_dspark_draft_window_matches_mrv1(method: str):
    tokenizer = AutoTokenizer.from_pretrained(MODELS[method]["main"], trust_remote_code=True)
    # test_dspark_kv_sliding_window's prompt.
    filler = " ".join(f"context paragraph {i} about speculative decoding." for i in range(220))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": f"{filler} Hello, your name is"}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=False,
    )
    prompt_tokens = len(tokenizer(prompt)["input_ids"])
    assert prompt_tokens > DRAFT_WINDOW_SIZE, (
        f"Prompt ({prompt_tokens} tokens) must exceed draft_window_size ({DRAFT_WINDOW_SIZE})"
    )

    acceptance_per_pos = draft_window_acceptance_per_pos(method, prompt)
    if method in MRV1_GOLDENS:
        golden = MRV1_GOLDENS[method]
    else:
        # vllm-ascend has no Model Runner V1 golden of this case: measure it here.
        with patch.dict(os.environ, {"VLLM_USE_V2_MODEL_RUNNER": "0"}):
            golden = draft_window_acceptance_per_pos(method, prompt)

    match = all(abs(a - b) < 0.1 for a, b in zip(acceptance_per_pos, golden, strict=True))
    assert match, f"acceptance_per_pos {acceptance_per_pos} does not match golden {golden}"
