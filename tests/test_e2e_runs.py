# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What a run of the end-to-end harness owns and what it refuses, without a server: a run
reads only what it wrote (a stale result left in its folder never reaches its report, a
second run into the folder gives its own numbers), a failed ``vllm bench sweep serve``
fails the run with the end of its log, every report says what produced it, the lossless
check over recorded texts (exact on CPU, the fraction identical on a device), every bad
setting stopped by name before anything runs (the dry run too), and ``PARALLEL`` servers
on cards of their own. ``vllm bench sweep serve`` is played by a stand-in that writes what
vLLM's writes and, as vLLM 0.33's does, refuses an experiment folder that exists."""

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from e2e import checks, cli, harness, host, lossless, reports, scenarios, study, sweep_plan
from tests.cpu_testbed.vllm_cli import sweep_words

ROOT = Path(__file__).resolve().parent.parent

# The same code on every vLLM line: run once, in .venv (design/testing.md).
pytestmark = pytest.mark.release_independent

# What `vllm bench sweep serve` does, as far as the harness reads it: one folder per
# experiment (refused when it exists), one run=0.json per run and workload with the fields
# `vllm bench serve` saves, the server's start-up lines in its output.
STAND_IN = """
import argparse, json, os, sys
from pathlib import Path
import pandas as pd
p = argparse.ArgumentParser()
for flag in ("--serve-cmd", "--bench-cmd", "--serve-params", "--bench-params", "--output-dir",
             "--experiment-name", "--num-runs", "--server-ready-timeout"):
    p.add_argument(flag)
p.add_argument("--show-stdout", action="store_true")
args, _ = p.parse_known_args(sys.argv[4:])
experiment = Path(args.output_dir) / args.experiment_name
if os.environ.get("STAND_IN_FAIL"):
    print("RuntimeError: Server failed to start in time (stand-in)")
    sys.exit(1)
if experiment.exists():
    print(f"ValueError: Cannot overwrite existing experiment_dir={experiment}")
    sys.exit(1)
length = float(os.environ["STAND_IN_LENGTH"])
rows = []
for serve in json.loads(Path(args.serve_params).read_text()):
    name = serve["_benchmark_name"]
    print(f"Server overrides: {{'_benchmark_name': '{name}'}}")
    window = serve.get("additional_config", {}).get("draft_window_size")
    if window is not None:
        print(f"INFO Draft KV window on for eagle3: draft_window_size={window}, stand-in")
        print("INFO Draft KV window active: the first draft metadata build is windowed.")
    for bench in json.loads(Path(args.bench_params).read_text()):
        prompts = Path(bench["dataset_path"]).read_text().splitlines()
        # STAND_IN_DIVERGE=k: every k-th text of a windowed server differs from the others'.
        every = int(os.environ.get("STAND_IN_DIVERGE") or 0) if window is not None else 0
        result = {
            "generated_texts": [
                f"other {i}" if every and i % every == every - 1 else f"text {i}"
                for i in range(len(prompts))
            ],
            "output_throughput": 10.0, "mean_tpot_ms": 1.0, "mean_ttft_ms": 1.0,
            "num_prompts": len(prompts), "completed": len(prompts), "failed": 0, "errors": [],
        }
        if os.environ.get("STAND_IN_OTHER_SERVER"):
            # What vllm bench serve saves where another server answers on the port.
            result |= {"completed": 0, "failed": len(prompts), "errors": ["Not Found"] * 2}
        if "speculative_config" in serve:
            # Past the drafter's training context the window gains.
            gain = 1.0 if window and "1024" in bench["_benchmark_name"] else 0.0
            result |= {
                "spec_decode_acceptance_length": length + gain,
                "spec_decode_acceptance_rate": 50.0,
                "spec_decode_per_position_acceptance_rates": [0.5, 0.3, 0.2],
                "spec_decode_num_drafts": 10,
            }
        folder = experiment / f"SERVE--{name}-BENCH--{bench['_benchmark_name']}"
        folder.mkdir(parents=True)
        (folder / "run=0.json").write_text(json.dumps(result))
        # As vLLM records a run: the serve parameters, then the bench ones over them.
        rows.append({**result, "run_number": 0, **serve, **bench})
    print("[END SERVER]")
pd.DataFrame.from_records(rows).to_csv(experiment / "summary.csv")
"""


@pytest.fixture
def study_run(tmp_path, monkeypatch):
    """Runs the CPU study of the EAGLE3 head at 32 and 1024 tokens into ``tmp_path`` with
    the stand-in for ``vllm bench sweep serve`` (its mean acceptance length ``length``):
    its exit code and what it printed. The install, the pairing check and vLLM's cutter are
    left out (each has its own test)."""
    stand_in = tmp_path / "vllm"
    stand_in.write_text(f"#!{sys.executable}\n{STAND_IN}")
    stand_in.chmod(0o755)
    monkeypatch.setattr(sweep_plan, "vllm_command", lambda: str(stand_in))
    monkeypatch.setattr(host, "install", lambda device: None)
    monkeypatch.setattr(host, "check_pairing", lambda method: None)

    def cut(commands):
        for command in commands:
            out = Path(command[command.index("--output") + 1])
            prompts = int(command[command.index("--num-prompts") + 1])
            sweep_plan.write_dataset(out, ["prompt"] * prompts, 4)

    monkeypatch.setattr(harness, "cut_datasets", cut)
    scenario = scenarios.cpu_scenarios({"PROMPTS_PER_CONTEXT": "2"})["eagle3"]
    settings = study.Settings([32, 1024], 2, 4, 32, long_from=512, short_to=32)
    out = tmp_path / "results" / "study_eagle3"

    def run(length: float, given: dict[str, str] | None = None, **env: str) -> int:
        """The study with the settings ``given``, the stand-in's ``env``."""
        for key, value in {"STAND_IN_LENGTH": str(length), **env}.items():
            monkeypatch.setenv(key, value)
        return harness.run_study(scenario, "cpu", 8123, out, settings, False, given)

    return run, out


def means(out: Path) -> dict[str, dict[str, float]]:
    report = json.loads((out / "report.json").read_text())
    return {
        name: {c: m["mean_length"] for c, m in run["contexts"].items()}
        for name, run in report["runs"].items()
        if name != "no_speculation"
    }


