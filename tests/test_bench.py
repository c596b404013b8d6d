# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What ``make bench`` writes comes from what it measured: each verdict (the greedy tokens
from the lossless counts, the studies' checks, the engine's tokens and acceptance) and each
label (W, K, contexts) from the rows and reports it is given, so other data gives other
words; a study whose checks failed still reaches its report, and one that wrote none stops
the run. And what the README says of ``vllm bench sweep plot``, run on results shaped as
``vllm bench sweep serve`` writes them for the README's parameters."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

# The same code on every vLLM line: run once, in .venv (design/testing.md).
pytestmark = pytest.mark.release_independent


def study_report(no_window: int | None, window: int | None, failures: list[str] = ()) -> dict:
    """A study report as far as make bench reads it: a run without speculation (the
    reference), and the runs without and with the window with that many of 48 texts the
    reference's (None: not counted)."""

    def run(mean: float, same: int | None) -> dict:
        measured = {"mean_length": mean, "output_tokens_per_s": 10.0 * mean, "shared_prefix": 0}
        found = {
            "contexts": {"32": measured, "1024": measured},
            "workloads": {"context_1024_concurrency_4": {**measured, "concurrency": 4}},
        }
        if same is not None:
            divergences = [
                {"workload": "context_1024", "prompt": i, "character": 5} for i in range(48 - same)
            ]
            found["lossless"] = {
                "reference": "no_speculation",
                "identical": same,
                "total": 48,
                "divergences": divergences,
            }
        return found

    return {
        "window": 33,
        "sinks": 0,
        "num_spec": 3,
        "prompts_per_context": 8,
        "output_tokens": 16,
        "draft_training_context": 64,
        "contexts": [32, 1024],
        "workloads": ["context_1024_concurrency_4"],
        "sampling": {"temperature": "0.8", "seed": "0"},
        "failures": list(failures),
        "runs": {
            "no_speculation": run(1.0, None),
            "v2_no_window": run(2.0, no_window),
            "v2_window": run(3.0, window),
        },
    }


def studies(eagle_load: int | None = 48, sampled_failures: list[str] = ()) -> dict:
    """Every study make bench runs, each greedy run 48 of 48 but the EAGLE3 one with the
    window under load (``eagle_load``), the sampled draft model's with ``sampled_failures``
    (sampled texts differ, as they may)."""
    whole = study_report(48, 48)
    sampled = study_report(30, 29, sampled_failures)
    pair = {"draft_model": whole, "eagle3": whole}
    return {
        "curves": pair,
        "avx2": pair,
        "load": {"draft_model": whole, "eagle3": study_report(48, eagle_load)},
        "sampled": {"draft_model": sampled, "eagle3": study_report(20, 12)},
        "rerun": study_report(31, 30),
        "dflash": dflash_curve(),
    }


def dflash_curve(identical: int = 48, inside: float = 3.0, windowed: float = 2.7) -> dict:
    """The DFlash curve as ``bench_dflash`` returns it: greedy and sampled, 32 and 1024."""

    def means(at_1024: float) -> dict:
        return {32: inside, 1024: at_1024}

    runs = {"v2_no_window": means(1.2), "v2_window": means(windowed), "v2_auto": means(windowed)}
    return {
        "contexts": [32, 1024],
        "window": 33,
        "sampling": {"temperature": 0.8, "seed": 0},
        "training_context": 64,
        "num_spec": 3,
        "means": {"greedy": runs, "t0.8": runs},
        "identical": identical,
        "total": 48,
        "wall_s": 1.0,
    }


def tokens_line(found: dict) -> str:
    from benchmarks import long_context

    (line,) = [x for x in long_context.long_context_lines(found) if x.startswith("Tokens: ")]
    return line


