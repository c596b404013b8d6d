# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""A run of the harness: its sweeps run (or, dry, their commands printed), then checked and
reported; and ``--check`` of what the printed commands wrote."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from e2e import checks, cli, host, reports, scenarios, study, sweep_plan
from e2e.scenarios import (
    ROOT,
    Run,
    Scenario,
    e2e_workloads,
    plan_sweeps,
    runs,
    study_plan,
    study_runs,
)


def run_sweeps(sweeps: list[sweep_plan.Sweep], out: Path, at_once: int = 1) -> dict:
    """Runs the sweeps, Model Runner V2's ``at_once`` side by side and then V1's, their
    servers started in ``out``, and collects what they wrote (``collect``)."""
    environ = dict(os.environ)
    codes = sweep_plan.run([s for s in sweeps if s.name != "v1"], environ, out, at_once)
    codes |= sweep_plan.run([s for s in sweeps if s.name == "v1"], environ, out, 1)
    return checks.collect(sweeps, codes)


def run_scenario(
    scenario: Scenario,
    device: str,
    port: int,
    out_dir: Path,
    record: bool = False,
    given: dict[str, str] | None = None,
) -> int:
    golden = checks.load_golden(scenario, record)
    conditions = checks.run_conditions(scenario, device, given or {})
    if checks.gate(golden, conditions) is None and not record:
        print(
            f"[e2e] no golden file {scenario.golden} recorded under this run's conditions: "
            "acceptance checked within the run, the window against no window",
            flush=True,
        )
    job = host.Job(scenario, device, out_dir, given or {})
    check_host(device, scenario.method)
    job.produced = host.start_run(job)
    workloads = e2e_workloads(scenario, out_dir)
    planned = runs(scenario, device)
    sweeps = plan_sweeps(scenario, planned, workloads, device, port, out_dir, 1, job.given)
    host.record_plan(out_dir, scenario, planned, sweeps)
    for one in sweeps:
        print(f"[e2e] {one.shell_lines()[0]}", flush=True)
    done = run_sweeps(sweeps, out_dir)
    if done["failures"]:
        return reports.report_failures(done["failures"])
    results = reports.scenario_results(done, workloads)
    if record and scenario.golden is not None:
        measured = results["v2_window"]["acceptance"]["per_position"]
        reports.write_golden(scenario.golden, "per_position", measured, 0.1, conditions)
    return reports.finish_scenario(job, results, record)


def run_study(
    scenario: Scenario,
    device: str,
    port: int,
    out_dir: Path,
    settings: study.Settings,
    record: bool,
    given: dict[str, str] | None = None,
) -> int:
    if not settings.contexts:
        raise SystemExit("no study context fits the model: set MAX_CONTEXT")
    job = host.Job(scenario, device, out_dir, given or {}, settings=settings)
    check_host(device, scenario.method)
    job.produced = host.start_run(job)
    (out_dir / "study_text.txt").write_text(settings.text(), encoding="utf-8")
    commands, workloads, sweeps = study_plan(scenario, device, port, settings, job.given, out_dir)
    planned = study_runs(scenario, device, job.given)
    host.record_plan(out_dir, scenario, planned, sweeps, settings)
    cut_datasets(commands)
    for one in sweeps:
        print(f"[e2e] study: {one.shell_lines()[0]}", flush=True)
    # The servers start in the study's folder (on CPU: they import this project as installed).
    done = run_sweeps(sweeps, out_dir, settings.parallel)
    if done["failures"]:
        return reports.report_failures(done["failures"])
    results = reports.study_results(done, planned, workloads, settings)
    for name, found in results.items():
        for workload, m in found["workloads"].items():
            mean = m["mean_length"]
            print(
                f"[e2e] study {name} {workload}: mean acceptance length "
                f"{'-' if mean is None else f'{mean:.3f}'}, "
                f"{m['output_tokens_per_s']:.1f} output tokens/s",
                flush=True,
            )
    if record:
        measured = {c: m["mean_length"] for c, m in results["v2_window"]["contexts"].items()}
        golden_file = study.golden_path(ROOT, scenario.name, scenario.window, scenario.min_context)
        conditions = checks.run_conditions(scenario, device, job.given)
        reports.write_golden(golden_file, "mean_length", measured, 0.15, conditions)
    return reports.finish_study(job, results, workloads, record)


def check_host(device: str, method: str) -> None:
    """The install and the pairing check, and beside the pairing check the probe of whether
    the host's vLLM still has Model Runner V1 (the servers' environment): each probe
    imports vLLM, seconds of CPU."""
    host.install(device)
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(scenarios.host_has_model_runner_v1)
        host.check_pairing(method)


def cut_datasets(commands: list[list[str]]) -> None:
    """vLLM's cutter for every dataset in one process (its ``main`` on each printed
    command's arguments, in order: one import of vLLM instead of one per dataset), then the
    other commands (the joins of its slices) in order."""
    cutter = ["-m", sweep_plan.CUTTER]
    cuts = [c[3:] for c in commands if c[1:3] == cutter]
    if cuts:
        script = f"import json, sys; from {sweep_plan.CUTTER} import main\n"
        script += "for argv in json.loads(sys.argv[1]): main(argv)"
        cut = [sys.executable, "-c", script, json.dumps(cuts)]
        subprocess.run(cut, check=True, capture_output=True)
    for command in commands:
        if command[1:3] != cutter:
            subprocess.run(command, check=True, capture_output=True)