def test_a_stale_result_in_the_folder_never_reaches_the_report(study_run, capsys):
    run, out = study_run
    # An earlier run's folder, with a result whose acceptance no run of this one gives.
    stale = out / "v2" / "SERVE--v2_window-BENCH--context_1024_concurrency_2" / "run=0.json"
    stale.parent.mkdir(parents=True)
    stale.write_text(json.dumps({"spec_decode_acceptance_length": 9.99}))
    (out / cli.RUN_RECORD).write_text("{}")
    assert run(2.0) == 0, capsys.readouterr().out
    assert means(out) == {
        "v2_window": {"32": 2.0, "1024": 3.0},
        "v2_no_window": {"32": 2.0, "1024": 2.0},
    }
    assert "9.99" not in (out / "report.md").read_text() + (out / "report.json").read_text()
    # A second run into the same folder gives its own numbers.
    assert run(2.5) == 0, capsys.readouterr().out
    assert means(out)["v2_no_window"] == {"32": 2.5, "1024": 2.5}


def test_every_report_says_what_produced_it(study_run, capsys):
    run, out = study_run
    assert run(2.0, {"DTYPE": "bfloat16"}) == 0, capsys.readouterr().out
    produced = json.loads((out / "report.json").read_text())["produced_by"]
    assert produced["versions"]["vllm"] == "0.33.0"
    assert produced["versions"]["vllm-ascend"] is None
    assert produced["models"] == {
        "target": str(scenarios.TRAINED_ROOT / "target"),
        "draft": str(scenarios.TRAINED_ROOT / "eagle3"),
        "method": "eagle3",
    }
    assert produced["settings"] == {"DTYPE": "bfloat16"}
    assert produced["started"] <= produced["finished"] and produced["device"] == "cpu"
    md = (out / "report.md").read_text()
    assert "Produced by: " in md and "vllm 0.33.0, vllm-ascend not installed" in md
    assert "- v2_window: 4 of 4 identical to no_speculation's; divergences: none" in md


def test_a_failed_sweep_fails_the_run_with_the_end_of_its_log(study_run, capsys):
    run, out = study_run
    assert run(2.0, STAND_IN_FAIL="1") == 1
    printed = capsys.readouterr().out
    assert f"vllm bench sweep serve (v2) exited 1; the end of its log, {out / 'v2.log'}:" in (
        printed
    )
    assert "RuntimeError: Server failed to start in time (stand-in)" in printed
    assert not (out / "report.json").exists()


def test_failed_requests_fail_the_run(study_run, capsys):
    run, out = study_run
    assert run(2.0, STAND_IN_OTHER_SERVER="1") == 1
    printed = capsys.readouterr().out
    assert (
        "no_speculation context_32_concurrency_2: 2 of 2 requests failed (vllm bench serve: "
        f"'Not Found'; is another server on its port? see {out / 'v2.log'})" in printed
    )


def test_a_run_takes_free_ports():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        assert host.free_ports(2, port) > port


def test_a_folder_no_run_wrote_is_refused_by_name(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep")
    with pytest.raises(SystemExit, match=r"holds files no run of this harness wrote"):
        host.own_folder(folder)
    assert (folder / "notes.txt").read_text() == "keep"


# make demo's texts (vLLM 0.33.0 on CPU, no speculation, 8 prompts of 1024 tokens of held-out
# text, 16 tokens each), as the lossless check's reference.
RECORDED = [
    " None the the th",
    "sser_state_state",
    "str, torch.Tenso",
    "e = self.config.",
    "                ",
    " str, str, torch",
    "                ",
    "alloade the the ",
]


def diverged(flips: dict[int, int]) -> list[str]:
    """The recorded texts with the divergence a flipped near-tie token gives: the same up to
    a character, another continuation from it."""
    return [
        text[:at] + "#" * (len(text) - at) if (at := flips.get(i)) is not None else text
        for i, text in enumerate(RECORDED)
    ]


def test_the_exact_check_names_every_divergence():
    reference = {"no_speculation": {"outputs": {"context_1024": RECORDED}}}
    runs = {**reference, "v2_window": {"outputs": {"context_1024": diverged({5: 11})}}}
    found, failures = lossless.check(runs, "no_speculation", lossless.Policy("exact"))
    assert failures == [
        "greedy outputs of v2_window differ from no_speculation in 1 of 8 prompts: "
        "context_1024 prompt 5 from character 11"
    ]
    assert found["v2_window"]["identical"] == 7


@pytest.mark.parametrize(
    ("flips", "failure"),
    [
        # 6 of 8 (75%): passes, its divergences kept in the report.
        ({2: 4, 6: 0}, None),
        # 5 of 8 (62%): below the threshold.
        (
            {0: 1, 2: 4, 6: 0},
            "v2_window: 5 of 8 texts identical to no_speculation's (62%), below "
            "MIN_IDENTICAL=0.66; first divergences: context_1024 prompt 0 from character 1, "
            "context_1024 prompt 2 from character 4, context_1024 prompt 6 from character 0",
        ),
    ],
)
def test_on_a_device_the_check_counts_identical_texts_against_a_threshold(flips, failure):
    runs = {
        "no_speculation": {"outputs": {"context_1024": RECORDED}},
        "v2_window": {"outputs": {"context_1024": diverged(flips)}},
    }
    policy = lossless.Policy.for_run("ascend", {})
    assert policy == lossless.Policy("fraction", 0.66)
    found, failures = lossless.check(runs, "no_speculation", policy)
    assert failures == ([failure] if failure else [])
    assert found["v2_window"]["divergences"] == [
        {"workload": "context_1024", "prompt": i, "character": at}
        for i, at in sorted(flips.items())
    ]


def test_a_missing_text_diverges_and_cpu_is_exact_unless_asked():
    compared = lossless.compare({"a": ["x", "y"]}, {"a": ["x"]})
    assert compared == {
        "identical": 1,
        "total": 2,
        "divergences": [{"workload": "a", "prompt": 1, "character": 0}],
    }
    assert lossless.Policy.for_run("cpu", {}).mode == "exact"
    asked = lossless.Policy.for_run("cpu", {"LOSSLESS": "fraction", "MIN_IDENTICAL": "0.9"})
    assert asked == lossless.Policy("fraction", 0.9)


def dry_run(capsys, monkeypatch, tmp_path, **given) -> tuple[int, str, str]:
    """``python -m e2e --dry-run`` with the settings ``given`` as their flags (the cards as
    the environment's): its exit code, what it printed and its errors."""
    for key in cli.DEVICE_ENV:
        monkeypatch.delenv(key, raising=False)
        if key in given:
            monkeypatch.setenv(key, given.pop(key))
    try:
        code = harness.main(["--dry-run", *cli.flags(given), "--out", str(tmp_path)])
    except SystemExit as stop:
        code = stop.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SINKS": "-3"}, "SINKS='-3' is not an integer >= 0"),
        ({"DEVICE": "tpu"}, "DEVICE='tpu' is not one of: ascend, cuda, cpu"),
        ({"STUDY": "short"}, "STUDY='short' is not one of: long"),
        ({"STUDY": "long", "PARALLEL": "0"}, "PARALLEL='0' is not an integer >= 1"),
        (
            {"E2E_SCENARIO": "bogus"},
            "E2E_SCENARIO='bogus' is not one of: eagle3, dspark, draft_model, dflash, tiny",
        ),
        ({"DCP": "abc"}, "DCP='abc' is not an integer >= 1"),
        ({"DTYPE": "fp8"}, "DTYPE='fp8' is not one of: auto, bfloat16, float16, float32"),
        ({"MIN_IDENTICAL": "2"}, "MIN_IDENTICAL='2' is not a fraction from 0 to 1"),
    ],
)
def test_a_bad_setting_stops_the_dry_run_with_one_error_naming_it(
    env, message, capsys, monkeypatch, tmp_path
):
    code, out, err = dry_run(capsys, monkeypatch, tmp_path, **env)
    assert code == 2 and out == ""
    (error,) = [line for line in err.splitlines() if "error:" in line]
    # The flag, and in the message the setting as the Makefile names it.
    flag = cli.SETTINGS[message.split("=")[0]][0]
    assert error.endswith(f"error: argument {flag}: {message}")