def test_the_greedy_token_verdict_counts_the_texts_and_names_the_runs_that_differ():
    same = tokens_line(studies())
    # 6 greedy studies of 2 runs each (the sampled runs' texts are not counted).
    assert same.startswith("Tokens: the same in every greedy run (576 of 576 texts, 12 runs) (")
    # One text differs, and no check failed: the verdict is the counts', not the failures'.
    differ = tokens_line(studies(eagle_load=47))
    assert differ.startswith(
        "Tokens: DIFFERENT (575 of 576 texts the same; EAGLE3 under load v2_window 47 of 48) ("
    )
    assert "the greedy runs' checks (the texts, acceptance within the run, the window's " in differ
    assert "start-up lines): passed;" in differ
    # No run counted: said, never taken as the same.
    nothing = studies()
    for group in ("curves", "avx2", "load"):
        nothing[group] = {s: study_report(None, None) for s in nothing[group]}
    assert tokens_line(nothing).startswith("Tokens: NOT COMPARED (no run's texts were counted)")


def test_the_studies_checks_verdicts_are_their_reports_failures():
    passed = tokens_line(studies())
    assert (
        "the sampled runs' checks (acceptance within the run, the window's start-up lines): "
        "passed." in passed
    )
    failed = tokens_line(studies(48, ["1024: acceptance with the window 2.1 < 2.3"]))
    assert (
        "the sampled runs' checks (acceptance within the run, the window's start-up lines): "
        "FAILED (draft model sampled: 1024: acceptance with the window 2.1 < 2.3)." in failed
    )
    load = studies()
    load["load"]["eagle3"]["failures"] = ["v2_window: its server did not log the window"]
    assert (
        "greedy runs' checks (the texts, acceptance within the run, the window's start-up "
        "lines): FAILED (EAGLE3 under load: v2_window: its server did not log the window);"
        in tokens_line(load)
    )


def test_a_study_whose_checks_failed_gives_its_report_and_one_without_a_report_stops(
    tmp_path, monkeypatch
):
    from benchmarks import long_context
    from e2e import cpu_study

    report = tmp_path / "study_eagle3" / "report.json"
    written = study_report(48, 40, ["greedy outputs of v2_window differ"])

    class Harness:
        """The harness's process: it prints ``stdout`` and exits 1, having written ``report``
        where it is given one (its checks failed) or none (a sweep failed)."""

        def __init__(self, stdout: str, written: dict | None) -> None:
            self.stdout, self.written, self.returncode = stdout, written, None

        def __call__(self, command, **kwargs):
            assert command[1:3] == ["-m", "e2e"] and command[-2:] == ["--out", str(tmp_path)]
            if self.written is not None:
                report.parent.mkdir(parents=True, exist_ok=True)
                report.write_text(json.dumps(self.written))
            return self

        def communicate(self):
            self.returncode = 1
            return self.stdout, None

    monkeypatch.setattr(cpu_study.subprocess, "Popen", Harness("[e2e] failed\n", written))
    found = long_context.study("eagle3", tmp_path, {})
    assert found["failures"] == ["greedy outputs of v2_window differ"]
    assert found["runs"]["v2_window"]["lossless"]["identical"] == 40

    # A sweep that failed: no report (the one left by the run before is not this run's), the
    # end of its output in the error.
    refused = Harness("vllm bench sweep serve exited 1\n", None)
    monkeypatch.setattr(cpu_study.subprocess, "Popen", refused)
    with pytest.raises(RuntimeError, match=r"wrote no report \(exit 1\):\nvllm bench sweep serve"):
        long_context.study("eagle3", tmp_path, {})


def launch_rows(window: int, context: int, draft_k: int) -> list[dict]:
    row = {"batch": 256, "mrv1": 10, "torch": 12, "fused": 1, "mrv1_us": 100.0, "torch_us": 40.0}
    row |= {"window": window, "context": context, "fixed_fused": 1, "fixed_us": 1.0}
    return [
        {**row, "method": "dflash", "k": 0},
        {**row, "method": "eagle", "k": 3, "fixed_torch": 1},
        {**row, "method": "draft_model", "k": draft_k},
    ]


