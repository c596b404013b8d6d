# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The autoregressive (EAGLE/EAGLE3) family's calls with the window, which both forms call
(the overlay's ``hooks/autoregressive.py``, vllm-ascend's explicit calls):

- ``prefill_attn_metadata`` (``_prefill``): the draft prefill reuses the target's metadata
  dict; the draft layers' entries are replaced by metadata built for the window through the
  draft's own builders (``windowed_prefill_metadata``; the target's objects are never
  touched);
- ``capturing`` (``capture``): the one place a draft prefill runs outside ``propose`` (on
  the target's dummy metadata; its graphs are PIECEWISE at most);
- ``prefill_cudagraph_mode`` (``init_cudagraph_manager``): a FULL prefill graph would read
  the target's captured buffers, so the draft prefill's manager is made without FULL graphs;
- ``decode_capture`` (the decode graph manager's ``capture``): the graphs record the
  persistent windowed buffers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from vllm.config.compilation import CUDAGraphMode
from vllm.v1.attention.backends.utils import PAD_SLOT_ID

from vllm_ascend.worker.v2.spec_decode.draft_window.config import KEY
from vllm_ascend.worker.v2.spec_decode.draft_window.dcp import dcp_local_lengths
from vllm_ascend.worker.v2.spec_decode.draft_window.log import logger
from vllm_ascend.worker.v2.spec_decode.draft_window.release import Release
from vllm_ascend.worker.v2.spec_decode.draft_window.window import window_seq_lens
from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import DraftWindow


def windowed_prefill_metadata(
    speculator: Any, window: DraftWindow, batch: Any, path: str, host_mirror: str | None = None
) -> dict:
    """The draft layers' prefill metadata: the target's batch, read through the window.

    Built by vLLM's own ``ModelState.prepare_attn`` with the draft's attention groups, as
    the target runner builds the target's (eager/PIECEWISE sizes), from the windowed
    ``seq_lens`` of the target's lengths and the cropped tables. ``host_mirror``: the name
    of the batch's exact host mirror of its lengths, where the release's batches keep one.
    """
    n = batch.num_reqs
    window.refresh(n, seq_lens=batch.seq_lens, query_start_loc=batch.query_start_loc)
    query_lens_cpu = torch.from_numpy(np.diff(batch.query_start_loc_np[: n + 1]))
    bound = window.host_upper_bound(batch.seq_lens_cpu_upper_bound, n, 0, query_lens_cpu)[:n]
    # NOTE: vLLM keeps the host bound exact for prefill rows, and builders (MLA) rely on it
    # (context = bound - q); there the same windowing applied to the exact host length
    # gives the exact windowed length.
    prefilling = torch.from_numpy(batch.is_prefilling_np[:n])
    if bool(prefilling.any()):
        windowed = _window_exact(window, batch.seq_lens_cpu_upper_bound[:n], query_lens_cpu)
        bound[prefilling] = windowed[prefilling]
    changes: dict[str, Any] = {"seq_lens": window.seq_lens[:n], "seq_lens_cpu_upper_bound": bound}
    if getattr(batch, "dcp_local_seq_lens", None) is not None:
        # The target's DCP-local lengths are this rank's share of the whole context; the
        # window's are its share of [start, L) (a window start is whole rounds of every
        # rank: window.py), from the windowed lengths on the device.
        local = window.dcp_local_seq_lens
        dcp_local_lengths(
            window.seq_lens[:n], window.dcp, scratch=window.dcp_scratch[:n], out=local[:n]
        )
        local[n:].zero_()
        changes["dcp_local_seq_lens"] = local[: batch.dcp_local_seq_lens.shape[0]]
    fields = {f.name for f in dataclasses.fields(batch)}
    if "prompt_lens" in fields:
        # Prompt lengths feed the target's restricted-SWA prefix, in absolute positions
        # the cropped tables no longer use; draft layers have no such prefix.
        changes["prompt_lens"] = None
    mirror = getattr(batch, host_mirror, None) if host_mirror else None
    if mirror is not None:
        # The exact host mirror of the target's lengths, which the release's kernel takes as
        # the exact lengths: windowed by the device's arithmetic (the mirror is exact).
        exact = torch.from_numpy(np.ascontiguousarray(mirror[:n], dtype=np.int32))
        changes[host_mirror] = _window_exact(window, exact, query_lens_cpu).numpy()
    windowed_batch = dataclasses.replace(batch, **changes)
    block_tables = tuple(t[:n] for t in window.block_tables.input_block_tables)
    model_state = speculator.model_state
    # The model state may keep what it built (vllm-ascend keeps the target's metadata for
    # its graph replays, and takes its max_seq_len from max_model_len): the draft's
    # build leaves every attribute as it was.
    kept = dict(vars(model_state))
    if isinstance(kept.get("max_model_len"), int) and n:
        model_state.max_model_len = min(kept["max_model_len"], int(bound.max()))
    window.exact_host_rows = prefilling
    try:
        with window.on_path(path):
            return model_state.prepare_attn(
                windowed_batch,
                CUDAGraphMode.NONE,
                block_tables,
                speculator.block_tables.slot_mappings[:, : batch.num_tokens],
                # The groups the window leaves alone keep the target's metadata (_prefill).
                window.windowed_attn_groups or speculator.attn_groups,
                speculator.kv_cache_config,
            )
    finally:
        window.exact_host_rows = None
        for name in set(vars(model_state)) - set(kept):
            delattr(model_state, name)
        vars(model_state).update(kept)
        # The prefill's metadata holds the wide tables; everything else (decode builds, a
        # graph capture's dummy tables) reads the per-step ones.
        window.block_tables.windows = window.windows


def _window_exact(window: DraftWindow, exact: torch.Tensor, query_lens: torch.Tensor):
    """Exact host lengths of a multi-token pass, windowed by the device's arithmetic."""
    windowed = torch.empty_like(exact)
    window_seq_lens(
        exact,
        window.spec,
        skip_out=torch.empty_like(exact),
        out=windowed,
        query_lens=query_lens.to(exact.dtype),
    )
    return windowed


def prefill_attn_metadata(
    speculator: Any,
    window: DraftWindow,
    batch: Any,
    target_metadata: dict[str, Any],
    num_tokens: int | None,
    path: str,
    release: Release,
) -> dict[str, Any]:
    """The draft prefill's metadata dict: the target's, with the draft layers' entries built
    for the window from the target's ``batch`` (``windowed_prefill_metadata``). The prefill
    runs ``num_tokens`` tokens (None: not known yet, as where vLLM 0.34 builds the prefill's
    metadata before it picks the prefill's graph): without FULL prefill graphs a PIECEWISE
    prefill may pad past the target's padded token count, and those slots must write
    nowhere (a graph may record the KV write)."""
    window.propose.prefill_windowed = True
    host_mirror = release.host_mirror[1] if release.host_mirror else None
    draft_metadata = windowed_prefill_metadata(speculator, window, batch, path, host_mirror)
    slot_mappings = speculator.block_tables.slot_mappings
    slot_mappings[:, batch.num_tokens_after_padding : num_tokens].fill_(PAD_SLOT_ID)
    return {**target_metadata, **draft_metadata}


def makes_prefill_manager(arguments: dict[str, Any]) -> bool:
    """Whether a speculator graph manager being made (its ``__init__``'s arguments) is the
    draft prefill's: its queries are longer than one token per request (vLLM 0.33 gives one
    ``decode_query_len``, 0.34 ``decode_query_lens`` by query length)."""
    if "decode_query_lens" in arguments:
        return max(arguments["decode_query_lens"], default=1) > 1
    return arguments["decode_query_len"] > 1


@contextmanager
def capturing(speculator: Any, window: DraftWindow | None, path: str) -> Iterator[None]:
    """The speculator's ``capture`` running on ``path``: its draft prefill (outside propose)
    may read the target's dummy metadata, since its graphs are PIECEWISE at most."""
    if window is None:
        yield
        return
    state = window.propose
    state.capturing = True
    try:
        with window.on_path(path):
            yield
    finally:
        state.capturing = False


def prefill_cudagraph_mode(cudagraph_mode: CUDAGraphMode) -> CUDAGraphMode:
    """The draft prefill's graph mode with the window on: ``cudagraph_mode`` without FULL
    graphs (a FULL prefill graph would read the target's captured metadata), said once."""
    if not cudagraph_mode.has_full_cudagraphs():
        return cudagraph_mode
    piecewise = cudagraph_mode.has_piecewise_cudagraphs()
    prefill_mode = CUDAGraphMode.PIECEWISE if piecewise else CUDAGraphMode.NONE
    logger.info(
        "%s: the draft prefill runs with cudagraph mode %s instead of %s, so that its "
        "metadata is built for the window at every step.",
        KEY,
        prefill_mode.name,
        cudagraph_mode.name,
    )
    return prefill_mode


@contextmanager
def decode_capture(window: DraftWindow | None, path: str) -> Iterator[None]:
    """The decode graph manager's ``capture`` on ``path``, handed ``window.input_buffers``
    and ``window.block_tables`` by the caller: every build under it is checked."""
    if window is None:
        yield
        return
    window.path_check.capture_on(path)
    with window.on_path(path):
        yield
