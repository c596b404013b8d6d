# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The `vllm.general_plugins` entry point, as vLLM itself discovers and calls it."""

import functools
import importlib.metadata
import inspect
import re

import pytest

from testbed.speculators import (
    make_speculative_vllm_config,
)
from testbed.vllm_line import RELEASE
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import plugin

ENTRY_POINT = "vllm_ascend.worker.v2.spec_decode.draft_window.overlay.plugin:register"
_SD = "vllm.v1.worker.gpu.spec_decode"
_BASE = [
    (f"{_SD}.speculator", "DraftModelSpeculator", "set_attn"),
    (f"{_SD}.speculator", "DraftModelSpeculator", "_build_attn_metadata"),
    (f"{_SD}.speculator", "DraftModelSpeculator", "_update_draft_decode_metadata"),
    (f"{_SD}.dflash.speculator", "DFlashSpeculator", "capture"),
]
_AR_0_33 = f"{_SD}.target_dependent_ar"
_AR_0_34 = f"{_SD}.autoregressive"
# Every method the window wraps on each vLLM line, as written down here (not read from the
# window's table).
HOOKED_BY_RELEASE = {
    "vLLM 0.33.x": [
        *_BASE,
        *(
            (f"{_AR_0_33}.speculator", "TargetDependentARSpeculator", method)
            for method in (
                "propose",
                "capture",
                "_prefill",
                "init_cudagraph_manager",
                "_fused_multi_step_decode",
            )
        ),
        (f"{_AR_0_33}.cudagraph_utils", "SpeculatorCudaGraphManager", "capture"),
    ],
    "vLLM 0.34.x": [
        *_BASE,
        (f"{_SD}.speculator", "DraftModelSpeculator", "_build_drafter_attn_metadata"),
        (f"{_AR_0_34}.speculator", "AutoRegressiveSpeculator", "capture"),
        (f"{_AR_0_34}.speculator", "AutoRegressiveSpeculator", "_run_fused_multi_step_decode"),
        (
            f"{_SD}.target_dependent_ar.speculator",
            "TargetDependentARSpeculator",
            "init_cudagraph_manager",
        ),
        (f"{_SD}.standalone_ar.speculator", "StandaloneARSpeculator", "init_cudagraph_manager"),
        (f"{_AR_0_34}.cudagraph_utils", "SpeculatorCudaGraphManager", "capture"),
    ],
}
HOOKED = [
    (getattr(importlib.import_module(module), cls), method)
    for module, cls, method in HOOKED_BY_RELEASE[RELEASE.name]
]
DraftModelSpeculator = HOOKED[0][0]
DFlashSpeculator = HOOKED[3][0]


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


# What register() may wrap on VllmConfig: its completion, and (where the release still has
# Model Runner V1) the runner choice, which it leaves to vLLM.
CONFIG_NAMES = (
    ("use_v2_model_runner", "__post_init__") if RELEASE.model_runner_v1 else ("__post_init__",)
)


@pytest.fixture
def restore_runner_choice():
    from vllm.config import VllmConfig

    saved = {name: VllmConfig.__dict__[name] for name in CONFIG_NAMES}
    yield VllmConfig
    for name, value in saved.items():
        setattr(VllmConfig, name, value)


def config_for(model_dir, additional_config):
    from testbed.speculators import make_vllm_config

    return make_vllm_config(model_dir, 512, 4, additional_config)


@pytest.mark.model_runner_v1
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


@pytest.mark.model_runner_v1
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


@pytest.mark.model_runner_v1
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


@pytest.mark.model_runner_v1
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


@pytest.mark.model_runner_v1
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


@pytest.mark.model_runner_v1
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
@pytest.mark.parametrize("env", ["0", "1"] if RELEASE.model_runner_v1 else [None])
def test_an_invalid_threshold_stops_start_up_naming_key_value_and_fix(
    value, error, env, model_dir, restore_runner_choice, monkeypatch
):
    plugin.register()
    if env is not None:
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


