# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The committed DFlash drafter (``trained_models/dflash``) is the model vLLM serves for the
``dflash`` method: its recipe's forward (``trained_models/recipe.py``, what it was trained
with) gives the logits vLLM's own ``DFlashQwen3ForCausalLM`` gives on the same weights and
inputs (vLLM's CPU platform, the checkpoint through its ``load_weights``, the context's keys
and values from its ``precompute_and_store_context_kv``; dense attention in place of the
kernel)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import trained_models as trained
from testbed.engine.runs import environment
from trained_models import recipe

pytestmark = pytest.mark.release_independent

FORWARD = Path(__file__).resolve().parent.parent / "testbed" / "engine" / "dflash_forward.py"


@pytest.fixture(scope="module")
def models():
    return trained.committed()


@pytest.fixture(scope="module")
def recipe_models(models):
    from transformers import LlamaForCausalLM

    target = LlamaForCausalLM.from_pretrained(models.target, dtype="float32").eval()
    return target, recipe.load_dflash(models.dflash)


def held_out_tokens(models, length: int) -> torch.Tensor:
    return torch.tensor(models.prompt(10_000, length))[None]


def recipe_logits(target, head, tokens, base: int):
    """The recipe's logits of the block after ``base`` [B, vocab], and the target's hidden
    states the drafter reads."""
    with torch.no_grad():
        features, _ = recipe.dflash_features(target, tokens)
        bases = torch.tensor([base])
        embeds = target.model.embed_tokens(recipe.dflash_query_ids(tokens, bases))
        blocks = recipe.dflash_blocks(bases, tokens.shape[1])
        return target.lm_head(head(features, embeds, blocks))[0, 0], features


def test_the_recipes_forward_is_vllms_dflash_model_on_the_same_weights(
    models, recipe_models, tmp_path
):
    target, head = recipe_models
    base = 40
    tokens = held_out_tokens(models, base + recipe.DFLASH_BLOCK + 1)
    expected, features = recipe_logits(target, head, tokens, base)
    ids = recipe.dflash_query_ids(tokens, torch.tensor([base]))[0, 0]
    torch.save(
        {
            "features": features[0, : base + 1].contiguous(),
            "query_ids": ids,
            "query_positions": base + 1 + torch.arange(recipe.DFLASH_BLOCK),
        },
        tmp_path / "inputs.pt",
    )
    plan = {
        "target": models.target,
        "draft": models.dflash,
        "max_model_len": trained.TARGET_CONTEXT,
        "num_spec": trained.NUM_SPEC,
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    done = subprocess.run(
        [sys.executable, str(FORWARD), "plan.json", "inputs.pt", "out.pt"],
        cwd=tmp_path,
        env=environment(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    found = torch.load(tmp_path / "out.pt")
    assert found["logits"].shape == expected.shape
    torch.testing.assert_close(found["logits"], expected, rtol=1e-4, atol=1e-4)
    # The drafts themselves: each mask query's greedy token.
    assert found["logits"][1:].argmax(-1).tolist() == expected[1:].argmax(-1).tolist()
    # What the window crops: the context's keys and values, one row per position.
    assert [k.shape[0] for k in found["context_keys"]] == [base + 1] * recipe.DFLASH_LAYERS


def test_the_committed_drafter_declares_what_vllm_reads(models):
    config = json.loads((Path(models.dflash) / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["max_position_embeddings"] == trained.DRAFT_CONTEXT
    assert config["block_size"] == trained.NUM_SPEC + 1
    assert config["dflash_config"]["mask_token_id"] == recipe.MASK_TOKEN_ID == 259
    target = json.loads((Path(models.target) / "config.json").read_text())
    assert max(config["dflash_config"]["target_layer_ids"]) < target["num_hidden_layers"]
