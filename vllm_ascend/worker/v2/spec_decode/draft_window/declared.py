# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""``draft_window_size: "auto"``: the context the draft's own config.json declares."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_ascend.worker.v2.spec_decode.draft_window.config import AUTO, KEY

if TYPE_CHECKING:
    from vllm.config import VllmConfig

# Read in order: top level, the speculators format's layer config, a composite text config.
FIELDS = (
    "max_position_embeddings",
    "transformer_layer_config.max_position_embeddings",
    "text_config.max_position_embeddings",
)


@dataclass(frozen=True)
class Declared:
    """The context the draft checkpoint declares (``tokens`` None: none) and where."""

    tokens: int | None
    field: str | None
    checkpoint: str
    path: Path


def declared_context(vllm_config: VllmConfig) -> Declared:
    checkpoint, path = _config_json(vllm_config)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(
            f"{KEY}={AUTO}: the draft checkpoint {checkpoint}'s config.json ({path}) cannot "
            f"be read ({type(error).__name__}: {error}), so the training context it declares "
            f"is unknown. Fix the checkpoint, or set {KEY} to a number of tokens."
        ) from None
    for name in FIELDS:
        value = _dotted(data, name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return Declared(value, name, checkpoint, path)
    return Declared(None, None, checkpoint, path)


def auto_window_size(context: int, alignment: int) -> int:
    """Largest window whose reads (at most ``W + a - 1`` tokens) stay within ``context``."""
    return context - alignment + 1


def _dotted(data: object, name: str) -> object:
    for part in name.split("."):
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data


def _config_json(vllm_config: VllmConfig) -> tuple[str, Path]:
    speculative = getattr(vllm_config, "speculative_config", None)
    draft = getattr(speculative, "draft_model_config", None)
    if draft is None:
        method = getattr(speculative, "method", None)
        raise ValueError(
            f"{KEY}={AUTO} sizes the window from the training context the draft checkpoint "
            f"declares, and speculative method {method!r} has no draft checkpoint of its own "
            f"here. Set {KEY} to a number of tokens."
        )
    source = str(getattr(draft, "hf_config_path", None) or draft.model)
    revision = getattr(draft, "revision", None)
    folder = Path(source).expanduser()
    if folder.is_dir():
        path = folder / "config.json"
        if path.is_file():
            return source, path
    else:
        cached = _from_hub_cache(source, revision)
        if cached is not None:
            return source, cached
    at = f" at revision {revision}" if revision else ""
    raise ValueError(
        f"{KEY}={AUTO}: no config.json found for the draft checkpoint {source}{at}, neither "
        f"in a local folder nor in the local Hugging Face cache (the window never downloads "
        f"at start-up), so the training context it declares cannot be read. Pass the draft "
        f"as a local folder holding its config.json, or set {KEY} to a number of tokens (the "
        f"drafter's training context)."
    )


def _from_hub_cache(repo_id: str, revision: str | None) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        cached = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    except ValueError:
        # HFValidationError: not a hub id.
        return None
    return Path(cached) if isinstance(cached, str) else None
