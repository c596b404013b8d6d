# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The end-to-end harness (``python -m e2e``), as far as it runs without NPUs: the `vllm
bench` commands it plans (``--dry-run``: what a user pastes), its refusals, what it reads of
a ``vllm bench serve`` result, and its assertions. (Its sweeps run for real on CPU in
``tests/test_engine_study.py``.)"""

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from e2e import checks, cli, harness, host, scenarios
from tests.cpu_testbed.vllm_cli import printed_sweeps as sweeps
from tests.cpu_testbed.vllm_cli import runs_of

# The same code on every vLLM line: run once, in .venv (design/testing.md).
pytestmark = pytest.mark.release_independent

ROOT = Path(__file__).resolve().parent.parent


def plan_lines(capsys, argv, monkeypatch, tmp_path=None, **given):
    """What ``python -m e2e`` prints with ``argv`` and the settings ``given`` (the
    Makefile's names) as their flags."""
    out = ["--out", str(tmp_path)] if tmp_path is not None else []
    assert harness.main([*argv, *cli.flags(given), *out]) == 0
    return capsys.readouterr().out.splitlines()


def test_default_plan_installs_then_sweeps_v2_with_and_without_the_window_and_v1(
    capsys, monkeypatch, tmp_path
):
    lines = plan_lines(capsys, ["--dry-run"], monkeypatch, tmp_path)
    # The install with its checks and the pairing check, as one command that fails loudly.
    prepare = [sys.executable, "-m", "e2e", "--prepare", "--device", "ascend"]
    prepare = shlex.join([*prepare, "--scenario", "eagle3"])
    assert lines[0] == f"cd {shlex.quote(str(ROOT))} && {prepare}"
    v2, v1 = found = sweeps(lines)
    assert v2["env"] == {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    assert v1["env"] == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    for s in found:
        assert " serve Qwen/Qwen3-8B " in s["serve"] and "--tensor-parallel-size 2" in s["serve"]
        assert s["bench"].split()[1:3] == ["bench", "serve"] and "--temperature 0" in s["bench"]
        assert "--skip-chat-template" not in s["bench"]
    eagle3 = {"method": "eagle3", "model": "RedHatAI/Qwen3-8B-speculator.eagle3"}
    spec = {**eagle3, "num_speculative_tokens": 3}
    assert runs_of(found) == {
        "v2_window": {"speculative_config": spec, "additional_config": {"draft_window_size": 512}},
        "v2_no_window": {"speculative_config": spec},
        "v1_window": {"speculative_config": spec, "additional_config": {"draft_window_size": 512}},
    }
    workloads = {w["_benchmark_name"]: w for w in v2["workloads"]}
    assert [(w["num_prompts"], w["custom_output_len"]) for w in workloads.values()] == [
        (1, 32),
        (7, 128),
        (2, 32),
    ]
    (golden,) = Path(workloads["golden"]["dataset_path"]).read_text().splitlines()
    assert json.loads(golden)["prompt"].endswith(" What is 2+2?")


def test_the_host_vllm_says_whether_it_still_has_model_runner_v1():
    """Asked of the host's vLLM as the plugin asks it (here 0.33.0, which has V1)."""
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import versions

    scenarios.host_has_model_runner_v1.cache_clear()
    assert scenarios.host_has_model_runner_v1() is versions.has_model_runner_v1() is True


@pytest.mark.parametrize("device", ["ascend", "cuda"])
def test_without_model_runner_v1_every_run_is_v2_with_nothing_to_set(
    device, capsys, monkeypatch, tmp_path
):
    """On a vLLM without Model Runner V1 (0.34) no run sets VLLM_USE_V2_MODEL_RUNNER (0.34
    refuses it unless 1 and warns it is redundant) and there is no V1 run to compare with."""
    monkeypatch.setattr(scenarios, "host_has_model_runner_v1", lambda: False)
    lines = plan_lines(capsys, ["--dry-run", "--device", device], monkeypatch, tmp_path)
    (only,) = sweeps(lines)
    assert only["env"] == {} and list(runs_of([only])) == ["v2_window", "v2_no_window"]
    assert not any("VLLM_USE_V2_MODEL_RUNNER" in line for line in lines)


def test_sinks_go_to_the_v2_window_run_only_and_have_their_own_golden(
    capsys, monkeypatch, tmp_path
):
    lines = plan_lines(capsys, ["--dry-run"], monkeypatch, tmp_path, SINKS="64")
    runs = runs_of(sweeps(lines))
    assert runs["v2_window"]["additional_config"] == {
        "draft_window_size": 512,
        "draft_attention_sinks": 64,
    }
    assert "additional_config" not in runs["v2_no_window"]
    assert runs["v1_window"]["additional_config"] == {"draft_window_size": 512}
    scenario = scenarios.scenarios({"SINKS": "64"})["eagle3"]
    assert scenario.golden.name == "eagle3_qwen3_8b_w512_s64.json"


def test_dspark_scenario_and_local_models_come_from_the_environment(capsys, monkeypatch, tmp_path):
    lines = plan_lines(
        capsys,
        [],
        monkeypatch,
        tmp_path,
        DRY_RUN="1",
        E2E_SCENARIO="dspark",
        TARGET_MODEL="/models/qwen3-8b",
        DRAFT_MODEL="/models/dspark",
    )
    found = sweeps(lines)
    assert " serve /models/qwen3-8b " in found[0]["serve"]
    assert "--model /models/qwen3-8b " in found[0]["bench"]
    assert "--tensor-parallel-size 1" in found[0]["serve"]
    spec = runs_of(found)["v2_window"]["speculative_config"]
    assert spec == {"method": "dspark", "model": "/models/dspark", "num_speculative_tokens": 7}


def test_tiny_cuda_mode_serves_the_models_trained_here(capsys, monkeypatch, tmp_path):
    """Downloads nothing: the committed target and EAGLE3 head (``trained_models/``), plain
    text prompts of their held-out text (the byte tokenizer has no chat template)."""
    lines = plan_lines(
        capsys, [], monkeypatch, tmp_path, DRY_RUN="1", E2E_SCENARIO="tiny", DEVICE="cuda"
    )
    (found,) = sweeps(lines)
    assert f" serve {scenarios.TRAINED_ROOT / 'target'} " in found["serve"]
    assert "--skip-chat-template" in found["bench"]
    runs = runs_of([found])
    assert runs["v2_window"]["speculative_config"]["model"] == str(
        scenarios.TRAINED_ROOT / "eagle3"
    )
    assert runs["v2_window"]["additional_config"] == {"draft_window_size": 33}
    heldout = scenarios.trained_models().HELDOUT.read_text()
    for workload in found["workloads"]:
        for line in Path(workload["dataset_path"]).read_text().splitlines():
            assert json.loads(line)["prompt"] in heldout
    assert not any("vllm-ascend" in line for line in lines)


def test_tiny_mode_needs_cuda(capsys):
    with pytest.raises(SystemExit) as info:
        harness.main(["--dry-run", "--scenario", "tiny"])
    assert info.value.code == 2 and "set DEVICE=cuda" in capsys.readouterr().err


def test_without_npus_it_stops_at_once_with_exit_code_2():
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable}
    result = subprocess.run(
        ["make", "-s", "e2e-ascend"], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert result.returncode == 2
    assert "needs Ascend NPUs: npu-smi not found" in result.stderr


@pytest.mark.parametrize(
    ("extra", "flag"), [([], None), (["DCP=2"], "--decode-context-parallel-size 2")]
)
def test_make_dry_run_prints_the_sweeps_to_paste(extra, flag, tmp_path):
    result = subprocess.run(
        ["make", "-s", "e2e-ascend", "DRY_RUN=1", f"OUT={tmp_path}", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
    )
    assert result.returncode == 0, result.stderr
    found = sweeps(result.stdout.splitlines())
    assert len(found) == 2 and len(runs_of(found)) == 3
    assert all(flag is None or flag in s["serve"] for s in found)
    # Into the folder named, not the checkout's.
    assert (tmp_path / "eagle3" / "run.json").is_file()


def test_dcp_serves_every_run_alike_and_has_its_own_golden(capsys, monkeypatch, tmp_path):
    lines = plan_lines(capsys, ["--dry-run"], monkeypatch, tmp_path, DCP="2")
    # The eagle3 scenario's TP=2 is already a multiple of DCP: kept, nothing said.
    assert not any(line.startswith("# DCP") for line in lines)
    for s in sweeps(lines):
        assert "--tensor-parallel-size 2 " in s["serve"]
        assert s["serve"].endswith(" --decode-context-parallel-size 2")
    # The window aligns to 2 blocks under DCP=2: what the draft reads changes.
    assert (
        scenarios.scenarios({"DCP": "2"})["eagle3"].golden.name == "eagle3_qwen3_8b_w512_dcp2.json"
    )
    assert scenarios.scenarios({})["eagle3"].golden.name == "eagle3_qwen3_8b_w512.json"


@pytest.mark.parametrize(
    ("env", "tp", "note"),
    [
        # The scenario's own TP=1 is raised to the smallest multiple of DCP, and says so.
        (
            {"E2E_SCENARIO": "dspark", "DCP": "4", "DCP_INTERLEAVE": "16"},
            4,
            "# DCP=4: --tensor-parallel-size 4, the dspark scenario's TP=1 raised to a "
            "multiple of DCP",
        ),
        # A TP set by hand that is a multiple stays.
        ({"E2E_SCENARIO": "dspark", "DCP": "2", "DCP_INTERLEAVE": "1", "TP": "4"}, 4, None),
        # The tiny scenario's own TP=1 is raised the same way.
        (
            {
                "E2E_SCENARIO": "tiny",
                "DEVICE": "cuda",
                "DCP": "2",
                "DCP_INTERLEAVE": "8",
            },
            2,
            "# DCP=2: --tensor-parallel-size 2, the tiny scenario's TP=1 raised to a "
            "multiple of DCP",
        ),
    ],
)
def test_dcp_fits_the_tensor_parallel_size_and_passes_the_interleave(
    env, tp, note, capsys, monkeypatch, tmp_path
):
    lines = plan_lines(capsys, ["--dry-run"], monkeypatch, tmp_path, **env)
    assert (lines[0] if lines[0].startswith("#") else None) == note
    flags = (
        f"--decode-context-parallel-size {env['DCP']} "
        f"--cp-kv-cache-interleave-size {env['DCP_INTERLEAVE']}"
    )
    found = sweeps(lines)
    assert found and all(f"--tensor-parallel-size {tp} " in s["serve"] for s in found)
    assert all(flags in s["serve"] for s in found)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"DCP": "4", "TP": "2"},
            "DCP=4 needs a tensor parallel size that is a multiple of it "
            "(vLLM shards the KV over the TP ranks): TP=2 is not; set TP=4, or leave TP unset",
        ),
        ({"DCP": "0"}, "DCP='0' is not an integer >= 1"),
        ({"DCP": "two"}, "DCP='two' is not an integer >= 1"),
        ({"DCP": "2", "DCP_INTERLEAVE": "-1"}, "DCP_INTERLEAVE='-1' is not an integer >= 1"),
        ({"DCP_INTERLEAVE": "16"}, "DCP_INTERLEAVE=16 needs DCP > 1"),
        ({"DCP": "2", "STUDY": "long"}, "STUDY=long does not take DCP=2"),
    ],
)
def test_bad_dcp_settings_stop_before_anything_runs(env, message, capsys, monkeypatch, tmp_path):
    with pytest.raises(SystemExit) as info:
        plan_lines(capsys, ["--dry-run"], monkeypatch, tmp_path, **env)
    captured = capsys.readouterr()
    assert info.value.code == 2 and message in captured.err
    assert "bench sweep serve" not in captured.out


def test_acceptance_is_what_vllm_bench_serve_measured():
    """The fields ``vllm bench serve`` writes from its two scrapes of /metrics."""
    measured = {
        "spec_decode_num_drafts": 100,
        "spec_decode_per_position_acceptance_rates": [0.7, 0.4, 0.3],
        "spec_decode_acceptance_length": 2.4,
    }
    assert checks.acceptance(measured) == {
        "drafts": 100,
        "per_position": [0.7, 0.4, 0.3],
        "mean_length": 2.4,
    }


def result(outputs, per_pos, long_mean=None):
    mean = 1 + sum(per_pos)
    return {
        "outputs": {"golden": outputs},
        "acceptance": {"per_position": per_pos, "mean_length": mean},
        "all_long": {"per_position": per_pos, "mean_length": long_mean or mean},
    }


def test_without_a_golden_the_acceptance_is_checked_within_the_run():
    """Every scenario without a golden file (DSpark, DFlash, sinks, MIN_CONTEXT, DCP, another
    WINDOW) runs: the V2 run with the window against the same run without it."""
    scenario = scenarios.scenarios({"WINDOW": "640"})["eagle3"]
    assert scenario.golden.name == "eagle3_qwen3_8b_w640.json" and not scenario.golden.exists()
    assert checks.load_golden(scenario, False) is None
    runs = {
        "v2_window": result(["a"], [0.7, 0.4, 0.3]),
        "v2_no_window": result(["a"], [0.7, 0.5, 0.3]),
    }
    assert checks.check(runs, None, num_spec=3) == []
    runs["v2_window"] = result(["a"], [0.5, 0.3, 0.2])
    assert checks.check(runs, None, num_spec=3) == [
        f"V2 with the window: mean acceptance 2.000 < V2 without it 2.500 - {checks.WINDOW_MARGIN}"
    ]


@pytest.mark.parametrize("per_position", [[], [0.7, 0.4]])
def test_an_empty_or_short_acceptance_by_position_fails(per_position):
    runs = {
        "v2_window": result(["a"], per_position),
        "v2_no_window": result(["a"], [0.7, 0.4, 0.3]),
    }
    assert (
        checks.check(runs, [0.7, 0.4, 0.3], num_spec=3)
        == [
            f"v2_window: acceptance by position has {len(per_position)} entries, "
            "num_speculative_tokens is 3"
        ]
        * 2
    )


def test_checks_flag_output_drift_golden_drift_and_a_v2_below_v1():
    good = {
        "v2_window": result(["a"], [0.7, 0.4, 0.3]),
        "v2_no_window": result(["a"], [0.7, 0.4, 0.3]),
        "v1_window": result(["a"], [0.7, 0.4, 0.3]),
    }
    assert checks.check(good, [0.7, 0.4, 0.3], num_spec=3) == []
    bad = {
        "v2_window": result(["a"], [0.5, 0.4, 0.3], long_mean=2.0),
        "v2_no_window": result(["b"], [0.5, 0.4, 0.3], long_mean=2.0),
        "v1_window": result(["a"], [0.7, 0.4, 0.3], long_mean=2.1),
    }
    assert checks.check(bad, [0.7, 0.4, 0.3], num_spec=3) == [
        "greedy outputs of v2_no_window differ from v2_window in 1 of 1 prompts: golden "
        "prompt 0 from character 0",
        "acceptance at position 0: 0.500, golden 0.700 (+-0.1)",
        "V2 with the window: mean acceptance 2.000 < V1 with the window 2.100 - 0.05",
    ]
    assert bad["v2_no_window"]["lossless"] == {
        "reference": "v2_window",
        "identical": 0,
        "total": 1,
        "divergences": [{"workload": "golden", "prompt": 0, "character": 0}],
    }


def test_the_dry_runs_prepare_command_installs_and_checks_the_pairing(monkeypatch, capsys):
    done = []
    monkeypatch.setattr(host, "install", lambda device: done.append(("install", device)))
    monkeypatch.setattr(host, "check_pairing", lambda method: done.append(("pairing", method)))
    argv = ["--prepare", "--device", "cpu", "--scenario", "draft_model", "--study", "long"]
    assert harness.main(argv) == 0
    assert done == [("install", "cpu"), ("pairing", "draft_model")]
    assert "bench sweep serve" not in capsys.readouterr().out


def test_the_host_pairing_is_checked_against_the_supported_lines_before_any_server(capsys):
    """The probe runs in the host's Python (here the test environment, vLLM 0.33.0)."""
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import supported

    host.check_pairing("eagle3")
    assert f"host: vLLM 0.33.0, vllm-ascend not installed; supported: {supported.SUPPORTED}" in (
        capsys.readouterr().out
    )
    with pytest.raises(
        SystemExit,
        match=r"the draft window does not serve method "
        r"'ngram' on vLLM 0\.33\.x",
    ):
        host.check_pairing("ngram")
