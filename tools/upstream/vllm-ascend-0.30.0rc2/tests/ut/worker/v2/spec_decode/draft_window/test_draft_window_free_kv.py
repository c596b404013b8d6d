# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Unit tests for ``draft_window_free_kv`` (vLLM frees the draft's KV before the window; this
release's ``AscendConfig`` declares it and the window refuses it): the key validated, refused
on this release, and only the draft layers it converted windowed as freed."""

from types import SimpleNamespace

import pytest
import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

from tests.ut.worker.v2.spec_decode.draft_window.test_draft_window import (
    _host_block_tables,  # noqa: F401
    _vllm_config,
)
from vllm_ascend.worker.v2.spec_decode.draft_window import policy
from vllm_ascend.worker.v2.spec_decode.draft_window.config import DraftWindowConfig
from vllm_ascend.worker.v2.spec_decode.draft_window.groups import Freed, decide_groups
from vllm_ascend.worker.v2.spec_decode.draft_window.release import VLLM_0_30_ASCEND


@pytest.mark.parametrize("value", ["yes", 1])
def test_free_kv_takes_a_boolean(value):
    with pytest.raises(ValueError, match=r"draft_window_free_kv.*must be true or false"):
        DraftWindowConfig.from_additional_config({"draft_window_size": 64, "draft_window_free_kv": value})


def test_free_kv_needs_the_window():
    with pytest.raises(ValueError, match=r'needs additional_config\["draft_window_size"\]'):
        DraftWindowConfig.from_additional_config({"draft_window_free_kv": True})


def test_free_kv_is_refused_on_this_release():
    additional = {"draft_window_size": 64, "draft_window_free_kv": True}
    config = DraftWindowConfig.from_additional_config(additional)
    vllm_config = _vllm_config(additional, speculative=True)

    with pytest.raises(ValueError, match=r"draft_window_free_kv=true cannot be served on vLLM 0\.30"):
        policy.check_start_up(vllm_config, config, VLLM_0_30_ASCEND, model_runner_v2=True)


def _group(layer_names, sliding_window):
    shape = dict(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float32)
    if sliding_window:
        spec = SlidingWindowSpec(**shape, sliding_window=66)
    else:
        spec = FullAttentionSpec(**shape)
    return SimpleNamespace(layer_names=layer_names, kv_cache_spec=spec)


def test_only_the_draft_layers_the_key_converted_are_windowed_as_freed():
    freed = Freed(tokens=66, layers=frozenset({"draft.0"}))
    groups = [_group(["draft.0"], True), _group(["target.1"], True), _group(["draft.1"], False)]
    kv_cache_config = SimpleNamespace(kv_cache_groups=groups)

    decisions = decide_groups(kv_cache_config, [[object()]] * 3, freed)

    assert [d.windowed for d in decisions] == [True, False, True]
    assert "freed" in decisions[0].reason
    # A target layer of the same sliding window grouped with a converted draft layer.
    mixed = SimpleNamespace(kv_cache_groups=[_group(["draft.0", "target.1"], True)])
    with pytest.raises(ValueError, match="grouped the draft layers it converted"):
        decide_groups(mixed, [[object()]], freed)
