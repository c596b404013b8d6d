# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""vLLM 0.33's attention backends on CPU: the MLA configs, layers and stand-ins the backend and
DCP tests build with, and the refusal checks they share."""

from types import SimpleNamespace

import pytest
import torch
from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig, VllmConfig
from vllm.v1.kv_cache_interface import MLAAttentionSpec

from testbed.speculators import (
    SPECULATOR_CLASSES,
    GroupLayout,
    wire_speculator,
)
from tests.cpu_testbed.dflash import (
    MAX_MODEL_LEN,
    MAX_NUM_REQS,
    NUM_SPEC,
    W,
    make_batch,
)

MLA_SPEC = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype=torch.float32)


class MLAPrefillStandIn:
    """Stand-in for an MLA layer's prefill kernel backend (a device kernel): the builder
    only clones it and hands it the prefill metadata."""

    def clone(self):
        return self

    def get_name(self):
        return "FLASH_ATTN"

    def prepare_metadata(self, metadata):
        self.prepared = metadata


def mla_config(mla_dir, method: str, monkeypatch, additional: dict | None = None) -> VllmConfig:
    """A real VllmConfig with a speculative config of NUM_SPEC tokens, as the builders'
    decode thresholds read it. Validated with an n-gram method, which needs no draft
    checkpoint (these tiny configs have none); the method and the window's keys are set
    after, as on the Ascend pairing's tests. Model Runner V2, as a host runs these speculators."""
    model = ModelConfig(
        model=str(mla_dir), skip_tokenizer_init=True, dtype="float32", max_model_len=MAX_MODEL_LEN
    )
    parallel = ParallelConfig()
    speculative = SpeculativeConfig(
        method="ngram",
        num_speculative_tokens=NUM_SPEC,
        prompt_lookup_max=3,
        prompt_lookup_min=1,
        target_model_config=model,
        target_parallel_config=parallel,
    )
    config = VllmConfig(
        model_config=model, parallel_config=parallel, speculative_config=speculative
    )
    object.__setattr__(speculative, "method", method)
    config.additional_config = {"draft_window_size": W} if additional is None else additional
    config.scheduler_config.max_num_seqs = MAX_NUM_REQS
    # Stand-in for the draft's registered MLA layer (building vLLM's MLAAttention needs the
    # model's projections): the fields the MLA metadata builders read at construction.
    config.compilation_config.static_forward_context["draft.0"] = SimpleNamespace(
        q_lora_rank=None,
        kv_lora_rank=512,
        qk_nope_head_dim=16,
        qk_rope_head_dim=64,
        v_head_dim=16,
        prefill_backend=MLAPrefillStandIn(),
        non_causal_multi_token_decode=False,
    )
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    return config


def wire_mla(mla_dir, method, backend, monkeypatch, batch=None):
    layouts = [GroupLayout(16, spec=MLA_SPEC, backend=backend)]
    batch = batch or make_batch(layouts, num_reqs_padded=MAX_NUM_REQS)
    config = mla_config(mla_dir, method, monkeypatch)
    wired = wire_speculator(SPECULATOR_CLASSES[method], batch, layouts, config, method, NUM_SPEC)
    return wired, layouts


def decode_view(metadata: dict) -> dict:
    """What an MLA decode kernel reads: the decode part's lengths and table."""
    return {
        name: SimpleNamespace(seq_lens=md.decode.seq_lens, block_table=md.decode.block_table)
        for name, md in metadata.items()
    }


def refused(match: str):
    return pytest.raises(ValueError, match=match)


def foreign_named(base: type, name: str, module: str) -> type:
    """A backend class named as one that cannot be imported on CPU (CUTLASS MLA allocates
    CUDA memory at import), with a builder that can."""
    return type(name, (base,), {"__module__": module})
