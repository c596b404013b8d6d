# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What Ascend users run, on CPU: vLLM 0.30.0, vllm-ascend 0.30.0rc2's real Python package
with its plugins, and this project installed into its tree as `pip install --no-deps .`
installs it on an Ascend host.

On this pairing the plugin installs the hooks of its vLLM 0.30 line (DFlash, DSpark, EAGLE
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
    speculative_config,
)
from vllm_ascend.worker.v2.spec_decode.draft_window import install


def test_the_environment_is_the_ascend_pairing():
    assert vllm.__version__ == "0.30.0"
    assert metadata.version("vllm-ascend") == "0.30.0rc2"
    import torch_npu

    assert type(torch_npu).__name__ == "StandIn"  # no NPU here


def test_the_overlay_sits_in_vllm_ascends_own_tree_and_replaced_none_of_its_files():
    from vllm_ascend.worker.v2.spec_decode import draft_window
    from vllm_ascend.worker.v2.spec_decode.dspark import speculator

    site = Path(vllm_ascend.__file__).parent.parent
    assert Path(draft_window.__file__).is_relative_to(site / "vllm_ascend")
    assert Path(speculator.__file__).parent.parent == Path(draft_window.__file__).parent.parent
    recorded = (VENV / "vllm-ascend-files.sha256").read_text().splitlines()
    assert len(recorded) > 700
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
    assert state == install.Status(installed=True, release="vLLM 0.30.x with vllm-ascend 0.30.0rc2")
    before, after = loaded_plugins["before"], loaded_plugins["after"]
    changed = {key for key in before if after[key] is not before[key]}
    # Exactly the release's hooks, each wrapping the method it replaced; nothing else (vLLM's
    # SpeculatorCudaGraphManager, vllm-ascend's DFlash and EAGLE subclasses) changed.
    assert changed == {
        (DraftModelSpeculator, "set_attn"),
        (DraftModelSpeculator, "_build_attn_metadata"),
        (DFlashSpeculator, "capture"),
        (AutoRegressiveSpeculator, "propose"),
        (AutoRegressiveSpeculator, "_prefill"),
        (AutoRegressiveSpeculator, "init_cudagraph_manager"),
        (AscendAutoRegressiveSpeculator, "capture"),
        (AscendAutoRegressiveSpeculator, "_calc_next_seq_lens_cpu"),
        (AscendAutoRegressiveSpeculator, "build_fia_params"),
        (AscendAutoRegressiveSpeculator, "_build_attn_metadata"),
        (AutoRegressiveAclGraphManager, "capture"),
        (AscendDSparkSpeculator, "_prepare_draft_dcp_metadata_inputs"),
    }
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
    from vllm_ascend.worker.v2.spec_decode.draft_window import install, policy

    assert speculative_config(model_dir, {"draft_window_size": 512}).use_v2_model_runner
    # Every other Model Runner V2 method of vLLM 0.30 but MTP (which keeps its warning) is
    # one the release does not serve, e.g. extract_hidden_states.
    with pytest.raises(ValueError) as error:
        policy.refuse_method("extract_hidden_states", install.installation().release, 512)
    assert (
        "draft_window_size=512 is not supported on Model Runner V2 for speculative method "
        "'extract_hidden_states' on vLLM 0.30.x with vllm-ascend 0.30.0rc2; supported there: "
        "dflash, dspark, eagle, eagle3. Remove draft_window_size from additional_config or "
        "use one of those methods."
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
    """vllm-ascend 0.30.0rc2's AscendConfig forbids unknown keys and has no sinks field."""
    from vllm_ascend.worker.v2.spec_decode.draft_window import plugin

    keys = {"draft_window_size": "512", "draft_attention_sinks": 64}
    assert ascend_config(model_dir, keys).draft_window_size == 512
    with pytest.raises(ValueError, match=re.escape("draft_attention_sink")):
        ascend_config(model_dir, {"draft_window_size": 512, "draft_attention_sink": 64})
    plugin.unregister()
    with pytest.raises(ValueError, match="draft_attention_sinks"):
        ascend_config(model_dir, keys)
