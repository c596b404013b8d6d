# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""``draft_window_size: "auto"``: the context the draft's own config.json declares."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vllm.logger import logger

from vllm_ascend.worker.v2.spec_decode.draft_window.config import AUTO, KEY
from vllm_ascend.worker.v2.spec_decode.draft_window.window import lcm_alignment

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

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


def auto_context(speculator: DraftModelSpeculator) -> Declared | None:
    """The context ``"auto"`` sizes the window from; None (off, said once): none, or not below max_model_len."""
    declared = declared_context(speculator.vllm_config)
    context, field, max_model_len = declared.tokens, declared.field, speculator.max_model_len
    if context is None:
        logger.warning(
            "%s=%s: the draft checkpoint %s declares no training context (none of %s in its "
            "config.json), so the draft window stays off. Set %s to the drafter's training "
            "context in tokens to window it.",
            KEY,
            AUTO,
            declared.checkpoint,
            ", ".join(FIELDS),
            KEY,
        )
        return None
    if context >= max_model_len:
        logger.info(
            "%s=%s: the draft checkpoint %s declares %s=%d, not below max_model_len=%d, so "
            "the draft reads no context longer than it declares; the draft window stays off. "
            "Set %s to the drafter's training context in tokens to window it anyway.",
            KEY,
            AUTO,
            declared.checkpoint,
            field,
            context,
            max_model_len,
            KEY,
        )
        return None
    return declared


def auto_window(speculator: DraftModelSpeculator, declared: Declared, units: Iterable[int]) -> int:
    """``"auto"`` as ``W = C - a + 1``: the largest window whose reads stay within the declared context ``C``."""
    context, field = declared.tokens, declared.field
    assert context is not None
    alignment = lcm_alignment(list(units))
    window_size = auto_window_size(context, alignment)
    query_stretch = speculator.num_speculative_steps + 1
    if window_size < query_stretch:
        raise ValueError(
            f"{KEY}={AUTO} cannot size the draft window: the draft checkpoint "
            f"{declared.checkpoint} declares {field}={context} and the window's alignment is "
            f"{alignment}, so W = {context} - {alignment} + 1 = {window_size} is smaller than "
            f"the {query_stretch} query tokens method {speculator.method!r} drafts per request "
            f"(num_speculative_tokens + 1). Set {KEY} explicitly to a number of tokens >= "
            f"{query_stretch}."
        )
    logger.info(
        "%s=%s became W=%d: the draft checkpoint %s declares %s=%d (its training context), "
        "and the window's reads (W to W + a - 1 = %d tokens, alignment %d) stay within it.",
        KEY,
        AUTO,
        window_size,
        declared.checkpoint,
        field,
        context,
        window_size + alignment - 1,
        alignment,
    )
    return window_size


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