@pytest.mark.parametrize(("window", "context", "k"), [(2048, 32768, 5), (4096, 65536, 7)])
def test_the_sections_name_the_window_k_and_contexts_they_measured(window, context, k):
    from benchmarks import attention, launch_cost, step_cost, whole_build

    launches = "\n".join(launch_cost.launch_lines(launch_rows(window, context, k)))
    assert f"128-token blocks, W = {window}, contexts up to {context // 1024}k." in launches
    assert f"MRV1's EAGLE apply (K = {k}): the same shape" in launches
    read = {"context": context, "window": window, "heads": 4, "head_dim": 64}
    read |= {"windowed_len": window + 64, "windowed_ms": 1.0, "full_ms": 4.0, "ratio": 0.25}
    read |= {"ideal": 0.2, "sinks_ratio": 1.1, "sinks_ideal": 1.05, "sinks_rounds": 15}
    text = "\n".join(attention.attention_lines([read]))
    assert f"One query token, 4 heads of 64, fp32, W = {window}: the time" in text
    whole = {"batch": 1, "context": context, "window": window, "num_spec": k, "plain": 10.0}
    whole |= {"ours": 12.0, "watched": 12.0, "unwatched": 11.0}
    text = "\n".join(whole_build.whole_build_lines([whole]))
    assert f"blocks, W = {window}, K = {k}, contexts near {context // 1024}k)" in text
    threshold = {"context": context, "batch": 1, "window": window, "min_context": 8192}
    threshold |= {"below": 0, "width": 1, "plain_width": 1, "on_us": 1.0, "plain_us": 1.0}
    threshold |= {"ratio": 1.0, "allocs": (0, 0), "launches": 1, "plain_launches": 1}
    text = "\n".join(step_cost.threshold_lines([threshold]))
    assert f"against the plain window, W = {window}, same inputs" in text
    assert "M = 8192: median 1.00, worst 1.00." in text
    dcp = {"context": context, "batch": 1, "window": window, "cp": 2, "alignment": 256}
    dcp |= {"width": 1, "plain_width": 2, "dcp_us": 1.0, "local_us": 1.0, "plain_us": 1.0}
    dcp |= {"ratio": 1.0, "local_ratio": 1.0, "allocs": (0, 0), "launches": 1}
    dcp |= {"local_launches": 3, "plain_launches": 1}
    text = "\n".join(step_cost.dcp_lines([dcp]))
    assert f"without DCP, W = {window}, {context // 1024}k contexts" in text


def engine_row(never: int, never_acceptance: tuple, crops_tokens: bool) -> dict:
    return {
        "ratios": [1.1, 1.3],
        "plain_s": 1.0,
        "never_s": 1.2,
        "crops_s": 2.0,
        "acceptance": {"plain": (72, 72), "never": never_acceptance, "crops": (38, 168)},
        "same_tokens": {"plain": True, "never": True, "crops": crops_tokens},
        "construct_s": 9.0,
        "config": {
            "method": "draft_model",
            "num_spec": 3,
            "prompt_lens": [9, 118],
            "max_tokens": 24,
            "windows": {"never": never, "crops": 32},
        },
    }


def test_the_engine_rows_say_whether_the_window_cropped_and_what_each_run_generated():
    from benchmarks.engine import engine_lines

    text = "\n".join(engine_lines(engine_row(512, (72, 72), True)))
    assert "greedy; a draft reads at most 145 tokens), with no window and with " in text
    assert "``draft_window_size=512 (never crops)`` (the same acceptance as without it), " in text
    assert "``draft_window_size=32 (crops)`` is shown beside them (acceptance lower" in text
    assert "| draft_window_size=512 (never crops) | 1.20 | 72 / 72 | the same |" in text
    assert "| draft_window_size=32 (crops) | 2.00 | 38 / 168 | the same |" in text
    # A window shorter than the longest read crops, and changes the acceptance; the tokens of
    # the run that differs are the only ones called different.
    text = "\n".join(engine_lines(engine_row(128, (60, 72), False)))
    assert (
        "``draft_window_size=128 (crops)`` (acceptance lower than without it: other drafts, so "
        "its time is not the window's cost alone)" in text
    )
    assert "| draft_window_size=128 (crops) | 1.20 | 60 / 72 | the same |" in text
    assert "| draft_window_size=32 (crops) | 2.00 | 38 / 168 | DIFFERENT |" in text


