"""``draft_window_size`` from ``--additional-config``, validated once at start-up."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

KEY = "draft_window_size"


class DraftWindowConfig(BaseModel):
    """The window settings of ``vllm_config.additional_config``.

    ``draft_window_size`` absent or None turns the window off. Otherwise it is the number
    of most recent tokens the draft attends to; integral strings such as ``"4096"`` are
    accepted, as vllm-ascend's validated config accepts them.
    """

    model_config = ConfigDict(frozen=True)

    draft_window_size: int | None = Field(default=None, ge=1)

    @field_validator("draft_window_size", mode="before")
    @classmethod
    def _no_booleans(cls, value: Any) -> Any:
        # pydantic's lax mode reads True as 1; a boolean here is a mistake, not a size.
        if isinstance(value, bool):
            raise ValueError("a boolean is not a window size")
        return value

    @property
    def enabled(self) -> bool:
        return self.draft_window_size is not None

    @classmethod
    def from_additional_config(
        cls, additional_config: Mapping[str, Any] | None
    ) -> DraftWindowConfig:
        value = (additional_config or {}).get(KEY)
        try:
            return cls(draft_window_size=value)
        except ValidationError:
            raise ValueError(
                f'additional_config["{KEY}"] must be a positive integer number of tokens '
                f'(an integral string such as "4096" is accepted), or null to turn the '
                f"draft window off; got {value!r} ({type(value).__name__})"
            ) from None
