# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The plugin's own logger, a child of vLLM's "vllm" logger (the core logs through vLLM's)."""

import logging

logger = logging.getLogger("vllm.draft_window")
