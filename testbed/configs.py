# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Real ``VllmConfig`` objects over a tiny model, as the engine builds them: the config
classes both supported vLLM releases share, so both test environments build with these."""

from pathlib import Path
from typing import Any

from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig, VllmConfig


def tiny_model_config(model_dir: Path, max_model_len: int) -> ModelConfig:
    return ModelConfig(
        model=str(model_dir), skip_tokenizer_init=True, dtype="float32", max_model_len=max_model_len
    )


def speculative_vllm_config(
    model_dir: Path,
    max_model_len: int,
    num_spec: int,
    method: str = "eagle3",
    additional_config: dict | None = None,
    draft: Path | None = None,
    **configs: Any,
) -> VllmConfig:
    """A config whose speculative config drafts with the tiny model itself, or with the draft
    checkpoint folder ``draft`` (``configs``: more of its parts, such as
    ``compilation_config``), ``__post_init__`` included. A DFlash or DSpark config validates
    against its draft checkpoint, which the tiny model is not: build with
    ``method="draft_model"`` and ``set_method`` afterwards, or pass such a ``draft``
    (``tiny_models.write_draft_dir``)."""
    model = tiny_model_config(model_dir, max_model_len)
    parallel = ParallelConfig()
    speculative = SpeculativeConfig(
        method=method,
        model=str(draft or model_dir),
        num_speculative_tokens=num_spec,
        target_model_config=model,
        target_parallel_config=parallel,
    )
    return VllmConfig(
        model_config=model,
        parallel_config=parallel,
        speculative_config=speculative,
        additional_config=additional_config or {},
        **configs,
    )


def set_method(config: VllmConfig, method: str, parallel_drafting: bool = False) -> VllmConfig:
    """The speculative method set after validation (see ``speculative_vllm_config``)."""
    object.__setattr__(config.speculative_config, "method", method)
    if parallel_drafting:
        object.__setattr__(config.speculative_config, "parallel_drafting", True)
    return config
