# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Where the Ascend releases' speculators differ in how a test drives them, one function per
difference, each choosing by what the installed release has (as vllm-ascend's own
``compat.py`` checks what vLLM has). What differs in what they do is in ``releases.py``."""

import inspect
from typing import Any

from vllm.config.compilation import CUDAGraphMode
from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor


def prepare_dflash_inputs(kv_cache_block_size: int):
    """The DFlash/DSpark input kernel the release runs: vllm-ascend 0.30's own, or vLLM 0.29's
    (whose Triton kernel vllm-ascend's worker patch swaps for its own: run here too)."""
    import functools

    try:
        from vllm_ascend.worker.v2.spec_decode.dflash.speculator import prepare_dflash_inputs
    except ImportError:
        import vllm.v1.worker.gpu.spec_decode.dflash.speculator as dflash

        from vllm_ascend.worker.v2.spec_decode.dflash.speculator import (
            _prepare_dflash_inputs_kernel_ascend,
        )

        dflash._prepare_dflash_inputs_kernel = _prepare_dflash_inputs_kernel_ascend
        return dflash.prepare_dflash_inputs
    return functools.partial(prepare_dflash_inputs, kv_cache_block_size=kv_cache_block_size)


def draft_build(
    s: Any,
    num_reqs: int,
    num_reqs_padded: int | None,
    num_tokens_padded: int,
    seq_lens_cpu_upper_bound: Any,
    step: int,
    num_query_per_req: int | None = None,
    cg_mode: CUDAGraphMode = CUDAGraphMode.NONE,
    **kwargs: Any,
) -> Any:
    """One draft build as vLLM's speculator runs it: ``_build_uniform_attn_metadata`` with a
    batch descriptor (vLLM 0.30), or ``_build_draft_attn_metadata`` with the padded counts
    (0.29: DFlash passes its own query stretch, EAGLE one token). ``num_reqs_padded`` None:
    eager."""
    if hasattr(s, "_build_uniform_attn_metadata"):
        desc = BatchExecutionDescriptor(
            cg_mode=cg_mode, num_tokens=num_tokens_padded, num_reqs=num_reqs_padded
        )
        return s._build_uniform_attn_metadata(
            num_reqs=num_reqs,
            batch_desc=desc,
            num_query_per_req=num_query_per_req or 1,
            seq_lens_cpu_upper_bound=seq_lens_cpu_upper_bound,
            step=step,
            **kwargs,
        )
    return s._build_draft_attn_metadata(
        num_reqs=num_reqs,
        num_reqs_padded=num_reqs_padded or num_reqs,
        num_tokens_padded=num_tokens_padded,
        seq_lens_cpu_upper_bound=seq_lens_cpu_upper_bound,
        step=step,
        **kwargs,
    )


def fia_params_before_replay(s: Any, num_reqs_padded: int) -> tuple[list | None, list]:
    """What vllm-ascend hands an EAGLE FULL ACL graph replay, made before it: the per-step
    metadata it builds first (0.30: once, at step 1; 0.29 builds none) and each step's FIA
    parameters."""
    from vllm_ascend.worker.v2.attn_utils import build_attn_metadata_wrapper

    if "draft_attn_metadata" not in inspect.signature(s.build_fia_params).parameters:
        return None, s.build_fia_params(num_reqs_padded, False)
    with build_attn_metadata_wrapper():
        metadatas = s.build_draft_attn_metadatas(num_reqs_padded, num_reqs_padded, False)
    return metadatas, s.build_fia_params(num_reqs_padded, metadatas[0], False)


def without_piecewise(mode: CUDAGraphMode) -> CUDAGraphMode:
    """The mode's graphs but PIECEWISE ones, as vLLM 0.30's ``without_piecewise`` gives them
    (vLLM 0.29's ``CUDAGraphMode`` has no such method)."""
    if hasattr(mode, "without_piecewise"):
        return mode.without_piecewise()
    if mode == CUDAGraphMode.PIECEWISE:
        return CUDAGraphMode.NONE
    if mode == CUDAGraphMode.FULL_AND_PIECEWISE:
        return CUDAGraphMode.FULL_DECODE_ONLY
    return mode
