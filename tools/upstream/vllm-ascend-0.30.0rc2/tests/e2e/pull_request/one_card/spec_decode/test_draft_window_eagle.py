# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The draft KV sliding window on Model Runner V2 for EAGLE and EAGLE3.

Greedy, ``draft_window_size=512`` and test_eagle3_sliding_window's prompt, longer than the
window. The window changes only what the draft reads, so Model Runner V2 accepts per position
as Model Runner V1 does on the same case.
"""

import os
from unittest.mock import patch

import pytest
from transformers import AutoTokenizer
from vllm import SamplingParams
from vllm.config import CompilationConfig
from vllm.v1.metrics.reader import Counter, Vector

from tests.e2e.conftest import VllmRunner
from tests.e2e.pull_request.one_card.spec_decode.utils import MODELS, calculate_acceptance_per_pos, eagle_model_name

DRAFT_WINDOW_SIZE = 512
NUM_SPECULATIVE_TOKENS = 3
EAGLE_MODELS = {
    "eagle": {"main": "LLM-Research/Meta-Llama-3.1-8B-Instruct", "spec": eagle_model_name()},
    **MODELS,
}


def draft_window_acceptance_per_pos(method: str, prompt: str) -> list[float]:
    """Acceptance per position of ``method`` on ``prompt`` on the model runner
    VLLM_USE_V2_MODEL_RUNNER selects."""
    with VllmRunner(
        EAGLE_MODELS[method]["main"],
        max_model_len=4096,
        disable_log_stats=False,
        tensor_parallel_size=1,
        max_num_seqs=16,
        distributed_executor_backend="mp",
        gpu_memory_utilization=0.7,
        speculative_config={
            "method": method,
            "model": EAGLE_MODELS[method]["spec"],
            "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
        },
        compilation_config=CompilationConfig(cudagraph_mode="PIECEWISE", cudagraph_capture_sizes=[4, 8]),
        additional_config={"draft_window_size": DRAFT_WINDOW_SIZE},
    ) as llm:
        # ignore_eos: every run drafts over all 256 tokens, enough drafts for a rate per position.
        outputs = llm.model.generate([prompt], SamplingParams(temperature=0, ignore_eos=True, max_tokens=256))
        metrics = llm.model.get_metrics()
    print(f"Generated text: {outputs[0].outputs[0].text!r}")
    return calculate_acceptance_per_pos(metrics, NUM_SPECULATIVE_TOKENS, Counter, Vector)


@pytest.mark.parametrize("method", EAGLE_MODELS.keys())
@patch.dict(os.environ, {"VLLM_USE_V2_MODEL_RUNNER": "1"})
def test_eagle_draft_window_matches_mrv1(method: str):
    tokenizer = AutoTokenizer.from_pretrained(EAGLE_MODELS[method]["main"], trust_remote_code=True)
    filler = "This is a padding sentence for testing sliding window draft attention. " * 80
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": filler + " What is 2+2?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    prompt_tokens = len(tokenizer(prompt)["input_ids"])
    assert prompt_tokens > DRAFT_WINDOW_SIZE, (
        f"Prompt ({prompt_tokens} tokens) must exceed draft_window_size ({DRAFT_WINDOW_SIZE})"
    )

    acceptance_per_pos = draft_window_acceptance_per_pos(method, prompt)
    # vllm-ascend has no one-card Model Runner V1 golden of this case (test_eagle3_sliding_window's
    # is EAGLE3 on two cards): measure it here.
    with patch.dict(os.environ, {"VLLM_USE_V2_MODEL_RUNNER": "0"}):
        golden = draft_window_acceptance_per_pos(method, prompt)

    match = all(abs(a - b) < 0.1 for a, b in zip(acceptance_per_pos, golden, strict=True))
    assert match, f"acceptance_per_pos {acceptance_per_pos} does not match golden {golden}"
