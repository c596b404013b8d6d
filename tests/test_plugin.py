# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The `vllm.general_plugins` entry point, as vLLM itself discovers and calls it."""

import functools
import importlib.metadata
import inspect
import re

import pytest
from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator
from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator
from vllm.v1.worker.gpu.spec_decode.target_dependent_ar.cudagraph_utils import (
    SpeculatorCudaGraphManager,
)
from vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator import (
    TargetDependentARSpeculator,
)

from tests.testbed.speculators import (
    make_speculative_vllm_config,
)
from vllm_ascend.worker.v2.spec_decode.draft_window import plugin

ENTRY_POINT = "vllm_ascend.worker.v2.spec_decode.draft_window.plugin:register"
HOOKED = [
    (DraftModelSpeculator, "set_attn"),
    (DraftModelSpeculator, "_build_attn_metadata"),
    (DraftModelSpeculator, "_update_draft_decode_metadata"),
    (DFlashSpeculator, "capture"),
    (TargetDependentARSpeculator, "propose"),
    (TargetDependentARSpeculator, "capture"),
    (TargetDependentARSpeculator, "_prefill"),
    (TargetDependentARSpeculator, "init_cudagraph_manager"),
    (TargetDependentARSpeculator, "_fused_multi_step_decode"),
    (SpeculatorCudaGraphManager, "capture"),
]


@pytest.fixture(autouse=True)
def clean_install():
    plugin.unregister()
    yield
    plugin.unregister()


def installed_methods():
    return [cls.__dict__[name] for cls, name in HOOKED]


def test_installed_distribution_declares_the_entry_point():
    points = importlib.metadata.entry_points(group="vllm.general_plugins")
    assert {p.name: p.value for p in points}.get("draft_window") == ENTRY_POINT


def test_vllm_discovers_the_plugin_and_it_installs_the_hooks_once(monkeypatch):
    from vllm.plugins import load_plugins_by_group

    monkeypatch.setenv("VLLM_PLUGINS", "draft_window")
    plugins = load_plugins_by_group("vllm.general_plugins")
    assert set(plugins) == {"draft_window"}
    originals = installed_methods()
    plugins["draft_window"]()
    first = installed_methods()
    assert all(a is not b for a, b in zip(first, originals, strict=True))
    plugins["draft_window"]()
    assert installed_methods() == first
    # Every draft-model speculator inherits the hook; none overrides the choke point.
    assert DFlashSpeculator._build_attn_metadata is first[1]


def test_hooks_keep_the_signatures_of_the_methods_they_wrap():
    originals = [inspect.signature(m) for m in installed_methods()]
    plugin.register()
    assert [inspect.signature(m) for m in installed_methods()] == originals


def test_uninstall_restores_vllms_own_methods():
    originals = installed_methods()
    plugin.register()
    plugin.unregister()
    assert installed_methods() == originals


@pytest.fixture
def restore_runner_choice():
    from vllm.config import VllmConfig

    saved = VllmConfig.__dict__["use_v2_model_runner"], VllmConfig.__dict__["__post_init__"]
    yield VllmConfig
    VllmConfig.use_v2_model_runner, VllmConfig.__post_init__ = saved


def config_for(model_dir, additional_config):
    from tests.testbed.speculators import make_vllm_config

    return make_vllm_config(model_dir, 512, 4, additional_config)


@pytest.mark.parametrize("env", ["1", "0"])
def test_runner_choice_is_unchanged_without_a_fallback(
    env, model_dir, restore_runner_choice, monkeypatch
):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", env)
    config = config_for(model_dir, {"draft_window_size": 512})
    before = config.use_v2_model_runner
    plugin.register()
    assert config.use_v2_model_runner == before == (env == "1")


def speculative_config_for(model_dir, additional_config):
    return make_speculative_vllm_config(model_dir, additional_config)


SINKS_ON_V1 = (
    "draft_attention_sinks=64 needs Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER=1): "
    "vllm-ascend's Model Runner V1 draft window has no attention sinks. "
    "Set VLLM_USE_V2_MODEL_RUNNER=1 or remove draft_attention_sinks."
)