def test_the_makefile_passes_every_setting_as_its_flag_and_nothing_else():
    """make's table (E2E_SETTINGS) is the command line's but for the study's own settings,
    which its code passes, and ``cli.flags`` refuses a name that is no setting."""
    text = (ROOT / "Makefile").read_text().split("E2E_SETTINGS := ")[1].split("\ne2e_flag")[0]
    table = dict(pair.split(":") for pair in text.replace("\\", " ").split())
    assert {name: f"--{flag}" for name, flag in table.items()} == {
        name: flag for name, (flag, _, _) in cli.SETTINGS.items() if name not in cli.STUDY_OWN
    }
    assert cli.flags({"SINKS": "32", "DRY_RUN": "1", "TOP_K": ""}) == [
        *("--sinks", "32", "--dry-run", "1")
    ]
    with pytest.raises(ValueError, match="not a setting of python -m e2e: SINK"):
        cli.flags({"SINK": "32"})


def test_make_passes_a_bad_setting_to_the_check():
    result = subprocess.run(
        ["make", "-s", "e2e-ascend", "DRY_RUN=1", "SINKS=-3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
    )
    assert result.returncode == 2 and "SINKS='-3' is not an integer >= 0" in result.stderr
    assert "bench sweep serve" not in result.stdout


def sweep_envs(out: str) -> dict[str, dict[str, str]]:
    """Each printed ``vllm bench sweep serve`` line's experiment name and environment."""
    found = {}
    for line in out.splitlines():
        if " bench sweep serve " in line:
            env, words = sweep_words(line)
            name = words[words.index("--experiment-name") + 1]
            found[name] = {k: v for k, v in env.items() if k != "PYTHONUNBUFFERED"}
    return found


def test_parallel_servers_get_cards_of_their_own(capsys, monkeypatch, tmp_path):
    # CUDA: two servers of the EAGLE3 scenario (TP = 2), four cards split in two.
    env = {"STUDY": "long", "DEVICE": "cuda", "PARALLEL": "2", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    code, out, err = dry_run(capsys, monkeypatch, tmp_path, **env)
    assert code == 0, err
    cards = {name: e.get("CUDA_VISIBLE_DEVICES") for name, e in sweep_envs(out).items()}
    assert cards == {"v2_0": "0,1", "v2_1": "2,3"}
    # Ascend: DSpark (TP = 1) on 4, 5 and 6 of what is given; V1 after V2, on the first's.
    env = {
        **env,
        "DEVICE": "ascend",
        "E2E_SCENARIO": "dspark",
        "PARALLEL": "3",
        "ASCEND_RT_VISIBLE_DEVICES": "4,5,6,7",
    }
    code, out, err = dry_run(capsys, monkeypatch, tmp_path, **env)
    assert code == 0, err
    found = sweep_envs(out)
    cards = {name: e.get("ASCEND_RT_VISIBLE_DEVICES") for name, e in found.items()}
    assert cards == {"v2_0": "4", "v2_1": "5", "v2_2": "6", "v1": "4"}
    assert not any("CUDA_VISIBLE_DEVICES" in e for e in found.values())


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"DEVICE": "cuda", "CUDA_VISIBLE_DEVICES": "0,1,2"},
            "PARALLEL=2 with --tensor-parallel-size 2 needs 4 cards, 2 per server: "
            "CUDA_VISIBLE_DEVICES='0,1,2' names 3; name at least 4, or lower PARALLEL",
        ),
        (
            {"DEVICE": "ascend"},
            "PARALLEL=2 with --tensor-parallel-size 2 needs 4 cards, 2 per server: "
            "ASCEND_RT_VISIBLE_DEVICES='' names 0; name at least 4, or lower PARALLEL",
        ),
    ],
)
def test_a_split_that_does_not_fit_is_refused_by_name(env, message, capsys, monkeypatch, tmp_path):
    code, out, err = dry_run(capsys, monkeypatch, tmp_path, STUDY="long", PARALLEL="2", **env)
    assert code == 2 and "bench sweep serve" not in out and err.endswith(f"error: {message}\n")


def report(window: int, sinks: int, trained: int, runs: dict[str, float]) -> dict:
    """A study report as far as make bench reads it: each run's mean acceptance length at
    two contexts and under load at one workload."""

    def measured(mean: float) -> dict:
        return {"mean_length": mean, "output_tokens_per_s": 10.0 * mean, "shared_prefix": 0}

    return {
        "window": window,
        "sinks": sinks,
        "num_spec": 3,
        "prompts_per_context": 8,
        "output_tokens": 16,
        "draft_training_context": trained,
        "contexts": [32, 1024],
        "workloads": ["context_1024_concurrency_4"],
        "failures": [],
        "runs": {
            name: {
                "contexts": {"32": measured(mean), "1024": measured(mean)},
                "workloads": {"context_1024_concurrency_4": {**measured(mean), "concurrency": 4}},
            }
            for name, mean in runs.items()
        },
    }


