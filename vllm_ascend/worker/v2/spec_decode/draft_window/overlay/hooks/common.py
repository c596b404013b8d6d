# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What every family's hooks share: the installation they serve, a speculator's window, and
the two shapes of wrapper."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vllm_ascend.worker.v2.spec_decode.draft_window.config import KEY, DraftWindowConfig
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.plugin_release import PluginRelease
from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import (
    DraftWindow,
    not_in_path,
)

# The speculator attribute holding its window (None: off), as vllm-ascend's own speculators
# declare it.
WINDOW_ATTR = "draft_window"
# A speculator whose set_attn never ran through the hook has no window attribute at all.
_UNSET = object()


@dataclass
class Installed:
    """The installation the hooks serve (``install.py`` makes it and hands it to every
    factory): the release, the classes whose methods it wrapped (``Class.method`` per method
    name, as the release resolved them, for the errors that name a path), and whether it is
    still active (after uninstalling, a wrapper another plugin keeps in its chain makes no
    window)."""

    release: PluginRelease
    names: dict[str, list[str]] = field(default_factory=dict)
    active: bool = True

    def hooked(self, method: str) -> str:
        """``Class.method`` of the hooked ``method`` (the classes, where several are)."""
        return " and ".join(self.names.get(method, [method]))


def window_of(speculator: Any, installed: Installed) -> DraftWindow | None:
    """The speculator's window, None when off.

    Before ``set_attn`` there is none yet. A speculator whose ``set_attn`` ran but not
    through the hook (a subclass that overrides it without ``super()``) has none: with the
    window asked for, that is an error, never a silent unwindowed draft.
    """
    window = getattr(speculator, WINDOW_ATTR, _UNSET)
    if window is not _UNSET:
        return window
    if "kv_cache_config" not in vars(speculator):
        # set_attn has not run yet (vLLM's profiling run proposes before the KV cache
        # exists): no window yet, and nothing decided.
        return None
    additional = getattr(getattr(speculator, "vllm_config", None), "additional_config", None)
    if installed.active and DraftWindowConfig.from_additional_config(additional).enabled:
        raise not_in_path(
            f"{type(speculator).__name__}.set_attn did not run through the window's hook (an "
            f"override of {installed.hooked('set_attn')} without super()?), so its draft has "
            f"no window although {KEY} is set"
        )
    setattr(speculator, WINDOW_ATTR, None)
    return None


def around(original: Callable, installed: Installed, body: Callable) -> Callable:
    """A wrapper of ``original`` that runs ``body(self, window, *args, **kwargs)`` for a
    speculator with a window, and ``original`` unchanged for one without."""

    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        window = window_of(self, installed)
        if window is None:
            return original(self, *args, **kwargs)
        return body(self, window, *args, **kwargs)

    return wrapper


def after(original: Callable, installed: Installed, windowed: Callable) -> Callable:
    """A wrapper of ``original`` whose result, for a speculator with a window, is
    ``windowed(self, window, result, *args, **kwargs)``."""

    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        window = window_of(self, installed)
        if window is None:
            return result
        return windowed(self, window, result, *args, **kwargs)

    return wrapper
