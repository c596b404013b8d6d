# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What the inspector's single-rank (``inspector.py``) and per-rank (``dcp.py``) runs share:
the methods it builds, the reference check's shape, the table title and its fixed-width
table (the served study's too, ``served.py``), and the console the window's start-up lines
reach."""

from __future__ import annotations

import logging
import os
import sys

from vllm_ascend.worker.v2.spec_decode.draft_window.config import KEY, MIN_CONTEXT_KEY, SINKS_KEY
from vllm_ascend.worker.v2.spec_decode.draft_window.methods import METHODS as KINDS
from vllm_ascend.worker.v2.spec_decode.draft_window.methods import Kind

# The methods the window serves somewhere, from the package's one table (MTP is left alone).
METHODS = tuple(m for m, kind in KINDS.items() if kind is not Kind.MTP)
DEFAULT_METHODS = ["dspark", "eagle3"]
# The reference check's head shape: small, since it checks positions, not numerics.
CHECK_HEADS, CHECK_HEAD_DIM = 1, 8


def is_parallel(method: str) -> bool:
    """DFlash/DSpark: one query pass of K + 1 tokens per request (else an EAGLE decode step)."""
    return KINDS[method] is Kind.PARALLEL


def query_len(method: str, num_spec_tokens: int) -> int:
    """The query tokens per request of the pass the inspector builds: DFlash/DSpark seq_lens
    count the whole query stretch; an EAGLE or draft-model decode step, one token."""
    return num_spec_tokens + 1 if is_parallel(method) else 1


def title(method: str, args, rows: list[dict]) -> str:
    """A method's table title: what was built and the window's settings as applied."""
    what = "its query pass" if is_parallel(method) else "its first draft decode step"
    sinks = rows[0]["sinks"]
    with_sinks = f", attention sinks {sinks} ({SINKS_KEY}={args.sinks})" if sinks else ""
    if rows[0]["min_context"]:
        with_sinks += f", engaged from a context of {rows[0]['min_context']} ({MIN_CONTEXT_KEY})"
    elif args.min_context:
        with_sinks += f" ({MIN_CONTEXT_KEY}={args.min_context} changes nothing)"
    return (
        f"\n{method} ({what}): {KEY}={args.window}{with_sinks}, block sizes "
        f"{args.block_sizes}, alignment {rows[0]['alignment']}, {args.num_spec_tokens} "
        f"speculative tokens"
    )


def draft_metadata(speculator, batch, n: int, query: int):
    """The speculator's draft metadata over ``batch``'s first ``n`` requests, ``query``
    tokens each, as an eager propose builds it (``_build_uniform_attn_metadata``)."""
    import torch
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor

    desc = BatchExecutionDescriptor(cg_mode=CUDAGraphMode.NONE, num_tokens=n * query, num_reqs=None)
    return speculator._build_uniform_attn_metadata(
        batch_desc=desc,
        num_reqs=n,
        num_query_per_req=query,
        seq_lens_cpu_upper_bound=torch.tensor(batch.seq_lens - query, dtype=torch.int32),
        step=query,
    )


def text_table(
    columns: list[tuple[str, int]],
    rows: list[list[str]],
    groups: tuple[tuple[str, int], ...] = (),
) -> list[str]:
    """A table of fixed-width columns (each a heading and its width), every cell
    right-aligned, one space apart, the header underlined; ``groups``: headings centred
    over runs of columns (each a heading and how many columns it spans), in order."""
    widths = [width for _, width in columns]

    def line(cells: list[str]) -> str:
        return " ".join(f"{cell:>{width}}" for cell, width in zip(cells, widths, strict=True))

    lines, first = [], 0
    if groups:
        spans = []
        for heading, count in groups:
            spans.append(f"{heading:^{sum(widths[first : first + count]) + count - 1}}")
            first += count
        lines.append(" ".join(spans).rstrip())
    header = line([heading for heading, _ in columns])
    return [*lines, header, "-" * len(header), *(line(row) for row in rows)]


# The columns of a request in the inspector's tables: what the window reads of it, then
# (``kv_columns``) its blocks, its KV and the checks.
REQUEST_COLUMNS = [("context", 8), ("seq_len", 8), ("engaged", 7), ("start", 8), ("windowed", 8)]


def request_cells(row: dict) -> list[str]:
    """A request's cells of ``REQUEST_COLUMNS``."""
    engaged = "yes" if row["engaged"] else "no"
    return [
        str(row["context"]),
        str(row["seq_len"]),
        engaged,
        str(row["start"]),
        str(row["windowed"]),
    ]


def kv_columns(blocks: str, kv: str) -> list[tuple[str, int]]:
    """The columns of ``kv_cells``, the first two headed ``blocks`` and ``kv``."""
    return [(blocks, 13), (kv, 20), ("reduction", 9), ("checks", 6)]


def kv_cells(row: dict) -> list[str]:
    """A request's blocks, KV MiB read (both against the whole context's), the reduction
    and its checks, as the inspector's tables show them."""
    mib = 1 << 20
    reduction = row["full_kv_bytes"] / row["kv_bytes"] if row["kv_bytes"] else 1.0
    return [
        f"{row['blocks']:>6}/{row['full_blocks']:<6}",
        f"{row['kv_bytes'] / mib:>9.2f}/{row['full_kv_bytes'] / mib:<10.2f}",
        f"{reduction:>8.1f}x",
        "ok" if row["ok"] else "FAILED",
    ]


def quiet_vllm() -> None:
    """Before vLLM's first import (the command line's): vLLM's own warnings about this
    CPU-only host (no ``vllm._C``, no pinned memory, the CPU platform's cache dtype) say
    nothing a user of the inspector can act on, so vLLM logs errors only, unless
    ``VLLM_LOGGING_LEVEL`` says otherwise. (Outside a server entry point vLLM configures
    no handler of its own: its warnings would reach Python's last-resort handler.)"""
    level = os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    logging.getLogger("vllm").setLevel(level.upper())


def show_window_lines() -> None:
    """The window's start-up lines, which a server prints through vLLM's logging, each on a
    line of its own (no progress bar redraws over them: a log keeps them whole)."""
    # The core logs through vLLM's logger: its lines, and vLLM's only as quiet_vllm lets them.
    logger = logging.getLogger("vllm")
    if not any(isinstance(h, _WindowLines) for h in logger.handlers):
        handler = _WindowLines(sys.stderr)
        handler.setFormatter(logging.Formatter("INFO %(message)s"))
        handler.addFilter(lambda record: record.levelno >= logging.INFO and window_record(record))
        logger.addHandler(handler)
        logger.setLevel(min(logger.getEffectiveLevel(), logging.INFO))


class _WindowLines(logging.StreamHandler):
    """The handler of the window's start-up lines."""


def window_record(record: logging.LogRecord) -> bool:
    """Whether ``record`` is the window's: the plugin's logger, or a module of the package."""
    return record.name == "vllm.draft_window" or f"{os.sep}draft_window{os.sep}" in record.pathname
