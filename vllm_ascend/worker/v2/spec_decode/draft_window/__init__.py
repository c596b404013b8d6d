# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Draft KV sliding window for Model Runner V2 speculators: with ``draft_window_size: W``
the draft attends to the last W tokens (start aligned to a block); the target to all."""
