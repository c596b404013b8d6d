# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Every speculative method the window knows, by vLLM's method name, and how its draft reads
its KV cache: the one table of method names (``release.Release.methods`` says which of them
each release serves)."""

import enum


class Kind(enum.Enum):
    """How a speculative method's draft reads its KV cache."""

    # One pass of K + 1 query tokens per request over the draft's own KV (DFlash, DSpark).
    PARALLEL = "parallel"
    # A draft prefill over the target's batch (any query length), then decode steps of one
    # token per request (EAGLE, EAGLE3).
    AUTOREGRESSIVE = "autoregressive"
    # Draft layers that read the target's own KV cache: a draft-only window does not apply.
    SHARED_KV = "shared_kv"


# Every speculative method the window knows, by vLLM's method name.
METHODS = {
    "dflash": Kind.PARALLEL,
    "dspark": Kind.PARALLEL,
    "eagle": Kind.AUTOREGRESSIVE,
    "eagle3": Kind.AUTOREGRESSIVE,
    "mtp": Kind.SHARED_KV,
}

__all__ = ["METHODS", "Kind"]
