# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Real vLLM 0.33.0 speculators on CPU, wired to real attention groups.

A speculator normally needs a loaded draft model and registered attention layers; here it
is made with `object.__new__` and given the state its attention path reads. The builders
are vLLM's real `TritonAttentionMetadataBuilder` (its `build` is plain Python and runs on
CPU), made from a VllmConfig of a tiny model config written locally.
"""

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import vllm.v1.worker.gpu.spec_decode.speculator as speculator_module
from vllm.config import VllmConfig
from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.worker.gpu.attn_utils import get_attn_cg_support
from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator
from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator
from vllm.v1.worker.gpu.spec_decode.eagle.speculator import EagleSpeculator
from vllm.v1.worker.gpu.spec_decode.mtp.speculator import MTPSpeculator
from vllm.v1.worker.utils import AttentionGroup

from testbed.buffers import CPU, Mrv2Batch
from testbed.configs import speculative_vllm_config, tiny_model_config
from testbed.tiny_models import HEAD_SIZE, NUM_KV_HEADS, TINY_LLAMA, write_model_dir


def tiny_model_dir(root: Path, max_position_embeddings: int = 8192) -> Path:
    """A tiny Llama config (no weights): enough for vLLM's configs and builders."""
    return write_model_dir(root, TINY_LLAMA, max_position_embeddings=max_position_embeddings)


def make_vllm_config(
    model_dir: Path, max_model_len: int, max_num_seqs: int, additional_config: dict | None
) -> VllmConfig:
    model_config = tiny_model_config(model_dir, max_model_len)
    config = VllmConfig(model_config=model_config, additional_config=additional_config or {})
    config.scheduler_config.max_num_seqs = max_num_seqs
    return config


def make_speculative_vllm_config(
    model_dir: Path, additional_config: dict | None, max_model_len: int = 512, method="eagle3"
) -> VllmConfig:
    """A real VllmConfig with a speculative config (the tiny model drafts for itself, as
    EAGLE3 by default): what the engine builds at start-up, ``__post_init__`` included."""
    return speculative_vllm_config(model_dir, max_model_len, 2, method, additional_config)


@dataclass
class GroupLayout:
    """One KV-cache group: its manager block size, whether the draft reads it, the smaller
    kernel block size its backend uses (None: the same), its KV-cache spec (None: full
    attention of ``block_size``-token blocks; a ``UniformTypeKVCacheSpecs`` gives its first
    member to the attention group), its attention backend (None: vLLM's Triton), and whether
    the window serves a spec of another class (None: only full attention and plain MLA)."""

    block_size: int
    draft: bool = True
    kernel_block_size: int | None = None
    spec: Any = None
    backend: Any = None
    windowed: bool | None = None

    @property
    def full_attention(self) -> bool:
        """Whether the window serves it: full attention, or plain MLA."""
        if self.windowed is not None:
            return self.windowed
        return self.spec is None or type(self.spec).__name__ == "MLAAttentionSpec"


def full_attention_spec(block_size: int) -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=block_size,
        num_kv_heads=NUM_KV_HEADS,
        head_size=HEAD_SIZE,
        dtype=torch.float32,
    )


@dataclass
class Wired:
    speculator: Any
    batch: Mrv2Batch
    attn_groups: list[list[AttentionGroup]]
    # group id -> CommonAttentionMetadata each call handed to that group's builder
    received: dict[int, list[Any]] = field(default_factory=dict)


def _attention_groups(
    layouts: list[GroupLayout], vllm_config: VllmConfig, record: bool
) -> tuple[list[list[AttentionGroup]], list[KVCacheGroupSpec], dict[int, list]]:
    """One KV-cache group per layout, with vLLM's real metadata builders for the draft's;
    what each draft group's builders receive (``record``), by group."""
    attn_groups, groups_spec, received = [], [], {}
    for g, layout in enumerate(layouts):
        spec = layout.spec or full_attention_spec(layout.block_size)
        names = [f"{'draft' if layout.draft else 'target'}.{g}"]
        groups_spec.append(KVCacheGroupSpec(layer_names=names, kv_cache_spec=spec))
        if not layout.draft:
            attn_groups.append([])
            continue
        layer_spec = (
            next(iter(spec.kv_cache_specs.values()), spec)
            if hasattr(spec, "kv_cache_specs")
            else spec
        )
        group = AttentionGroup(layout.backend or TritonAttentionBackend, names, layer_spec, g)
        group.create_metadata_builders(vllm_config, CPU, layout.kernel_block_size)
        assert group.kernel_block_size == layout.kernel_block_size
        if record:
            _record_builds(group, received.setdefault(g, []))
        attn_groups.append([group])
    return attn_groups, groups_spec, received


