# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""vLLM's ``DraftModelSpeculator`` (``spec_decode/speculator.py``, alike on every release),
the base every family builds through. Each wrapper calls the function of ``speculator.py``
that vllm-ascend's explicit calls call:

- ``set_attn`` makes each speculator's window once, before any graph capture
  (``create_draft_window``), with the path check on its builders and the fused refresh
  enabled if its self-check passes (``create_checked_window``);
- ``_build_attn_metadata`` (``_build_draft_attn_metadata`` on vLLM 0.29): the choke point
  every draft metadata build goes through (``build_attn_metadata``);
- ``_update_draft_decode_metadata`` (vLLM 0.33): the in-place update a FULL graph records;
  the window's refresh (device ops into persistent buffers) is recorded with it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vllm_ascend.worker.v2.spec_decode.draft_window import speculator
from vllm_ascend.worker.v2.spec_decode.draft_window.config import KEY, DraftWindowConfig
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.fused_check import enable_if_trusted
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.hooks.common import (
    WINDOW_ATTR,
    Installed,
    around,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.hooks.kv_cache import FREED_ATTR
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.log import logger
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.path_check import (
    UPDATE_PATH,
    PathCheck,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.plugin_release import (
    PluginRelease,
    refuse_config,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import DraftWindow

if TYPE_CHECKING:
    from vllm_ascend.worker.v2.spec_decode.draft_window.groups import Freed


def create_checked_window(
    draft_speculator: Any, release: PluginRelease, freed: Freed | None = None
) -> DraftWindow | None:
    """``speculator.create_draft_window`` once the layouts only the plugin's releases refuse
    are checked (``refuse_config``), its builders then watched by the path check (the
    hooks wrap methods by name: a release that routes a build around them is caught) and
    the fused refresh enabled where its self-check passes on the window's device."""
    vllm_config = draft_speculator.vllm_config
    config = DraftWindowConfig.from_additional_config(getattr(vllm_config, "additional_config", None))
    if config.enabled:
        refuse_config(vllm_config, release, config.draft_window_size)
    window = speculator.create_draft_window(draft_speculator, release, freed)
    if window is not None:
        window.path_check = PathCheck(window, draft_speculator, release, release.bound_as_exact_rows)
        enable_if_trusted(window, logger, KEY)
    return window


def set_attn(original: Callable, installed: Installed) -> Callable:
    """``DraftModelSpeculator.set_attn``: vLLM's own, then the speculator's window."""

    @functools.wraps(original)
    def wrapper(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        freed = getattr(self, FREED_ATTR, None)
        window = create_checked_window(self, installed.release, freed) if installed.active else None
        setattr(self, WINDOW_ATTR, window)

    return wrapper


def build_attn_metadata(original: Callable, installed: Installed) -> Callable:
    """``DraftModelSpeculator._build_attn_metadata`` (``_build_draft_attn_metadata`` on vLLM
    0.29), built for the window (``speculator.build_attn_metadata``)."""
    signature = inspect.signature(original)
    path = original.__qualname__

    def body(self: Any, window: DraftWindow, *args: Any, **kwargs: Any) -> Any:
        arguments = signature.bind(self, *args, **kwargs).arguments
        del arguments["self"]
        build = functools.partial(original, self)
        return speculator.build_attn_metadata(self, window, build, arguments, path)

    return around(original, installed, body)


def update_draft_decode_metadata(original: Callable, installed: Installed) -> Callable:
    """``DraftModelSpeculator._update_draft_decode_metadata``: the window refreshed in the
    persistent buffers the recorded metadata references, then vLLM's update."""

    def body(self: Any, window: DraftWindow, attn_metadata: Any, num_reqs: int) -> None:
        window.refresh(num_reqs)
        # A backend with smaller kernel blocks reads a kernel-block table that only a
        # build maps; the update skips the build, so map the refreshed windows here
        # (a write into the group's persistent table, fit for recording in a graph).
        for g, cropped in window.windows.items():
            for group in self.attn_groups[g]:
                if group.kernel_block_size is not None:
                    group.map_to_kernel_block_table(cropped.block_table[:num_reqs])
        with window.on_path(UPDATE_PATH):
            original(self, attn_metadata, num_reqs)

    return around(original, installed, body)
