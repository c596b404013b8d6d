# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The committed tiny models (``trained_models/``) are the ones their manifest records, the
held-out text their prompts come from is rebuilt from the installed vLLM 0.33.0 and checked
by its sha256, and nothing that serves them trains them again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import trained_models
from trained_models.recipe import RECIPE

# The manifest and the held-out text are the same on every line (the text is rebuilt from
# .venv's vLLM 0.33.0): once, in .venv.
pytestmark = pytest.mark.release_independent

ROOT = Path(__file__).resolve().parent.parent


def test_the_committed_files_are_the_manifests():
    assert trained_models.check_files() == []
    recorded = trained_models.manifest()["files"]
    for name in trained_models.MODELS:
        for file in ("config.json", "model.safetensors", "tokenizer.json"):
            assert f"{name}/{file}" in recorded
    # The weights are those the committed training record names.
    training = json.loads((trained_models.DIR / "training.json").read_text())
    assert {name: recorded[f"{name}/model.safetensors"] for name in trained_models.MODELS} == (
        training["weights"]
    )
    assert trained_models.MODELS == ("target", "draft", "eagle3", "dflash")


def test_the_committed_models_are_the_current_recipes():
    """A change to the recipe (recipe.py or its settings) retrains and commits again:
    ``make trained-models``, then ``python -m trained_models adopt .cache/trained-models``."""
    assert trained_models.manifest()["recipe"] == RECIPE.fingerprint()


def test_a_changed_missing_or_extra_file_fails_the_check(tmp_path):
    copy = tmp_path / "models"
    for name in trained_models.MODELS:
        shutil.copytree(trained_models.DIR / name, copy / name)
    assert trained_models.check_files(copy) == []
    weights = copy / "eagle3" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    (copy / "draft" / "tokenizer.json").unlink()
    (copy / "target" / "extra.bin").write_bytes(b"")
    problems = trained_models.check_files(copy)
    assert len(problems) == 3
    assert problems[0] == "missing: draft/tokenizer.json"
    assert problems[1] == "not in the manifest: target/extra.bin"
    assert problems[2].startswith("changed: eagle3/model.safetensors")


def test_make_trained_models_compares_a_retrained_set_and_replaces_nothing(tmp_path):
    retrained = tmp_path / "retrained"
    for name in trained_models.MODELS:
        shutil.copytree(trained_models.DIR / name, retrained / name)
    lines = []
    assert trained_models.compare(retrained, log=lines.append)
    assert "target/model.safetensors: the same" in lines[1]
    weights = retrained / "draft" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    lines.clear()
    assert not trained_models.compare(retrained, log=lines.append)
    assert any(line.startswith("  draft/model.safetensors: DIFFERS") for line in lines)
    assert "differ from the committed ones" in lines[-1]
    assert trained_models.check_files() == []


def test_git_tracks_the_models_and_ignores_the_rebuilt_text():
    files = [f"trained_models/{name}" for name in trained_models.manifest()["files"]]
    files += ["trained_models/manifest.json", "trained_models/training.json"]
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", *files], cwd=ROOT, capture_output=True, text=True
    )
    assert ignored.stdout == ""
    for rebuilt in (".cache/heldout.txt", ".cache/trained-models/target/model.safetensors"):
        assert subprocess.run(["git", "check-ignore", "-q", rebuilt], cwd=ROOT).returncode == 0


def test_the_held_out_text_is_rebuilt_from_the_installed_vllm_and_checked(tmp_path):
    expected = trained_models.manifest()["heldout"]
    assert trained_models.installed_vllm() == expected["vllm"] == trained_models.CORPUS_VLLM
    out = trained_models.build_heldout(tmp_path / "heldout.txt")
    assert out.stat().st_size == expected["bytes"]
    assert trained_models.sha256(out) == expected["sha256"]
    out.read_text(encoding="utf-8")
    trained_models.check_heldout(out)
    out.write_bytes(out.read_bytes()[:-1])
    with pytest.raises(trained_models.FixtureError, match="not the manifest's"):
        trained_models.check_heldout(out)
    with pytest.raises(trained_models.FixtureError, match="run `make heldout`"):
        trained_models.check_heldout(tmp_path / "none.txt")


def test_another_vllms_text_fails_naming_the_version(tmp_path, monkeypatch):
    recorded = trained_models.manifest()
    other = {**recorded, "heldout": {**recorded["heldout"], "sha256": "0" * 64}}
    monkeypatch.setattr(trained_models, "manifest", lambda: other)
    with pytest.raises(trained_models.FixtureError) as error:
        trained_models.build_heldout(tmp_path / "heldout.txt")
    assert f"installed vLLM {trained_models.installed_vllm()}" in str(error.value)
    assert not (tmp_path / "heldout.txt").exists()
    monkeypatch.setattr(trained_models, "manifest", lambda: recorded)
    monkeypatch.setattr(trained_models, "installed_vllm", lambda: "0.34.0")
    with pytest.raises(trained_models.FixtureError, match=r"this environment has vLLM 0\.34\.0"):
        trained_models.build_heldout(tmp_path / "heldout.txt")


def test_the_committed_models_load_with_their_held_out_text():
    models = trained_models.committed()
    assert models.root == trained_models.DIR and models.heldout == trained_models.HELDOUT
    for path in (models.target, models.draft_model, models.eagle3, models.dflash):
        config = json.loads((Path(path) / "config.json").read_text())
        assert config["vocab_size"] == 260
    for head in (models.eagle3, models.dflash):
        config = json.loads((Path(head) / "config.json").read_text())
        assert config["max_position_embeddings"] == trained_models.DRAFT_CONTEXT


def test_a_prompt_of_the_held_out_text_is_what_the_targets_tokenizer_makes_of_it():
    """Every prompt is cut from the held-out text as its bytes (``TrainedModels.prompt``):
    the target's own tokenizer gives the whole text those ids."""
    from transformers import AutoTokenizer

    models = trained_models.committed()
    tokenizer = AutoTokenizer.from_pretrained(models.target)
    text = models.heldout.read_text(encoding="utf-8")
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert len(ids) == models.heldout_tokens
    assert ids == models.prompt(0, models.heldout_tokens)
    assert models.prompt(len(ids) - 3, 8) == ids[-3:]


def test_what_serves_the_models_never_trains_them():
    """``make -n``: what each target would run, from this checkout as it is (the retrained
    models in .cache may be missing or stale: nothing here asks for them)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS")}
    for target in ("setup", "demo", "test", "bench", "study-cpu"):
        planned = subprocess.run(
            ["make", "-n", "--no-print-directory", target],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        assert planned.returncode == 0, planned.stderr
        assert "trained_models train" not in planned.stdout, target
        assert "trained-models" not in planned.stdout, target
