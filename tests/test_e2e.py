# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The end-to-end harness, as far as it runs without NPUs: its plan, its refusal, its
metrics arithmetic and assertions, and its server lifecycle."""

import importlib.util
import socket
import subprocess
import sys
from pathlib import Path

import pytest

# The same code on every vLLM line: run once, in .venv (design/testing.md).
pytestmark = pytest.mark.release_independent

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("e2e_harness", ROOT / "e2e" / "e2e.py")
e2e = importlib.util.module_from_spec(spec)
sys.modules["e2e_harness"] = e2e
spec.loader.exec_module(e2e)


def plan_lines(capsys, argv, monkeypatch, **env):
    for key in (
        "E2E_SCENARIO",
        "DEVICE",
        "DRY_RUN",
        "TARGET_MODEL",
        "DRAFT_MODEL",
        "TP",
        "SINKS",
        "DCP",
        "DCP_INTERLEAVE",
        "STUDY",
    ):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert e2e.main(argv) == 0
    return capsys.readouterr().out.splitlines()


def serve_lines(lines):
    return [line for line in lines if " -m vllm.entrypoints.cli.main serve " in line]


def test_default_plan_installs_then_runs_v2_with_and_without_the_window_and_v1(capsys, monkeypatch):
    lines = plan_lines(capsys, ["--dry-run"], monkeypatch)
    assert lines[0].endswith(f"-m pip install --no-deps {ROOT}")
    assert "no vllm-ascend file was replaced" in lines[1]
    v2_window, v2_plain, v1_window = serve_lines(lines)
    assert v2_window.startswith(f"VLLM_USE_V2_MODEL_RUNNER=1 {sys.executable} -m ")
    assert " serve Qwen/Qwen3-8B " in v2_window
    assert "--tensor-parallel-size 2" in v2_window
    assert '"method": "eagle3"' in v2_window and '"num_speculative_tokens": 3' in v2_window
    assert """--additional-config '{"draft_window_size": 512}'""" in v2_window
    assert (
        v2_plain.startswith("VLLM_USE_V2_MODEL_RUNNER=1 ") and "--additional-config" not in v2_plain
    )
    assert v1_window.startswith("VLLM_USE_V2_MODEL_RUNNER=0 ") and "draft_window_size" in v1_window
    # Every server is stopped, and metrics are read around the long prompt.
    assert sum("kill -INT" in line for line in lines) == 3
    assert sum("/metrics" in line for line in lines) == 9
    assert any("the golden prompt, longer than W=512" in line for line in lines)


def test_the_host_vllm_says_whether_it_still_has_model_runner_v1():
    """Asked of the host's vLLM (here 0.33.0, which has V1)."""
    e2e.host_has_model_runner_v1.cache_clear()
    assert e2e.host_has_model_runner_v1()


@pytest.mark.parametrize("device", ["ascend", "cuda"])
def test_without_model_runner_v1_every_run_is_v2_with_nothing_to_set(device, capsys, monkeypatch):
    """On a vLLM without Model Runner V1 (0.34) no run sets VLLM_USE_V2_MODEL_RUNNER (0.34
    refuses it unless 1 and warns it is redundant) and there is no V1 run to compare with."""
    monkeypatch.setattr(e2e, "host_has_model_runner_v1", lambda: False)
    lines = plan_lines(capsys, ["--dry-run", "--device", device], monkeypatch)
    v2_window, v2_plain = serve_lines(lines)
    assert v2_window.startswith(f"{sys.executable} -m vllm.entrypoints.cli.main serve ")
    assert "draft_window_size" in v2_window and "--additional-config" not in v2_plain
    assert not any("VLLM_USE_V2_MODEL_RUNNER" in line for line in lines)
    assert sum("kill -INT" in line for line in lines) == 2


def test_sinks_go_to_the_v2_window_run_only_and_have_their_own_golden(capsys, monkeypatch):
    lines = plan_lines(capsys, ["--dry-run"], monkeypatch, SINKS="64")
    v2_window, v2_plain, v1_window = serve_lines(lines)
    assert """'{"draft_window_size": 512, "draft_attention_sinks": 64}'""" in v2_window
    assert "--additional-config" not in v2_plain
    assert """'{"draft_window_size": 512}'""" in v1_window and "sinks" not in v1_window
    scenario = e2e.scenarios({"SINKS": "64"})["eagle3"]
    assert scenario.golden.name == "eagle3_qwen3_8b_w512_s64.json"


