# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The draft window's logger, a child of vLLM's "vllm" logger."""

import logging

logger = logging.getLogger("vllm.draft_window")
