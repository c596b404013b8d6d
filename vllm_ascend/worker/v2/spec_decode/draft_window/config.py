# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The window's keys of ``--additional-config``, validated once at start-up."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

KEY = "draft_window_size"
# draft_window_size's one word value: the window sized from the training context the draft
# checkpoint declares (declared.py; the size is resolved in plan.py).
AUTO = "auto"
SINKS_KEY = "draft_attention_sinks"
MIN_CONTEXT_KEY = "draft_window_min_context"
FREE_KV_KEY = "draft_window_free_kv"


class DraftWindowConfig(BaseModel):
    """The window keys of ``additional_config``: ``draft_window_size`` (None: off; tokens; ``"auto"``: the draft's
    declared training context) and, only with it, the sinks, the threshold and ``draft_window_free_kv``."""

    model_config = ConfigDict(frozen=True)

    draft_window_size: Annotated[int, Field(ge=1)] | Literal["auto"] | None = None
    draft_attention_sinks: int = Field(default=0, ge=0)
    draft_window_min_context: int = Field(default=0, ge=0)
    draft_window_free_kv: bool = False

    @field_validator("draft_window_size", "draft_attention_sinks", "draft_window_min_context", mode="before")
    @classmethod
    def _no_booleans(cls, value: object) -> object:
        # pydantic's lax mode reads True as 1; a boolean here is a mistake, not a size.
        if isinstance(value, bool):
            raise ValueError("a boolean is not a number of tokens")
        return value

    @property
    def enabled(self) -> bool:
        return self.draft_window_size is not None

    @property
    def auto(self) -> bool:
        """Whether the window is sized from the draft checkpoint (``"auto"``)."""
        return self.draft_window_size == AUTO

    @classmethod
    def from_additional_config(cls, additional_config: dict | None) -> DraftWindowConfig:
        additional_config = additional_config or {}
        value = additional_config.get(KEY)
        try:
            window = cls(draft_window_size=value)
        except ValidationError:
            raise ValueError(
                f'additional_config["{KEY}"] must be a positive integer number of tokens '
                f'(an integral string such as "4096" is accepted), "{AUTO}" to size it from '
                f"the training context the draft checkpoint declares, or null to turn the "
                f"draft window off; got {value!r} ({type(value).__name__})"
            ) from None
        values = {"draft_window_size": window.draft_window_size}
        free_kv = additional_config.get(FREE_KV_KEY)
        if free_kv is not None:
            if not isinstance(free_kv, bool):
                raise ValueError(
                    f'additional_config["{FREE_KV_KEY}"] must be true or false; got '
                    f"{free_kv!r} ({type(free_kv).__name__})"
                )
            if free_kv and not window.enabled:
                raise ValueError(
                    f'additional_config["{FREE_KV_KEY}"]=true needs additional_config["{KEY}"]: '
                    f"it frees the draft KV the window never reads. Set {KEY} too, or remove "
                    f"{FREE_KV_KEY}."
                )
            values[FREE_KV_KEY] = free_kv
        for key, example, off in (
            (SINKS_KEY, "64", "0 or null for none"),
            (MIN_CONTEXT_KEY, "8192", "0 or null: every context"),
        ):
            value = additional_config.get(key)
            if value is None:
                continue
            if not window.enabled:
                raise ValueError(
                    f'additional_config["{key}"]={value!r} needs additional_config["{KEY}"]: '
                    f"it shapes the draft window. Set {KEY} too, or remove {key}."
                )
            try:
                cls(draft_window_size=window.draft_window_size, **{key: value})
            except ValidationError:
                raise ValueError(
                    f'additional_config["{key}"] must be an integer number of tokens >= 0 (an '
                    f'integral string such as "{example}" is accepted; {off}); got {value!r} '
                    f"({type(value).__name__})"
                ) from None
            values[key] = value
        return cls(**values)
