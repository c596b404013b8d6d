# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The draft window for autoregressive (EAGLE) speculators."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.config.compilation import CUDAGraphMode
from vllm.logger import logger
from vllm.v1.attention.backends.utils import PAD_SLOT_ID

from vllm_ascend.worker.v2.spec_decode.draft_window.config import KEY
from vllm_ascend.worker.v2.spec_decode.draft_window.dcp import dcp_local_lengths
from vllm_ascend.worker.v2.spec_decode.draft_window.release import Release
from vllm_ascend.worker.v2.spec_decode.draft_window.window import window_seq_lens
from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import DraftWindow

if TYPE_CHECKING:
    from vllm.v1.worker.gpu.input_batch import InputBatch
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator


def windowed_prefill_metadata(
    speculator: DraftModelSpeculator,
    window: DraftWindow,
    batch: InputBatch,
    path: str,
    host_mirror: str | None = None,
    prepare_attn_state: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The draft layers' prefill metadata over the target's batch, windowed (the model state as it was after)."""
    n = batch.num_reqs
    window.refresh(n, seq_lens=batch.seq_lens, query_start_loc=batch.query_start_loc)
    query_lens_cpu = torch.from_numpy(np.diff(batch.query_start_loc_np[: n + 1]))
    bound = window.host_upper_bound(batch.seq_lens_cpu_upper_bound, n, 0, query_lens_cpu)[:n]
    # The host bound is exact for prefill rows and builders (MLA) rely on it: window it
    # exactly there.
    prefilling = torch.from_numpy(batch.is_prefilling_np[:n])
    if bool(prefilling.any()):
        windowed = _window_exact(window, batch.seq_lens_cpu_upper_bound[:n], query_lens_cpu)
        bound[prefilling] = windowed[prefilling]
    changes: dict[str, object] = {
        "seq_lens": window.seq_lens[:n],
        "seq_lens_cpu_upper_bound": bound,
    }
    dcp_lengths = getattr(batch, "dcp_local_seq_lens", None)
    if dcp_lengths is not None:
        layout, local, scratch = window.dcp, window.dcp_local_seq_lens, window.dcp_scratch
        assert layout is not None and local is not None and scratch is not None
        dcp_local_lengths(window.seq_lens[:n], layout, scratch=scratch[:n], out=local[:n])
        local[n:].zero_()
        changes["dcp_local_seq_lens"] = local[: dcp_lengths.shape[0]]
    fields = {f.name for f in dataclasses.fields(batch)}
    if "prompt_lens" in fields:
        # The target's restricted-SWA prefix; the draft layers have none.
        changes["prompt_lens"] = None
    mirror = getattr(batch, host_mirror, None) if host_mirror else None
    if host_mirror and mirror is not None:
        exact = torch.from_numpy(np.ascontiguousarray(mirror[:n], dtype=np.int32))
        changes[host_mirror] = _window_exact(window, exact, query_lens_cpu).numpy()
    windowed_batch = dataclasses.replace(batch, **changes)
    block_tables = tuple(t[:n] for t in window.block_tables.input_block_tables)
    model_state = speculator.model_state
    names = ("max_model_len", *prepare_attn_state)
    own = {name: model_state.__dict__[name] for name in names if name in model_state.__dict__}
    if isinstance(own.get("max_model_len"), int) and n:
        model_state.max_model_len = min(own["max_model_len"], int(bound.max()))
    window.exact_host_rows = prefilling
    try:
        with window.on_path(path):
            return model_state.prepare_attn(
                windowed_batch,
                CUDAGraphMode.NONE,
                block_tables,
                speculator.block_tables.slot_mappings[:, : batch.num_tokens],
                window.windowed_attn_groups or speculator.attn_groups,
                speculator.kv_cache_config,
            )
    finally:
        window.exact_host_rows = None
        for name in names:
            if name in own:
                setattr(model_state, name, own[name])
            else:
                model_state.__dict__.pop(name, None)
        window.block_tables.windows = window.windows


def _window_exact(window: DraftWindow, exact: torch.Tensor, query_lens: torch.Tensor) -> torch.Tensor:
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
    speculator: DraftModelSpeculator,
    window: DraftWindow,
    batch: InputBatch,
    target_metadata: dict[str, Any],
    num_tokens: int | None,
    path: str,
    release: Release,
) -> dict[str, Any]:
    """The target's metadata with the draft layers' entries windowed."""
    window.propose.prefill_windowed = True
    host_mirror = release.host_mirror[1] if release.host_mirror else None
    draft_metadata = windowed_prefill_metadata(speculator, window, batch, path, host_mirror, release.prepare_attn_state)
    # A PIECEWISE prefill may pad past the target's tokens: those slots write nowhere.
    slot_mappings = speculator.block_tables.slot_mappings
    slot_mappings[:, batch.num_tokens_after_padding : num_tokens].fill_(PAD_SLOT_ID)
    return {**target_metadata, **draft_metadata}


@contextmanager
def capturing(speculator: DraftModelSpeculator, window: DraftWindow | None, path: str) -> Iterator[None]:
    """The speculator's ``capture``: its draft prefill may read the target's dummy metadata."""
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
    """``cudagraph_mode`` without FULL graphs, which would read the target's metadata."""
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
    """The decode graph manager's ``capture``: every build under it is a capture's."""
    if window is None:
        yield
        return
    if window.path_check is not None:
        window.path_check.capture_on(path)
    with window.on_path(path):
        yield
