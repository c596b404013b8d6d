# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The tiny models the engine suites, ``make demo``, ``make bench`` and the CPU study serve,
committed here as fixtures: a target (``target/``), a draft model trained at 64 tokens
(``draft/``), an EAGLE3 head trained at 64 tokens (``eagle3/``) and a DFlash drafter trained
at 64 tokens (``dflash/``, vLLM's ``dflash`` method), the digest of every file
(``manifest.json``) and the record of the training that made them (``training.json``).
``recipe.py`` is how they were made; nothing here trains them again.

The held-out text their prompts come from is not committed (it is vLLM 0.33.0's own source):
it is rebuilt from the installed vLLM wheel into ``.cache/heldout.txt`` (``make heldout``, in
``.venv``) and checked by its sha256 (``manifest.json``).

    python -m trained_models check          # the committed files against the manifest
    python -m trained_models heldout [OUT]  # make heldout: rebuild and check the held-out text
    python -m trained_models train DIR      # make trained-models: retrain into DIR (recipe.py)
    python -m trained_models compare DIR    # make trained-models: retrained DIR's digests
                                            # against the committed ones (replaces nothing)
    python -m trained_models adopt DIR      # commit DIR's models here (after a recipe change)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from trained_models.recipe import (
    CORPUS_VLLM,
    DRAFT_CONTEXT,
    NUM_SPEC,
    RECIPE,
    TARGET_CONTEXT,
    TrainedModels,
)

__all__ = [
    "COMMITTED",
    "CORPUS_VLLM",
    "DRAFT_CONTEXT",
    "HELDOUT",
    "NUM_SPEC",
    "TARGET_CONTEXT",
    "FixtureError",
    "TrainedModels",
    "committed",
]

DIR = Path(__file__).resolve().parent
REPO = DIR.parent
MANIFEST = DIR / "manifest.json"
# The four models' folders, as ``TrainedModels`` names them.
MODELS = ("target", "draft", "eagle3", "dflash")
# Where the held-out text is rebuilt (ignored by git, as all of .cache).
HELDOUT = REPO / ".cache" / "heldout.txt"
# The committed models and the rebuilt held-out text: paths only (``committed()`` checks them).
COMMITTED = TrainedModels(DIR, HELDOUT)


class FixtureError(RuntimeError):
    """A committed file or the rebuilt held-out text is not what the manifest records."""


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def manifest() -> dict:
    return json.loads(MANIFEST.read_text())


def model_files(root: Path) -> dict[str, str]:
    """Every file of the four models under ``root`` (``target/config.json``, ...) with its
    sha256."""
    root = Path(root)
    return {
        path.relative_to(root).as_posix(): sha256(path)
        for name in MODELS
        for path in sorted((root / name).rglob("*"))
        if path.is_file()
    }


def check_files(root: Path = DIR, recorded: dict | None = None) -> list[str]:
    """What differs between the models under ``root`` and the manifest's digests: a line per
    missing, extra or changed file (none: they match)."""
    recorded = manifest()["files"] if recorded is None else recorded
    found = model_files(root)
    problems = [f"missing: {name}" for name in sorted(recorded.keys() - found.keys())]
    problems += [f"not in the manifest: {name}" for name in sorted(found.keys() - recorded.keys())]
    problems += [
        f"changed: {name} (sha256 {found[name][:16]}..., the manifest's {recorded[name][:16]}...)"
        for name in sorted(found.keys() & recorded.keys())
        if found[name] != recorded[name]
    ]
    return problems


def installed_vllm() -> str:
    from importlib import metadata

    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return "none"


def build_heldout(out: Path = HELDOUT) -> Path:
    """Rebuilds the held-out text from the installed vLLM (its ``.py`` files, as the recipe
    split them) into ``out``, written only when its sha256 is the manifest's."""
    from trained_models.recipe import split_corpus

    expected = manifest()["heldout"]
    version = installed_vllm()
    if version != expected["vllm"]:
        raise FixtureError(
            f"the held-out text is rebuilt from vLLM {expected['vllm']}'s source; this "
            f"environment has vLLM {version}: run `make heldout` (it uses .venv)"
        )
    _, heldout = split_corpus()
    digest = hashlib.sha256(heldout).hexdigest()
    if digest != expected["sha256"]:
        raise FixtureError(
            f"the held-out text rebuilt from the installed vLLM {version} "
            f"({len(heldout)} bytes, sha256 {digest}) is not the one the committed models' "
            f"prompts come from (vLLM {expected['vllm']}'s wheel: {expected['bytes']} bytes, "
            f"sha256 {expected['sha256']}): install vLLM {expected['vllm']}'s own wheel "
            "(make setup)"
        )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.{os.getpid()}")
    partial.write_bytes(heldout)
    partial.replace(out)
    return out


def check_heldout(path: Path = HELDOUT) -> None:
    """The held-out text at ``path`` is the manifest's, or a ``FixtureError`` saying what to
    run."""
    expected = manifest()["heldout"]
    if not Path(path).exists():
        raise FixtureError(
            f"no held-out text at {path}: run `make heldout` (rebuilds it from .venv's "
            f"vLLM {expected['vllm']}; this environment has vLLM {installed_vllm()})"
        )
    digest = sha256(path)
    if digest != expected["sha256"]:
        raise FixtureError(
            f"the held-out text at {path} has sha256 {digest}, not the manifest's "
            f"{expected['sha256']} (vLLM {expected['vllm']}'s source): run `make heldout`"
        )


def committed() -> TrainedModels:
    """The committed models, checked against the manifest, with the held-out text rebuilt
    where it is missing and this environment has the vLLM it comes from."""
    problems = check_files()
    if problems:
        raise FixtureError(
            f"the models under {DIR} are not the committed ones:\n  " + "\n  ".join(problems)
        )
    if not HELDOUT.exists() and installed_vllm() == manifest()["heldout"]["vllm"]:
        build_heldout()
    check_heldout()
    return COMMITTED


def compare(retrained: Path, log=print) -> bool:
    """Prints, for every committed file, whether the retrained one under ``retrained`` has
    the same digest (the weights first); True where all do. The committed ones stay."""
    recorded = manifest()["files"]
    found = model_files(retrained)
    weights = [f"{name}/model.safetensors" for name in MODELS]
    same = True
    log(f"the models retrained in {retrained} against the committed ones ({DIR}):")
    for name in weights + sorted(recorded.keys() - set(weights)):
        theirs = found.get(name)
        if theirs == recorded[name]:
            log(f"  {name}: the same (sha256 {theirs[:16]}...)")
        else:
            same = False
            what = f"sha256 {theirs[:16]}..." if theirs else "missing"
            log(f"  {name}: DIFFERS (retrained {what}, committed {recorded[name][:16]}...)")
    for name in sorted(found.keys() - recorded.keys()):
        same = False
        log(f"  {name}: DIFFERS (only in the retrained models)")
    log(
        "the retrained models are the committed ones, byte for byte"
        if same
        else "the retrained models differ from the committed ones (the suites, make demo and "
        "make bench serve the committed ones; this machine's training is in "
        f"{Path(retrained) / 'training.json'})"
    )
    return same


def adopt(retrained: Path) -> None:
    """Replaces the committed models with those retrained under ``retrained`` (of the
    current recipe) and writes their manifest: after a change to the recipe."""
    from trained_models.recipe import trained_models

    source = trained_models(Path(retrained))
    heldout = source.heldout.read_bytes()
    for name in MODELS:
        shutil.rmtree(DIR / name, ignore_errors=True)
        shutil.copytree(source.root / name, DIR / name)
    shutil.copyfile(source.root / "training.json", DIR / "training.json")
    record = {
        "recipe": RECIPE.fingerprint(),
        "files": model_files(DIR),
        "heldout": {
            "vllm": CORPUS_VLLM,
            "bytes": len(heldout),
            "sha256": hashlib.sha256(heldout).hexdigest(),
        },
    }
    MANIFEST.write_text(json.dumps(record, indent=1) + "\n")
