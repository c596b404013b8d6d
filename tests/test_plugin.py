"""The `vllm.general_plugins` entry point, as vLLM itself discovers and calls it."""

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

from vllm_ascend.worker.v2.spec_decode.draft_window import hooks, plugin

ENTRY_POINT = "vllm_ascend.worker.v2.spec_decode.draft_window.plugin:register"
HOOKED = [
    (DraftModelSpeculator, "set_attn"),
    (DraftModelSpeculator, "_build_attn_metadata"),
    (DraftModelSpeculator, "_update_draft_decode_metadata"),
    (DFlashSpeculator, "capture"),
    (TargetDependentARSpeculator, "propose"),
    (TargetDependentARSpeculator, "_prefill"),
    (TargetDependentARSpeculator, "init_cudagraph_manager"),
    (TargetDependentARSpeculator, "_fused_multi_step_decode"),
    (SpeculatorCudaGraphManager, "capture"),
]


@pytest.fixture(autouse=True)
def clean_install():
    hooks.uninstall()
    yield
    hooks.uninstall()


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
    hooks.uninstall()
    assert installed_methods() == originals


def test_a_moved_vllm_method_fails_loudly_at_start_up(monkeypatch):
    def _build_attn_metadata(self, num_reqs, batch_desc, query_start_loc_np, step):
        """vLLM without seq_lens_cpu_upper_bound."""

    monkeypatch.setattr(DraftModelSpeculator, "_build_attn_metadata", _build_attn_metadata)
    with pytest.raises(RuntimeError, match=r"_build_attn_metadata no longer takes "
                                           r"\['seq_lens_cpu_upper_bound'\]"):  # fmt: skip
        plugin.register()
    assert DraftModelSpeculator.__dict__["set_attn"] is not None
    assert not hasattr(DraftModelSpeculator.__dict__["set_attn"], "__draft_window_wraps__")


@pytest.fixture
def restore_runner_choice():
    from vllm.config import VllmConfig

    saved = VllmConfig.__dict__["use_v2_model_runner"], VllmConfig.__dict__["__post_init__"]
    yield VllmConfig
    VllmConfig.use_v2_model_runner, VllmConfig.__post_init__ = saved


def config_for(model_dir, additional_config):
    from vllm_ascend.worker.v2.spec_decode.draft_window.cpu.speculators import make_vllm_config

    return make_vllm_config(model_dir, 512, 4, additional_config)


@pytest.mark.parametrize("env", ["1", "0"])
def test_runner_choice_is_unchanged_without_a_fallback(env, model_dir, restore_runner_choice,
                                                       monkeypatch):  # fmt: skip
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", env)
    config = config_for(model_dir, {"draft_window_size": 512})
    before = config.use_v2_model_runner
    plugin.register()
    assert config.use_v2_model_runner == before == (env == "1")


def test_a_v1_fallback_forced_by_the_window_alone_is_lifted(model_dir, restore_runner_choice,
                                                           monkeypatch):  # fmt: skip
    VllmConfig = restore_runner_choice
    vllm_choice = VllmConfig.__dict__["use_v2_model_runner"].fget

    def ascend_like_choice(self):
        """Stand-in for a vllm-ascend patch: V1 whenever the window is set (no release
        seen so far has one; the project detects it by behaviour, as it would this)."""
        if (self.additional_config or {}).get("draft_window_size") is not None:
            return False
        return vllm_choice(self)

    VllmConfig.use_v2_model_runner = property(ascend_like_choice)
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    windowed = config_for(model_dir, {"draft_window_size": 512, "other": 1})
    assert windowed.use_v2_model_runner is False
    plugin.register()
    plugin.register()
    assert windowed.use_v2_model_runner is True
    assert windowed.additional_config == {"draft_window_size": 512, "other": 1}
    # V1 asked for stays V1.
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    assert windowed.use_v2_model_runner is False


def speculative_config_for(model_dir, additional_config):
    """A real VllmConfig with a draft-model speculative config: the tiny model drafts for
    itself."""
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig, VllmConfig

    model_config = ModelConfig(
        model=str(model_dir), skip_tokenizer_init=True, dtype="float32", max_model_len=512,
    )  # fmt: skip
    parallel_config = ParallelConfig()
    speculative_config = SpeculativeConfig(
        method="draft_model", model=str(model_dir), num_speculative_tokens=2,
        target_model_config=model_config, target_parallel_config=parallel_config,
    )  # fmt: skip
    return VllmConfig(
        model_config=model_config, parallel_config=parallel_config,
        speculative_config=speculative_config, additional_config=additional_config,
    )  # fmt: skip


SINKS_ON_V1 = (
    "draft_attention_sinks=64 needs Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER=1): "
    "vllm-ascend's Model Runner V1 draft window has no attention sinks. "
    "Set VLLM_USE_V2_MODEL_RUNNER=1 or remove draft_attention_sinks."
)


def test_attention_sinks_on_model_runner_v1_are_refused_with_the_fix(model_dir,
                                                                    restore_runner_choice,
                                                                    monkeypatch):  # fmt: skip
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


@pytest.mark.parametrize(("env", "speculative", "sinks", "expected"), [
    ("0", True, 0, False),
    ("0", True, None, False),
    ("0", False, 64, False),
    ("1", True, 64, True),
])  # fmt: skip
def test_runner_choice_is_unchanged_unless_v1_would_ignore_sinks(env, speculative, sinks,
                                                                 expected, model_dir,
                                                                 restore_runner_choice,
                                                                 monkeypatch):  # fmt: skip
    plugin.register()
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", env)
    make = speculative_config_for if speculative else config_for
    config = make(model_dir, {"draft_window_size": 512, "draft_attention_sinks": sinks})
    assert config.use_v2_model_runner is expected


@pytest.mark.parametrize(("additional_config", "error"), [
    ({"draft_window_size": 512, "draft_attention_sinks": -1}, "must be an integer number"),
    ({"draft_attention_sinks": 64}, 'needs additional_config["draft_window_size"]'),
])  # fmt: skip
def test_invalid_sinks_on_model_runner_v1_raise_the_configs_error(additional_config, error,
                                                                  model_dir,
                                                                  restore_runner_choice,
                                                                  monkeypatch):  # fmt: skip
    plugin.register()
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    with pytest.raises(ValueError, match=re.escape(error)):
        speculative_config_for(model_dir, additional_config)


def test_sinks_without_a_window_are_an_error_without_a_draft(model_dir, restore_runner_choice):
    plugin.register()
    message = 'needs additional_config["draft_window_size"]'
    with pytest.raises(ValueError, match=re.escape(message)):
        config_for(model_dir, {"draft_attention_sinks": 64})
