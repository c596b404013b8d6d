# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What the window knows about each release's draft attention backends and layouts (design
doc, section 4.2): the builders it is proven for, and the reasons it refuses the others by
name. ``releases.py`` names, per release and method, which of these apply.
"""

# vLLM 0.33's draft attention backends the window is proven for: their builders hand the
# kernel the window's device lengths and cropped tables, and take host values as bounds
# only, on every pass of the method. Flash attention, Triton and the MLA decode path are
# driven through their real builds in the tests; FlashInfer (which copies the exact device
# lengths to the host whenever speculative tokens are configured), CPU attention, FlashMLA
# and the FlashInfer and FlashAttention MLA builders do not build on a CPU without their
# kernels' packages and are served from reading their builds, with the path check testing
# the MLA prefill rows at every build.
GQA_0_33 = (
    "FlashAttentionBackend",
    "TritonAttentionBackend",
    "FlashInferBackend",
    "CPUAttentionBackend",
)
# MLA builders whose decode threshold (1 + K, or more) keeps a DFlash/DSpark query pass of
# K + 1 or K tokens per request on the decode path, which reads the device lengths.
MLA_QUERY_PASS_0_33 = (
    "TritonMLABackend",
    "FlashMLABackend",
    "FlashInferMLABackend",
    "FlashAttnMLABackend",
)
# MLA builders that send only rows longer than the threshold to their prefill path (a
# draft prefill's prefilling rows, whose host length the window makes exact).
MLA_VARLEN_0_33 = ("FlashInferMLABackend", "FlashAttnMLABackend")

_SINGLE_ONLY_MLA = (
    "its builder takes single-token queries only, so every draft query of several tokens "
    "goes to its prefill path, which takes the host bound as the exact context length; the "
    "window's host bound is only a bound there"
)
_UNIFORM_MLA_AR = (
    "its builder sends every row from the first query of another length on to its prefill "
    "path, which takes the host bound as the exact context length; an EAGLE draft prefill's "
    "verify rows have only a bound there"
)
NOTES_0_33 = (
    ("CutlassMLABackend", _SINGLE_ONLY_MLA),
    ("CPUMLABackend", _SINGLE_ONLY_MLA),
    ("XPUFlashAttnMLABackend", _SINGLE_ONLY_MLA),
    ("TritonMLABackend", _UNIFORM_MLA_AR),
    ("FlashMLABackend", _UNIFORM_MLA_AR),
    (
        "FlexAttentionBackend",
        "its builder copies the lengths into buffers of its own, which the window's in-place "
        "updates and its path check do not follow",
    ),
)
# vLLM 0.34's new backend (FLASHINFER_TS, for DFlash/DSpark drafts).
NOTES_0_34 = (
    (
        "FlashInferTSBackend",
        "its builder copies the lengths and the block table into buffers of its own at "
        "each build (and crops them again to a sliding window of its own), which the "
        "window's in-place updates and its path check do not follow",
    ),
)

# Per method, why its draft is served on fewer of vLLM 0.33's backends.
METHOD_NOTES_0_33 = (
    (
        "draft_model",
        "vLLM's draft-model prefill hands the builder the target's host bound, one token "
        "short of the expanded prefill (one correction token per request) it reads, and an "
        "MLA builder's prefill path takes that bound as the exact context length; only "
        "builders that take host lengths as bounds are served for it",
    ),
)

# Under DCP an MLA builder without varlen DCP support gets multi-token queries on its prefill
# path (``_init_reorder_batch_threshold``), which takes the host bound as exact.
_DCP_NO_VARLEN = (
    "under decode context parallelism its builder declares no varlen support, so vLLM "
    "sends the draft's queries of several tokens to its prefill path, which takes the host "
    "bound as the exact context length; the window's host bound is only a bound there"
)
# (backend, why, only when cp_kv_cache_interleave_size > 1)
DCP_NOTES_0_33 = (
    ("TritonMLABackend", _DCP_NO_VARLEN, False),
    ("FlashMLABackend", _DCP_NO_VARLEN, False),
    (
        "FlashAttnMLABackend",
        _DCP_NO_VARLEN.replace(
            "declares no varlen support",
            "declares varlen support only with cp_kv_cache_interleave_size=1",
        ),
        True,
    ),
)


# vllm-ascend 0.29.0rc1: its draft builds hand the kernel no per-request host lengths.
_ONE_HOST_LENGTH_029 = (
    "its builder hands the kernel one host length for every request of a draft build (the "
    "batch's draft_max_seq_len), which it takes as exact; no per-request window can be set "
    "there"
)
NOTES_ASCEND_0_29 = (("AscendMLABackend", _ONE_HOST_LENGTH_029),)
DCP_UNSERVED_ASCEND_0_29 = (
    "vllm-ascend 0.29.0rc1's drafts have no decode-context-parallel path (no draft DCP "
    "manager: its DCP builders split one batch-wide host length per rank)"
)

# vLLM 0.34's layouts the window does not serve, read from the VllmConfig at start-up:
# (attribute path, the layout, why, the fix).
UNSERVED_CONFIG_0_34 = (
    (
        "parallel_config.use_ubatching",
        "with dual-batch overlap (micro-batching)",
        "the target's forward builds metadata per micro-batch, so the draft prefill rebuilds "
        "its own from the full block tables, a path the window is not proven on",
        "Disable dual-batch overlap",
    ),
)
