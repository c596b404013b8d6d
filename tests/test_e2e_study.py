# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The long-context study of the end-to-end harness, as far as it runs without NPUs: its
`vllm bench` commands per context and concurrency (``DRY_RUN=1``), vLLM's text cutter on the
held-out text, its checks, its report and its refusal without NPUs. (Its sweeps run for real
on CPU in ``tests/test_engine_study.py``.)"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from e2e import cli, harness, reports, scenarios, study, sweep_plan
from tests.cpu_testbed.vllm_cli import printed_sweeps as sweeps
from tests.cpu_testbed.vllm_cli import runs_of

ROOT = Path(__file__).resolve().parent.parent

# The same code on every vLLM line: run once, in .venv (design/testing.md).
pytestmark = pytest.mark.release_independent


@pytest.fixture
def dry_run(capsys, tmp_path):
    def lines(**given):
        flags = cli.flags({"STUDY": "long", "DRY_RUN": "1", **given})
        assert harness.main([*flags, "--out", str(tmp_path)]) == 0
        return capsys.readouterr().out.splitlines()

    return lines


def cutter(lines) -> list[dict]:
    """Each run of vLLM's text cutter the plan prints, by its flags."""
    found = []
    for line in lines:
        if "create_txt_slices_dataset" in line:
            words = line.split()
            found.append(dict(zip(words[3::2], words[4::2], strict=False)))
    return found


def test_the_plan_serves_each_run_once_and_sends_every_context_its_prompts(dry_run):
    lines = dry_run()
    cut = cutter(lines)
    assert [int(c["--input-len"]) for c in cut] == [4096, 8192, 16384, 32768]
    assert all(c["--num-prompts"] == "3" and c["--output-len"] == "256" for c in cut)
    assert all(c["--tokenizer"] == "Qwen/Qwen3-8B" for c in cut)
    v2, v1 = found = sweeps(lines)
    assert all("--max-model-len 33024" in s["serve"] for s in found)
    assert all("--skip-chat-template" in s["bench"] for s in found)
    # Without speculation (the reference), V2 with the window, V2 without; V1 with the
    # window in a sweep of its own (its runner variable).
    assert [r["_benchmark_name"] for r in v2["runs"]] == [
        "no_speculation",
        "v2_window",
        "v2_no_window",
    ]
    assert v1["env"] == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    runs = runs_of(found)
    assert runs["no_speculation"] == {}
    assert runs["v2_window"]["additional_config"] == {"draft_window_size": 512}
    assert "additional_config" not in runs["v2_no_window"]
    # Every context's prompts, all at once, to every run.
    for s in found:
        assert [
            (w["_benchmark_name"], w["num_prompts"], w["max_concurrency"]) for w in s["workloads"]
        ] == [(f"context_{c}_concurrency_3", 3, 3) for c in (4096, 8192, 16384, 32768)]


def test_concurrency_and_a_shared_prefix_are_workloads_of_their_own(dry_run):
    lines = dry_run(CONCURRENCY="1,4", SHARED_PREFIX="3000", CONTEXTS="4096,8192")
    names = [w["_benchmark_name"] for w in sweeps(lines)[0]["workloads"]]
    assert names == [
        "context_4096_concurrency_1",
        "context_4096_concurrency_4",
        "context_8192_concurrency_1",
        "context_8192_concurrency_4",
        "shared_prefix_3000_context_8192_concurrency_4",
    ]
    cut = cutter(lines)
    # The prefix once, the rest of the longest context for every prompt, then joined.
    assert [(c["--num-prompts"], c["--input-len"]) for c in cut[-2:]] == [
        ("1", "3000"),
        ("3", "5192"),
    ]
    assert any(
        line.endswith("shared_prefix_3000_context_8192.jsonl") and "shared-prefix" in line
        for line in lines
    )


def test_min_context_goes_to_the_v2_window_run_and_sinks_are_a_run_of_their_own(dry_run):
    runs = runs_of(sweeps(dry_run(MIN_CONTEXT="8192", SINKS="64", NO_SPECULATION="0")))
    assert list(runs) == ["v2_window", "v2_no_window", "v2_window_sinks", "v1_window"]
    assert runs["v2_window"]["additional_config"] == {
        "draft_window_size": 512,
        "draft_window_min_context": 8192,
    }
    assert runs["v2_window_sinks"]["additional_config"] == {
        "draft_window_size": 512,
        "draft_attention_sinks": 64,
    }
    # V1 windows every context and has no sinks: its run keeps the plain window.
    assert runs["v1_window"]["additional_config"] == {"draft_window_size": 512}
    assert study.golden_path(ROOT, "eagle3", 512, 8192).name == "study_eagle3_w512_m8192.json"