@pytest.mark.parametrize(
    "additional",
    [
        {"draft_window_sise": 512},
        {"draft_window_size": 512, "draft_window_free_kvv": True},
        {"draft_windw_size": 512, "draft_attention_sink": 64},
    ],
)
def test_an_unknown_draft_key_stops_start_up_naming_it_and_the_known_keys(
    model_dir, restore_runner_choice, additional
):
    """vLLM's own additional_config takes any key: a misspelled key of the window would be
    served as if absent. With a draft or without, one error names it and the keys known."""
    plugin.register()
    unknown = sorted(k for k in additional if k not in ("draft_window_size",))
    message = (
        f"additional_config has {', '.join(unknown)}, which the draft window does not know (a "
        "misspelling?): its keys are draft_window_size, draft_attention_sinks, "
        "draft_window_min_context, draft_window_free_kv."
    )
    for make in (config_for, speculative_config_for):
        with pytest.raises(ValueError, match=re.escape(message)):
            make(model_dir, additional)


@pytest.mark.parametrize(
    ("additional", "message"),
    [
        (
            {"draft_window_free_kv": True},
            'additional_config["draft_window_free_kv"]=true needs '
            'additional_config["draft_window_size"]',
        ),
        (
            {"draft_window_size": 512, "draft_window_free_kv": "yes"},
            "additional_config[\"draft_window_free_kv\"] must be true or false; got 'yes' (str)",
        ),
    ],
)
def test_free_kv_without_a_window_or_not_a_boolean_is_an_error(
    model_dir, restore_runner_choice, additional, message
):
    plugin.register()
    with pytest.raises(ValueError, match=re.escape(message)):
        config_for(model_dir, additional)


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
    from tests.cpu_testbed.dflash import LAYOUTS, build, make_batch, wire

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

    before = {name: VllmConfig.__dict__[name] for name in CONFIG_NAMES}
    plugin.register()
    assert VllmConfig.__dict__["__post_init__"] is not before["__post_init__"]
    if RELEASE.model_runner_v1:
        assert VllmConfig.__dict__["use_v2_model_runner"] is before["use_v2_model_runner"]
    plugin.unregister()
    assert {name: VllmConfig.__dict__[name] for name in CONFIG_NAMES} == before


@pytest.mark.without_model_runner_v1
@pytest.mark.parametrize(
    "additional_config",
    [
        {"draft_window_size": 512},
        {"draft_window_size": 512, "draft_attention_sinks": 64},
        {"draft_window_size": 512, "draft_window_min_context": 8192},
    ],
)
def test_without_model_runner_v1_every_window_config_is_checked_as_model_runner_v2(
    additional_config, model_dir, restore_runner_choice, monkeypatch, window_log
):
    """vLLM 0.34 has no runner choice (no VLLM_USE_V2_MODEL_RUNNER, no
    ``use_v2_model_runner``): a config asking for the window, sinks and a threshold included,
    is served as Model Runner V2 with nothing to set, and a method the window does not serve
    stops start-up without suggesting Model Runner V1."""
    from vllm import envs

    assert "VLLM_USE_V2_MODEL_RUNNER" not in envs.environment_variables
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    plugin.register()
    config = speculative_config_for(model_dir, additional_config)
    assert config.additional_config == additional_config
    with pytest.raises(ValueError) as error:
        make_speculative_vllm_config(model_dir, additional_config, method="ngram")
    message = str(error.value)
    assert "for speculative method 'ngram' on vLLM 0.34.x" in message
    assert "Model Runner V1" not in message and "VLLM_USE_V2_MODEL_RUNNER" not in message


def tp4_dcp2_config(model_dir, method, draft_dcp):
    """A config of tensor parallel size 4 and decode context parallel size 2 (the tiny model
    has 2 KV heads, which DCP needs TP to exceed), its draft at ``draft_dcp`` (None: vLLM's
    default), with the window: the engine's validation, the window's start-up check included."""
    from vllm.config import ParallelConfig, SpeculativeConfig, VllmConfig

    from testbed.configs import tiny_model_config

    model = tiny_model_config(model_dir, 512)
    parallel = ParallelConfig(tensor_parallel_size=4, decode_context_parallel_size=2)
    speculative = SpeculativeConfig(
        method=method,
        model=str(model_dir),
        num_speculative_tokens=2,
        target_model_config=model,
        target_parallel_config=parallel,
        draft_decode_context_parallel_size=draft_dcp,
    )
    return VllmConfig(
        model_config=model,
        parallel_config=parallel,
        speculative_config=speculative,
        additional_config={"draft_window_size": 512},
    )


