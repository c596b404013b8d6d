# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What Ascend users run, on CPU: a supported vllm-ascend release's real Python package on its vLLM,
with its plugins, and this project installed into its tree as `pip install --no-deps .`
installs it on an Ascend host.

On each pairing the plugin installs the hooks of its release (DFlash, DSpark, EAGLE
and EAGLE3 through vllm-ascend's GQA backend): a user without the window sees vLLM and
vllm-ascend build as without the package, a method the release does not serve stops start-up
with the release named, and vllm-ascend's own Model Runner V1 window still takes the key.
"""

import hashlib
import re
from importlib import metadata
from pathlib import Path

import pytest
import vllm

import vllm_ascend
from tests.ascend.npu_testbed.pairing import (
    VENV,
    ascend_config,
    installed_release,
    speculative_config,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import install, supported


def test_the_environment_is_a_supported_ascend_release():
    release = installed_release()
    assert release is not None and supported.requires_for(release) is not None
    assert vllm.__version__.startswith("{}.{}.".format(*release.vllm_minor))
    assert metadata.version("vllm-ascend") in supported.requires_for(release)[1]
    import torch_npu

    assert type(torch_npu).__name__ == "StandIn"  # no NPU here


def test_the_overlay_sits_in_vllm_ascends_own_tree_and_replaced_none_of_its_files():
    from vllm_ascend.worker.v2.spec_decode import draft_window
    from vllm_ascend.worker.v2.spec_decode.dspark import speculator

    site = Path(vllm_ascend.__file__).parent.parent
    assert Path(draft_window.__file__).is_relative_to(site / "vllm_ascend")
    assert Path(speculator.__file__).parent.parent == Path(draft_window.__file__).parent.parent
    recorded = (VENV / "vllm-ascend-files.sha256").read_text().splitlines()
    assert len(recorded) > 500  # the whole package, not a few files
    for line in recorded:
        digest, name = line.split(maxsplit=1)
        assert hashlib.sha256((site / name).read_bytes()).hexdigest() == digest, name


def test_vllms_plugin_loading_with_vllm_ascends_plugins_installs_the_ascend_line(
    loaded_plugins,
):
    from vllm.v1.worker.gpu.spec_decode.autoregressive.speculator import (
        AutoRegressiveSpeculator,
    )
    from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    from vllm_ascend.worker.v2.spec_decode.autoregressive.aclgraph import (
        AutoRegressiveAclGraphManager,
    )
    from vllm_ascend.worker.v2.spec_decode.autoregressive.speculator import (
        AscendAutoRegressiveSpeculator,
    )
    from vllm_ascend.worker.v2.spec_decode.dspark.speculator import AscendDSparkSpeculator

    names = {p.name for p in metadata.entry_points(group="vllm.general_plugins")}
    assert {"draft_window", "ascend_model", "ascend_kv_connector", "ascend_model_loader"} <= names
    state = install.status()
    assert state == install.Status(installed=True, release=installed_release().name)
    before, after = loaded_plugins["before"], loaded_plugins["after"]
    changed = {key for key in before if after[key] is not before[key]}
    # Exactly the release's hooks, each wrapping the method it replaced; nothing else (vLLM's
    # SpeculatorCudaGraphManager, vllm-ascend's DFlash and EAGLE subclasses) changed.
    common = {
        (DraftModelSpeculator, "set_attn"),
        (DFlashSpeculator, "capture"),
        (AutoRegressiveSpeculator, "propose"),
        (AutoRegressiveSpeculator, "_prefill"),
        (AutoRegressiveSpeculator, "init_cudagraph_manager"),
        (AscendAutoRegressiveSpeculator, "capture"),
        (AscendAutoRegressiveSpeculator, "_calc_next_seq_lens_cpu"),
        (AscendAutoRegressiveSpeculator, "build_fia_params"),
        (AutoRegressiveAclGraphManager, "capture"),
    }
    # Where the releases differ: the draft build's name (vLLM 0.29's
    # _build_draft_attn_metadata), and vllm-ascend 0.30's DCP and DSpark MLA host lengths.
    by_release = {
        (0, 30): {
            (DraftModelSpeculator, "_build_attn_metadata"),
            (AscendAutoRegressiveSpeculator, "_build_attn_metadata"),
            (AscendDSparkSpeculator, "_prepare_draft_dcp_metadata_inputs"),
        },
        (0, 29): {
            (DraftModelSpeculator, "_build_draft_attn_metadata"),
            (AscendAutoRegressiveSpeculator, "_build_draft_attn_metadata"),
        },
    }
    assert changed == common | by_release[installed_release().vllm_minor]
    assert all(after[key].__wrapped__ is before[key] for key in changed)
    assert not [m for m in loaded_plugins["lines"] if "draft window" in m]


@pytest.mark.parametrize("v2", [False, True], ids=["model_runner_v1", "model_runner_v2"])
def test_without_the_window_configs_build_as_without_this_package(
    v2, registered, model_dir, request, monkeypatch
):
    if v2:
        request.getfixturevalue("model_runner_v2")
    else:
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    config = speculative_config(model_dir, {})
    assert config.use_v2_model_runner is v2


def test_eagle3_with_the_window_builds_on_model_runner_v2_and_other_methods_stop_named(
    registered, model_runner_v2, model_dir
):
    from vllm_ascend.worker.v2.spec_decode.draft_window import policy
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import install

    assert speculative_config(model_dir, {"draft_window_size": 512}).use_v2_model_runner
    # Every other Model Runner V2 method of vLLM 0.30 but MTP (which keeps its warning) is
    # one the release does not serve, e.g. extract_hidden_states.
    with pytest.raises(ValueError) as error:
        policy.refuse_method("extract_hidden_states", install.installation().release, 512)
    assert (
        "draft_window_size=512 is not supported on Model Runner V2 for speculative method "
        f"'extract_hidden_states' on {installed_release().name}; supported there: "
        "dflash, dspark, eagle, eagle3. Use one of those methods, or remove "
        "draft_window_size."
    ) in str(error.value)


def test_with_the_window_on_model_runner_v1_vllm_ascends_own_window_takes_the_key(
    registered, model_dir, monkeypatch
):
    from vllm_ascend.ascend_config import init_ascend_config

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    config = speculative_config(model_dir, {"draft_window_size": "512"})
    assert not config.use_v2_model_runner
    assert init_ascend_config(config).draft_window_size == 512


def test_vllm_ascends_strict_ascend_config_takes_the_sinks_key_only_with_the_plugin(
    registered, model_dir
):
    """vllm-ascend's AscendConfig forbids unknown keys and has no sinks field."""
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import plugin

    keys = {"draft_window_size": "512", "draft_attention_sinks": 64}
    assert ascend_config(model_dir, keys).draft_window_size == 512
    with pytest.raises(ValueError, match=re.escape("draft_attention_sink")):
        ascend_config(model_dir, {"draft_window_size": 512, "draft_attention_sink": 64})
    plugin.unregister()
    with pytest.raises(ValueError, match="draft_attention_sinks"):
        ascend_config(model_dir, keys)


def test_every_release_served_as_this_one_runs_exactly_its_code():
    """vllm-ascend 0.30.0rc1 is served as rc2 is: every file of its Python package but the
    version stamp is byte for byte the installed release's (the sdists' trees, fetched by
    ``make setup``). A release whose code ever differed would fail here, not on a host."""
    same_code = (VENV / "vllm-ascend-same-code.txt").read_text().split()
    release = installed_release()
    # Every other release the table serves as this one was fetched (none beside 0.29.0rc1).
    assert set(same_code) == set(supported.requires_for(release)[1]) - {
        metadata.version("vllm-ascend")
    }
    installed = {}
    for line in (VENV / "vllm-ascend-files.sha256").read_text().splitlines():
        digest, path = line.split(maxsplit=1)
        installed[path] = digest
    # What the setup wrote beside the package, and the version stamp: not vllm-ascend's code.
    not_code = {"vllm_ascend/_build_info.py", "vllm_ascend/_version.py"}
    checkout = Path(__file__).resolve().parents[2]
    for version in same_code:
        tree = checkout / ".cache" / f"vllm-ascend-{version}" / f"vllm_ascend-{version}"
        theirs = {
            str(p.relative_to(tree)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in (tree / "vllm_ascend").rglob("*")
            if p.is_file()
        }
        ours = {p: d for p, d in installed.items() if p not in not_code}
        assert {p: d for p, d in theirs.items() if p not in not_code} == ours, version


def test_vllm_ascend_0_30_0rc1_installs_the_same_hooks(monkeypatch):
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import versions

    release = installed_release()
    for version in supported.requires_for(release)[1]:
        installed = {"vllm": vllm.__version__, "vllm-ascend": version}
        monkeypatch.setattr(versions, "installed_versions", lambda v=installed: v)
        assert versions.requirement_problem(release) is None
        assert supported.release_for(vllm.__version__) is release
    monkeypatch.setattr(
        versions, "installed_versions", lambda: {"vllm": vllm.__version__, "vllm-ascend": "0.31.0"}
    )
    assert "installed: 0.31.0" in versions.requirement_problem(release)