def test_auto_and_more_windows_are_runs_of_their_own(dry_run, capsys):
    runs = runs_of(sweeps(dry_run(AUTO="1", MORE_WINDOWS="1024,4096", DEVICE="cuda")))
    assert runs["v2_auto"]["additional_config"] == {"draft_window_size": "auto"}
    assert runs["v2_window_1024"]["additional_config"] == {"draft_window_size": 1024}
    assert runs["v2_window_4096"]["additional_config"] == {"draft_window_size": 4096}
    for bad in ("0", "a,1"):
        with pytest.raises(SystemExit):
            harness.main(["--dry-run", "--study", "long", "--more-windows", bad])
        assert f"MORE_WINDOWS={bad!r} is not a comma-separated list of distinct integers >= 1" in (
            capsys.readouterr().err
        )


def test_the_plan_reaches_128k_where_the_model_allows_and_cuda_has_no_v1_run(dry_run):
    lines = dry_run(
        MAX_CONTEXT="140000", DEVICE="cuda", E2E_SCENARIO="dspark", PROMPTS_PER_CONTEXT="2"
    )
    assert [int(c["--input-len"]) for c in cutter(lines)][-1] == 131072
    (only,) = sweeps(lines)
    assert "--max-model-len 131328" in only["serve"] and "v1_window" not in runs_of([only])


def test_the_study_of_the_tiny_scenario_serves_the_trained_models_on_cuda(dry_run):
    lines = dry_run(DEVICE="cuda", E2E_SCENARIO="tiny", CONTEXTS="32,512")
    (only,) = sweeps(lines)
    assert f" serve {scenarios.TRAINED_ROOT / 'target'} " in only["serve"]


def test_vllms_cutter_gives_every_prompt_exactly_its_context_of_the_held_out_text(tmp_path):
    """vLLM's own ``create_txt_slices_dataset``, run as the study runs it (every dataset in
    one process), over the trained models' held-out text and their byte tokenizer: each
    prompt is a stretch of the text whose tokens number exactly the context, and each
    dataset is the one its printed command writes alone."""
    from transformers import AutoTokenizer

    import trained_models
    from e2e import harness

    models = trained_models.committed()
    contexts = {512: tmp_path / "context_512.jsonl", 64: tmp_path / "context_64.jsonl"}
    commands = [
        sweep_plan.slices_command(models.heldout, out, models.target, 4, context, 16)
        for context, out in contexts.items()
    ]
    harness.cut_datasets(commands)
    alone = tmp_path / "alone.jsonl"
    command = sweep_plan.slices_command(models.heldout, alone, models.target, 4, 64, 16)
    subprocess.run(command, check=True, capture_output=True)
    assert alone.read_bytes() == contexts[64].read_bytes()
    tokenizer = AutoTokenizer.from_pretrained(models.target)
    heldout = models.heldout.read_text(encoding="utf-8")
    for context, out in contexts.items():
        prompts = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(prompts) == 4 and all(p["output_tokens"] == 16 for p in prompts)
        for p in prompts:
            assert len(tokenizer(p["prompt"], add_special_tokens=False).input_ids) == context
            assert p["prompt"] in heldout + heldout


@pytest.mark.parametrize(
    ("context", "window", "sinks"),
    [
        (32768, 512, 0),
        (32768, 512, 64),
        (4096, 2048, 0),
        (300, 512, 0),
        (1000, 512, 200),
    ],
)
def test_the_draft_kv_read_is_the_longest_read_of_any_context_up_to_it(context, window, sinks):
    """Against the window's own length arithmetic over every context up to `context`."""
    from vllm_ascend.worker.v2.spec_decode.draft_window.window import (
        WindowSpec,
        align_sinks,
        window_seq_lens,
    )

    spec = WindowSpec(window, 128, align_sinks(sinks, 128))
    lengths = torch.arange(1, context + 1, dtype=torch.int32)
    reads = torch.empty_like(lengths)
    window_seq_lens(lengths, spec, skip_out=torch.empty_like(lengths), out=reads)
    assert study.draft_kv_read(context, window, sinks, 128) == int(reads.max())
    assert study.draft_kv_read(context, None, sinks, 128) == context