def test_the_free_kv_engine_sentence_comes_from_its_runs():
    from benchmarks.kv_reclaim import kv_reclaim_lines

    def run(tokens: dict, running: int) -> dict:
        return {"tokens": tokens, "most_running": running, "counters": {"vllm:num_preemptions": 0}}

    engine = {"window": 40, "requests": 2, "lengths": [512]}
    same = {**engine, "whole": run({"a": [1]}, 1), "freed": run({"a": [1]}, 2)}
    text = "\n".join(kv_reclaim_lines({"rows": [], "engine": same}))
    assert "(the draft model trained here, W = 40, 2 requests of 512 tokens in KV" in text
    assert "at most 1 running at once without the key, 2 with it" in text
    assert text.rstrip().endswith("tokens the same.")
    differ = {**engine, "whole": run({"a": [1]}, 1), "freed": run({"a": [2]}, 2)}
    text = "\n".join(kv_reclaim_lines({"rows": [], "engine": differ}))
    assert text.rstrip().endswith("tokens DIFFERENT.")


# The README's serve and bench parameters ("Measure it on your hardware").
SPEC = {
    "method": "dspark",
    "model": "deepseek-ai/dspark_qwen3_8b_block7",
    "num_speculative_tokens": 7,
}
SERVE_PARAMS = [
    {"_benchmark_name": "no_speculation"},
    {"_benchmark_name": "v2_no_window", "speculative_config": SPEC},
    {
        "_benchmark_name": "v2_window",
        "speculative_config": SPEC,
        "additional_config": {"draft_window_size": "auto"},
    },
]


def bench_params(context: int) -> dict:
    return {
        "_benchmark_name": f"context_{context}_concurrency_8",
        "dataset_path": f"context_{context}.jsonl",
        "num_prompts": 8,
        "max_concurrency": 8,
        "custom_output_len": 256,
    }


@pytest.fixture(scope="module")
def readme_experiment(tmp_path_factory) -> Path:
    """``results/window`` as ``vllm bench sweep serve`` (vLLM 0.33 and 0.34) leaves it for the
    README's parameters at two contexts: per server and workload a folder
    ``SERVE--<run>-BENCH--<workload>`` with ``run=0.json`` (what ``vllm bench serve`` saved,
    then the run number, the serve parameters and the bench ones written over it, as
    ``_update_run_data`` does: the workload's ``_benchmark_name`` replaces the server's) and
    ``summary.json`` (its runs: what ``vllm bench sweep plot`` reads), and ``summary.csv`` of
    every run."""
    import pandas as pd

    experiment = tmp_path_factory.mktemp("results") / "window"
    rows = []
    for serve in SERVE_PARAMS:
        for context in (4096, 32768):
            bench = bench_params(context)
            saved = {
                "date": "20261206-010000",
                "backend": "vllm",
                "model_id": "Qwen/Qwen3-8B",
                "num_prompts": 8,
                "request_rate": "inf",
                "max_concurrency": 8,
                "completed": 8,
                "total_input_tokens": 8 * context,
                "total_output_tokens": 8 * 256,
                "output_throughput": 500.0,
                "median_ttft_ms": 40.0,
                "median_tpot_ms": 10.0,
            }
            if "speculative_config" in serve:
                with_window = "additional_config" in serve
                saved["spec_decode_acceptance_length"] = 4.5 if with_window else 1.1
                saved["spec_decode_per_position_acceptance_rates"] = [0.5] * 7
            run = {**saved, "run_number": 0, **serve, **bench}
            folder = (
                experiment / f"SERVE--{serve['_benchmark_name']}-BENCH--{bench['_benchmark_name']}"
            )
            folder.mkdir(parents=True)
            (folder / "run=0.json").write_text(json.dumps(run, indent=4))
            (folder / "summary.json").write_text(json.dumps([run], indent=4))
            rows.append(run)
    pd.DataFrame.from_records(rows).to_csv(experiment / "summary.csv")
    return experiment


