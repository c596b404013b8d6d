# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The speculative methods the window knows, and how each draft reads its KV cache."""

import enum


class Kind(enum.Enum):
    # One pass of K + 1 query tokens per request (DFlash, DSpark).
    PARALLEL = "parallel"
    # A draft prefill over the target's batch, then one-token decode steps (EAGLE).
    AUTOREGRESSIVE = "autoregressive"
    # A separate draft model: a prefill, then one-token decode steps.
    DRAFT_MODEL = "draft_model"
    # Not windowed (MTP_REASONS).
    MTP = "mtp"


METHODS = {
    "dflash": Kind.PARALLEL,
    "dspark": Kind.PARALLEL,
    "eagle": Kind.AUTOREGRESSIVE,
    "eagle3": Kind.AUTOREGRESSIVE,
    "draft_model": Kind.DRAFT_MODEL,
    "mtp": Kind.MTP,
}

# Why an MTP draft is not windowed, by speculator class; other classes get MTP_REASON.
MTP_REASON = (
    "its MTP layers keep a KV cache of their own, but an MTP module is trained with its "
    "target over the target's whole context, and the window is not proven for MTP's draft "
    "layouts (vllm-ascend's Model Runner V1 window leaves MTP alone too)"
)
MTP_REASONS = {
    "Gemma4Speculator": (
        "its draft layers keep no KV cache of their own: they read the target's (KV "
        "sharing), which the target reads whole, so there is no draft KV to crop"
    ),
    "MultiModuleMTPSpeculator": (
        "its MTP modules each keep a KV cache of their own and all read one metadata build "
        "per propose, each a token behind the previous one, which one window per pass does "
        "not describe"
    ),
}

__all__ = ["METHODS", "MTP_REASON", "MTP_REASONS", "Kind"]
