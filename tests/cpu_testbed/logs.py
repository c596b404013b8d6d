# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What a logger emits while a test runs, in both test environments."""

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def recorded(
    name: str, level: int, keep: Callable[[logging.LogRecord], Any] = lambda record: record
) -> Iterator[list]:
    """``keep(record)`` of every record logger ``name`` emits at ``level`` and above."""
    records: list = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(keep(record))
    logger = logging.getLogger(name)
    saved = logger.level
    # setLevel, not the attribute: it also clears the loggers' cached isEnabledFor answers.
    logger.setLevel(level)
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)
