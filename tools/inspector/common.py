# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What the inspector's single-rank (``inspector.py``) and per-rank (``dcp.py``) runs share:
the methods it builds, the reference check's shape, the table title, and the console the
window's start-up lines reach."""

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
    from vllm_ascend.worker.v2.spec_decode.draft_window.log import logger

    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("INFO %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
