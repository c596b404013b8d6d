# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""``draft_window_size: "auto"`` on the Ascend pairing, in both forms: vllm-ascend's strict
``AscendConfig`` (``draft_window_size: int | None``, ``extra="forbid"``) takes it through the
plugin (as None: that field feeds only vllm-ascend's Model Runner V1 window), the upstream
patch's widened field takes it as it is, Model Runner V1 stops on it with the fix, and
vllm-ascend's own speculators size the window from the draft checkpoint's config.json.

On vLLM 0.29 and 0.30 only an EAGLE draft's ``max_position_embeddings`` is raised to the
target's ``max_model_len`` at start-up; a DFlash or DSpark draft keeps what it declares. The
window reads the checkpoint's file either way.
"""

import re

import pytest
from vllm.config.compilation import CUDAGraphMode

from testbed.configs import speculative_vllm_config
from testbed.tiny_models import DRAFT_LAYOUTS, write_draft_dir
from tests.ascend.npu_testbed.npu_startup import BLOCK, MAX_MODEL_LEN, started
from tests.ascend.npu_testbed.pairing import IN_TREE, ascend_config, speculative_config
from tests.cpu_testbed.logs import recorded
from vllm_ascend.worker.v2.spec_decode.draft_window.declared import declared_context

AUTO = {"draft_window_size": "auto"}
AUTO_ON_V1 = (
    "draft_window_size=auto needs Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER=1): vllm-ascend's "
    "Model Runner V1 draft window takes a number of tokens. Set VLLM_USE_V2_MODEL_RUNNER=1 or "
    "set draft_window_size to the drafter's training context in tokens."
)


@pytest.mark.parametrize(
    "additional_config",
    [AUTO, {**AUTO, "draft_attention_sinks": 64, "draft_window_min_context": 8192}],
)
def test_vllm_ascends_strict_ascend_config_passes_auto(registered, model_dir, additional_config):
    """Through the plugin "auto" reaches AscendConfig as None; in the tree form the widened
    field (``int | Literal["auto"] | None``) keeps it."""
    config = ascend_config(model_dir, additional_config)
    assert config.draft_window_size == ("auto" if IN_TREE else None)


@pytest.mark.parametrize("value", ["Auto", "auto ", "big"])
def test_any_other_word_is_still_rejected_by_vllm_ascend(registered, model_dir, value):
    with pytest.raises(ValueError, match="draft_window_size"):
        ascend_config(model_dir, {"draft_window_size": value})


@pytest.mark.overlay
def test_without_the_plugin_vllm_ascend_rejects_auto(registered, model_dir):
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import plugin

    plugin.unregister()
    with pytest.raises(ValueError, match="draft_window_size"):
        ascend_config(model_dir, AUTO)


def test_auto_on_model_runner_v1_stops_with_the_fix(registered, model_dir, monkeypatch):
    """The overlay stops as the config completes; the tree form in vllm-ascend's own
    validation (``AscendConfig._check_draft_window``), both with ``policy.check_start_up``."""
    from vllm_ascend.ascend_config import init_ascend_config

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    with pytest.raises(ValueError, match=re.escape(AUTO_ON_V1)):
        config = speculative_config(model_dir, AUTO)
        assert IN_TREE and not config.use_v2_model_runner
        init_ascend_config(config)


def test_auto_builds_on_model_runner_v2(registered, model_runner_v2, model_dir):
    from vllm_ascend.ascend_config import init_ascend_config

    config = speculative_config(model_dir, AUTO)
    assert config.use_v2_model_runner
    assert init_ascend_config(config).draft_window_size == ("auto" if IN_TREE else None)


def test_a_config_json_gone_stops_vllm_ascends_validation_named(
    registered, model_runner_v2, model_dir, tmp_path
):
    """The check both forms run at start-up reads the checkpoint's config.json."""
    from vllm_ascend.ascend_config import init_ascend_config

    draft = write_draft_dir(tmp_path / "eagle3", "eagle3", 256)
    config = speculative_vllm_config(model_dir, 512, 2, "eagle3", {}, draft=draft)
    (draft / "config.json").unlink()
    config.additional_config = dict(AUTO)
    with pytest.raises(ValueError, match=re.escape(f"checkpoint {draft}")):
        if not IN_TREE:
            from vllm_ascend.worker.v2.spec_decode.draft_window import policy
            from vllm_ascend.worker.v2.spec_decode.draft_window.config import (
                DraftWindowConfig,
            )
            from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import install

            release = install.installation().release
            policy.check_start_up(
                config, DraftWindowConfig(draft_window_size="auto"), release, True
            )
        init_ascend_config(config)


@pytest.mark.parametrize("layout", ["eagle3", "eagle3-speculators", "dflash", "dspark"])
def test_vllm_ascends_speculators_size_the_window_from_the_draft_checkpoint(
    layout, registered, model_dir, tmp_path, monkeypatch
):
    """vllm-ascend's own speculator (its ``__init__`` and ``set_attn``) on a config vLLM
    validated over the family's checkpoint declaring 1024 tokens: W = 1024 - 128 + 1."""
    import logging

    method, field = DRAFT_LAYOUTS[layout]
    context = 1024
    draft = write_draft_dir(tmp_path / layout, layout, context)
    with recorded("vllm.draft_window", logging.INFO, lambda r: r.getMessage()) as lines:
        # Eager: the window is sized as the speculator is made, whatever the graph mode (the
        # capture tests replay windows of every size).
        s, _ = started(model_dir, method, 3, CUDAGraphMode.NONE, AUTO, monkeypatch, draft=draft)
    loaded = s.vllm_config.speculative_config.draft_model_config.hf_config
    # vLLM 0.29/0.30 raise an EAGLE draft's positions to the target's, and only an EAGLE's.
    eagle = method in ("eagle", "eagle3")
    assert loaded.max_position_embeddings == (MAX_MODEL_LEN if eagle else context)
    declared = declared_context(s.vllm_config)
    assert (declared.tokens, declared.field) == (context, field)
    assert s.draft_window.spec.window_size == context - BLOCK + 1 == 897
    assert lines[0] == (
        f"draft_window_size=auto became W=897: the draft checkpoint {draft} declares "
        f"{field}={context} (its training context), and the window's reads (W to W + a - 1 = "
        f"1024 tokens, alignment {BLOCK}) stay within it."
    )
    assert lines[1].startswith(f"Draft KV window on for {method}: draft_window_size=897, ")


def test_a_declared_context_at_max_model_len_keeps_the_window_off(
    registered, model_dir, tmp_path, monkeypatch
):
    import logging

    draft = write_draft_dir(tmp_path / "dspark", "dspark", MAX_MODEL_LEN)
    with recorded("vllm.draft_window", logging.INFO, lambda r: r.getMessage()) as lines:
        s, _ = started(model_dir, "dspark", 3, CUDAGraphMode.NONE, AUTO, monkeypatch, draft=draft)
    assert s.draft_window is None
    assert lines == [
        f"draft_window_size=auto: the draft checkpoint {draft} declares "
        f"max_position_embeddings={MAX_MODEL_LEN}, not below max_model_len={MAX_MODEL_LEN}, so "
        "the draft reads no context longer than it declares; the draft window stays off. Set "
        "draft_window_size to the drafter's training context in tokens to window it anyway."
    ]


@pytest.mark.parametrize("free_kv", [False, True])
def test_free_kv_passes_the_strict_ascend_config_and_true_is_refused_by_name(
    registered, model_runner_v2, model_dir, free_kv
):
    """``draft_window_free_kv`` passes vllm-ascend's strict ``AscendConfig`` in both forms (the
    plugin's own key; a field the patch declares beside the window's others), as vllm-ascend's
    platform builds it at start-up: ``false`` changes nothing, ``true`` stops start-up with the
    reason it is not served here."""
    from vllm_ascend.ascend_config import init_ascend_config

    keys = {"draft_window_size": 512, "draft_window_free_kv": free_kv}
    if not free_kv:
        assert init_ascend_config(speculative_config(model_dir, keys)).draft_window_size == 512
        return
    with pytest.raises(ValueError) as info:
        init_ascend_config(speculative_config(model_dir, keys))
    # (vLLM 0.29 and 0.30 wrap a config's error in pydantic's.)
    message = str(info.value)
    assert "draft_window_free_kv=true cannot be served on vLLM 0." in message
    assert "does not null a sliding-window group's freed blocks" in message
    assert "Remove draft_window_free_kv" in message