def dry_run(scenario, device, port, out, settings=None, given=None) -> list[str]:
    """Writes the parameter files and the e2e datasets into ``out`` and returns every
    command, as a user pastes them: the install, vLLM's cutter for the study's datasets,
    and one ``vllm bench sweep serve`` per sweep (with the environment it needs). The folder
    is the run's own, as a real run's is (``start_run``)."""
    given = given or {}
    host.start_run(host.Job(scenario, device, out, given), dry_run=True)
    # The install and its checks, and the pairing check, as the real run does them: a
    # command that stops with the reason where one fails (from the checkout, as make runs it).
    prepare = [sys.executable, "-m", "e2e", "--prepare", "--device", device]
    prepare += ["--scenario", scenario.name, *(("--study", "long") if settings else ())]
    lines = [f"cd {shlex.quote(str(ROOT))} && {shlex.join(prepare)}"]
    if settings is None:
        workloads = e2e_workloads(scenario, out)
        planned = runs(scenario, device)
        sweeps = plan_sweeps(scenario, planned, workloads, device, port, out, 1, given)
        host.record_plan(out, scenario, planned, sweeps)
    else:
        # The text the datasets are cut from, written as a real run writes it.
        (out / "study_text.txt").write_text(settings.text(), encoding="utf-8")
        text = settings.text_path or "the documentation CPython ships (study.corpus())"
        lines.append(f"# wrote {out / 'study_text.txt'}: {text}")
        commands, _, sweeps = study_plan(scenario, device, port, settings, given, out)
        host.record_plan(out, scenario, study_runs(scenario, device, given), sweeps, settings)
        lines += [shlex.join(command) for command in commands]
    sweep_plan.write_files(sweeps)
    for planned in sweeps:
        lines += planned.shell_lines()
    return lines


def check_results(folder: Path, asked: dict[str, str] | None = None) -> int:
    """``make e2e-check RESULTS=folder``: the checks of a real run over what the dry run's
    commands wrote into ``folder`` (each sweep's summary.csv and its servers' log beside
    it): lossless (``lossless.py``), the acceptance within the run (and a golden where one
    was recorded), the window's start-up lines; a report as a run writes it. The plan comes
    from the folder's run.json, the runs and workloads from the parameter files the
    commands read. LOSSLESS and MIN_IDENTICAL given to the check (``asked``) are the
    check's: both come from it, over the run's."""
    record_file = folder / cli.RUN_RECORD
    if not record_file.exists():
        print(
            f"[e2e] FAILED: no {record_file}: not a folder the dry run (DRY_RUN=1) or a run of "
            "this harness wrote; pass the folder its vllm bench commands wrote into",
            flush=True,
        )
        return 2
    record = json.loads(record_file.read_text())
    plan = record.get("plan")
    if plan is None:
        print(f"[e2e] FAILED: {record_file} holds no plan (written before --check existed)")
        return 2
    given, device = record.get("settings", {}), record["device"]
    asked = {k: v for k, v in (asked or {}).items() if k in cli.CHECK_SETTINGS}
    if asked:
        given = {k: v for k, v in given.items() if k not in cli.CHECK_SETTINGS} | asked
    problem = cli.lossless_problem(given, device)
    if problem:
        print(f"[e2e] FAILED: {problem}", flush=True)
        return 2
    fields = plan["scenario"]
    scenario = Scenario(**fields | {"golden": fields["golden"] and Path(fields["golden"])})
    planned = [Run(**run) for run in plan["runs"]]
    sweeps, failures = [], []
    for name in plan["sweeps"]:
        try:
            sweeps.append(sweep_plan.Sweep.read(name, folder))
        except FileNotFoundError as missing:
            failures.append(f"{name}: no {missing.filename} (the dry run writes it)")
    done = checks.collect(sweeps, since=record_file.stat().st_mtime)
    failures += done["failures"]
    missing_runs = [run.name for run in planned if run.name not in done["results"]]
    if missing_runs and not failures:
        failures.append(f"no results for {', '.join(missing_runs)} in {folder}")
    if failures:
        return reports.report_failures(failures)
    workloads = sweeps[0].workloads
    produced = {key: value for key, value in record.items() if key != "plan"}
    by = " ".join(f"{k}={v}" for k, v in asked.items())
    produced["checked"] = f"{host.now()} by --check ({folder}){f' with {by}' if by else ''}"
    settings = None if plan["study"] is None else study.Settings(**plan["study"])
    job = host.Job(scenario, device, folder, given, produced, settings)
    print(f"[e2e] checking {folder}: {scenario.name} on {device}, {job.policy.describe()}")
    if settings is not None:
        return reports.finish_study(
            job, reports.study_results(done, planned, workloads, settings), workloads
        )
    return reports.finish_scenario(job, reports.scenario_results(done, workloads))


def main(argv: list[str] | None = None) -> int:
    """``python -m e2e``: the command line (``cli``), then the run it asks for."""
    options = cli.parse(argv)
    if options.check is not None:
        return check_results(options.check, options.given)
    scenario, device, settings = options.scenario, options.device, options.settings
    if options.prepare:
        host.install(device)
        host.check_pairing(scenario.method)
        return 0
    given = options.given
    port = int(given.get("PORT") or 8123)
    if options.on("DRY_RUN"):
        print("\n".join(dry_run(scenario, device, port, options.out, settings, given)))
        return 0
    problem = host.host_problem(device, scenario.name, given)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    if "PORT" not in given:
        # One port per sweep: PARALLEL of V2's, and V1's.
        port = host.free_ports((settings.parallel if settings else 1) + 1, port)
    record = options.on("RECORD_GOLDEN")
    if settings is not None:
        return run_study(scenario, device, port, options.out, settings, record, given)
    return run_scenario(scenario, device, port, options.out, record, given)
