# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The checks of `make gpu-check` (gpu_check.py): the one-launch refresh against the torch
path over a grid of shapes and the start-up self-check's verdict; vLLM's
``unified_attention`` over windowed metadata against dense attention over exactly the window;
on a GPU, the refresh in a CUDA graph (replays equal eager, no allocation) and without host
syncs. Device-agnostic: on CPU they run under Triton's interpreter on tiny shapes."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace


@dataclass
class Result:
    section: str
    name: str
    ok: bool | None  # None: a measurement or a skipped part
    detail: str
    # A measurement's numbers, for the plot.
    values: dict | None = None


def synthetic_window(
    device, batch: int, context: int, block_sizes, window_size: int, sinks: int, gen
):
    """A window over random full tables of ``context`` tokens, with actual lengths, and the
    fused refresh enabled."""
    import torch

    from testbed.plans import plan_over
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.fused import enable_fused
    from vllm_ascend.worker.v2.spec_decode.draft_window.window import ceil_div
    from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import (
        ActualSeqLens,
        DraftWindow,
    )

    def i32(*shape, high=1 << 30):
        return torch.randint(1, high, shape, generator=gen, dtype=torch.int32).to(device)

    tables = [i32(batch, ceil_div(context, b) + 1) for b in block_sizes]
    actual = ActualSeqLens(torch.zeros(batch, dtype=torch.int32, device=device), context + 8)
    window = DraftWindow(
        plan_over(
            window_size,
            SimpleNamespace(input_block_tables=tables, block_sizes=list(block_sizes)),
            list(range(len(block_sizes))),
            max_chunk_len=2 * window_size,
            sink_tokens=sinks,
            actual=actual,
        ),
        SimpleNamespace(seq_lens=torch.zeros(batch, dtype=torch.int32, device=device)),
        SimpleNamespace(input_block_tables=tables, block_sizes=list(block_sizes)),
        batch,
        device,
    )
    enable_fused(window)
    lengths = torch.randint(0, context + 1, (batch,), generator=gen, dtype=torch.int32)
    lengths[0] = context
    if batch > 1:
        lengths[-1] = 0  # a padded row
    actual.source.copy_(torch.where(lengths > 0, lengths + 3, 0).to(device))
    return window, lengths.to(device)


def check_kernels(device, tiny: bool, quick: bool) -> list[Result]:
    """The fused refresh against the torch path on every variant, over the grid."""
    import torch

    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.fused_check import (
        compare_with_torch,
        self_check,
    )

    if tiny:
        grid = [
            (b, 300, blocks, s) for b in (1, 5) for blocks in ((16,), (16, 32)) for s in (0, 20)
        ]
        window_size = 64
    else:
        batches = (1, 256) if quick else (1, 64, 256, 1024)
        contexts = (8192, 131072) if quick else (8192, 32768, 131072)
        grid = [
            (b, c, blocks, s)
            for b in batches
            for c in contexts
            for blocks in ((16,), (128,), (16, 128))
            for s in (0, 64)
        ]
        window_size = 2048
    results = []
    for batch, context, blocks, sinks in grid:
        gen = torch.Generator().manual_seed(batch * 7 + context)
        window, lengths = synthetic_window(device, batch, context, blocks, window_size, sinks, gen)
        chunks = torch.minimum(
            torch.randint(1, 2 * window_size, (batch,), generator=gen, dtype=torch.int32),
            lengths.cpu(),
        )
        qsl = torch.zeros(batch + 1, dtype=torch.int32)
        qsl[1:] = torch.cumsum(chunks, 0)
        variants = {
            "decode": {},
            "prefill": {"query_start_loc": qsl.to(device)},
            "told 1": {"actual_step": 1},
            "told 3": {"actual_step": 3},
        }
        diffs = [
            f"{name}: {d}"
            for name, kw in variants.items()
            for d in compare_with_torch(window, batch, lengths, **kw)
        ]
        name = f"batch {batch}, {context} tokens, blocks {list(blocks)}, sinks {sinks}"
        results.append(Result("refresh kernel", name, not diffs, "; ".join(diffs) or "bit for bit"))
    verdict = self_check(window)
    results.append(
        Result(
            "refresh kernel", "start-up self-check", not verdict, "; ".join(verdict) or "trusted"
        )
    )
    return results


def decode_attention(q, k, v, out, lengths, max_len: int, table) -> None:
    """vLLM's ``unified_attention`` of one query token a request, into ``out``, over the
    paged K/V ``table`` maps: ``lengths`` tokens each, at most ``max_len``."""
    import torch
    from vllm.v1.attention.ops.triton_unified_attention import unified_attention

    unified_attention(
        q=q,
        k=k,
        v=v,
        out=out,
        cu_seqlens_q=torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device),
        max_seqlen_q=1,
        seqused_k=lengths,
        max_seqlen_k=max_len,
        softmax_scale=q.shape[-1] ** -0.5,
        causal=True,
        window_size=(-1, -1),
        block_table=table,
        softcap=0,
        q_descale=None,
        k_descale=None,
        v_descale=None,
    )