def test_dspark_scenario_and_local_models_come_from_the_environment(capsys, monkeypatch):
    lines = plan_lines(
        capsys,
        [],
        monkeypatch,
        DRY_RUN="1",
        E2E_SCENARIO="dspark",
        TARGET_MODEL="/models/qwen3-8b",
        DRAFT_MODEL="/models/dspark",
    )
    v2_window = serve_lines(lines)[0]
    assert " serve /models/qwen3-8b " in v2_window
    assert '"method": "dspark", "model": "/models/dspark", "num_speculative_tokens": 7' in v2_window
    assert "--tensor-parallel-size 1" in v2_window


def test_tiny_cuda_mode_downloads_nothing_and_compares_window_on_and_off(capsys, monkeypatch):
    lines = plan_lines(capsys, [], monkeypatch, DRY_RUN="1", E2E_SCENARIO="tiny", DEVICE="cuda")
    serves = serve_lines(lines)
    assert len(serves) == 2
    assert all("--load-format dummy" in line and "<tmp>/target" in line for line in serves)
    assert not any("vllm-ascend" in line for line in lines)


def test_tiny_mode_needs_cuda(monkeypatch, capsys):
    monkeypatch.setenv("E2E_SCENARIO", "tiny")
    monkeypatch.delenv("DEVICE", raising=False)
    with pytest.raises(SystemExit) as info:
        e2e.main(["--dry-run"])
    assert info.value.code == 2 and "set DEVICE=cuda" in capsys.readouterr().err


def test_without_npus_it_stops_at_once_with_exit_code_2():
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable}
    result = subprocess.run(
        ["make", "-s", "e2e-ascend"], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert result.returncode == 2
    assert "needs Ascend NPUs: npu-smi not found" in result.stderr


def test_make_dry_run_prints_the_plan():
    result = subprocess.run(
        ["make", "-s", "e2e-ascend", "DRY_RUN=1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
    )
    assert result.returncode == 0
    assert len(serve_lines(result.stdout.splitlines())) == 3


def test_make_dry_run_with_dcp_serves_every_run_with_it():
    result = subprocess.run(
        ["make", "-s", "e2e-ascend", "DRY_RUN=1", "DCP=2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
    )
    assert result.returncode == 0
    serves = serve_lines(result.stdout.splitlines())
    assert len(serves) == 3
    assert all(" --decode-context-parallel-size 2" in line for line in serves)


def test_dcp_serves_every_run_alike_and_has_its_own_golden(capsys, monkeypatch):
    lines = plan_lines(capsys, ["--dry-run"], monkeypatch, DCP="2")
    v2_window, v2_plain, v1_window = serves = serve_lines(lines)
    # The eagle3 scenario's TP=2 is already a multiple of DCP: kept, nothing said.
    assert not any(line.startswith("# DCP") for line in lines)
    for line in serves:
        assert "--tensor-parallel-size 2 " in line
        assert " --decode-context-parallel-size 2" in line
        assert "--cp-kv-cache-interleave-size" not in line
    assert """--additional-config '{"draft_window_size": 512}'""" in v2_window
    assert "--additional-config" not in v2_plain
    assert v1_window.startswith("VLLM_USE_V2_MODEL_RUNNER=0 ") and "draft_window_size" in v1_window
    # The window aligns to 2 blocks under DCP=2: what the draft reads changes.
    assert e2e.scenarios({"DCP": "2"})["eagle3"].golden.name == "eagle3_qwen3_8b_w512_dcp2.json"
    assert e2e.scenarios({})["eagle3"].golden.name == "eagle3_qwen3_8b_w512.json"


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
        # The tiny scenario keeps its own TP=1 whatever TP says, so it is raised.
        (
            {
                "E2E_SCENARIO": "tiny",
                "DEVICE": "cuda",
                "DCP": "2",
                "DCP_INTERLEAVE": "8",
                "TP": "1",
            },
            2,
            "# DCP=2: --tensor-parallel-size 2, the tiny scenario's TP=1 raised to a "
            "multiple of DCP",
        ),
    ],
)
def test_dcp_fits_the_tensor_parallel_size_and_passes_the_interleave(
    env, tp, note, capsys, monkeypatch
):
    lines = plan_lines(capsys, ["--dry-run"], monkeypatch, **env)
    assert (lines[0] if lines[0].startswith("#") else None) == note
    serves = serve_lines(lines)
    flags = (
        f"--decode-context-parallel-size {env['DCP']} "
        f"--cp-kv-cache-interleave-size {env['DCP_INTERLEAVE']}"
    )
    assert serves and all(f"--tensor-parallel-size {tp} " in line for line in serves)
    assert all(flags in line for line in serves)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"DCP": "4", "TP": "2"},
            "DCP=4 needs a tensor parallel size that is a multiple of it "
            "(vLLM shards the KV over the TP ranks): TP=2 is not; set TP=4, or leave TP unset",
        ),
        ({"DCP": "0"}, "DCP must be a positive integer, got '0'"),
        ({"DCP": "two"}, "DCP must be a positive integer, got 'two'"),
        (
            {"DCP": "2", "DCP_INTERLEAVE": "-1"},
            "DCP_INTERLEAVE must be a positive integer, got '-1'",
        ),
        ({"DCP_INTERLEAVE": "16"}, "DCP_INTERLEAVE=16 needs DCP > 1"),
        ({"DCP": "2", "STUDY": "long"}, "STUDY=long does not take DCP=2"),
    ],
)
def test_bad_dcp_settings_stop_before_anything_runs(env, message, capsys, monkeypatch):
    with pytest.raises(SystemExit) as info:
        plan_lines(capsys, ["--dry-run"], monkeypatch, **env)
    captured = capsys.readouterr()
    assert info.value.code == 2 and message in captured.err
    assert " serve " not in captured.out


METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="0"}} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="1"}} {p1}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="2"}} {p2}
"""


def test_acceptance_comes_from_the_metric_deltas():
    before = METRICS.format(drafts=10.0, p0=5.0, p1=2.0, p2=1.0)
    after = METRICS.format(drafts=110.0, p0=75.0, p1=42.0, p2=31.0)
    got = e2e.acceptance(before, after, 3)
    assert got["drafts"] == 100 and got["per_position"] == [0.7, 0.4, 0.3]
    assert got["mean_length"] == pytest.approx(2.4)
    with pytest.raises(RuntimeError, match="no speculative drafts"):
        e2e.acceptance(before, before, 3)


def result(outputs, per_pos):
    return {
        "outputs": outputs,
        "acceptance": {"per_position": per_pos, "mean_length": 1 + sum(per_pos)},
    }


def test_a_missing_golden_stops_before_any_server_starts(tmp_path, monkeypatch):
    scenario = e2e.scenarios({"WINDOW": "640"})["eagle3"]
    assert scenario.golden.name == "eagle3_qwen3_8b_w640.json" and not scenario.golden.exists()
    monkeypatch.setattr(e2e, "install", lambda device: pytest.fail("installed before the check"))
    with pytest.raises(SystemExit, match="RECORD_GOLDEN=1"):
        e2e.run_scenario(scenario, "ascend", 1, tmp_path)


def test_checks_flag_output_drift_golden_drift_and_a_v2_below_v1():
    good = {
        "v2_window": result(["a"], [0.7, 0.4, 0.3]),
        "v2_no_window": result(["a"], [0.1] * 3),
        "v1_window": result(["a"], [0.7, 0.4, 0.3]),
    }
    assert e2e.check(good, [0.7, 0.4, 0.3]) == []
    bad = {
        "v2_window": result(["a"], [0.5, 0.4, 0.3]),
        "v2_no_window": result(["b"], [0.1] * 3),
        "v1_window": result(["a"], [0.7, 0.4, 0.3]),
    }
    failures = e2e.check(bad, [0.7, 0.4, 0.3])
    assert any("v2_no_window differ" in f for f in failures)
    assert any("position 0" in f for f in failures)
    assert any("< V1 with the window" in f for f in failures)


def test_server_is_stopped_and_leaves_no_process(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # A stand-in for vllm serve: answers every GET with 200 on loopback.
    # It stops on SIGINT as vllm serve does (a process started with SIGINT ignored, as under
    # make, would otherwise keep the default of ignoring it).
    script = (
        "import http.server, signal, sys\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.end_headers(); self.wfile.write(b'ok')\n"
        "    def log_message(self, *a): pass\n"
        f"http.server.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n"
    )
    with e2e.Server({}, [sys.executable, "-c", script], tmp_path / "server.log", port) as server:
        server.wait_healthy(timeout=30)
        pid = server.proc.pid
    assert server.proc.poll() is not None
    with pytest.raises(ProcessLookupError):
        import os

        os.kill(pid, 0)


def test_the_host_pairing_is_checked_against_the_supported_lines_before_any_server(capsys):
    """The probe runs in the host's Python (here the test environment, vLLM 0.33.0)."""
    from vllm_ascend.worker.v2.spec_decode.draft_window import releases

    e2e.check_pairing("eagle3")
    assert f"host: vLLM 0.33.0, vllm-ascend not installed; supported: {releases.SUPPORTED}" in (
        capsys.readouterr().out
    )
    with pytest.raises(
        SystemExit,
        match=r"the draft window does not serve method "
        r"'ngram' on vLLM 0\.33\.x",
    ):
        e2e.check_pairing("ngram")
