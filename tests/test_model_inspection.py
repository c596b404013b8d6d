# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""vLLM's inspection of a model class, run in the test process (``testbed.shims``): what vLLM
finds in the subprocess it runs it in."""

from __future__ import annotations

import pytest
from vllm.model_executor.models import registry

from testbed.shims import inspect_in_process


@pytest.mark.release_independent
def test_a_class_inspected_here_is_what_vllms_subprocess_finds():
    assert registry._run_in_subprocess is inspect_in_process
    model = registry.ModelRegistry.models["Eagle3LlamaForCausalLM"]

    def inspect() -> registry._ModelInfo:
        return registry._ModelInfo.from_model_cls(model.load_model_cls())

    here = inspect_in_process(inspect)
    assert here == inspect_in_process.in_subprocess(inspect)
    assert here.is_text_generation_model and not here.is_attention_free
