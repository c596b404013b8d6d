# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The measurements of `make gpu-check` (gpu_check.py), side by side in one run with CUDA
events: the window's refresh per propose (the fused kernel, the torch path, the released
MRV1 adapter where ``MRV1_ADAPTER`` names its file) and the draft's attention through the
window against the whole context (vLLM's ``unified_attention``, bf16, 32 query / 8 KV heads
of 128), next to the ideal ratio."""

from __future__ import annotations

import importlib.util
import os
import statistics
from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace

import torch

from tools.gpu_check.checks import Result, decode_attention, synthetic_window


def cuda_ms(fn, rounds: int = 20) -> float:
    """Median milliseconds of ``fn`` between CUDA events."""
    fn()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _refreshes(window, batch: int, lengths, count: int) -> None:
    for _ in range(count):
        window.refresh(batch, seq_lens=lengths)


def _apply_mrv1(adapter, table, lengths) -> None:
    adapter.apply(
        SimpleNamespace(
            block_table_tensor=table,
            seq_lens=lengths.clone(),
            seq_lens_cpu_upper_bound=lengths.cpu(),
        )
    )


def torch_arange(n: int, device) -> torch.Tensor:
    return torch.arange(n, dtype=torch.int32, device=device)


@dataclass(frozen=True)
class Sizes:
    """What is measured: the refresh at ``batches`` x one ``context``; the attention at
    ``contexts`` x ``attention_batches`` with ``heads`` (query, KV, head size)."""

    batches: tuple[int, ...] = (1, 64, 256, 1024)
    context: int = 32768
    window_size: int = 2048
    contexts: tuple[int, ...] = (8192, 32768, 131072)
    attention_batches: tuple[int, ...] = (1, 16, 64)
    heads: tuple[int, int, int] = (32, 8, 128)


def measure(device, sizes: Sizes = Sizes()) -> list[Result]:
    """Refresh per propose (fused, torch path, MRV1) and draft attention window/full."""
    results, mrv1, w_size = [], _mrv1_adapter(), sizes.window_size
    for batch in sizes.batches:
        gen = torch.Generator().manual_seed(batch)
        fused, lengths = synthetic_window(device, batch, sizes.context, (128,), w_size, 0, gen)
        plain, _ = synthetic_window(device, batch, sizes.context, (128,), w_size, 0, gen)
        plain.refresh_kernel = None
        table = fused.block_tables.base.input_block_tables[0][:batch]
        for k in (1, 3, 5, 7):  # 1: a DFlash/DSpark propose; K: an EAGLE propose's refreshes
            times = [cuda_ms(partial(_refreshes, w, batch, lengths, k)) for w in (fused, plain)]
            detail = f"fused {times[0] * 1000:.1f} us, torch path {times[1] * 1000:.1f} us"
            if mrv1 is not None:
                adapter = mrv1.SlidingWindowAdapter(w_size, 128, batch, 0 if k == 1 else k, device)
                ms = cuda_ms(partial(_apply_mrv1, adapter, table, lengths))
                detail += f", MRV1 apply {ms * 1000:.1f} us"
            what = "DFlash/DSpark" if k == 1 else f"EAGLE K={k}"
            values = {
                "batch": batch,
                "k": k,
                "fused_us": times[0] * 1000,
                "torch_us": times[1] * 1000,
            }
            results.append(
                Result(
                    "measured", f"refresh per propose, batch {batch}, {what}", None, detail, values
                )
            )
    if importlib.util.find_spec("vllm") is None:
        return results
    (heads, kv_heads, dim), b = sizes.heads, 16
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    for context in sizes.contexts:
        k = torch.randn(context // b + 1, b, kv_heads, dim, device=device, dtype=dtype)
        v = torch.randn_like(k)
        for batch in sizes.attention_batches:
            # Every request reads the same blocks: the same work as distinct ones.
            table = (torch_arange(context // b, device) + 1).repeat(batch, 1)
            gen = torch.Generator().manual_seed(context + batch)
            window, _ = synthetic_window(device, batch, context, (b,), w_size, 0, gen)
            window.block_tables.base.input_block_tables[0].zero_()[:, :-1].copy_(table)
            full = torch.full((batch,), context, dtype=torch.int32, device=device)
            window.refresh(batch, seq_lens=full)
            q = torch.randn(batch, heads, dim, device=device, dtype=dtype)
            out = torch.empty_like(q)
            t_full = cuda_ms(partial(decode_attention, q, k, v, out, full, context, table))
            read, cropped = window.seq_lens[:batch], window.windows[0].block_table[:batch]
            max_read = window.spec.max_read_len
            t_win = cuda_ms(partial(decode_attention, q, k, v, out, read, max_read, cropped))
            ideal = int(window.seq_lens[0]) / context
            results.append(
                Result(
                    "measured",
                    f"draft attention, {context} tokens, batch {batch}",
                    None,
                    f"window {t_win:.3f} ms, full {t_full:.3f} ms, ratio "
                    f"{t_win / t_full:.3f} (ideal {ideal:.3f})",
                    {"context": context, "batch": batch, "ratio": t_win / t_full, "ideal": ideal},
                )
            )
    return results


def _mrv1_adapter():
    path = os.environ.get("MRV1_ADAPTER")
    if not path:
        return None
    spec = importlib.util.spec_from_file_location("released_mrv1_adapter", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