def test_make_bench_labels_its_runs_from_the_reports_config():
    from benchmarks import long_context

    runs = {"no_speculation": 1.0, "v2_window": 3.0, "v2_no_window": 2.0, "v2_window_sinks": 3.1}
    curves = {
        "draft_model": report(40, 16, 128, {**runs, "v2_window_96": 3.2}),
        "eagle3": report(40, 16, 128, runs),
    }
    seeded = {"temperature": "0.8", "seed": "0"}
    one = {**report(40, 0, 128, {"v2_no_window": 1.5, "v2_window": 1.8}), "sampling": seeded}
    sampled = {"draft_model": one, "eagle3": one}
    rerun = report(40, 0, 128, {"v2_no_window": 1.5, "v2_window": 1.9})
    dflash_runs = {run: {32: 3.0, 1024: 2.0} for run in ("v2_no_window", "v2_window", "v2_auto")}
    dflash = {
        "contexts": [32, 1024],
        "window": 40,
        "sampling": seeded,
        "training_context": 128,
        "num_spec": 3,
        "means": {"greedy": dflash_runs, "t0.8": dflash_runs},
        "identical": 48,
        "total": 48,
    }
    studies = {
        "curves": curves,
        "avx2": curves,
        "load": curves,
        "sampled": sampled,
        "rerun": rerun,
        "dflash": dflash,
    }
    text = "\n".join(long_context.long_context_lines(studies))
    # The sampled curve beside the greedy one, its shares and its rerun from the reports.
    assert "Sampled as users serve (temperature 0.8, seed 0: every request seeded)" in text
    assert "| draft model, W = 40 | 1.80 | 1.80 |" in text
    assert "draft model 150% greedy, 120% sampled" in text
    assert "the same seed, moves it by at most 0.10." in text
    for row in (
        "| draft model, W = 40 | 3.00 | 3.00 |",
        "| draft model, W = 40 + 16 sinks | 3.10 | 3.10 |",
        "| draft model, W = 96 | 3.20 | 3.20 |",
        "| EAGLE3, no window | 2.00 | 2.00 |",
        "| EAGLE3, W = 40 / no window | 1.50 |",
    ):
        assert row in text
    assert "at most 4) by context (tokens of prompt; the drafters trained at 128)" in text
    assert "without the window and with W = 40, W = 40 + 16 sinks, W = 96." in text
    assert "W = 33" not in text and "trained at 64" not in text
    with pytest.raises(ValueError):
        long_context.trained_at({"a": report(40, 0, 64, runs), "b": report(40, 0, 128, runs)})


@pytest.mark.parametrize(
    ("fused", "torch_us", "verdicts"),
    [
        # MRV1: 10 launches and 100 us a propose; at batch 256.
        (1, 40.0, ["met", "met", "met"]),
        (3, 60.0, ["not met", "not met", "not met"]),
    ],
)
def test_make_bench_computes_its_verdicts_from_what_it_measured(fused, torch_us, verdicts):
    from benchmarks import launch_cost

    row = {"batch": 256, "mrv1": 10, "torch": 12, "fused": fused, "mrv1_us": 100.0}
    row |= {"window": 2048, "context": 32768}
    rows = [
        {**row, "method": "dflash", "k": 0, "torch_us": torch_us},
        {**row, "method": "eagle", "k": 3, "torch_us": torch_us, "fixed_torch": 1},
        {**row, "method": "eagle", "k": 7, "torch_us": torch_us, "fixed_torch": 1},
        {**row, "method": "draft_model", "k": 5, "torch_us": torch_us},
    ]
    for r in rows:
        r |= {"fixed_fused": 1, "fixed_us": 1.0}
    text = "\n".join(launch_cost.launch_lines(rows))
    ratio = f"{fused / 10:.2f}x"
    assert f"- DFlash/DSpark launches: fused {ratio} MRV1 at most: {verdicts[0]}." in text
    assert f"- EAGLE launches: fused {ratio} to {ratio} MRV1 (K = 3 to 7): {verdicts[1]}." in text
    cpu = f"{torch_us / 100:.2f}x"
    assert f"{cpu} to {cpu} MRV1 per propose: {verdicts[2]} (DFlash/DSpark {cpu} to {cpu}" in text


def test_the_users_sampling_goes_to_vllm_bench_serve_and_is_checked_on_acceptance_only(
    capsys, monkeypatch, tmp_path
):
    env = {"STUDY": "long", "DEVICE": "cuda", "TEMPERATURE": "0.8", "TOP_P": "0.95"}
    code, out, err = dry_run(capsys, monkeypatch, tmp_path, **env)
    assert code == 0, err
    (line,) = [line for line in out.splitlines() if " bench sweep serve " in line]
    bench = shlex.split(line)[shlex.split(line).index("--bench-cmd") + 1]
    words = shlex.split(bench)
    assert " --temperature 0.8 --top-p 0.95 " in bench
    # vLLM's per-request seed, in every request's body (a rerun draws the same tokens).
    assert json.loads(words[words.index("--extra-body") + 1]) == {"seed": 0}
    code, out, err = dry_run(capsys, monkeypatch, tmp_path, **env, SEED="7")
    (line,) = [line for line in out.splitlines() if " bench sweep serve " in line]
    words = shlex.split(shlex.split(line)[shlex.split(line).index("--bench-cmd") + 1])
    assert json.loads(words[words.index("--extra-body") + 1]) == {"seed": 7}
    policy = lossless.Policy.for_run("cpu", env)
    assert policy.mode == "sampled"
    runs = {
        "no_speculation": {"outputs": {"context_1024": RECORDED}},
        "v2_window": {"outputs": {"context_1024": diverged({0: 1, 1: 1, 2: 1, 3: 1})}},
    }
    found, failures = lossless.check(runs, "no_speculation", policy)
    assert failures == [] and found["v2_window"]["identical"] == 4
    assert study.sampled({"temperature": "0.8", "top_p": "0.95"}) == (
        "sampled (temperature 0.8, top_p 0.95)"
    )
    code, out, err = dry_run(capsys, monkeypatch, tmp_path, TEMPERATURE="hot")
    assert code == 2 and err.endswith(
        "error: argument --temperature: TEMPERATURE='hot' is not a number from 0 to 100\n"
    )


@pytest.mark.parametrize("name", ["TOP_P", "TOP_K"])
def test_the_cpu_study_refuses_the_sampling_its_engine_does_not_run(
    name, capsys, monkeypatch, tmp_path
):
    """vLLM's top-p/top-k Triton kernel fails under Triton's interpreter (an engine run with
    them died in it, InterpreterError): the CPU study refuses them before anything runs."""
    value = {"TOP_P": "0.9", "TOP_K": "20"}[name]
    cpu = {"DEVICE": "cpu", "STUDY": "long", "TEMPERATURE": "0.8"}
    code, out, err = dry_run(capsys, monkeypatch, tmp_path, **cpu, **{name: value})
    assert code == 2 and "bench sweep serve" not in out
    assert err.endswith(
        f"error: {name}={value!r} is not run by vLLM's CPU engine (its top-p/top-k Triton "
        "kernel fails under Triton's interpreter): on DEVICE=cpu sample with TEMPERATURE alone\n"
    )
    code, out, err = dry_run(capsys, monkeypatch, tmp_path, **cpu)
    assert code == 0, err


