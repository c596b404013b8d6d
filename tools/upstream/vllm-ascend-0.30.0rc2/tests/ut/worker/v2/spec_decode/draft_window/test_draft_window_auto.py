# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Unit tests for ``draft_window_size: "auto"``: accepted by ``init_ascend_config`` on Model Runner V2 with a
readable draft checkpoint, and sized so that the window's reads stay within the context the checkpoint declares.
"""

import json
from types import SimpleNamespace

import pytest
import torch

from tests.ut.worker.v2.spec_decode.draft_window.test_draft_window import (  # noqa: F401
    _clean_ascend_config,
    _vllm_config,
)
from vllm_ascend.ascend_config import clear_ascend_config, init_ascend_config
from vllm_ascend.worker.v2.spec_decode.draft_window.declared import (
    auto_window_size,
    declared_context,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.window import WindowSpec, window_seq_lens


@pytest.mark.usefixtures("_clean_ascend_config")
def test_ascend_config_accepts_auto_for_the_window_size():
    config = init_ascend_config(_vllm_config({"draft_window_size": "auto"}))

    assert config.draft_window_size == "auto"


@pytest.mark.usefixtures("_clean_ascend_config")
@pytest.mark.parametrize("v2", [False, True])
def test_auto_needs_model_runner_v2_and_a_readable_draft_checkpoint(monkeypatch, tmp_path, v2):
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 2048}')
    config = _vllm_config({"draft_window_size": "auto"}, speculative=True)
    draft = SimpleNamespace(model=str(tmp_path), hf_config_path=None, revision=None)
    config.speculative_config.draft_model_config = draft
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1" if v2 else "0")

    if v2:
        assert init_ascend_config(config).draft_window_size == "auto"
        (tmp_path / "config.json").unlink()
        clear_ascend_config()
        with pytest.raises(ValueError, match=r"no config\.json found for the draft checkpoint"):
            init_ascend_config(config)
    else:
        with pytest.raises(ValueError, match="VLLM_USE_V2_MODEL_RUNNER"):
            init_ascend_config(config)


@pytest.mark.parametrize("context,alignment", [(2048, 128), (64, 32), (4096, 16)])
def test_auto_window_reads_stay_within_the_declared_context(tmp_path, context, alignment):
    """W = C - a + 1 is the largest window whose reads stay within the checkpoint's C."""
    layer = {"max_position_embeddings": context}
    (tmp_path / "config.json").write_text(json.dumps({"transformer_layer_config": layer}))
    draft = SimpleNamespace(model=str(tmp_path), hf_config_path=None, revision=None)
    config = SimpleNamespace(speculative_config=SimpleNamespace(draft_model_config=draft))
    declared = declared_context(config)
    window_size = auto_window_size(declared.tokens, alignment)
    lengths = torch.arange(0, 4 * context, dtype=torch.int32)

    def reads(size):
        out, skip = torch.empty_like(lengths), torch.empty_like(lengths)
        window_seq_lens(lengths, WindowSpec(size, alignment), skip_out=skip, out=out)
        return int(out.max())

    assert declared.field == "transformer_layer_config.max_position_embeddings"
    assert reads(window_size) == context
    assert reads(window_size + 1) > context
