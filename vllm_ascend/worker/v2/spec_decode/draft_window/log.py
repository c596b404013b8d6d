# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The draft window's logger: a child of vLLM's "vllm" logger, so its lines reach the handler
vLLM configures (``vllm.logger.init_logger`` returns the same object)."""

import logging

logger = logging.getLogger("vllm.draft_window")