@pytest.mark.parametrize(
    ("context", "min_context"),
    [(8000, 8192), (8192, 8192), (9000, 8192), (32768, 8192), (4096, 300)],
)
def test_the_draft_kv_read_with_a_threshold(context, min_context):
    """Below the threshold the whole context (what the window's arithmetic reads there);
    from it on, the plain window's bound (300 <= S + W + a: no threshold)."""
    from vllm_ascend.worker.v2.spec_decode.draft_window.window import WindowSpec, window_seq_lens

    read = study.draft_kv_read(context, 512, 0, 128, min_context)
    if context < min_context and min_context == 8192:
        spec = WindowSpec(512, 128, 0, min_context)
        length = torch.tensor([context], dtype=torch.int32)
        out = torch.empty_like(length)
        window_seq_lens(length, spec, skip_out=torch.empty_like(length), out=out)
        assert read == int(out[0]) == context
    else:
        assert read == study.draft_kv_read(context, 512, 0, 128) == min(context, 639)


def run(outputs, lengths):
    """A run's report entry: its texts (one workload) and its mean acceptance by context."""
    return {
        "outputs": {"context_32_concurrency_8": outputs},
        "contexts": {str(c): {"mean_length": m} for c, m in lengths.items()},
    }


def test_checks_flag_every_rule():
    on = run(["a"], {4096: 3.0, 32768: 2.5, 65536: 2.4})
    off = run(["a"], {4096: 3.05, 32768: 1.2, 65536: 1.1})
    v1 = run(["a"], {4096: 3.0, 32768: 2.48, 65536: 2.4})
    golden = {"4096": 3.0, "32768": 2.5, "65536": 2.4}
    assert study.check({"v2_window": on, "v2_no_window": off, "v1_window": v1}, golden, 0.15) == []
    bad_on = run(["a"], {4096: 2.8, 32768: 1.0, 65536: 2.4})
    bad_off = run(["b"], {4096: 3.05, 32768: 1.2, 65536: 1.1})
    failures = study.check(
        {"v2_window": bad_on, "v2_no_window": bad_off, "v1_window": v1}, golden, 0.15
    )
    assert (
        "greedy outputs of v2_no_window differ from v2_window in 1 of 1 prompts: "
        "context_32_concurrency_8 prompt 0 from character 0" in failures
    )
    assert any(
        f.startswith("4096: acceptance with the window 2.800 is not within 0.1") for f in failures
    )
    assert any(
        f.startswith("32768: acceptance with the window 1.000 < without 1.200") for f in failures
    )
    assert any(
        f.startswith("32768: V2 with the window 1.000 is not within 0.05 of V1") for f in failures
    )
    assert any(f.startswith("32768: mean acceptance length 1.000, golden 2.500") for f in failures)


def test_checks_below_the_threshold_compare_with_the_window_off():
    on = run(["a"], {4096: 3.0, 16384: 2.0, 32768: 2.5})
    off = run(["a"], {4096: 3.05, 16384: 2.5, 32768: 1.2})
    v1 = run(["a"], {4096: 2.0, 16384: 2.0, 32768: 2.5})  # V1 windows every context
    assert study.check({"v2_window": on, "v2_no_window": off}, None, 0.15) == []
    failures = study.check(
        {"v2_window": on, "v2_no_window": off, "v1_window": v1}, None, 0.15, 20000
    )
    assert failures == [
        "16384: below draft_window_min_context=20000, acceptance with the window "
        "2.000 is not within 0.1 of without 2.500"
    ]


def measured(context, concurrency, mean, prefix=0, speculative=True):
    """What ``vllm bench serve`` saved of one workload (the fields the study reads)."""
    result = {
        "output_throughput": 12.5,
        "mean_tpot_ms": 10.0,
        "mean_ttft_ms": 40.0,
        "completed": 3,
        "generated_texts": ["x"] * 3,
    }
    if speculative:
        result |= {
            "spec_decode_acceptance_length": mean,
            "spec_decode_acceptance_rate": (mean - 1) / 3 * 100,
            "spec_decode_per_position_acceptance_rates": [mean - 1, 0.0, 0.0],
            "spec_decode_num_drafts": 100,
        }
    name = f"context_{context}_concurrency_{concurrency}"
    if prefix:
        name = f"shared_prefix_{prefix}_{name}"
    return name, result


