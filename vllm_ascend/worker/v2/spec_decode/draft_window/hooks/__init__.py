"""The window's hooks around vLLM's and vllm-ascend's speculator methods, one room per
speculator family, as the anchors arrange their speculators:

- ``start.py``: ``set_attn`` makes each speculator's window (alike on both lines);
- ``draft.py``: the draft build every family goes through, and DFlash's graph (DSpark is
  a DFlash);
- ``autoregressive.py``: the EAGLE family's propose, draft prefill and graphs;
- ``ascend.py``: vllm-ascend's told lengths.

``lines.py`` names, per supported line, the methods to wrap and the factory of each (by the
names below); ``install.py`` hands every factory the installation it serves. Each wrapper
names its path on the window, so that the run-time proof (``proof.py``) can check that the
builders received the window and name the path when they did not. With the window off each
wrapper costs one attribute check.
"""

from collections.abc import Callable

from vllm_ascend.worker.v2.spec_decode.draft_window.hooks import (
    ascend,
    autoregressive,
    draft,
    start,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.hooks.common import (
    WINDOW_ATTR,
    Installed,
    window_of,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.hooks.start import create_draft_window

# The factories by the names ``lines.py`` gives them: factory(original, installed).
FACTORIES: dict[str, Callable] = {
    "set_attn": start.set_attn,
    "build_attn_metadata": draft.build_attn_metadata,
    "update_draft_decode_metadata": draft.update_draft_decode_metadata,
    "dflash_capture": draft.dflash_capture,
    "propose": autoregressive.propose,
    "prefill": autoregressive.prefill,
    "ar_capture": autoregressive.ar_capture,
    "init_cudagraph_manager": autoregressive.init_cudagraph_manager,
    "manager_capture": autoregressive.manager_capture,
    "fused_multi_step_decode": autoregressive.fused_multi_step_decode,
    "told_host_lengths": ascend.told_host_lengths,
    "fia_params": ascend.fia_params,
    "exact_host_lengths": ascend.exact_host_lengths,
    "dcp_told_lengths": ascend.dcp_told_lengths,
}

__all__ = ["FACTORIES", "WINDOW_ATTR", "Installed", "create_draft_window", "window_of"]
