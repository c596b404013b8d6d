# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""vLLM's ``GPUModelRunner.get_kv_cache_spec`` (Model Runner V2; the CPU worker's runner
inherits it): vLLM's specs, then, with ``draft_window_free_kv``, the draft's full-attention
layers' turned into the sliding-window spec that has vLLM free their KV before the window
(``free_kv.draft_kv_cache_spec``). The engine groups the layers and sizes the KV cache from
what this returns, before any speculator's ``set_attn``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import free_kv
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.hooks.common import Installed

# The speculator attribute holding what the key freed (``kv_reclaim.Freed``), set where the
# runner returns the specs and handed to the window at set_attn; absent: the KV is whole.
FREED_ATTR = "_draft_window_freed"


def get_kv_cache_spec(original: Callable, installed: Installed) -> Callable:
    """``GPUModelRunner.get_kv_cache_spec``: vLLM's own, then the draft's freed layers."""

    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        specs = original(self, *args, **kwargs)
        # Without the key, vLLM's specs as they are, nothing else of the runner read.
        if not installed.active or not free_kv.asks_free_kv(self):
            return specs
        width = installed.release.block_table_width_function()
        specs, freed = free_kv.draft_kv_cache_spec(self, specs, width)
        if freed is not None:
            setattr(self.speculator, FREED_ATTR, freed)
        return specs

    return wrapper