# make study-cpu's dry run at two contexts (make e2e-check's test), and make e2e-ascend's
# (W = 256: no golden recorded, the acceptance checked within the run).
PASTED = {
    "study": {
        **{"DEVICE": "cpu", "STUDY": "long", "CONTEXTS": "32,1024"},
        **{"PROMPTS_PER_CONTEXT": "2", "OUTPUT_TOKENS": "4"},
        **{"LONG_CONTEXT": "512", "SHORT_CONTEXT": "32"},
    },
    "ascend": {"WINDOW": "256"},
}


def pasted(kind, tmp_path, monkeypatch, capsys, **env: str) -> Path:
    """A dry run's folder after its printed commands ran, as a user pastes them (by bash,
    the stand-in playing vllm, with ``env``; vLLM's cutter played by writing each dataset it
    names): each sweep's summary.csv and its servers' log, where the printed command writes
    them."""
    stand_in = tmp_path / "vllm"
    stand_in.write_text(f"#!{sys.executable}\n{STAND_IN}")
    stand_in.chmod(0o755)
    monkeypatch.setattr(sweep_plan, "vllm_command", lambda: str(stand_in))
    code, out, err = dry_run(capsys, monkeypatch, tmp_path / "results", **PASTED[kind])
    assert code == 0, err
    ran = 0
    # Kept for the tests that paste a line again (``printed``).
    (tmp_path / "printed.txt").write_text(out)
    for line in out.splitlines():
        if "create_txt_slices_dataset" in line:
            words = shlex.split(line)
            prompts = int(words[words.index("--num-prompts") + 1])
            sweep_plan.write_dataset(Path(words[words.index("--output") + 1]), ["p"] * prompts, 4)
        elif " bench sweep serve " in line:
            stand_in_env = {"PATH": "/usr/bin:/bin", "STAND_IN_LENGTH": "2.0", **env}
            done = subprocess.run(line, shell=True, executable="/bin/bash", env=stand_in_env)
            assert done.returncode == 0
            ran += 1
    assert ran == {"study": 1, "ascend": 2}[kind]
    return results_folder(kind, tmp_path)


def results_folder(kind: str, tmp_path: Path) -> Path:
    return tmp_path / "results" / ("study_eagle3" if kind == "study" else "eagle3")


def paste(line: str, **env: str) -> subprocess.CompletedProcess:
    """A printed line pasted into bash (the stand-in playing vllm)."""
    env = {"PATH": "/usr/bin:/bin", "STAND_IN_LENGTH": "2.0", **env}
    return subprocess.run(
        line, shell=True, executable="/bin/bash", env=env, capture_output=True, text=True
    )


def printed(folder: Path) -> list[str]:
    """The dry run's printed vllm bench sweep serve lines (kept by ``pasted``)."""
    lines = (folder.parent.parent / "printed.txt").read_text().splitlines()
    return [line for line in lines if " bench sweep serve " in line]


def e2e_check(folder: Path, capsys) -> tuple[int, list[str]]:
    code = harness.main(["--check", str(folder)])
    printed = capsys.readouterr().out
    return code, [line.removeprefix("[e2e] FAILED: ") for line in printed.splitlines()]


@pytest.mark.parametrize("kind", ["study", "ascend"])
def test_e2e_check_passes_what_the_printed_commands_wrote(kind, tmp_path, monkeypatch, capsys):
    folder = pasted(kind, tmp_path, monkeypatch, capsys)
    # The servers' output is in the folder, not only on the terminal.
    assert "Draft KV window on for eagle3" in (folder / "v2.log").read_text()
    code, printed = e2e_check(folder, capsys)
    assert code == 0, printed
    assert printed[-1] == f"[e2e] passed; report in {folder}"
    report = json.loads((folder / "report.json").read_text())
    assert report["failures"] == [] and "by --check" in report["produced_by"]["checked"]


def test_e2e_check_fails_by_name(tmp_path, monkeypatch, capsys):
    folder = pasted("study", tmp_path, monkeypatch, capsys)
    log = folder / "v2.log"
    kept = log.read_text()
    # The server with the window did not log its start-up line.
    log.write_text("\n".join(ln for ln in kept.splitlines() if "window_size=33" not in ln))
    code, printed = e2e_check(folder, capsys)
    assert code == 1
    assert (
        "v2_window: its server did not log the window's start-up line ('Draft KV window on "
        "for ...'): is this project installed where it served?" in printed
    )
    log.write_text(kept)
    # A text of the windowed run diverges from the run without speculation's.
    import pandas as pd

    summary = folder / "v2" / "summary.csv"
    table = pd.read_csv(summary, index_col=0)
    row = (table["_benchmark_name"] == "context_32_concurrency_2") & table[
        "additional_config"
    ].fillna("").str.contains("draft_window_size")
    assert row.sum() == 1
    table.loc[row, "generated_texts"] = repr(["text 0", "texT 1"])
    table.to_csv(summary)
    code, printed = e2e_check(folder, capsys)
    assert code == 1
    assert (
        "greedy outputs of v2_window differ from no_speculation in 1 of 4 prompts: "
        "context_32_concurrency_2 prompt 1 from character 3" in printed
    )
    # A file the commands write is missing.
    summary.unlink()
    code, printed = e2e_check(folder, capsys)
    assert code == 1
    assert any(line.startswith(f"v2: no {summary} (the printed") for line in printed), printed
    # And a folder no dry run wrote.
    code, printed = e2e_check(tmp_path, capsys)
    assert code == 2 and "not a folder the dry run" in printed[0]


def test_a_printed_sweep_fails_where_vllms_sweep_fails(tmp_path, monkeypatch, capsys):
    """``tee`` exits 0 whatever the sweep does: the printed line sets pipefail."""
    folder = pasted("ascend", tmp_path, monkeypatch, capsys)
    line = printed(folder)[0]
    (folder / "v2.log").unlink()
    import shutil

    shutil.rmtree(folder / "v2")
    done = paste(line, STAND_IN_FAIL="1")
    assert done.returncode != 0
    assert "Server failed to start in time" in (folder / "v2.log").read_text()