def test_the_report_is_written_from_what_vllm_bench_serve_measured(tmp_path):
    """Workload by workload: its context, concurrency and shared prefix, whether the window
    engages there, acceptance from the spec-decode counters, output tok/s and TPOT, and the
    most KV one draft step reads."""
    settings = study.Settings([4096, 32768], 3, 16, 128, concurrency=[3], shared_prefix=1000)
    workloads = [
        sweep_plan.Workload(name, Path("x.jsonl"), 3, 3, 16)
        for name in (
            "context_4096_concurrency_3",
            "context_32768_concurrency_3",
            "shared_prefix_1000_context_32768_concurrency_3",
        )
    ]
    results = {}
    for name, window, means in (
        ("v2_window", 512, (3.0, 2.5, 2.5)),
        ("v2_no_window", None, (3.0, 1.2, 1.2)),
    ):
        found = dict(
            measured(c, 3, m, prefix)
            for (c, prefix), m in zip(((4096, 0), (32768, 0), (32768, 1000)), means, strict=True)
        )
        planned = scenarios.Run(name, True, window, min_context=8192 if window else 0)
        results[name] = reports.study_run_results(planned, found, "", workloads, settings)
    meta = {
        "scenario": "dspark",
        "device": "ascend",
        "window": 512,
        "sinks": 0,
        "min_context": 8192,
        "workloads": [w.name for w in workloads],
        "prompts_per_context": 3,
        "output_tokens": 16,
        "text": "the documentation CPython ships",
    }
    study.write_report(tmp_path, meta, results, [])
    md = (tmp_path / "report.md").read_text()
    assert md.startswith(
        "# Long-context study: dspark on ascend, W = 512, draft_window_min_context 8192\n"
    )
    assert (
        "| 4096 | 3 | - | no | v2_window | 3.000 | 66.7% | 2.00, 0.00, 0.00 | 12.5 | 10.00 | 4096 |"
        in md
    )
    assert (
        "| 32768 | 3 | - | yes | v2_window | 2.500 | 50.0% | 1.50, 0.00, 0.00 | 12.5 | 10.00 "
        "| 639 |" in md
    )
    assert (
        "| 32768 | 3 | 1000 | yes | v2_no_window | 1.200 | 6.7% | 0.20, 0.00, 0.00 | 12.5 "
        "| 10.00 | 32768 |" in md
    )
    assert "vllm-ascend #12103" in md and "Failures: none" in md
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["runs"]["v2_window"]["contexts"]["32768"]["mean_length"] == 2.5
    assert (tmp_path / "study.png").stat().st_size > 0


def test_without_a_golden_the_study_checks_the_window_against_no_window_and_never_nothing():
    """No study golden is committed: every scenario's acceptance is checked within the run;
    a study whose contexts reach neither side of the rule, with no golden, fails."""
    assert not list((ROOT / "e2e" / "golden").glob("study_*.json"))
    on = run(["a"], {8192: 2.0, 16384: 2.1})
    off = run(["a"], {8192: 2.2, 16384: 2.3})
    assert study.check({"v2_window": on, "v2_no_window": off}, None, 0.15) == [
        "no context of [8192, 16384] is at least 32768 (LONG_CONTEXT) or at most 4096 "
        "(SHORT_CONTEXT), and no golden: the acceptance is checked nowhere"
    ]


