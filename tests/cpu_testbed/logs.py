# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What a logger emits while a test runs, in both test environments."""

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# The window's lines: the core logs through vLLM's logger ("vllm"), the plugin through its own.
WINDOW = "vllm.draft_window"


@contextmanager
def recorded(
    name: str, level: int, keep: Callable[[logging.LogRecord], Any] = lambda record: record
) -> Iterator[list]:
    """``keep(record)`` of every record logger ``name`` emits at ``level`` and above (for
    ``WINDOW``: the window's records on vLLM's logger)."""
    records: list = []
    handler = logging.Handler()
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.log import is_window_record

    window = name == WINDOW
    handler.emit = lambda record: (
        records.append(keep(record)) if not window or is_window_record(record) else None
    )
    logger = logging.getLogger("vllm" if window else name)
    saved = logger.level
    # setLevel, not the attribute: it also clears the loggers' cached isEnabledFor answers.
    logger.setLevel(level)
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)