def test_attention_sinks_on_model_runner_v1_are_refused_with_the_fix(
    model_dir, restore_runner_choice, monkeypatch
):
    additional_config = {"draft_window_size": 512, "draft_attention_sinks": "64"}
    plugin.register()
    plugin.register()
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    # The complete config says V1: start-up stops.
    with pytest.raises(ValueError, match=re.escape(SINKS_ON_V1)):
        speculative_config_for(model_dir, additional_config)
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    assert speculative_config_for(model_dir, additional_config).use_v2_model_runner


def test_sinks_are_refused_on_v1_also_when_a_platform_patch_replaces_the_runner_choice(
    model_dir, restore_runner_choice, monkeypatch
):
    """vllm-ascend 0.26.0rc1 replaces `VllmConfig.use_v2_model_runner` with a property that
    answers VLLM_USE_V2_MODEL_RUNNER alone (V1 when unset), possibly after this plugin."""
    VllmConfig = restore_runner_choice
    plugin.register()
    VllmConfig.use_v2_model_runner = property(lambda self: False)  # the stand-in patch
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(ValueError, match=re.escape(SINKS_ON_V1)):
        speculative_config_for(model_dir, {"draft_window_size": 512, "draft_attention_sinks": 64})


@pytest.mark.parametrize(
    ("env", "speculative", "sinks", "expected"),
    [
        ("0", True, 0, False),
        ("0", True, None, False),
        ("0", False, 64, False),
        ("1", True, 64, True),
    ],
)
def test_runner_choice_is_unchanged_unless_v1_would_ignore_sinks(
    env, speculative, sinks, expected, model_dir, restore_runner_choice, monkeypatch
):
    plugin.register()
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", env)
    make = speculative_config_for if speculative else config_for
    config = make(model_dir, {"draft_window_size": 512, "draft_attention_sinks": sinks})
    assert config.use_v2_model_runner is expected


@pytest.mark.parametrize(
    ("additional_config", "error"),
    [
        ({"draft_window_size": 512, "draft_attention_sinks": -1}, "must be an integer number"),
        ({"draft_attention_sinks": 64}, 'needs additional_config["draft_window_size"]'),
    ],
)
def test_invalid_sinks_on_model_runner_v1_raise_the_configs_error(
    additional_config, error, model_dir, restore_runner_choice, monkeypatch
):
    plugin.register()
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    with pytest.raises(ValueError, match=re.escape(error)):
        speculative_config_for(model_dir, additional_config)


MIN_CONTEXT_ON_V1 = (
    "draft_window_min_context=8192 needs Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER=1): "
    "vllm-ascend's Model Runner V1 draft window windows every context. "
    "Set VLLM_USE_V2_MODEL_RUNNER=1 or remove draft_window_min_context."
)


