# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The window's own keys (`draft_attention_sinks`, `draft_window_min_context`,
`draft_window_free_kv`) and
`draft_window_size: "auto"` pass vllm-ascend's own validation of `additional_config`: a
strict `AscendConfig` drops the keys, takes "auto" as None where its declared field would
reject it, and still checks every other key and value; a lenient one is untouched.
"""

import sys
from types import ModuleType
from typing import Literal

import pydantic
import pytest
from pydantic.dataclasses import dataclass

from testbed.mrv1_adapter import load_released_file
from testbed.speculators import make_vllm_config
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import plugin

# The same code on every vLLM line: run once, in .venv (design/testing.md).
pytestmark = pytest.mark.release_independent

MODULE = "vllm_ascend.ascend_config"
RELEASED_MEMBER = "vllm_ascend/ascend_config.py"

# Stand-in for vllm-ascend's ascend_config.py after its config migration, which needs a newer
# vllm_ascend than can be imported here. The same shape: `AscendConfig` a pydantic dataclass
# forbidding unknown keys, declaring draft_window_size, naming a sub-config defined below it
# (so pydantic completes it on first use), built by `init_ascend_config` from
# additional_config minus the keys the factory passes itself.
STRICT_ASCEND_CONFIG = """
from __future__ import annotations

import dataclasses

from pydantic import ConfigDict
from pydantic.dataclasses import dataclass

config = dataclass(config=ConfigDict(extra="forbid"))


@config
class AscendConfig:
    enable_kv_nz: bool = False
    draft_window_size: int | None = None
    scheduler_config: SchedulerConfig = dataclasses.field(default_factory=lambda: SchedulerConfig())


@config
class SchedulerConfig:
    enable_balance_scheduling: bool = False


def init_ascend_config(vllm_config):
    additional_config = vllm_config.additional_config or {}
    scheduler_config = SchedulerConfig(**additional_config.get("scheduler_config", {}))
    non_user_keys = {"refresh", "scheduler_config"}
    kwargs = {k: v for k, v in additional_config.items() if k not in non_user_keys}
    return AscendConfig(scheduler_config=scheduler_config, **kwargs)