@pytest.mark.release("vLLM 0.34.x")
@pytest.mark.parametrize(
    ("method", "draft_dcp", "served"),
    [("eagle3", None, 2), ("eagle3", 2, 2), ("eagle3", 1, 2), ("draft_model", 1, 2)],
)
def test_a_draft_at_a_decode_context_parallel_size_of_its_own_is_refused_by_name(
    method, draft_dcp, served, model_dir, restore_runner_choice
):
    """vLLM 0.34 lets a draft run at a DCP size of its own (draft_decode_context_parallel_size).
    The window serves each method at the size earlier releases gave it, the target's for
    EAGLE and draft models (a replicated draft's prefill would read the target's DCP-sharded
    metadata), and refuses another one at start-up."""
    plugin.register()
    if draft_dcp in (None, served):
        config = tp4_dcp2_config(model_dir, method, draft_dcp)
        assert config.speculative_config.draft_decode_context_parallel_size == served
        return
    message = (
        f"draft_window_size=512 is not supported on vLLM 0.34.x with "
        f"draft_decode_context_parallel_size={draft_dcp} under decode_context_parallel_size=2 "
        f"for method {method!r}: the window is proven for that draft at "
        f"draft_decode_context_parallel_size={served} only. Set "
        f"draft_decode_context_parallel_size={served} (or leave it unset), or remove "
        "draft_window_size."
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        tp4_dcp2_config(model_dir, method, draft_dcp)


@pytest.mark.release("vLLM 0.34.x")
@pytest.mark.parametrize(("use_mla", "draft_dcp", "refused"), [(False, 1, False), (False, 2, True)])
def test_a_dflash_draft_is_served_at_the_dcp_size_vllm_gives_it_by_default(
    use_mla, draft_dcp, refused, model_dir, restore_runner_choice
):
    """A DFlash-family draft without MLA runs replicated (DCP 1) under a DCP target, as on
    vLLM 0.33: served; sharded, a layout no earlier release made: refused. (The method is
    set after validation: a DFlash config validates against its draft checkpoint.)"""
    from testbed.configs import set_method
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.plugin_release import (
        refuse_config,
    )

    config = set_method(tp4_dcp2_config(model_dir, "eagle3", None), "dflash")
    assert not config.speculative_config.draft_model_config.use_mla
    object.__setattr__(config.speculative_config, "draft_decode_context_parallel_size", draft_dcp)
    if not refused:
        refuse_config(config, RELEASE, 512)
        return
    proven = "^draft_window_size=512 is not supported .* for method 'dflash': the window is proven "
    with pytest.raises(ValueError, match=proven):
        refuse_config(config, RELEASE, 512)


@pytest.mark.release("vLLM 0.34.x")
def test_dual_batch_overlap_is_refused_by_name(model_dir, restore_runner_choice):
    """Dual-batch overlap makes vLLM 0.34 rebuild the draft prefill's metadata from the full
    tables, a path the window is not proven on. (vLLM's CPU platform turns DBO off at
    validation, a GPU platform keeps it: set after validation.)"""
    plugin.register()
    config = speculative_config_for(model_dir, {"draft_window_size": 512})
    object.__setattr__(config.parallel_config, "enable_dbo", True)
    assert config.parallel_config.use_ubatching
    message = (
        "draft_window_size=512 is not supported on vLLM 0.34.x with dual-batch overlap "
        "(micro-batching): the target's forward builds metadata per micro-batch, so the draft "
        "prefill rebuilds its own from the full block tables, a path the window is not proven "
        "on. Disable dual-batch overlap, or remove draft_window_size."
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        plugin._check_window_config(config)


@pytest.mark.release("vLLM 0.34.x")
def test_dual_batch_overlap_the_start_up_check_did_not_see_is_refused_at_set_attn(model_dir):
    """The same refusal where the layout was set after the engine's start-up check: the
    plugin's set_attn refuses it before the draft's window is made."""
    from testbed.speculators import SPECULATOR_CLASSES, make_vllm_config, wire_speculator
    from tests.cpu_testbed.dflash import LAYOUTS, MAX_MODEL_LEN, MAX_NUM_REQS, NUM_SPEC, make_batch

    plugin.register()
    config = make_vllm_config(model_dir, MAX_MODEL_LEN, MAX_NUM_REQS, {"draft_window_size": 64})
    object.__setattr__(config.parallel_config, "enable_dbo", True)
    layouts = LAYOUTS["one_group"]
    batch = make_batch(layouts, num_reqs_padded=MAX_NUM_REQS)
    message = "draft_window_size=64 is not supported on vLLM 0.34.x with dual-batch overlap"
    with pytest.raises(ValueError, match=re.escape(message)):
        wire_speculator(SPECULATOR_CLASSES["dflash"], batch, layouts, config, "dflash", NUM_SPEC)


FREE_KV = {"draft_window_size": 512, "draft_window_free_kv": True}


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        (
            {"draft_attention_sinks": 64},
            "with draft_attention_sinks=64: vLLM's sliding-window KV cache manager frees a "
            "request's first blocks too, the sinks' among them",
        ),
        (
            {"draft_window_min_context": 8192},
            "with draft_window_min_context=8192: a request below it reads its whole context",
        ),
    ],
)
def test_free_kv_with_sinks_or_a_threshold_is_refused_by_name(
    model_dir, restore_runner_choice, extra, reason
):
    plugin.register()
    message = f"draft_window_free_kv=true cannot be served {reason}"
    with pytest.raises(ValueError, match=re.escape(message)):
        speculative_config_for(model_dir, {**FREE_KV, **extra})