@pytest.mark.parametrize(
    ("min_context", "refused"), [(8192, True), ("8192", True), (0, False), (None, False)]
)
def test_a_threshold_on_model_runner_v1_is_refused_with_the_fix(
    min_context, refused, model_dir, restore_runner_choice, monkeypatch
):
    additional_config = {"draft_window_size": 512, "draft_window_min_context": min_context}
    plugin.register()
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    if refused:
        with pytest.raises(ValueError, match=re.escape(MIN_CONTEXT_ON_V1)):
            speculative_config_for(model_dir, additional_config)
    else:  # 0 or absent: today's behaviour, vllm-ascend's own V1 window
        assert not speculative_config_for(model_dir, additional_config).use_v2_model_runner
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    assert speculative_config_for(model_dir, additional_config).use_v2_model_runner


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (-1, "got -1 (int)"),
        (1.5, "got 1.5 (float)"),
        (True, "got True (bool)"),
        ("8k", "got '8k' (str)"),
        ([8192], "got [8192] (list)"),
    ],
)
@pytest.mark.parametrize("env", ["0", "1"])
def test_an_invalid_threshold_stops_start_up_naming_key_value_and_fix(
    value, error, env, model_dir, restore_runner_choice, monkeypatch
):
    plugin.register()
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", env)
    message = (
        'additional_config["draft_window_min_context"] must be an integer number of tokens >= 0 '
        '(an integral string such as "8192" is accepted; 0 or null: every context); ' + error
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        speculative_config_for(
            model_dir, {"draft_window_size": 512, "draft_window_min_context": value}
        )


def test_a_threshold_without_a_window_is_an_error_with_or_without_a_draft(
    model_dir, restore_runner_choice
):
    plugin.register()
    message = (
        'additional_config["draft_window_min_context"]=8192 needs '
        'additional_config["draft_window_size"]: it shapes the draft window. Set '
        "draft_window_size too, or remove draft_window_min_context."
    )
    for make in (config_for, speculative_config_for):
        with pytest.raises(ValueError, match=re.escape(message)):
            make(model_dir, {"draft_window_min_context": 8192})


def test_sinks_without_a_window_are_an_error_without_a_draft(model_dir, restore_runner_choice):
    plugin.register()
    message = 'needs additional_config["draft_window_size"]'
    with pytest.raises(ValueError, match=re.escape(message)):
        config_for(model_dir, {"draft_attention_sinks": 64})


def another_plugins_wrapper(method, calls):
    """What a second plugin typically does: functools.wraps, which also copies the wrapped
    function's __dict__ (and so any mark a wrapper carries)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        calls.append(type(self).__name__)
        return method(self, *args, **kwargs)

    return wrapper


def window_build(model_dir, monkeypatch):
    """A DSpark draft with draft_window_size=64: what its builder received."""
    from tests.testbed.dflash import LAYOUTS, build, make_batch, wire

    layouts = LAYOUTS["one_group"]
    wired = wire("dspark", layouts, make_batch(layouts), model_dir, monkeypatch)
    build(wired)
    (received,) = wired.received[0]
    return wired, received


def test_a_second_plugin_wrapping_ours_is_kept_and_ours_goes_inert(model_dir, monkeypatch):
    plugin.register()
    ours = DraftModelSpeculator.__dict__["_build_attn_metadata"]
    calls = []
    theirs = another_plugins_wrapper(ours, calls)
    monkeypatch.setattr(DraftModelSpeculator, "_build_attn_metadata", theirs)
    # Idempotent: ours is found inside theirs, nothing is wrapped again.
    plugin.register()
    assert DraftModelSpeculator.__dict__["_build_attn_metadata"] is theirs
    wired, received = window_build(model_dir, monkeypatch)
    assert received.seq_lens.data_ptr() == wired.speculator.draft_window.seq_lens.data_ptr()
    assert calls == ["DSparkSpeculator"]
    # Unregistering cannot take ours out of their chain without dropping theirs: both stay,
    # and ours makes no window, so the build is vLLM's own.
    plugin.unregister()
    assert DraftModelSpeculator.__dict__["_build_attn_metadata"] is theirs
    wired, received = window_build(model_dir, monkeypatch)
    assert wired.speculator.draft_window is None
    assert received.seq_lens.data_ptr() == wired.batch.input_buffers.seq_lens.data_ptr()
    assert calls == ["DSparkSpeculator"] * 2


def test_a_second_plugin_wrapping_before_ours_is_wrapped_and_restored(model_dir, monkeypatch):
    vllms = DraftModelSpeculator.__dict__["_build_attn_metadata"]
    calls = []
    theirs = another_plugins_wrapper(vllms, calls)
    monkeypatch.setattr(DraftModelSpeculator, "_build_attn_metadata", theirs)
    plugin.register()
    plugin.register()
    ours = DraftModelSpeculator.__dict__["_build_attn_metadata"]
    assert ours is not theirs and ours.__wrapped__ is theirs
    wired, received = window_build(model_dir, monkeypatch)
    assert received.seq_lens.data_ptr() == wired.speculator.draft_window.seq_lens.data_ptr()
    assert calls == ["DSparkSpeculator"]
    plugin.unregister()
    assert DraftModelSpeculator.__dict__["_build_attn_metadata"] is theirs


def test_unregister_restores_the_config_check_and_leaves_the_runner_choice_to_vllm():
    from vllm.config import VllmConfig

    choice, post_init = (VllmConfig.__dict__[n] for n in ("use_v2_model_runner", "__post_init__"))
    plugin.register()
    assert VllmConfig.__dict__["use_v2_model_runner"] is choice
    assert VllmConfig.__dict__["__post_init__"] is not post_init
    plugin.unregister()
    assert VllmConfig.__dict__["__post_init__"] is post_init