# Each invocation of vLLM's command-line entry point (what ``vllm`` runs), in one process:
# what it printed, and the exception it ended with ("" when it ended without one).
SWEEP_PLOTS = """
import contextlib, io, json, sys, traceback
from vllm.entrypoints.cli.main import main
ended = []
for argv in json.loads(sys.argv[1]):
    sys.argv, printed, raised = ["vllm", *argv], io.StringIO(), ""
    with contextlib.redirect_stdout(printed):
        try:
            main()
        except Exception:
            raised = traceback.format_exc()
    ended.append({"stdout": printed.getvalue(), "raised": raised})
print(json.dumps(ended))
"""

# One curve per run: the plot sorts its rows by the curve's columns first, and dicts neither
# sort nor (for two columns) hash. One row, column or figure per run (--row-by, --fig-by
# alike): the run served without the key has none.
CANNOT_GROUP = {
    "--curve-by speculative_config,additional_config": "TypeError: unhashable type",
    "--curve-by additional_config": "TypeError: '<' not supported between instances",
    "--col-by additional_config": "ValueError: Cannot find metric 'additional_config'",
}
UNGROUPED = "--dry-run"


@pytest.fixture(scope="module")
def sweep_plots(readme_experiment) -> dict[str, dict]:
    """``vllm bench sweep plot`` of the experiment, acceptance length by total input tokens
    (the context times 8 prompts), grouped each way ``CANNOT_GROUP`` names and ungrouped:
    the environment's vLLM, its command-line entry point given each command line a user
    types (one process for all: vLLM's import is most of a run's time)."""
    grouped = {**CANNOT_GROUP, UNGROUPED: None}
    base = ["bench", "sweep", "plot", str(readme_experiment), "--var-x", "total_input_tokens"]
    base += ["--var-y", "spec_decode_acceptance_length"]
    argvs = [base + by.split() for by in grouped]
    done = subprocess.run(
        [sys.executable, "-c", SWEEP_PLOTS, json.dumps(argvs)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return dict(zip(grouped, json.loads(done.stdout.splitlines()[-1]), strict=True))


@pytest.mark.parametrize("by", list(CANNOT_GROUP))
def test_vllm_bench_sweep_plot_cannot_tell_the_readmes_runs_apart(
    sweep_plots, readme_experiment, by
):
    assert CANNOT_GROUP[by] in sweep_plots[by]["raised"]
    assert not list(readme_experiment.rglob("*.png"))


def test_vllm_bench_sweep_plot_without_grouping_pools_every_run_in_one_curve(sweep_plots):
    # The serve parameters are the only fields that tell the runs apart (each run's
    # _benchmark_name is the workload's): ungrouped, one figure of one panel and one curve.
    done = sweep_plots[UNGROUPED]
    assert done["raised"] == "", done["raised"]
    assert done["stdout"].count("[BEGIN FIGURE]") == 1
    assert "Group: {}\nGrid: 1 rows x 1 cols\n" in done["stdout"]


def test_the_dflash_lines_compute_the_shares_and_the_tokens_verdict():
    from benchmarks import long_context

    lines = long_context.dflash_lines(dflash_curve())
    assert "| DFlash, W = 33 | 3.00 | 2.70 |" in lines
    assert "| DFlash, no window, sampled | 3.00 | 1.20 |" in lines
    (said,) = [line for line in lines if line.startswith("At 1024 tokens")]
    assert "no window 40% greedy; W = 33 90% greedy; auto 90% greedy;" in said
    assert said.endswith("Greedy tokens: the same as the target alone's (48 of 48 texts).")
    (differ,) = [
        line
        for line in long_context.dflash_lines(dflash_curve(identical=47))
        if line.startswith("At 1024 tokens")
    ]
    assert differ.endswith("Greedy tokens: DIFFERENT from the target alone's (47 of 48 texts).")


# ---- make bench SECTION=...: each section's rows saved, the results written from them ----


def test_saved_rows_read_back_as_measured_int_keys_and_tuples_included(tmp_path):
    from benchmarks import bench_window, long_context

    rows = {**studies(), "engine": engine_row(512, (72, 72), True)}
    bench_window.save_rows(tmp_path, "long_context", rows, "a machine", "2026-12-06T10:00:00Z")
    record = json.loads(bench_window.rows_path(tmp_path, "long_context").read_text())
    back = bench_window._decode(record["rows"])
    assert back == rows and repr(back) == repr(rows)
    # The DFlash curve's contexts are ints, as measured: its lines read them so.
    assert long_context.dflash_lines(back["dflash"]) == long_context.dflash_lines(rows["dflash"])


def test_a_section_alone_needs_the_others_rows_and_stops_before_measuring(tmp_path, monkeypatch):
    from benchmarks import bench_window

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", bench_window.MMAP_THRESHOLD)
    measured = []
    sections = tuple(
        bench_window.Section(s.name, s.title, lambda args, name=s.name: measured.append(name))
        for s in bench_window.SECTIONS
    )
    monkeypatch.setattr(bench_window, "SECTIONS", sections)
    monkeypatch.setattr(sys, "argv", ["bench", "--out", str(tmp_path), "--section", "attention"])
    with pytest.raises(SystemExit) as stopped:
        bench_window.main()
    assert stopped.value.code == 2 and not measured


def test_a_section_alone_measures_it_and_writes_the_results_with_the_others_rows(
    tmp_path, monkeypatch
):
    from benchmarks import bench_window

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", bench_window.MMAP_THRESHOLD)
    for section in bench_window.SECTIONS:
        bench_window.save_rows(
            tmp_path, section.name, {"old": section.name}, "machine A", "2026-12-01T09:00:00Z"
        )
    measured, written = [], {}
    sections = tuple(
        bench_window.Section(
            s.name, s.title, lambda args, name=s.name: measured.append(name) or {"new": name}
        )
        for s in bench_window.SECTIONS
    )
    monkeypatch.setattr(bench_window, "SECTIONS", sections)
    monkeypatch.setattr(bench_window, "BY_NAME", {s.name: s for s in sections})
    monkeypatch.setattr(bench_window, "load_mrv1_adapter_module", lambda: None)
    monkeypatch.setattr(bench_window, "machine", lambda: "machine B")
    monkeypatch.setattr(bench_window, "write_results", lambda out, records: written.update(records))
    monkeypatch.setattr(bench_window, "studies_failures", lambda studies: [])
    argv = ["bench", "--out", str(tmp_path), "--section", "dcp", "--section", "attention"]
    monkeypatch.setattr(sys, "argv", argv)

    bench_window.main()

    assert measured == ["dcp", "attention"]  # in the sections' order as given
    assert written["dcp"]["rows"] == {"new": "dcp"} and written["dcp"]["machine"] == "machine B"
    assert written["steps"]["rows"] == {"old": "steps"}
    said = bench_window.provenance(written)
    assert said.startswith("Measured in more than one run")
    assert "dcp, attention: machine B" in said and "machine A" in said
    # The same machine on the same day, in two runs: still two runs, each with its start.
    same_day = {
        name: {**record, "machine": "machine B", "date": "2026-12-01"}
        for name, record in written.items()
    }
    said = bench_window.provenance(same_day)
    assert said.startswith("Measured in more than one run") and "2026-12-01T09:00:00Z" in said
    one_run = {name: {**record, **written["dcp"], "rows": {}} for name, record in written.items()}
    assert bench_window.provenance(one_run) == (
        f"Machine: machine B. Written by `make bench` ({written['dcp']['started'][:10]})."
    )


def without_times(rows: list[dict]) -> list[dict]:
    """Per-build rows without their times (every float: microseconds, and ratios of them):
    the configurations, and the allocations, launches and table widths measured."""
    return [{k: v for k, v in row.items() if not isinstance(v, float)} for row in rows]


def test_the_committed_results_are_written_from_rows_the_sections_measure(tmp_path, monkeypatch):
    """benchmarks/results/README.md is what the writer makes of benchmarks/results/rows/, and
    those rows are what the sections measure now: the per-build sections' (one round of one
    call each) but for their times, and ``kv_reclaim``'s shapes (vLLM's grouping, KV cache
    manager and concurrency, no clock) exactly. Not measured again here, minutes each: the
    real engines' rows (``long_context``, ``engine``, ``kv_reclaim``'s engine runs: the next
    test checks their settings) and ``attention`` (its reads of 128k contexts)."""
    import argparse
    import shutil

    from benchmarks import bench_window, kv_reclaim
    from testbed.mrv1_adapter import load_mrv1_adapter_module

    results = bench_window.ROOT / "benchmarks" / "results"
    shutil.copytree(results / "rows", tmp_path / "rows")
    records = bench_window.load_rows(tmp_path)
    bench_window.write_results(tmp_path, records)
    assert (tmp_path / "README.md").read_text() == (results / "README.md").read_text()
    args = argparse.Namespace(mrv1=load_mrv1_adapter_module(), rounds=1, iters=1, out=tmp_path)
    for name in ("steps", "sinks", "threshold", "dcp", "launches"):
        measured = bench_window.BY_NAME[name].measure(args)
        assert without_times(measured) == without_times(records[name]["rows"]), name
    committed = records["kv_reclaim"]["rows"]
    monkeypatch.setattr(kv_reclaim, "engine_admission", lambda: committed["engine"])
    measured = bench_window.BY_NAME["kv_reclaim"].measure(args)
    for now, then in zip(measured["rows"], committed["rows"], strict=True):
        assert now == then, now["shape"]


def test_the_committed_engine_rows_carry_the_settings_their_sections_run():
    """The rows of the real engines (minutes each to measure again) name what they were
    measured from: the long-context studies the CPU study's contexts, prompts, tokens, K,
    block size, sampling and the drafters' training context; the engine section and
    ``kv_reclaim``'s engine runs their plans."""
    import trained_models as trained
    from benchmarks import bench_window, engine, long_context
    from e2e.scenarios import cpu_study_defaults
    from testbed.engine.load_plan import WINDOW
    from testbed.engine.runs import PROMPT_LENS, Run

    records = bench_window.load_rows(bench_window.ROOT / "benchmarks" / "results")
    studies = records["long_context"]["rows"]
    study = cpu_study_defaults()
    contexts = [int(c) for c in study["CONTEXTS"].split(",")]
    greedy, sampled = {"temperature": "0"}, {"temperature": "0.8", "seed": "0"}
    settings = ("contexts", "prompts_per_context", "output_tokens", "num_spec")
    settings += ("draft_training_context", "alignment", "sampling")
    common = (int(study["OUTPUT_TOKENS"]), trained.NUM_SPEC, trained.DRAFT_CONTEXT)
    common += (int(study["BLOCK_SIZE"]),)
    curve = (contexts, int(study["PROMPTS_PER_CONTEXT"]), *common)
    load = ([long_context.LONGEST], int(long_context.LOAD["PROMPTS_PER_CONTEXT"]), *common)
    reports = [("rerun", studies["rerun"], (*curve, sampled))]
    for group, want in (
        ("curves", (*curve, greedy)),
        ("avx2", (*curve, greedy)),
        ("sampled", (*curve, sampled)),
        ("load", (*load, greedy)),
    ):
        assert set(studies[group]) == set(long_context.CURVES), group
        reports += [(f"{group} {s}", report, want) for s, report in studies[group].items()]
    for name, report, want in reports:
        assert tuple(report[key] for key in settings) == want, name
    dflash = studies["dflash"]
    assert (dflash["contexts"], dflash["num_spec"], dflash["training_context"]) == (
        contexts,
        trained.NUM_SPEC,
        trained.DRAFT_CONTEXT,
    )
    assert records["engine"]["rows"]["config"] == {
        "method": engine.METHOD,
        "num_spec": engine.NUM_SPEC,
        "prompt_lens": list(PROMPT_LENS),
        "max_tokens": Run("any", engine.METHOD).max_tokens,
        "windows": {"never": engine.NEVER, "crops": engine.CROPS},
    }
    admission = records["kv_reclaim"]["rows"]["engine"]
    assert (admission["window"], admission["requests"], admission["lengths"]) == (
        WINDOW["draft_window_size"],
        4,
        [1024],
    )
