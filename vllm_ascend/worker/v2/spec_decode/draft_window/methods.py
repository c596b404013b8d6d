# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Every speculative method the window knows, by vLLM's method name, and how its draft reads
its KV cache: the one table of method names (``release.Release.methods`` says which of them
each release serves, ``release.Release.speculators`` which speculator classes)."""

import enum


class Kind(enum.Enum):
    """How a speculative method's draft reads its KV cache."""

    # One pass of K + 1 query tokens per request over the draft's own KV (DFlash, DSpark and
    # the DFlash family: XPress, DFlash2, LiLiCorr).
    PARALLEL = "parallel"
    # A draft prefill over the target's batch (any query length), then decode steps of one
    # token per request (EAGLE, EAGLE3).
    AUTOREGRESSIVE = "autoregressive"
    # A separate small LM with a KV cache of its own: a prefill over the target's batch and
    # one correction token per request (any query length), built through the draft's own
    # build, then decode steps of one token per request (vLLM's StandaloneARSpeculator).
    DRAFT_MODEL = "draft_model"
    # Multi-token prediction modules: not windowed, with a warning whose reason is the
    # speculator class's (``MTP_REASONS``).
    MTP = "mtp"


# Every speculative method the window knows, by vLLM's method name.
METHODS = {
    "dflash": Kind.PARALLEL,
    "dspark": Kind.PARALLEL,
    "eagle": Kind.AUTOREGRESSIVE,
    "eagle3": Kind.AUTOREGRESSIVE,
    "draft_model": Kind.DRAFT_MODEL,
    "mtp": Kind.MTP,
}

# Why the window leaves an MTP draft alone, by the speculator class vLLM or vllm-ascend makes
# for method "mtp" (design doc, section 4.4); any other class gets ``MTP_REASON``.
MTP_REASON = (
    "its MTP layers keep a KV cache of their own, but an MTP module is trained with its "
    "target over the target's whole context, and the window is not proven for MTP's draft "
    "layouts (vllm-ascend's Model Runner V1 window leaves MTP alone too)"
)
MTP_REASONS = {
    # vLLM 0.33: Gemma4's MTP drafter reads the target's KV cache (KV sharing, queries only).
    "Gemma4Speculator": (
        "its draft layers keep no KV cache of their own: they read the target's (KV "
        "sharing), which the target reads whole, so there is no draft KV to crop"
    ),
    # vLLM 0.33: K MTP modules, each with its own KV, over one metadata build per propose.
    "MultiModuleMTPSpeculator": (
        "its MTP modules each keep a KV cache of their own and all read one metadata build "
        "per propose, each a token behind the previous one, which one window per pass does "
        "not describe"
    ),
}

__all__ = ["METHODS", "MTP_REASON", "MTP_REASONS", "Kind"]