def test_a_second_paste_fails_and_keeps_the_first_pastes_log(tmp_path, monkeypatch, capsys):
    folder = pasted("ascend", tmp_path, monkeypatch, capsys)
    line = printed(folder)[0]
    log = (folder / "v2.log").read_text()
    done = paste(line)
    assert done.returncode == 1
    assert done.stderr.startswith(f"{folder / 'v2'} exists: this sweep already ran into it")
    assert (folder / "v2.log").read_text() == log
    code, lines = e2e_check(folder, capsys)
    assert code == 0, lines


def unguarded(line: str) -> str:
    """A printed line as it was before its guard and pipefail: the sweep piped to tee."""
    env, words = sweep_words(line)
    end = words.index("2>&1")
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    log = words[words.index("tee") + 1]
    return f"{assignments} {shlex.join(words[:end])} 2>&1 | tee {shlex.quote(log)}"


def test_e2e_check_tells_a_log_of_another_paste_from_a_window_that_did_not_engage(
    tmp_path, monkeypatch, capsys
):
    """Pasted twice in the old form, vLLM refuses the second (its experiment folder exists)
    and tee replaces the first's log: the check names that, not the window."""
    folder = pasted("study", tmp_path, monkeypatch, capsys)
    done = paste(unguarded(printed(folder)[0]))
    assert done.returncode == 0  # what the old form let through
    assert checks.REFUSED in (folder / "v2.log").read_text()
    code, lines = e2e_check(folder, capsys)
    assert code == 1
    assert any("is the output of a paste vLLM refused" in line for line in lines), lines
    assert not any("did not log the window" in line for line in lines)
    # A log that names none of the servers whose results summary.csv holds.
    (folder / "v2.log").write_text("another sweep's output\n")
    code, lines = e2e_check(folder, capsys)
    assert code == 1
    assert any("names no server of" in line for line in lines), lines
    assert not any("installed where it served" in line for line in lines)


def test_e2e_check_calls_results_older_than_the_dry_run_stale(tmp_path, monkeypatch, capsys):
    import os

    folder = pasted("ascend", tmp_path, monkeypatch, capsys)
    summary = folder / "v2" / "summary.csv"
    before = (folder / cli.RUN_RECORD).stat().st_mtime - 3600
    os.utime(summary, (before, before))
    code, lines = e2e_check(folder, capsys)
    assert code == 1
    assert f"v2: {summary} is older than the dry run's run.json: stale" in lines[0]


def test_e2e_check_takes_lossless_and_min_identical_given_to_it(tmp_path, monkeypatch, capsys):
    """The check's settings over the run's (the dry run's run.json says fraction 66% on
    Ascend), from the command line and from make e2e-check: the windowed server's texts
    differ from the others' for every second prompt (6 of 10 identical), so each setting
    decides the verdict."""
    folder = pasted("ascend", tmp_path, monkeypatch, capsys, STAND_IN_DIVERGE="2")
    assert harness.main(["--check", str(folder)]) == 1
    assert harness.main(["--check", str(folder), "--min-identical", "0.5"]) == 0
    report = json.loads((folder / "report.json").read_text())
    assert report["lossless"] == "fraction: at least 50% of the prompts' texts identical"
    assert "with MIN_IDENTICAL=0.5" in report["produced_by"]["checked"]
    assert harness.main(["--check", str(folder), "--lossless", "exact"]) == 1
    report = json.loads((folder / "report.json").read_text())
    assert report["lossless"] == "exact: every text identical"
    capsys.readouterr()
    # (make exits 2 where its recipe fails.)
    for setting, code in (("0.4", 0), ("0.7", 2)):
        result = subprocess.run(
            ["make", "-s", "e2e-check", f"RESULTS={folder}", f"MIN_IDENTICAL={setting}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
        )
        assert result.returncode == code, result.stdout + result.stderr
    report = json.loads((folder / "report.json").read_text())
    assert report["lossless"] == "fraction: at least 70% of the prompts' texts identical"
    code, lines = e2e_check_with(folder, capsys, "--lossless", "exact", "--min-identical", "0.5")
    assert code == 2
    assert lines[-1] == (
        "MIN_IDENTICAL='0.5' applies to LOSSLESS=fraction, the check is LOSSLESS=exact: set "
        "LOSSLESS=fraction, or leave MIN_IDENTICAL out"
    )
    with pytest.raises(SystemExit) as info:
        harness.main(["--check", str(folder), "--device", "cuda"])
    assert info.value.code == 2
    assert "DEVICE='cuda' is the run's, not the check's" in capsys.readouterr().err


def e2e_check_with(folder: Path, capsys, *flags: str) -> tuple[int, list[str]]:
    code = harness.main(["--check", str(folder), *flags])
    out = capsys.readouterr().out
    return code, [line.removeprefix("[e2e] FAILED: ") for line in out.splitlines()]


# Bad values and combinations, each refused by name before anything is written.
STUDY = {"STUDY": "long"}
CPU_STUDY = {"DEVICE": "cpu", "STUDY": "long"}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({**STUDY, "CONTEXTS": ","}, "CONTEXTS=',' is not a comma-separated list of distinct"),
        ({**STUDY, "CONTEXTS": "32,,64"}, "CONTEXTS='32,,64' is not a comma-separated list"),
        ({**STUDY, "CONTEXTS": "64,64"}, "CONTEXTS='64,64' is not a comma-separated list"),
        ({**STUDY, "MORE_WINDOWS": "256,256"}, "MORE_WINDOWS='256,256' is not a comma"),
        ({"PORT": "70000"}, "PORT='70000' is not an integer from 1 to 65535"),
        ({"PORT": "0"}, "PORT='0' is not an integer from 1 to 65535"),
        ({"TEMPERATURE": "inf"}, "TEMPERATURE='inf' is not a number from 0 to 100"),
        ({"TEMPERATURE": "nan"}, "TEMPERATURE='nan' is not a number from 0 to 100"),
        ({"TEMPERATURE": "0.8", "TOP_P": "0"}, "TOP_P='0' is not a number above 0 and at most 1"),
        ({"WINDOW": "0"}, "WINDOW='0' is not an integer >= 1"),
        ({**STUDY, "STUDY_TEXT": "/no/such/text"}, "STUDY_TEXT='/no/such/text' is not a file"),
        (
            {"TARGET_MODEL": str(ROOT / "Makefile")},
            f"TARGET_MODEL={str(ROOT / 'Makefile')!r} is a file, not a model's folder or name",
        ),
        ({"CONTEXTS": "4096"}, "CONTEXTS='4096' is the long-context study's: set STUDY=long"),
        ({"PARALLEL": "2"}, "PARALLEL='2' is the long-context study's: set STUDY=long"),
        ({"MAX_MODEL_LEN": "8192"}, "MAX_MODEL_LEN='8192' is the long-context study's"),
        ({"AUTO": "1"}, "AUTO='1' is the long-context study's"),
        ({"OUTPUT_TOKENS": "64"}, "OUTPUT_TOKENS='64' is the long-context study's"),
        ({"SEED": "7"}, "SEED='7' applies to sampled requests only: set TEMPERATURE above 0"),
        ({"TOP_K": "20"}, "TOP_K='20' applies to sampled requests only"),
        ({"TEMPERATURE": "0", "TOP_P": "0.9"}, "TOP_P='0.9' applies to sampled requests only"),
        (
            {"TEMPERATURE": "0.8", "LOSSLESS": "exact"},
            "LOSSLESS='exact' chooses how greedy texts are checked; sampled (TEMPERATURE=0.8)",
        ),
        (
            {"LOSSLESS": "exact", "MIN_IDENTICAL": "0.5"},
            "MIN_IDENTICAL='0.5' applies to LOSSLESS=fraction, the check is LOSSLESS=exact",
        ),
        (
            {**CPU_STUDY, "MIN_IDENTICAL": "0.5"},
            "MIN_IDENTICAL='0.5' applies to LOSSLESS=fraction, the check is exact on DEVICE=cpu",
        ),
        ({**CPU_STUDY, "TP": "2"}, "TP='2' does not apply to DEVICE=cpu"),
        ({**CPU_STUDY, "RECORD_GOLDEN": "1"}, "RECORD_GOLDEN='1': the CPU study has no golden"),
        ({"RECORD_GOLDEN": "1"}, "RECORD_GOLDEN=1 with DRY_RUN=1: a dry run measures nothing"),
        (
            {**STUDY, "MAX_CONTEXT": "8192", "CONTEXTS": "4096"},
            "MAX_CONTEXT='8192' with CONTEXTS='4096': CONTEXTS names every context",
        ),
        ({**STUDY, "MAX_CONTEXT": "100"}, "MAX_CONTEXT='100': no study context"),
        (
            {**STUDY, "CONTEXTS": "4096", "SHARED_PREFIX": "4096"},
            "SHARED_PREFIX=4096 does not fit the longest context 4096",
        ),
        (
            {**STUDY, "CONTEXTS": "4096", "MAX_MODEL_LEN": "4096"},
            "MAX_MODEL_LEN=4096 does not hold the longest context 4096 and its OUTPUT_TOKENS=256",
        ),
        ({**STUDY, "SHORT_CONTEXT": "40000"}, "SHORT_CONTEXT=40000 is not below LONG_CONTEXT"),
        (
            {**STUDY, "CONTEXTS": "4096", "MIN_CONTEXT": "8192"},
            "MIN_CONTEXT=8192 engages the window at none of the contexts",
        ),
        (
            {**STUDY, "MORE_WINDOWS": "1024,512"},
            "MORE_WINDOWS='1024,512' repeats the run with the window (WINDOW=512)",
        ),
        (
            {"DEVICE": "cuda", "CUDA_VISIBLE_DEVICES": "0,1,0"},
            "CUDA_VISIBLE_DEVICES='0,1,0' names card 0 twice",
        ),
        (
            {"ASCEND_RT_VISIBLE_DEVICES": "3,3"},
            "ASCEND_RT_VISIBLE_DEVICES='3,3' names card 3 twice",
        ),
        ({**STUDY, "PORT": "65535"}, "PORT='65535' leaves no port for each of 2 sweeps"),
        (
            {"E2E_SCENARIO": "dspark", "DCP": "2", "TP": "3"},
            "DCP=2 needs a tensor parallel size that is a multiple of it",
        ),
    ],
)
def test_a_bad_value_or_combination_stops_before_anything_is_written(
    env, message, capsys, monkeypatch, tmp_path
):
    code, out, err = dry_run(capsys, monkeypatch, tmp_path / "out", **env)
    assert code == 2 and "bench sweep serve" not in out
    assert message in err, err
    assert not (tmp_path / "out").exists()


