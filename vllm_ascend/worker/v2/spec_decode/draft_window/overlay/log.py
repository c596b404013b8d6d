# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The plugin's own logger, a child of vLLM's "vllm" logger (the core logs through vLLM's)."""

import logging
import os

logger = logging.getLogger("vllm.draft_window")


def is_window_record(record: logging.LogRecord) -> bool:
    """Whether ``record`` is the window's: the plugin's logger, or a module of the package."""
    return record.name == logger.name or f"{os.sep}draft_window{os.sep}" in record.pathname
