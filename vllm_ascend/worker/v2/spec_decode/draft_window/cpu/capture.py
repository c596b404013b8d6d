"""A DFlash graph manager stand-in for CPU, shared by the tests of both vLLM lines.

Graphs cannot be captured on CPU: the stand-in runs vLLM's real capture-input preparation
(`_prepare_dflash_inputs_to_capture`) for one graph size and keeps the metadata it built,
which is what a captured graph records.
"""

from typing import Any

import torch
from vllm.v1.worker.gpu.spec_decode.dflash.cudagraph import _prepare_dflash_inputs_to_capture


def capture_on_cpu(speculator: Any, num_reqs: int, query_len: int) -> dict:
    """Give a DFlash speculator the stand-in manager; returns the dict that receives the
    captured metadata (layer name -> metadata)."""
    captured = {}

    class CaptureOnCpu:
        def capture(self, forward_fn, input_buffers, block_tables, attn_groups,
                    kv_cache_config, max_model_len, causal, **kwargs):  # fmt: skip
            state = _prepare_dflash_inputs_to_capture(
                num_reqs, num_reqs * query_len, input_buffers, block_tables, attn_groups,
                kv_cache_config, max_model_len, skip_attn=False, causal=causal,
            )  # fmt: skip
            captured.update(state.attn_metadata)

    speculator.query_cudagraph_manager = CaptureOnCpu()
    speculator.sample_indices = torch.zeros(num_reqs * query_len, dtype=torch.int64)
    speculator.sample_pos = torch.zeros_like(speculator.sample_indices)
    speculator.sample_idx_mapping = torch.zeros_like(speculator.sample_indices)
    speculator._speculator_name = "DFlash"
    return captured