def test_out_that_is_a_file_is_refused_by_name(capsys, monkeypatch, tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("mine")
    code, out, err = dry_run(capsys, monkeypatch, taken)
    assert code == 2 and out == "" and "Traceback" not in err
    assert f"OUT={str(taken)!r}: {taken} is a file, not a folder: pass OUT=a folder" in err
    assert taken.read_text() == "mine"


def test_a_dry_run_never_deletes_a_runs_results(capsys, monkeypatch, tmp_path):
    folder = tmp_path / "eagle3"
    (folder / "v2").mkdir(parents=True)
    for name in (cli.RUN_RECORD, "report.md", "v2.log"):
        (folder / name).write_text("a real run's")
    code, out, err = dry_run(capsys, monkeypatch, tmp_path)
    assert code == 2 and out == ""
    assert (
        f"{folder} holds a run's results (report.md, v2, v2.log): a dry run never deletes "
        "results; remove them, or pass another OUT" in err
    )
    assert (folder / "report.md").read_text() == "a real run's"
    # A dry run's own files (no results) are its to replace.
    (folder / "report.md").unlink()
    (folder / "v2.log").unlink()
    (folder / "v2").rmdir()
    code, out, err = dry_run(capsys, monkeypatch, tmp_path)
    assert code == 0, err


def test_a_real_run_clears_its_folder_only_after_the_install_and_pairing_pass(
    monkeypatch, tmp_path
):
    folder = tmp_path / "eagle3"
    folder.mkdir()
    (folder / cli.RUN_RECORD).write_text("{}")
    (folder / "report.md").write_text("the last run's")

    def refuse(method):
        raise SystemExit("cannot run: not a supported pairing")

    monkeypatch.setattr(host, "install", lambda device: None)
    monkeypatch.setattr(host, "check_pairing", refuse)
    scenario = scenarios.scenarios({})["eagle3"]
    with pytest.raises(SystemExit, match="not a supported pairing"):
        harness.run_scenario(scenario, "ascend", 8123, folder, False, {})
    assert (folder / "report.md").read_text() == "the last run's"


@pytest.mark.parametrize(
    "env",
    [
        {"DEVICE": "cuda", "DTYPE": "float16", "BLOCK_SIZE": "32"},
        {"DTYPE": "float16"},
        {"DEVICE": "cuda", "E2E_SCENARIO": "tiny", "DTYPE": "bfloat16"},
        {"DEVICE": "cuda", "STUDY": "long", "CONTEXTS": "4096", "DTYPE": "float16"},
    ],
)
def test_dtype_and_block_size_reach_every_server_as_vllms_flags(env, capsys, monkeypatch, tmp_path):
    """What run.json records (the settings) is what the servers were given."""
    code, out, err = dry_run(capsys, monkeypatch, tmp_path, **env)
    assert code == 0, err
    serves = [shlex.split(line) for line in out.splitlines() if " bench sweep serve " in line]
    assert serves
    (record,) = [json.loads(p.read_text()) for p in tmp_path.glob("*/run.json")]
    assert record["settings"]["DTYPE"] == env["DTYPE"]
    for words in serves:
        serve = words[words.index("--serve-cmd") + 1]
        assert f" --dtype {env['DTYPE']}" in serve
        assert ("BLOCK_SIZE" not in env) or f" --block-size {env['BLOCK_SIZE']}" in serve
    recorded = [s["serve"] for s in record["plan"]["servers"].values()]
    assert recorded and all(f" --dtype {env['DTYPE']}" in s for s in recorded)


def golden_results(per_position: list[float], v1: bool = False) -> dict:
    """The scenario's runs as its checks read them (with ``v1``, V1's run with the window
    too), every text alike, the window active where served."""

    def one(window: bool) -> dict:
        measured = {"per_position": per_position, "mean_length": 1 + sum(per_position)}
        return {
            "outputs": {"golden": ["a"]},
            "acceptance": dict(measured),
            "all_long": dict(measured),
            "window_active": window,
        }

    runs = {"v2_window": one(True), "v2_no_window": one(False)}
    return {**runs, "v1_window": one(True)} if v1 else runs


def test_the_committed_golden_gates_no_run_but_fails_a_drafter_broken_on_every_runner(tmp_path):
    """It was measured by vllm-ascend's MRV1 test (greedy, eager, EOS honoured); the harness
    runs Model Runner V2 with --ignore-eos and graphs: its figures gate no run, but it is a
    greedy run's floor on Ascend and on CUDA. A drafter broken on every runner (0.3 tokens
    per draft against its 1.4, with and without the window, on V1 as on V2) fails the run;
    one a few tenths below it passes; sampled, it is a reference only."""
    scenario = scenarios.scenarios({})["eagle3"]
    golden = checks.load_golden(scenario, False)
    assert golden.values == [0.7, 0.4, 0.3] and "Model Runner V1's figure" in golden.source
    broken, healthy = [0.2, 0.1, 0.0], [0.6, 0.3, 0.2]
    for device in ("ascend", "cuda"):
        conditions = checks.run_conditions(scenario, device, {})
        assert conditions["ignore_eos"] is True and conditions["eager"] is False
        assert checks.gate(golden, conditions) is None
        out = tmp_path / device
        out.mkdir()
        job = host.Job(scenario, device, out, {})
        job.produced = host.provenance(job)
        v1 = device == "ascend"
        assert reports.finish_scenario(job, golden_results(broken, v1)) == 1
        assert json.loads((out / "report.json").read_text())["failures"] == [
            "V2 with the window accepts 0.30 tokens per draft on the golden prompt, under 50% "
            "of the 1.40 of the golden recorded under other conditions: a drafter this far "
            "below it is broken, whichever runner agrees with it"
        ]
        md = (out / "report.md").read_text()
        assert "Golden acceptance by position 0.70, 0.40, 0.30: a floor, not a gate" in md
        assert "runner 'v1' (this run: 'v2')" in md and "ignore_eos False (this run: True)" in md
        assert reports.finish_scenario(job, golden_results(healthy, v1)) == 0
    sampled = host.Job(scenario, "ascend", tmp_path / "ascend", {"TEMPERATURE": "0.8"})
    sampled.produced = host.provenance(sampled)
    assert reports.finish_scenario(sampled, golden_results(broken, True)) == 0
    md = (tmp_path / "ascend" / "report.md").read_text()
    assert "Golden acceptance by position 0.70, 0.40, 0.30: a reference, not a gate" in md


def test_a_greedy_run_no_golden_bounds_fails_a_drafter_broken_on_every_runner(tmp_path):
    """DSpark, DFlash and the draft model have no golden: greedy, a drafter broken on every
    runner (0.3 tokens per draft on the golden prompt, V1 as low as V2) fails on Ascend and on
    CUDA, a working one passes; sampled, nothing bounds it."""
    broken, healthy = [0.2, 0.1, 0.0], [0.4, 0.1, 0.05]
    for name in ("dspark", "dflash", "draft_model"):
        scenario = scenarios.scenarios({})[name]
        assert checks.load_golden(scenario, False) is None, name
        width = scenario.num_spec
        for device in ("ascend", "cuda"):
            out = tmp_path / name / device
            out.mkdir(parents=True)
            job = host.Job(scenario, device, out, {})
            job.produced = host.provenance(job)
            v1 = device == "ascend" and "v1_window" in [
                r.name for r in scenarios.runs(scenario, device)
            ]
            low = (broken + [0.0] * width)[:width]
            assert reports.finish_scenario(job, golden_results(low, v1)) == 1, (name, device)
            (said,) = json.loads((out / "report.json").read_text())["failures"]
            assert said.startswith("V2 with the window accepts 0.30 tokens per draft"), said
            assert "no golden bounds this run" in said
            fine = (healthy + [0.0] * width)[:width]
            assert reports.finish_scenario(job, golden_results(fine, v1)) == 0, (name, device)
        sampled = host.Job(scenario, "cuda", tmp_path / name / "cuda", {"TEMPERATURE": "0.8"})
        sampled.produced = host.provenance(sampled)
        low = (broken + [0.0] * scenario.num_spec)[: scenario.num_spec]
        assert reports.finish_scenario(sampled, golden_results(low)) == 0, name


def test_a_golden_recorded_under_the_runs_conditions_gates_it(tmp_path):
    scenario = scenarios.scenarios({"DEVICE": "cuda"})["eagle3"]
    scenario.golden = tmp_path / "golden.json"
    conditions = checks.run_conditions(scenario, "cuda", {})
    reports.write_golden(scenario.golden, "per_position", [0.7, 0.4, 0.3], 0.1, conditions)
    out = tmp_path / "run"
    out.mkdir()
    job = host.Job(scenario, "cuda", out, {})
    job.produced = host.provenance(job)
    assert reports.finish_scenario(job, golden_results([0.2, 0.4, 0.3])) == 1
    report = json.loads((out / "report.json").read_text())
    assert report["failures"] == ["acceptance at position 0: 0.200, golden 0.700 (+-0.1)"]
    # Sampled, the same golden is a reference only.
    sampled = host.Job(scenario, "cuda", out, {"TEMPERATURE": "0.8"})
    sampled.produced = host.provenance(sampled)
    assert reports.finish_scenario(sampled, golden_results([0.2, 0.4, 0.3])) == 0