def test_without_npus_the_study_stops_at_once_with_exit_code_2():
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "STUDY": "long"}
    result = subprocess.run(
        ["make", "-s", "e2e-ascend"], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert result.returncode == 2
    assert "needs Ascend NPUs: npu-smi not found" in result.stderr


@pytest.mark.parametrize("method", ["eagle3", "dspark", "dflash", "draft_model"])
def test_every_drafting_method_has_a_scenario(dry_run, method):
    runs = runs_of(sweeps(dry_run(E2E_SCENARIO=method, DEVICE="cuda")))
    # Every run but the one without speculation drafts with the scenario's method.
    assert "speculative_config" not in runs.pop("no_speculation")
    assert all(run["speculative_config"]["method"] == method for run in runs.values())


def test_the_cpu_study_serves_the_trained_models_on_vllms_cpu_worker(dry_run):
    """DEVICE=cpu: the committed tiny models, the CPU engine environment (``tools/cpu_engine.py``),
    the held-out text cut to each context exactly, plain completions."""
    import trained_models as trained

    lines = dry_run(DEVICE="cpu", AUTO="1", PARALLEL="2")
    assert lines[0].endswith("--prepare --device cpu --scenario eagle3 --study long")
    cut = cutter(lines)
    assert [int(c["--input-len"]) for c in cut] == [32, 64, 128, 256, 512, 1024]
    assert all(c["--input"].endswith("study_text.txt") for c in cut)
    assert f"{trained.HELDOUT}" in lines[1]
    # Two sweeps side by side, a port each, the runs dealt over them.
    found = sweeps(lines)
    assert [[r["_benchmark_name"] for r in s["runs"]] for s in found] == [
        ["no_speculation", "v2_no_window"],
        ["v2_window", "v2_auto"],
    ]
    assert ["--port 8123" in s["serve"] and "--port 8123" in s["bench"] for s in found] == [
        True,
        False,
    ]
    assert "--port 8124" in found[1]["serve"] and "--port 8124" in found[1]["bench"]
    for s in found:
        # What the server's environment adds to this one's (which has Triton's interpreter on).
        assert s["env"]["VLLM_TARGET_DEVICE"] == "cpu"
        assert f"serve {scenarios.TRAINED_ROOT / 'target'} " in s["serve"]
        assert "--max-model-len 1040" in s["serve"] and "--block-size 32" in s["serve"]
        assert "--dtype float32" in s["serve"] and "--max-num-seqs 8" in s["serve"]
        assert "--skip-chat-template" in s["bench"]
        assert len(s["workloads"]) == 6
    runs = runs_of(found)
    assert runs["v2_window"]["speculative_config"]["model"] == str(
        scenarios.TRAINED_ROOT / "eagle3"
    )
    # The window auto picks for a head declaring 64 tokens with blocks of 32: 64 - 32 + 1.
    assert runs["v2_window"]["additional_config"] == {"draft_window_size": 33}
    assert runs["v2_auto"]["additional_config"] == {"draft_window_size": "auto"}
    assert trained.DRAFT_CONTEXT == 64


def test_the_cpu_study_runs_the_study_only(capsys):
    with pytest.raises(SystemExit) as info:
        harness.main(["--dry-run", "--device", "cpu"])
    assert info.value.code == 2 and "DEVICE=cpu runs the long-context study only" in (
        capsys.readouterr().err
    )


def test_checks_compare_every_output_with_the_run_without_speculation_and_take_the_drafters_scale():
    alone = run(["a"], {32: None, 512: None})
    on = run(["a"], {32: 3.8, 512: 3.2})
    off = run(["a"], {32: 3.8, 512: 1.7})
    results = {"no_speculation": alone, "v2_window": on, "v2_no_window": off}
    assert study.check(results, None, 0.15, 0, long_from=512, short_to=32) == []
    worse = {**results, "v2_window": run(["b"], {32: 3.5, 512: 1.5})}
    assert study.check(worse, None, 0.15, 0, long_from=512, short_to=32) == [
        "greedy outputs of v2_window differ from no_speculation in 1 of 1 prompts: "
        "context_32_concurrency_8 prompt 0 from character 0",
        "32: acceptance with the window 3.500 is not within 0.1 of without 3.800",
        "512: acceptance with the window 1.500 < without 1.700",
    ]


def test_a_shared_prefix_dataset_begins_every_prompt_with_the_same_text(tmp_path):
    prefix, suffixes, out = tmp_path / "p.jsonl", tmp_path / "s.jsonl", tmp_path / "o.jsonl"
    sweep_plan.write_dataset(prefix, ["The shared start. "], 16)
    sweep_plan.write_dataset(suffixes, ["one", "two", "three"], 16)
    subprocess.run(sweep_plan.shared_prefix_command(prefix, suffixes, out), check=True)
    joined = [json.loads(line) for line in out.read_text().splitlines()]
    assert [j["prompt"] for j in joined] == [
        f"The shared start. {t}" for t in ("one", "two", "three")
    ]
    assert {j["output_tokens"] for j in joined} == {16}