def wire_speculator(
    cls: type,
    batch: Mrv2Batch,
    layouts: list[GroupLayout],
    vllm_config: VllmConfig,
    method: str,
    num_speculative_steps: int,
    dcp_size: int = 1,
    draft_input_buffers: Any = None,
    model_state: Any = None,
    record: bool = True,
) -> Wired:
    """A real `cls` instance whose real `set_attn` attaches real attention groups.

    DFlash drafts read the batch's buffers as their own; an EAGLE draft has its own
    `draft_input_buffers` and reads the batch's as the target's.
    """
    attn_groups, groups_spec, received = _attention_groups(layouts, vllm_config, record)
    kv_cache_config = KVCacheConfig(num_blocks=1, kv_cache_tensors=[], kv_cache_groups=groups_spec)

    s = object.__new__(cls)
    s.vllm_config = vllm_config
    s.speculative_config = vllm_config.speculative_config or _no_draft_overrides()
    # As __init__ sets it from the speculative config (off by default); vLLM 0.34's EAGLE
    # graph managers read it.
    s.enable_adaptive_verification = bool(
        getattr(s.speculative_config, "enable_adaptive_verification", False)
    )
    s.method = method
    s.device = CPU
    s.num_speculative_steps = num_speculative_steps
    if issubclass(cls, DFlashSpeculator):
        s.num_query_per_req = num_speculative_steps + 1
    s.max_num_reqs = batch.block_tables.max_num_reqs
    s.max_num_tokens = batch.block_tables.max_num_batched_tokens
    s.dcp_size = dcp_size
    s.draft_max_seq_len = vllm_config.model_config.max_model_len
    s.input_buffers = draft_input_buffers or batch.input_buffers
    s.arange_np = np.arange(s.max_num_reqs + 1, dtype=np.int32)
    s.draft_is_prefilling = torch.zeros(s.max_num_reqs, dtype=torch.bool)
    s.draft_attn_layer_names = {n for gs in groups_spec for n in gs.layer_names if "draft" in n}
    s.requires_non_causal = False
    # No draft weights on CPU: set_attn only asks the model for optional layer maps.
    s.model = object()
    # init_attn_backend needs the model's attention layers registered in the config;
    # set_attn gets the groups built above instead (with vLLM's own graph-support answer for
    # them), for this call only.
    cg_support = get_attn_cg_support(attn_groups, vllm_config)
    real_init_attn_backend = speculator_module.init_attn_backend
    speculator_module.init_attn_backend = lambda *args, **kwargs: (attn_groups, cg_support, None)
    try:
        s.set_attn(model_state, kv_cache_config, batch.block_tables, batch.input_buffers, None)
    finally:
        speculator_module.init_attn_backend = real_init_attn_backend
    return Wired(s, batch, attn_groups, received)


def _no_draft_overrides() -> Any:
    """The speculative config of a tiny config that has none: vLLM 0.34's
    ``attn_vllm_config`` applies the draft's overrides of the target's settings
    (``_DRAFT_VLLM_CONFIG_OVERRIDES``), none of which such a draft sets; vLLM 0.33 reads no
    speculative config on the build path."""
    from types import SimpleNamespace

    import vllm.config.speculative as speculative

    overrides = getattr(speculative, "_DRAFT_VLLM_CONFIG_OVERRIDES", ())
    return SimpleNamespace(**{name: None for name, _, _ in overrides}) if overrides else None


def _record_builds(group: AttentionGroup, log: list[Any]) -> None:
    """Record what the real builder receives, then let it build."""
    for builder in group.metadata_builders:
        for name in ("build", "build_for_cudagraph_capture"):
            real = getattr(builder, name)

            def recording(*args, _real=real, **kwargs):
                cam = kwargs.get("common_attn_metadata", args[-1] if args else None)
                log.append(cam)
                return _real(*args, **kwargs)

            setattr(builder, name, recording)


SPECULATOR_CLASSES = {
    "dflash": DFlashSpeculator,
    "dspark": DSparkSpeculator,
    "eagle": EagleSpeculator,
    "eagle3": EagleSpeculator,
    "mtp": MTPSpeculator,
}
if importlib.util.find_spec("vllm.v1.worker.gpu.spec_decode.standalone_ar"):
    # vLLM 0.33's draft-model speculator (the Ascend releases' vLLM has none).
    from vllm.v1.worker.gpu.spec_decode.standalone_ar.speculator import StandaloneARSpeculator

    SPECULATOR_CLASSES["draft_model"] = StandaloneARSpeculator


def propose_after_verify(
    speculator: Any,
    input_batch: Any,
    attn_metadata: dict,
    slot_mappings: dict,
    num_rejected: torch.Tensor,
) -> None:
    """The speculator's own ``propose`` after a target verify step of ``num_speculative_steps
    + 1`` tokens per request, ``num_rejected`` of them rejected (greedy; zero hidden states
    stand in for the target model's)."""
    from vllm.config import set_current_vllm_config

    n, m = len(num_rejected), speculator.max_num_reqs
    hidden = torch.zeros(input_batch.num_tokens, speculator.hidden_size)
    q = torch.full((n,), speculator.num_speculative_steps + 1, dtype=torch.int32)
    zeros = torch.zeros(m, dtype=torch.int64)
    with set_current_vllm_config(speculator.vllm_config):
        speculator.propose(
            input_batch,
            attn_metadata,
            slot_mappings,
            hidden,
            [hidden, hidden, hidden],
            q - num_rejected,
            num_rejected,
            zeros,
            zeros,
            torch.zeros(m),
            zeros,
        )