def check_attention(device, tiny: bool) -> list[Result]:
    """vLLM's unified_attention over windowed metadata against dense attention over exactly
    the window (the sinks, then [start, L))."""
    import torch

    try:
        from vllm.v1.attention.ops import triton_unified_attention  # noqa: F401
    except ImportError as error:
        return [
            Result(
                "attention",
                "vLLM unified_attention",
                None,
                f"skipped: vLLM is not importable ({error}); set VLLM_PY",
            )
        ]
    from testbed.reference import positions_read

    heads, kv_heads, dim = (4, 2, 32) if tiny else (32, 8, 128)
    window_size, b, sinks = (64, 16, 16) if tiny else (2048, 16, 64)
    contexts = [100, 300, 1000] if tiny else [1000, 8192, 32768, 131072]
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    n, blocks = len(contexts), [-(-c // b) for c in contexts]
    k = torch.randn(sum(blocks) + 1, b, kv_heads, dim, generator=gen).to(device, dtype)
    v = torch.randn(sum(blocks) + 1, b, kv_heads, dim, generator=gen).to(device, dtype)
    table = torch.zeros(n, max(blocks), dtype=torch.int32)
    ids = torch.randperm(sum(blocks), generator=gen).to(torch.int32) + 1
    for i, count in enumerate(blocks):
        table[i, :count] = ids[sum(blocks[:i]) : sum(blocks[: i + 1])]
    window, _ = synthetic_window(device, n, max(contexts), (b,), window_size, sinks, gen)
    full = window.block_tables.base.input_block_tables[0]
    full.zero_()[:, : table.shape[1]].copy_(table.to(device))
    lengths = torch.tensor(contexts, dtype=torch.int32, device=device)
    window.refresh(n, seq_lens=lengths)
    spec = window.spec
    q = torch.randn(n, heads, dim, generator=gen).to(device, dtype)
    out = torch.empty_like(q)
    cropped, read = window.windows[0].block_table[:n], window.seq_lens[:n]
    # The interpreter evaluates masked-off lanes too (0/0 there, discarded by the mask).
    with numpy_errors_ignored():
        decode_attention(q, k, v, out, read, spec.max_read_len, cropped)
    worst, bounds = 0.0, []
    for i, length in enumerate(contexts):
        start, kept = positions_read(length, int(read[i]), spec.sink_size)
        # The window itself: an aligned start W to W + a - 1 tokens back (or all).
        reach = spec.sink_size + spec.window_size + spec.alignment
        if start % spec.alignment or not min(length, reach - spec.alignment) <= len(kept) < reach:
            bounds.append(f"request {i}: reads {len(kept)} of {length} from {start}")
        slots = table[i, kept // b].long() * b + kept % b
        keys = k.flatten(0, 1)[slots.to(device)].float().repeat_interleave(heads // kv_heads, 1)
        values = v.flatten(0, 1)[slots.to(device)].float().repeat_interleave(heads // kv_heads, 1)
        weights = torch.einsum("hd,khd->hk", q[i].float(), keys).mul(dim**-0.5).softmax(-1)
        expected = torch.einsum("hk,khd->hd", weights, values)
        worst = max(worst, float((out[i].float() - expected).abs().max()))
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    shape = f"{heads}/{kv_heads} heads of {dim}, {str(dtype)[6:]}, W = {window_size}, sinks {sinks}"
    detail = f"max abs error {worst:.2e} (tolerance {tolerance})"
    return [
        Result(
            "attention",
            f"unified_attention over the window ({shape})",
            worst <= tolerance and not bounds,
            "; ".join([detail, *bounds]),
        )
    ]


def numpy_errors_ignored():
    import numpy as np

    return np.errstate(invalid="ignore", divide="ignore")


def capture(fn):
    """Record ``fn`` in a CUDA graph; return the graph's replay."""
    import torch

    fn()  # compile before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def allocations() -> int:
    """Device allocations so far (after the device has finished its work)."""
    import torch

    torch.cuda.synchronize()
    return torch.cuda.memory_stats()["allocation.all.allocated"]


@contextmanager
def sync_errors():
    """Inside: a device-to-host sync raises."""
    import torch

    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def check_graphs(
    device, batch: int = 256, context: int = 32768, window_size: int = 2048
) -> list[Result]:
    """The refresh in a CUDA graph: replays with new inputs equal eager refreshes of the
    torch path, and allocate nothing; eager refreshes never sync the host."""
    import torch

    def make(seed: int):
        return synthetic_window(
            device, batch, context, (16, 128), window_size, 64, torch.Generator().manual_seed(seed)
        )

    (window, lengths), (twin, _) = make(1), make(1)
    twin.refresh_kernel = None  # the torch path, eager
    source = lengths.clone()
    replay = capture(partial(window.refresh, batch, seq_lens=source))
    gen = torch.Generator().manual_seed(2)
    problems, allocated = [], []
    for trial in range(3):
        new = torch.randint(0, context + 1, (batch,), generator=gen, dtype=torch.int32)
        source.copy_(new)
        for full, other in zip(
            window.block_tables.base.input_block_tables,
            twin.block_tables.base.input_block_tables,
            strict=True,
        ):
            full.copy_(torch.randint(1, 1 << 30, full.shape, generator=gen, dtype=torch.int32))
            other.copy_(full)
        before = allocations()
        replay()
        allocated.append(allocations() - before)
        twin.refresh(batch, seq_lens=new.to(device))
        if not torch.equal(window.seq_lens, twin.seq_lens):
            problems.append(f"replay {trial}: lengths")
        for g in window.windows:
            if not torch.equal(window.windows[g].block_table, twin.windows[g].block_table):
                problems.append(f"replay {trial}: group {g} table")
    results = [
        Result(
            "graphs",
            "refresh captured, replayed with new lengths and tables",
            not problems,
            "; ".join(problems) or "equal to eager, 3 replays",
        ),
        Result(
            "graphs",
            "allocations during replay",
            not any(allocated),
            f"{sum(allocated)} allocations",
        ),
    ]
    for name, w in (("fused", window), ("torch path", twin)):
        try:
            with sync_errors():
                w.refresh(batch, seq_lens=source)
                w.refresh(batch, seq_lens=source, actual_step=2)
            ok, detail = True, "no host sync"
        except RuntimeError as error:
            ok, detail = False, f"host sync: {error}"
        results.append(Result("graphs", f"host syncs in the {name} refresh", ok, detail))
    return results