"""


@pytest.fixture(autouse=True)
def registered_for_one_test(monkeypatch):
    """register() also installs the hooks and wraps the runner choice and the config's
    completion; all undone after."""
    from vllm.config import VllmConfig

    for name in ("use_v2_model_runner", "__post_init__"):
        if name in VllmConfig.__dict__:  # vLLM 0.34 has no runner choice
            monkeypatch.setattr(VllmConfig, name, VllmConfig.__dict__[name])
    yield
    plugin.unregister()


def load_released_ascend_config() -> ModuleType:
    """The released vllm-ascend `ascend_config.py`, loaded alone: at the top it imports only
    vLLM, the rest of `vllm_ascend` inside the methods that need it."""
    return load_released_file(RELEASED_MEMBER, MODULE)


def install_module(monkeypatch, module: ModuleType) -> ModuleType:
    monkeypatch.setitem(sys.modules, MODULE, module)
    return module


def install_strict_ascend_config(monkeypatch) -> ModuleType:
    module = install_module(monkeypatch, ModuleType(MODULE))
    exec(STRICT_ASCEND_CONFIG, module.__dict__)
    return module


def build(module, model_dir, additional_config):
    return module.init_ascend_config(make_vllm_config(model_dir, 512, 4, additional_config))


def test_register_works_without_vllm_ascend_config(monkeypatch):
    # None in sys.modules makes the import fail as if vllm-ascend were not installed.
    monkeypatch.setitem(sys.modules, MODULE, None)
    plugin.register()


def test_the_released_lenient_ascend_config_is_left_untouched(monkeypatch):
    released = install_module(monkeypatch, load_released_ascend_config())
    assert not pydantic.dataclasses.is_pydantic_dataclass(released.AscendConfig)
    init = released.AscendConfig.__init__
    plugin.register()
    assert released.AscendConfig.__init__ is init


OWN_KEYS = ("draft_attention_sinks", "draft_window_min_context", "draft_window_free_kv")


@pytest.mark.parametrize("key", OWN_KEYS)
def test_a_strict_ascend_config_rejects_the_own_keys_without_the_plugin(
    key, model_dir, monkeypatch
):
    strict = install_strict_ascend_config(monkeypatch)
    with pytest.raises(ValueError, match=key):
        build(strict, model_dir, {"draft_window_size": 4096, key: 8192})


def test_a_strict_ascend_config_accepts_the_own_keys_once_registered(model_dir, monkeypatch):
    strict = install_strict_ascend_config(monkeypatch)
    assert not strict.AscendConfig.__pydantic_complete__
    plugin.register()
    # Twice: pydantic completing the class on first use must not drop the wrapper.
    for _ in range(2):
        ascend_config = build(
            strict,
            model_dir,
            {
                "draft_window_size": "4096",
                "draft_attention_sinks": 64,
                "draft_window_min_context": 8192,
                "draft_window_free_kv": True,
            },
        )
        assert ascend_config.draft_window_size == 4096
        for key in OWN_KEYS:
            assert not hasattr(ascend_config, key)


@pytest.mark.parametrize(
    ("additional_config", "rejected"),
    [
        ({"draft_window_size": 4096, "draft_attention_sink": 64}, "draft_attention_sink"),
        ({"draft_window_size": "big", "draft_attention_sinks": 64}, "draft_window_size"),
        ({"draft_attention_sinks": 64, "scheduler_config": {"balance": 1}}, "balance"),
    ],
)
def test_a_strict_ascend_config_still_rejects_other_bad_keys(
    additional_config, rejected, model_dir, monkeypatch
):
    strict = install_strict_ascend_config(monkeypatch)
    plugin.register()
    with pytest.raises(ValueError, match=rejected):
        build(strict, model_dir, additional_config)


@pytest.mark.parametrize(
    "additional_config",
    [
        {"draft_window_size": "auto"},
        {"draft_window_size": "auto", "draft_attention_sinks": 64},
        {"draft_window_size": "auto", "draft_window_min_context": "8192"},
    ],
)
def test_a_strict_ascend_config_takes_auto_as_none_once_registered(
    additional_config, model_dir, monkeypatch
):
    """vllm-ascend's draft_window_size feeds only its Model Runner V1 window; the MRV2 window
    reads "auto" from additional_config itself."""
    strict = install_strict_ascend_config(monkeypatch)
    config = make_vllm_config(model_dir, 512, 4, additional_config)
    with pytest.raises(ValueError, match="draft_window_size"):
        strict.init_ascend_config(config)
    plugin.register()
    for _ in range(2):
        assert strict.init_ascend_config(config).draft_window_size is None
    # what the window reads is untouched
    assert config.additional_config["draft_window_size"] == "auto"


@pytest.mark.parametrize("value", ["Auto", "auto ", "big"])
def test_a_strict_ascend_config_still_rejects_any_other_word(value, model_dir, monkeypatch):
    strict = install_strict_ascend_config(monkeypatch)
    plugin.register()
    with pytest.raises(ValueError, match="draft_window_size"):
        build(strict, model_dir, {"draft_window_size": value})


def test_registering_twice_wraps_a_strict_ascend_config_once(monkeypatch):
    strict = install_strict_ascend_config(monkeypatch)
    plugin.register()
    wrapped = strict.AscendConfig.__init__
    plugin.register()
    assert strict.AscendConfig.__init__ is wrapped
    # One wrapper, around pydantic's own __init__.
    assert not hasattr(wrapped.__wrapped__, "__wrapped__")


def test_a_strict_ascend_config_that_declares_the_own_keys_and_auto_is_left_untouched(
    monkeypatch,
):
    """The upstream patch's AscendConfig: every key declared, "auto" in the field's type."""

    @dataclass(config=pydantic.ConfigDict(extra="forbid"))
    class AscendConfig:
        draft_window_size: int | Literal["auto"] | None = None
        draft_attention_sinks: int = 0
        draft_window_min_context: int = 0
        draft_window_free_kv: bool = False

    module = install_module(monkeypatch, ModuleType(MODULE))
    module.AscendConfig = AscendConfig
    init = AscendConfig.__init__
    plugin.register()
    assert AscendConfig.__init__ is init
    assert AscendConfig(draft_window_size=8, draft_attention_sinks="4").draft_attention_sinks == 4
    assert AscendConfig(draft_window_size="auto").draft_window_size == "auto"


def test_a_strict_ascend_config_declaring_the_own_keys_takes_auto_as_none(monkeypatch):
    """Every key declared, but draft_window_size an integer: only "auto" changes."""

    @dataclass(config=pydantic.ConfigDict(extra="forbid"))
    class AscendConfig:
        draft_window_size: int | None = None
        draft_attention_sinks: int = 0
        draft_window_min_context: int = 0
        draft_window_free_kv: bool = False

    module = install_module(monkeypatch, ModuleType(MODULE))
    module.AscendConfig = AscendConfig
    with pytest.raises(ValueError, match="draft_window_size"):
        AscendConfig(draft_window_size="auto")
    plugin.register()
    assert AscendConfig(draft_window_size="auto").draft_window_size is None
    config = AscendConfig(draft_window_size="8", draft_attention_sinks="4")
    assert (config.draft_window_size, config.draft_attention_sinks) == (8, 4)
    with pytest.raises(ValueError, match="draft_window_size"):
        AscendConfig(draft_window_size="Auto")


def test_a_strict_ascend_config_declaring_one_own_key_gets_it_and_drops_the_other(monkeypatch):
    @dataclass(config=pydantic.ConfigDict(extra="forbid"))
    class AscendConfig:
        draft_window_size: int | None = None
        draft_attention_sinks: int = 0

    module = install_module(monkeypatch, ModuleType(MODULE))
    module.AscendConfig = AscendConfig
    plugin.register()
    config = AscendConfig(
        draft_window_size=8, draft_attention_sinks="4", draft_window_min_context=64
    )
    assert config.draft_attention_sinks == 4
    assert not hasattr(config, "draft_window_min_context")


def test_a_strict_pydantic_model_drops_the_sinks_key_too(monkeypatch):
    class AscendConfig(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        draft_window_size: int | None = None

    module = install_module(monkeypatch, ModuleType(MODULE))
    module.AscendConfig = AscendConfig
    plugin.register()
    assert AscendConfig(draft_window_size="8", draft_attention_sinks=4).draft_window_size == 8
    with pytest.raises(ValueError, match="draft_attention_sink"):
        AscendConfig(draft_attention_sink=4)


def test_a_failed_adaptation_warns_and_start_up_goes_on(monkeypatch, vllm_log_records):
    """Most deployments never set the key: the plugin must not stop vLLM over it."""

    def broken():
        raise RuntimeError("AscendConfig moved")

    monkeypatch.setattr(plugin, "_accept_own_keys", broken)
    plugin.register()
    (record,) = [r for r in vllm_log_records if "draft_attention_sinks" in r.getMessage()]
    assert record.levelname == "WARNING"
    assert "(RuntimeError: AscendConfig moved)" in record.getMessage()


def test_unregister_restores_the_strict_ascend_config(model_dir, monkeypatch):
    strict = install_strict_ascend_config(monkeypatch)
    plugin.register()
    build(strict, model_dir, {"draft_window_size": 4096, "draft_attention_sinks": 64})
    plugin.unregister()
    with pytest.raises(ValueError, match="draft_attention_sinks"):
        build(strict, model_dir, {"draft_window_size": 4096, "draft_attention_sinks": 64})
