# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The window's wrappers around vLLM's and vllm-ascend's speculator methods, one module per
speculator family, arranged as the anchors' ``spec_decode/`` folders are:

- ``speculator.py``: ``DraftModelSpeculator``, the base every family builds through
  (``set_attn`` makes the window; every draft metadata build and in-place update);
- ``dflash.py``: ``DFlashSpeculator`` (DSpark is a DFlash): its graph capture;
- ``autoregressive.py``: the EAGLE family's propose, draft prefill and graphs;
- ``ascend/autoregressive.py`` and ``ascend/dspark.py``: what vllm-ascend adds to each, the
  actual lengths it computes on the host for its kernels;
- ``kv_cache.py``: the model runner's KV-cache specs, where ``draft_window_free_kv`` gives
  the draft's layers the spec that frees their KV before the window.

``supported.py`` names, per release, the methods to wrap and the family of each; ``family_module``
below is the one dispatch. Each wrapper names its path on the window, so that the path
check (``path_check.py``) can check that the builders received the window and name the path
when they did not. With the window off each wrapper costs one attribute check.
"""

from collections.abc import Callable
from types import ModuleType

from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.hooks.common import Installed, window_of
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.supported import Family, Hook


def family_module(family: Family) -> ModuleType:
    """The module holding a family's wrappers (one branch per family, as vLLM's
    ``init_speculator`` picks a speculator class by method)."""
    if family is Family.SPECULATOR:
        from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.hooks import (
            speculator as module,
        )
    elif family is Family.DFLASH:
        from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.hooks import dflash as module
    elif family is Family.AUTOREGRESSIVE:
        from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.hooks import (
            autoregressive as module,
        )
    elif family is Family.ASCEND_AUTOREGRESSIVE:
        from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.hooks.ascend import (
            autoregressive as module,
        )
    elif family is Family.ASCEND_DSPARK:
        from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.hooks.ascend import (
            dspark as module,
        )
    elif family is Family.KV_CACHE:
        from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.hooks import kv_cache as module
    else:
        raise ValueError(f"no hooks module for {family}")
    return module


def wrapper_factory(hook: Hook) -> Callable:
    """``factory(original, installed)`` making the wrapper of ``hook``'s method."""
    return getattr(family_module(hook.family), hook.wrapper_name)


__all__ = ["Installed", "family_module", "window_of", "wrapper_factory"]
