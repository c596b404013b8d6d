# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What the window-cost sections share: the inputs (random lengths and block tables over a
context), the window over them, and how a build is timed (torch.utils.benchmark's Timer, the
medians of rounds that alternate which of two goes first), its allocations counted (torch
profiler memory events) and its device launches counted; and how every section writes its
tables (``markdown_table``)."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
from types import SimpleNamespace

import torch
from torch.utils import benchmark
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from testbed.plans import plan_over
from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import DraftWindow

BLOCK_SIZE = 128


BATCH_SIZES = [1, 64, 256, 1024]


WINDOWS = [512, 2048, 8192]


CONTEXTS = [8 * 1024, 32 * 1024, 128 * 1024]


SINKS_WINDOW = 2048


def make_inputs(batch: int, context: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    width = -(-context // BLOCK_SIZE)
    # Lengths spread over the whole context, so every window start case is hit.
    seq_lens = torch.randint(1, context + 1, (batch,), generator=gen, dtype=torch.int32)
    table = torch.randint(1, 1 << 20, (batch, width), generator=gen, dtype=torch.int32)
    return seq_lens, table


def mrv2_step(window: DraftWindow, bound: torch.Tensor, n: int) -> None:
    window.refresh(n)
    window.host_upper_bound(bound, n, 0)


def window_over(
    seq_lens: torch.Tensor,
    table: torch.Tensor,
    window_size: int = 0,
    block_tables: SimpleNamespace | None = None,
    **plan: int,
) -> DraftWindow:
    """A window over these lengths and one group's table (``block_tables``: a layout of its
    own, such as one DCP rank's), W = SINKS_WINDOW unless given; ``plan``: ``plan_over``'s
    ``sink_tokens`` or ``min_context``."""
    tables = block_tables or SimpleNamespace(block_sizes=[BLOCK_SIZE], input_block_tables=[table])
    lengths = SimpleNamespace(seq_lens=seq_lens)
    return DraftWindow(
        plan_over(window_size or SINKS_WINDOW, tables, [0], **plan),
        lengths,
        tables,
        seq_lens.shape[0],
        torch.device("cpu"),
    )


def step_of(window: DraftWindow, bound: torch.Tensor):
    """One build's window work (``mrv2_step``) over the window's whole batch, as a call."""
    n = bound.shape[0]
    return lambda: mrv2_step(window, bound, n)


def mrv1_step(adapter, seq_lens, table, bound) -> None:
    cam = SimpleNamespace(
        block_table_tensor=table, seq_lens=seq_lens, seq_lens_cpu_upper_bound=bound
    )
    adapter.apply(cam)


def timed(fn, iters: int) -> float:
    """Microseconds per call of ``fn``, over ``iters`` calls (torch.utils.benchmark's Timer,
    on this process's threads)."""
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return timer.timeit(iters).mean * 1e6


def interleaved(fn_a, fn_b, rounds: int, iters: int) -> tuple[float, float]:
    """Median microseconds per call of each, alternating which goes first every round."""
    a, b = [], []
    for r in range(rounds):
        if r % 2:
            b.append(timed(fn_b, iters))
            a.append(timed(fn_a, iters))
        else:
            a.append(timed(fn_a, iters))
            b.append(timed(fn_b, iters))
    return statistics.median(a), statistics.median(b)


@contextlib.contextmanager
def quiet_profiler():
    """The profiler's own lines (its start and stop markers, and torch's note on memory
    allocated before it started) go to the process's standard error from C++, one pair per
    measurement: kept out of the tables."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def allocations(fn) -> tuple[int, int]:
    """(allocations above 8 bytes, their bytes) in one call; smaller ones are Python scalar
    operands wrapped as 0-dim tensors, which on an accelerator stay on the host."""
    fn()
    with (
        quiet_profiler(),
        torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
        ) as prof,
    ):
        fn()
    sizes = [e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 8]
    return len(sizes), sum(sizes)


class LaunchCounter(TorchDispatchMode):
    """Counts the ops that would launch a device kernel: every aten op but views, and but
    ops on host tensors only (``host``: the host bound and its mirror, which stay on the
    host on an accelerator)."""

    def __init__(self, host: tuple[torch.Tensor, ...] = ()) -> None:
        super().__init__()
        self.host = {t.untyped_storage().data_ptr() for t in host}
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        on_host = bool(tensors) and all(
            t.untyped_storage().data_ptr() in self.host or t.dim() == 0 for t in tensors
        )
        if not func.is_view and not on_host:
            self.count += 1
        out = func(*args, **kwargs)
        if on_host:  # host temporaries stay on the host too
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.host.add(t.untyped_storage().data_ptr())
        return out


def launches(fn, host: tuple[torch.Tensor, ...] = ()) -> int:
    fn()  # warm-up: first-call allocations are not per-step launches
    with LaunchCounter(host) as counter:
        fn()
    return counter.count


def markdown_table(heads: list[str], rows: list[list[str]], aligns: str = "") -> list[str]:
    """A markdown table of ``rows`` of cells under ``heads``; ``aligns``: a letter a column,
    ``l`` left-aligned, ``r`` right-aligned (the default for every column not named)."""
    aligns = aligns.ljust(len(heads), "r")
    return [
        "| " + " | ".join(heads) + " |",
        "|" + "".join("---|" if a == "l" else "---:|" for a in aligns),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def measured(rows: list[dict], row: dict, what: str) -> None:
    """A measurement's row, kept in ``rows`` and shown as it is taken: its context and batch,
    then ``what``."""
    rows.append(row)
    print(f"  context {row['context']:>6} batch {row['batch']:>4} {what}", flush=True)


def kib(tokens: int) -> str:
    """A context as the tables name it: ``8k``."""
    return f"{tokens // 1024}k"


def counted(allocations: tuple[int, int]) -> str:
    """Allocations as the tables show them: count / bytes."""
    return f"{allocations[0]} / {allocations[1]}"


def inputs_against_plain(contexts: list[int]):
    """The inputs of a window measured against the plain one at each context and batch
    size: (context, batch, lengths, table, the host bound, the plain window over them)."""
    for context in contexts:
        for batch in BATCH_SIZES:
            seq_lens, table = make_inputs(batch, context)
            yield context, batch, seq_lens, table, seq_lens.clone(), window_over(seq_lens, table)


def listed(values) -> str:
    """Distinct values, in order, as the reports name them: ``2048`` or ``512, 2048``."""
    return ", ".join(str(v) for v in sorted(set(values)))


def windows(rows: list[dict]) -> str:
    """The windows W the rows were measured with."""
    return listed(r["window"] for r in rows)


def verdict(worst: float, goal: float) -> str:
    """ "met" where the worst measured ratio is within the goal, else "not met"."""
    return "met" if worst <= goal else "not met"
