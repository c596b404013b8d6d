# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What a logger emits while a test runs, in both test environments."""

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# The window's lines: the core logs through vLLM's logger ("vllm"), the plugin through its own.
WINDOW = "vllm.draft_window"


def is_window_record(record: logging.LogRecord) -> bool:
    """Whether ``record`` is the window's: the plugin's logger, or a module of the package."""
    return record.name == WINDOW or f"{os.sep}draft_window{os.sep}" in record.pathname


@contextmanager
def recorded(
    name: str, level: int, keep: Callable[[logging.LogRecord], Any] = lambda record: record
) -> Iterator[list]:
    """``keep(record)`` of every record logger ``name`` emits at ``level`` and above (for
    ``WINDOW``: the window's records on vLLM's logger)."""
    records: list = []
    handler = logging.Handler()
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
