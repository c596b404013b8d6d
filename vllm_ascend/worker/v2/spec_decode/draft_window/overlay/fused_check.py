# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Start-up check that the fused refresh matches the torch path bit for bit."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch

from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.fused import (
    enable_fused,
    triton_available,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.window import ceil_div
from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import ActualSeqLens, DraftWindow, Plan

if TYPE_CHECKING:
    from logging import Logger

    from vllm_ascend.worker.v2.spec_decode.draft_window.window import BlockTableWindow


def compare_with_torch(
    window: DraftWindow,
    num_reqs_padded: int,
    source: torch.Tensor,
    query_start_loc: torch.Tensor | None = None,
    actual_step: int | None = None,
) -> list[str]:
    """Outputs where the torch and fused refresh differ (overwrites the window's buffers)."""
    n = num_reqs_padded
    windows = window.windows if query_start_loc is None else window.chunk_windows
    kept, window.refresh_kernel = window.refresh_kernel, None
    try:
        window.refresh(n, seq_lens=source, query_start_loc=query_start_loc, actual_step=actual_step)
    finally:
        window.refresh_kernel = kept
    expected = _outputs(window, windows, n, actual_step is not None)
    for buffer in (window.seq_lens, window.window_skip, window.actual_windowed):
        buffer.fill_(-7)
    for cropped in windows.values():
        cropped.block_table.fill_(-7)
    window.refresh(n, seq_lens=source, query_start_loc=query_start_loc, actual_step=actual_step)
    got = _outputs(window, windows, n, actual_step is not None)
    return [name for name in expected if not torch.equal(expected[name], got[name])]


def _outputs(
    window: DraftWindow, windows: dict[int, BlockTableWindow], n: int, actual: bool
) -> dict[str, torch.Tensor]:
    out = {"seq_lens": window.seq_lens[:n].clone(), "skip": window.window_skip[:n].clone()}
    if actual:
        out["actual_windowed"] = window.actual_windowed[:n].clone()
    for g, cropped in windows.items():
        out[f"group {g} table"] = cropped.block_table[:n].clone()
    return out


def self_check(window: DraftWindow, seed: int = 0) -> list[str]:
    """Compare both refresh paths on a synthetic window of the same shape, per variant."""
    spec = window.spec
    device = window.seq_lens.device
    gen = torch.Generator().manual_seed(seed)
    rows = 8
    max_len = 4 * spec.reach + spec.min_context
    groups = sorted(window.group_block_sizes)
    tables, sizes = [], []
    for g in range(max(groups) + 1):
        b = window.group_block_sizes.get(g, spec.alignment)
        ids = torch.randint(1, 10_000, (rows, ceil_div(max_len, b) + 3), generator=gen, dtype=torch.int32)
        tables.append(ids.to(device))
        sizes.append(b)
    actual = None
    if window.actual is not None:
        # Triton specializes on some integer arguments: keep the real max_model_len.
        high = min(max_len, window.actual.max_model_len)
        source = torch.randint(0, high, (rows,), generator=gen, dtype=torch.int32)
        actual = ActualSeqLens(source.to(device), window.actual.max_model_len)
    plan = Plan(spec, window.group_block_sizes, max_chunk_len=2 * spec.window_size, actual=actual)
    synthetic = DraftWindow(
        plan,
        SimpleNamespace(seq_lens=torch.zeros(rows, dtype=torch.int32, device=device)),
        SimpleNamespace(input_block_tables=tables, block_sizes=sizes),
        max_num_reqs=rows,
        device=device,
    )
    enable_fused(synthetic)
    lengths = torch.randint(0, max_len, (rows,), generator=gen, dtype=torch.int32)
    lengths[-2:] = 0  # padded rows
    if spec.min_context:
        lengths[:2] = torch.tensor([spec.min_context - 1, spec.min_context])  # either side
    query_lens = torch.minimum(
        torch.randint(1, 2 * spec.window_size, (rows,), generator=gen, dtype=torch.int32), lengths
    )
    qsl = torch.zeros(rows + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(query_lens, 0)
    variants: dict[str, dict] = {"decode": {}, "prefill": {"query_start_loc": qsl.to(device)}}
    if actual is not None:
        variants["actual"] = {"actual_step": 1}
    problems = []
    for name, kwargs in variants.items():
        diff = compare_with_torch(synthetic, rows, lengths.to(device), **kwargs)
        problems += [f"{name}: {d}" for d in diff]
    return problems


def enable_if_trusted(window: DraftWindow, logger: Logger, key: str, allow_cpu: bool = False) -> bool:
    """Enable the fused refresh if the self-check passes on the window's device."""
    if window.seq_lens.device.type == "cpu" and not allow_cpu:
        return False
    if not triton_available():
        return False
    try:
        problems = self_check(window)
        if not problems:
            enable_fused(window)
    except Exception as error:  # a compiler, runtime or table layout the kernel cannot take
        window.refresh_kernel = None
        problems = [f"the kernel did not run ({type(error).__name__}: {error})"]
    if problems:
        logger.warning(
            "%s: the one-launch window refresh disagrees with the torch path on %s (%s); "
            "the window refreshes with the torch path.",
            key,
            window.seq_lens.device,
            "; ".join(problems),
        )
        return False
    logger.info("%s: the window refreshes with one kernel launch on %s.", key, window.seq_lens.device)
    return True
