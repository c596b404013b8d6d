# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Draft KV sliding window for vLLM Model Runner V2 speculators.

With ``additional_config={"draft_window_size": W}`` the draft model attends only to the
last W tokens of each request (start aligned down to a block), while the target keeps full
attention and the draft's KV writes stay at absolute positions. ``draft_attention_sinks``
(S) also keeps the first S tokens of each request (rounded up to the block alignment).

The package imports nothing at load: vLLM loads its plugin (``plugin.register``) in every
process, and the arithmetic is ``window.py``.
"""