def test_free_kv_with_the_hybrid_kv_cache_manager_off_is_refused_by_name(
    model_dir, restore_runner_choice
):
    """vLLM would merge every layer into one full-attention group and free nothing."""
    from vllm.config import SchedulerConfig

    from testbed.configs import speculative_vllm_config

    plugin.register()
    scheduler = SchedulerConfig(
        max_model_len=512, is_encoder_decoder=False, disable_hybrid_kv_cache_manager=True
    )
    message = "draft_window_free_kv=true cannot be served with the hybrid KV cache manager off"
    with pytest.raises(ValueError, match=re.escape(message)):
        speculative_vllm_config(model_dir, 512, 2, "eagle3", FREE_KV, scheduler_config=scheduler)


@pytest.mark.release("vLLM 0.34.x")
def test_free_kv_under_decode_context_parallelism_is_refused_by_name(
    model_dir, restore_runner_choice
):
    from vllm_ascend.worker.v2.spec_decode.draft_window.config import DraftWindowConfig
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import free_kv

    config = tp4_dcp2_config(model_dir, "eagle3", None)
    message = "draft_window_free_kv=true cannot be served under decode context parallelism"
    with pytest.raises(ValueError, match=re.escape(message)):
        free_kv.refuse_free_kv(config, DraftWindowConfig(**FREE_KV), RELEASE)


@pytest.mark.model_runner_v1
def test_free_kv_on_model_runner_v1_is_refused_with_the_fix(
    model_dir, restore_runner_choice, monkeypatch
):
    plugin.register()
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    message = (
        "draft_window_free_kv=true needs Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER=1): it frees "
        "the draft KV the MRV2 window never reads."
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        speculative_config_for(model_dir, FREE_KV)


@pytest.mark.usefixtures("window_hooks")
def test_free_kv_for_mtp_is_refused_by_name_before_the_model_loads(
    model_dir, restore_runner_choice
):
    """The window leaves MTP drafts alone, so there is no windowed draft KV to free: the key
    stops start-up at the config check, not after KV-cache allocation. (A real EAGLE3
    config with its method read as "mtp": the check reads only the method.)"""
    import copy

    from vllm_ascend.worker.v2.spec_decode.draft_window import policy
    from vllm_ascend.worker.v2.spec_decode.draft_window.config import DraftWindowConfig

    config = copy.copy(speculative_config_for(model_dir, {}))
    config.speculative_config = copy.copy(config.speculative_config)
    config.speculative_config.method = "mtp"
    message = "draft_window_free_kv=true cannot be served for speculative method 'mtp'"
    config.additional_config = {**FREE_KV}
    with pytest.raises(ValueError, match=re.escape(message)):
        plugin._check_window_config(config)
    # Without the key an MTP draft keeps its warning at set_attn: nothing stops here.
    config.additional_config = {"draft_window_size": 512}
    plugin._check_window_config(config)
    policy.check_start_up(config, DraftWindowConfig(draft_window_size=512), RELEASE, True)
