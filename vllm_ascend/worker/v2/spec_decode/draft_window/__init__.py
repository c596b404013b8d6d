# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Draft KV sliding window for Model Runner V2 speculators.

With ``additional_config={"draft_window_size": W}`` the draft attends only to the last W
tokens of each request (start aligned down to a block); the target keeps full attention.
"""
