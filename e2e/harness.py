# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""A run of the harness: the install and the pairing check, the sweeps run (or, dry, their
commands printed), what they measured collected, the checks, the report with what produced
it; and ``--check`` of what the printed commands wrote."""

from __future__ import annotations

import base64
import dataclasses
import datetime
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from e2e import cli, lossless, study, sweep_plan
from e2e.scenarios import (
    KEY,
    ROOT,
    Run,
    Scenario,
    additional_config,
    e2e_workloads,
    plan_sweeps,
    runs,
    sampling,
    study_plan,
    study_runs,
    trained_models,
)


@dataclass
class Job:
    """One run of the harness, or ``--check`` of one: its scenario on its device, its
    folder, the settings given (the Makefile's names: ``cli.SETTINGS``), what produced it
    (``run.json``) and, for the study, the study's settings."""

    scenario: Scenario
    device: str
    out: Path
    given: dict[str, str]
    produced: dict | None = None
    settings: study.Settings | None = None

    @property
    def policy(self) -> lossless.Policy:
        return lossless.Policy.for_run(self.device, self.given)


PLUGIN_MODULE = "vllm_ascend.worker.v2.spec_decode.draft_window.overlay.plugin"


def record_hashes(dist: str) -> dict[str, str]:
    """Current sha256 of every file a distribution's RECORD lists."""
    out = {}
    for f in metadata.distribution(dist).files or []:
        path = Path(f.locate())
        if path.is_file() and f.hash is not None:
            digest = hashlib.sha256(path.read_bytes()).digest()
            out[str(f)] = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    return out


def install(device: str) -> None:
    if device == "cpu":
        # make installed this project into .venv (a regular install); the servers import it
        # from there, never from this checkout (they start in the study's folder).
        probe = [sys.executable, "-c", f"import {PLUGIN_MODULE}"]
        if subprocess.run(probe, capture_output=True, cwd="/").returncode != 0:
            raise SystemExit(f"{PLUGIN_MODULE} is not installed here: run make study-cpu")
        return
    before = record_hashes("vllm-ascend") if device == "ascend" else {}
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", str(ROOT)]
    try:
        # Offline hosts: build with the environment's own setuptools when it is recent enough.
        if int(metadata.version("setuptools").split(".")[0]) >= 77:
            cmd.insert(-1, "--no-build-isolation")
    except metadata.PackageNotFoundError:
        pass
    print(f"[e2e] {shlex.join(cmd)}", flush=True)
    subprocess.run(cmd, check=True)
    if device == "ascend":
        after = record_hashes("vllm-ascend")
        changed = sorted(p for p, h in before.items() if after.get(p) != h)
        if changed:
            raise SystemExit(f"installing this project changed vllm-ascend files: {changed[:5]}")
    # An editable vllm-ascend hides the namespace folders this overlay installs into.
    probe = [sys.executable, "-c", f"import {PLUGIN_MODULE}"]
    if subprocess.run(probe, capture_output=True).returncode != 0:
        raise SystemExit(
            f"{PLUGIN_MODULE} does not import after the install (is vllm-ascend "
            "installed editable? install it regularly)"
        )


def check_pairing(method: str) -> None:
    """Before any server: the host's vLLM (and vllm-ascend) must be a release the window
    supports, and serve the scenario's method there (the installed package's own table)."""
    probe = [sys.executable, "-c", PAIRING_PROBE, method]
    result = subprocess.run(probe, capture_output=True, text=True)
    print(f"[e2e] {result.stdout.strip()}", flush=True)
    if result.returncode != 0:
        raise SystemExit(result.stdout.strip().splitlines()[-1] if result.stdout else result.stderr)


# Run in the host's Python after the install: the versions and the supported supported.
PAIRING_PROBE = """
import sys
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import supported, versions
installed = versions.installed_versions()
line = supported.release_for(installed["vllm"])
print(f"host: {versions.describe_versions()}; supported: {supported.SUPPORTED}")
problem = None
if line is None:
    problem = f"vLLM {installed['vllm']} is not a release the draft window supports"
else:
    problem = versions.requirement_problem(line)
    if problem is None and sys.argv[1] not in line.methods:
        problem = (f"the draft window does not serve method {sys.argv[1]!r} on {line.name} "
                   f"(supported there: {', '.join(line.methods)}): pick another E2E_SCENARIO")
if problem:
    print(f"cannot run: {problem}")
    sys.exit(2)
"""


@dataclass(frozen=True)
class Golden:
    """A golden file: its figures, their tolerance, where they come from, and the conditions
    they were recorded under (``recorded``: ``run_conditions``'s keys). It gates only a run
    of the same conditions; elsewhere the report shows it as a reference."""

    values: list | dict
    tolerance: float
    source: str
    recorded: dict

    def differences(self, conditions: dict) -> list[str]:
        """Each condition of this run the golden was recorded under otherwise."""
        return [
            f"{key} {self.recorded.get(key, 'unrecorded')!r} (this run: {value!r})"
            for key, value in conditions.items()
            if self.recorded.get(key) != value
        ]

    def describe(self, conditions: dict) -> str:
        differs = self.differences(conditions)
        if not differs:
            return f"gates this run (+-{self.tolerance}): {self.source}"
        return f"a reference, not a gate (recorded with {', '.join(differs)}): {self.source}"


def run_conditions(scenario: Scenario, device: str, given: dict[str, str]) -> dict:
    """What a golden must have been recorded under to gate this run's V2 run with the
    window: the device, the runner, the sampling, whether the requests ignore EOS (every
    ``vllm bench serve`` of the harness does: ``sweep_plan.bench_command``), eager or
    graphs, the dtype and the block size the servers were given."""
    bench = sweep_plan.bench_command(scenario.target, 0, scenario.chat)
    served = scenario.extra_args
    flag = {served[i]: served[i + 1] for i in range(len(served) - 1) if served[i].startswith("--")}
    return {
        "device": device,
        "runner": "v2",
        "sampling": sampling(given) or "greedy",
        "ignore_eos": "--ignore-eos" in bench,
        "eager": "--enforce-eager" in served,
        "dtype": flag.get("--dtype", "auto"),
        "block_size": int(flag["--block-size"]) if "--block-size" in flag else None,
    }


def load_golden(scenario: Scenario, record: bool) -> Golden | None:
    """The scenario's golden file where it has one (and is not recording it); None: the
    acceptance is checked within the run (``check``)."""
    if scenario.golden is None or record or not scenario.golden.exists():
        return None
    data = json.loads(scenario.golden.read_text())
    source, recorded = data.get("source", str(scenario.golden)), data.get("recorded") or {}
    return Golden(data["per_position"], float(data.get("tolerance", 0.1)), source, recorded)


def gate(golden: Golden | None, conditions: dict) -> Golden | None:
    """The golden where it gates this run (recorded under its conditions), else None."""
    return golden if golden is not None and not golden.differences(conditions) else None


def acceptance(result: dict) -> dict:
    """What ``vllm bench serve`` measured of speculative decoding in one workload."""
    return {
        "drafts": result.get("spec_decode_num_drafts", 0),
        "per_position": result.get("spec_decode_per_position_acceptance_rates", []),
        "mean_length": result.get("spec_decode_acceptance_length"),
    }


# The window may cost at most this much mean acceptance over the long prompts against the
# same V2 run without it: inside the drafter's training context it changes little (the
# study's rule at short contexts), past it it gains.
WINDOW_MARGIN = 0.1


def check(
    results: dict[str, dict],
    golden: list[float] | None,
    tolerance: float = 0.1,
    num_spec: int | None = None,
    policy: lossless.Policy | None = None,
) -> list[str]:
    """The assertions; returns the failures (empty when everything holds). Every run's
    texts against the V2 run with the window's (``policy``: exact unless it says otherwise;
    each run's result under ``results[run]["lossless"]``); every run's acceptance by
    position has ``num_spec`` entries; the acceptance checked within the run (the window
    against no window, ``WINDOW_MARGIN``) and against the golden where there is one."""
    found, failures = lossless.check(results, "v2_window", policy or lossless.Policy())
    for name, compared in found.items():
        results[name]["lossless"] = compared
    incomplete = [
        f"{name}: acceptance by position has {len(r[w]['per_position'] or [])} entries, "
        f"num_speculative_tokens is {num_spec}"
        for name, r in results.items()
        for w in ("acceptance", "all_long")
        if r[w]["mean_length"] is None
        or (num_spec is not None and len(r[w]["per_position"] or []) != num_spec)
    ]
    if incomplete:
        return failures + incomplete
    ours = results["v2_window"]["acceptance"]
    with_window = results["v2_window"]["all_long"]["mean_length"]
    without = results["v2_no_window"]["all_long"]["mean_length"]
    if with_window < without - WINDOW_MARGIN:
        failures.append(
            f"V2 with the window: mean acceptance {with_window:.3f} < V2 without it "
            f"{without:.3f} - {WINDOW_MARGIN}"
        )
    if golden is not None:
        if len(golden) != len(ours["per_position"]):
            failures.append(
                f"the golden has {len(golden)} positions, the run {len(ours['per_position'])}"
            )
        for i, (got, want) in enumerate(zip(ours["per_position"], golden, strict=False)):
            if abs(got - want) > tolerance:
                failures.append(
                    f"acceptance at position {i}: {got:.3f}, golden {want:.3f} (+-{tolerance})"
                )
    if "v1_window" in results:
        v2 = results["v2_window"]["all_long"]["mean_length"]
        v1 = results["v1_window"]["all_long"]["mean_length"]
        if v2 < v1 - 0.05:
            failures.append(
                f"V2 with the window: mean acceptance {v2:.3f} < V1 with the window {v1:.3f} - 0.05"
            )
    return failures


def run_sweeps(sweeps: list[sweep_plan.Sweep], out: Path, at_once: int = 1) -> dict:
    """Runs the sweeps, Model Runner V2's ``at_once`` side by side and then V1's, their
    servers started in ``out``, and collects what they wrote (``collect``)."""
    environ = dict(os.environ)
    codes = sweep_plan.run([s for s in sweeps if s.name != "v1"], environ, out, at_once)
    codes |= sweep_plan.run([s for s in sweeps if s.name == "v1"], environ, out, 1)
    return collect(sweeps, codes)


# What vLLM's sweep prints where its experiment folder exists (vllm/benchmarks/sweep/serve.py).
REFUSED = "Cannot overwrite existing experiment_dir"


def pasted_problem(planned: sweep_plan.Sweep, since: float | None) -> str | None:
    """Why a pasted sweep's log and results are not one run's, or None: a log of a paste vLLM
    refused (pasted again over the results), results older than the dry run (``since``: its
    run.json's time; stale), or results of runs whose servers the log never names (the log
    of another paste). Checked before the window's start-up lines are read from the log."""
    summary = planned.experiment / "summary.csv"
    log = planned.log.read_text(errors="replace")
    again = f"remove {planned.experiment} and {planned.log} and paste its command again"
    if REFUSED in log:
        return (
            f"{planned.name}: {planned.log} is the output of a paste vLLM refused "
            f"({planned.experiment} existed: the sweep was pasted again), not of the sweep "
            f"that wrote {summary}: the log and the results are of different pastes; {again}"
        )
    if since is not None and summary.stat().st_mtime < since:
        return (
            f"{planned.name}: {summary} is older than the dry run's {RUN_RECORD}: stale "
            f"results of an earlier run, not of the printed commands; {again}"
        )
    logged = sweep_plan.server_logs(planned)
    written = sorted({run for run, _ in sweep_plan.results(planned) if run is not None})
    unlogged = [run for run in written if run not in logged]
    if unlogged:
        return (
            f"{planned.name}: {planned.log} names no server of {', '.join(unlogged)}, whose "
            f"results {summary} holds: the log and the results are of different pastes; "
            f"{again}"
        )
    return None


def collect(
    sweeps: list[sweep_plan.Sweep], codes: dict[str, int] | None = None, since: float | None = None
) -> dict:
    """Each run's results by workload, its server's log, and the failures: a sweep that
    exited non-zero (with the end of its log; nothing of it is read), a run that produced no
    result, a workload whose requests failed. ``codes`` None: the sweeps were run by hand
    (the dry run's commands, ``--check``), and a log or summary.csv they did not leave is a
    failure by name."""
    found, logs, failures = {}, {}, []
    for planned in sweeps:
        code = None if codes is None else codes[planned.name]
        if code not in (None, 0):
            failures.append(
                f"vllm bench sweep serve ({planned.name}) exited {code}; the "
                f"end of its log, {planned.log}:\n{sweep_plan.log_tail(planned)}"
            )
            continue
        if code is None:
            summary = planned.experiment / "summary.csv"
            missing = [p for p in (planned.log, summary) if not p.exists()]
            if missing:
                failures.append(
                    f"{planned.name}: no {' and no '.join(map(str, missing))} (the printed "
                    f"vllm bench sweep serve writes its results there and its servers' "
                    f"output to {planned.log.name}; did it run to the end in this folder?)"
                )
                continue
            problem = pasted_problem(planned, since)
            if problem:
                failures.append(problem)
                continue
        results = sweep_plan.results(planned)
        logs.update(sweep_plan.server_logs(planned))
        for serving_ in planned.runs:
            by_workload = {w: r for (run, w), r in results.items() if run == serving_.name}
            for workload, result in by_workload.items():
                if result.get("failed") or not result.get("completed"):
                    errors = [e for e in result.get("errors") or [] if e]
                    failures.append(
                        f"{serving_.name} {workload}: {result.get('failed')} of "
                        f"{result.get('num_prompts')} requests failed (vllm bench serve: "
                        f"{errors[0] if errors else 'no error given'!r}; is another server on "
                        f"its port? see {planned.log})"
                    )
            missing = [w.name for w in planned.workloads if w.name not in by_workload]
            if missing:
                failures.append(
                    f"{serving_.name}: no result for {', '.join(missing)} ("
                    f"{'' if code is None else f'vllm bench sweep serve exited {code}; '}"
                    f"see {planned.log})"
                )
            found[serving_.name] = by_workload
    return {"results": found, "logs": logs, "failures": failures}


def run_scenario(
    scenario: Scenario,
    device: str,
    port: int,
    out_dir: Path,
    record: bool = False,
    given: dict[str, str] | None = None,
) -> int:
    golden = load_golden(scenario, record)
    conditions = run_conditions(scenario, device, given or {})
    if gate(golden, conditions) is None and not record:
        print(
            f"[e2e] no golden file {scenario.golden} recorded under this run's conditions: "
            "acceptance checked within the run, the window against no window",
            flush=True,
        )
    job = Job(scenario, device, out_dir, given or {})
    install(device)
    check_pairing(scenario.method)
    job.produced = start_run(job)
    workloads = e2e_workloads(scenario, out_dir)
    planned = runs(scenario, device)
    sweeps = plan_sweeps(scenario, planned, workloads, device, port, out_dir, 1, job.given)
    record_plan(out_dir, scenario, planned, sweeps)
    for one in sweeps:
        print(f"[e2e] {one.shell_lines()[0]}", flush=True)
    done = run_sweeps(sweeps, out_dir)
    if done["failures"]:
        return report_failures(done["failures"])
    results = scenario_results(done, workloads)
    if record and scenario.golden is not None:
        measured = results["v2_window"]["acceptance"]["per_position"]
        write_golden(scenario.golden, "per_position", measured, 0.1, conditions)
    return finish_scenario(job, results, record)


def write_golden(path: Path, key: str, measured, tolerance: float, conditions: dict) -> None:
    """Records what the V2 run with the window measured as the golden (RECORD_GOLDEN=1),
    with the conditions it was measured under (it gates runs of the same only)."""
    data = {"source": f"recorded by python -m e2e on {conditions['device']}", key: measured}
    data |= {"tolerance": tolerance, "recorded": conditions}
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"[e2e] recorded {path}")


def report_failures(failures: list[str], out_dir: Path | None = None) -> int:
    """Prints each failure and, where a report was written (``out_dir``), the verdict; the
    exit code."""
    for failure in failures:
        print(f"[e2e] FAILED: {failure}")
    if out_dir is not None:
        print(f"[e2e] {'passed' if not failures else 'failed'}; report in {out_dir}")
    return 1 if failures else 0


def scenario_results(done: dict, workloads: list[sweep_plan.Workload]) -> dict[str, dict]:
    """Each run's texts, acceptance (the golden prompt's and the long prompts') and whether
    its server logged the window on and active."""
    results = {}
    for name, by_workload in done["results"].items():
        log = done["logs"].get(name, "")
        results[name] = {
            "outputs": {w.name: by_workload[w.name]["generated_texts"] for w in workloads},
            "acceptance": acceptance(by_workload["golden"]),
            "all_long": acceptance(by_workload["long"]),
            # The start-up line and the line of the first windowed build.
            "window_active": "Draft KV window on for" in log and "Draft KV window active" in log,
        }
    return results


def finish_scenario(job: Job, results: dict, record: bool = False) -> int:
    """The scenario's checks over its runs' results (``check``, the window's start-up lines),
    its report, and its exit code: a run's or ``--check``'s."""
    scenario = job.scenario
    golden = load_golden(scenario, record)
    conditions = run_conditions(scenario, job.device, job.given)
    gating = gate(golden, conditions)
    tolerance = 0.1 if gating is None else gating.tolerance
    values = None if gating is None else gating.values
    failures = check(results, values, tolerance, scenario.num_spec, job.policy)
    if not results["v2_window"]["window_active"]:
        failures.append("the V2 server with the window did not log the window on and active")
    if results["v2_no_window"]["window_active"]:
        failures.append("the V2 server without the window logged the window as on")
    produced = {**(job.produced or {}), "finished": now()}
    note = golden and golden.describe(conditions)
    write_report(
        job.out, scenario, job.device, results, golden, failures, produced, job.policy, note
    )
    return report_failures(failures, job.out)


def write_report(
    out_dir, scenario, device, results, golden, failures, produced=None, policy=None, note=None
) -> None:
    """report.json, report.md and acceptance.png; ``golden`` (a ``Golden`` or None) with
    ``note``: whether it gated this run or is shown as a reference."""
    policy = policy or lossless.Policy()
    report = {
        "scenario": scenario.name,
        "device": device,
        "window": scenario.window,
        "runs": results,
        "golden": golden and {**dataclasses.asdict(golden), "note": note},
        "lossless": policy.describe(),
        "failures": failures,
        "produced_by": produced,
    }
    (out_dir / "report.json").write_text(json.dumps(report, indent=2, default=str))
    lines = [
        f"# Draft window end to end: {scenario.name} on {device}",
        "",
        "| run | mean acceptance length (golden prompt) | per-position acceptance | mean "
        "acceptance length (long prompts) |",
        "|---|---:|---|---:|",
    ]
    for name, r in results.items():
        a = r["acceptance"]
        lines.append(
            f"| {name} | {a['mean_length']:.3f} | "
            f"{', '.join(f'{x:.2f}' for x in a['per_position'])} | "
            f"{r['all_long']['mean_length']:.3f} |"
        )
    if golden is not None:
        shown = ", ".join(f"{x:.2f}" for x in golden.values)
        lines += ["", f"Golden acceptance by position {shown}: {note}."]
    lines += [
        "",
        *study.lossless_lines(policy.describe(), results),
        "",
        *study.report_end(produced, failures, "acceptance.png", "acceptance"),
    ]
    (out_dir / "report.md").write_text("\n".join(lines))
    # Drawn here: `vllm bench sweep plot` cannot curve by run (study.plot says why).
    plt = study.pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, r in results.items():
        per_pos = r["acceptance"]["per_position"]
        ax.plot(range(len(per_pos)), per_pos, marker="o", label=name)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_title(f"{scenario.name}: window {scenario.window} vs none")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "acceptance.png", dpi=110)
    plt.close(fig)


def workload_metrics(result: dict, workload: sweep_plan.Workload, speculative: bool) -> dict:
    """One workload of one run, as ``vllm bench serve`` measured it."""
    found = re.match(r"(?:shared_prefix_(\d+)_)?context_(\d+)_concurrency_(\d+)", workload.name)
    prefix, context, concurrency = found.groups()
    return {
        "context": int(context),
        "concurrency": int(concurrency),
        "shared_prefix": int(prefix or 0),
        "mean_length": result.get("spec_decode_acceptance_length") if speculative else None,
        "acceptance_rate": result.get("spec_decode_acceptance_rate"),
        "per_position": (
            result.get("spec_decode_per_position_acceptance_rates") if speculative else None
        ),
        "drafts": result.get("spec_decode_num_drafts", 0),
        "output_tokens_per_s": result["output_throughput"],
        "tpot_ms": result["mean_tpot_ms"],
        "ttft_ms": result["mean_ttft_ms"],
        "completed": result["completed"],
    }


def study_run_results(
    run: Run, by_workload: dict, log: str, workloads: list, settings: study.Settings
) -> dict:
    """A run's report entry: every workload's metrics and texts, the study's curve (each
    context at the first concurrency), and the window's start-up lines."""
    lines = sweep_plan.window_lines(log)
    # "auto" reads as the window its start-up line says it became.
    window = run.window
    if window == "auto":
        became = [re.match(r"draft_window_size=auto became W=(\d+)", line) for line in lines]
        window = next((int(m.group(1)) for m in became if m), None)
    metrics = {}
    for workload in workloads:
        m = workload_metrics(by_workload[workload.name], workload, run.speculative)
        m["draft_kv_read"] = (
            None
            if not run.speculative
            else study.draft_kv_read(
                m["context"], window, run.sinks, settings.alignment, run.min_context
            )
        )
        metrics[workload.name] = m
    first = settings.concurrencies[0]
    return {
        "outputs": {w.name: by_workload[w.name]["generated_texts"] for w in workloads},
        "workloads": metrics,
        "contexts": {
            str(c): metrics[f"context_{c}_concurrency_{first}"] for c in settings.contexts
        },
        "window_lines": lines,
        "additional_config": additional_config(run),
    }


def study_golden(scenario: Scenario, device: str, record: bool) -> Golden | None:
    """The golden mean acceptance length by context where one was recorded on a device;
    None elsewhere: the acceptance is checked within the run, the window against no window
    (study.check)."""
    golden_file = study.golden_path(ROOT, scenario.name, scenario.window, scenario.min_context)
    if record or device == "cpu" or not golden_file.exists():
        return None
    data = json.loads(golden_file.read_text())
    source, recorded = data.get("source", str(golden_file)), data.get("recorded") or {}
    return Golden(data["mean_length"], float(data.get("tolerance", 0.15)), source, recorded)


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
    job = Job(scenario, device, out_dir, given or {}, settings=settings)
    install(device)
    check_pairing(scenario.method)
    job.produced = start_run(job)
    (out_dir / "study_text.txt").write_text(settings.text(), encoding="utf-8")
    commands, workloads, sweeps = study_plan(scenario, device, port, settings, job.given, out_dir)
    planned = study_runs(scenario, device, job.given)
    record_plan(out_dir, scenario, planned, sweeps, settings)
    cut_datasets(commands, settings.parallel)
    for one in sweeps:
        print(f"[e2e] study: {one.shell_lines()[0]}", flush=True)
    # The servers start in the study's folder (on CPU: they import this project as installed).
    done = run_sweeps(sweeps, out_dir, settings.parallel)
    if done["failures"]:
        return report_failures(done["failures"])
    results = study_results(done, planned, workloads, settings)
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
        conditions = run_conditions(scenario, device, job.given)
        write_golden(golden_file, "mean_length", measured, 0.15, conditions)
    return finish_study(job, results, workloads, record)


def study_results(done: dict, planned: list[Run], workloads: list, settings) -> dict:
    """Each planned run's report entry (``study_run_results``), in the plan's order."""
    runs_by_name = {run.name: run for run in planned}
    results = {
        name: study_run_results(
            runs_by_name[name], by_workload, done["logs"].get(name, ""), workloads, settings
        )
        for name, by_workload in done["results"].items()
        if name in runs_by_name
    }
    return {run: results[run] for run in runs_by_name if run in results}


def startup_failures(results: dict[str, dict]) -> list[str]:
    """The window's start-up line in each server's log: every run served with a window
    logged it, no run without one did."""
    failures = []
    for name, r in results.items():
        said = any(line.startswith("Draft KV window on for") for line in r["window_lines"])
        if KEY in r["additional_config"] and not said:
            failures.append(
                f"{name}: its server did not log the window's start-up line "
                f"('Draft KV window on for ...'): is this project installed where it served?"
            )
        elif KEY not in r["additional_config"] and said:
            failures.append(f"{name}: served without the window, its server logged it on")
    return failures


def finish_study(job: Job, results: dict, workloads: list, record: bool = False) -> int:
    """The study's checks over its runs' results (``study.check``, the window's start-up
    lines), its report, and its exit code: a run's or ``--check``'s."""
    scenario, settings, policy = job.scenario, job.settings, job.policy
    golden = study_golden(scenario, job.device, record)
    conditions = run_conditions(scenario, job.device, job.given)
    gating = gate(golden, conditions)
    failures = study.check(
        results,
        None if gating is None else gating.values,
        0.15 if gating is None else gating.tolerance,
        scenario.min_context,
        settings.long_from,
        settings.short_to,
        policy=policy,
        num_spec=scenario.num_spec,
    )
    failures += startup_failures(results)
    meta = {
        "scenario": scenario.name,
        "device": job.device,
        "method": scenario.method,
        "target": scenario.target,
        "draft": scenario.draft,
        "draft_training_context": study.training_context(scenario.draft),
        "window": scenario.window,
        "num_spec": scenario.num_spec,
        "alignment": settings.alignment,
        "sinks": scenario.sinks,
        "min_context": scenario.min_context,
        "contexts": settings.contexts,
        "concurrency": settings.concurrencies,
        "shared_prefix": settings.shared_prefix,
        "workloads": [w.name for w in workloads],
        "prompts_per_context": settings.prompts_per_context,
        "output_tokens": settings.output_tokens,
        "text": settings.text_path or "the documentation CPython ships",
        "long_from": settings.long_from,
        "short_to": settings.short_to,
        "lossless": policy.describe(),
        "sampling": sampling(job.given) or {"temperature": "0"},
        "golden": golden and golden.describe(conditions),
        "produced_by": {**(job.produced or {}), "finished": now()},
    }
    study.write_report(job.out, meta, results, failures)
    return report_failures(failures, job.out)


def cut_datasets(commands: list[list[str]], at_once: int) -> None:
    """vLLM's cutter, a process per dataset, as many at once as servers will run."""
    with ThreadPoolExecutor(max_workers=at_once) as pool:
        list(pool.map(lambda c: subprocess.run(c, check=True, capture_output=True), commands))


def dry_run(scenario, device, port, out, settings=None, given=None) -> list[str]:
    """Writes the parameter files and the e2e datasets into ``out`` and returns every
    command, as a user pastes them: the install, vLLM's cutter for the study's datasets,
    and one ``vllm bench sweep serve`` per sweep (with the environment it needs). The folder
    is the run's own, as a real run's is (``start_run``)."""
    given = given or {}
    start_run(Job(scenario, device, out, given), dry_run=True)
    # The install and its checks, and the pairing check, as the real run does them: a
    # command that stops with the reason where one fails (from the checkout, as make runs it).
    prepare = [sys.executable, "-m", "e2e", "--prepare", "--device", device]
    prepare += ["--scenario", scenario.name, *(("--study", "long") if settings else ())]
    lines = [f"cd {shlex.quote(str(ROOT))} && {shlex.join(prepare)}"]
    if settings is None:
        workloads = e2e_workloads(scenario, out)
        planned = runs(scenario, device)
        sweeps = plan_sweeps(scenario, planned, workloads, device, port, out, 1, given)
        record_plan(out, scenario, planned, sweeps)
    else:
        # The text the datasets are cut from, written as a real run writes it.
        (out / "study_text.txt").write_text(settings.text(), encoding="utf-8")
        text = settings.text_path or "the documentation CPython ships (study.corpus())"
        lines.append(f"# wrote {out / 'study_text.txt'}: {text}")
        commands, _, sweeps = study_plan(scenario, device, port, settings, given, out)
        record_plan(out, scenario, study_runs(scenario, device, given), sweeps, settings)
        lines += [shlex.join(command) for command in commands]
    sweep_plan.write_files(sweeps)
    for planned in sweeps:
        lines += planned.shell_lines()
    return lines


RUN_RECORD = cli.RUN_RECORD


def own_folder(out_dir: Path, dry_run: bool = False) -> None:
    """Gives the run an empty ``out_dir``: a run's folder is cleared (vLLM's sweep refuses to
    write into an experiment folder that exists, and nothing of an earlier run may reach
    this run's report); a folder the run may not have (``cli.folder_problem``: a file, a
    folder no run of this harness wrote, results under a dry run) is refused. A dry run's
    folder holds no results (refused), so clearing it deletes none."""
    problem = cli.folder_problem(out_dir, dry_run)
    if problem:
        raise SystemExit(problem)
    if out_dir.is_dir():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)


def version_of(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def provenance(job: Job) -> dict:
    """What produces a run: the command (the settings given as its flags, the device's
    variables before it), the settings, the versions of the host's vLLM and vllm-ascend
    (the servers' environment), the models, the checkout, the time."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    scenario, given = job.scenario, job.given
    settings = {k: v for k, v in given.items() if k not in cli.DEVICE_ENV}
    command = [Path(sys.executable).name, "-m", "e2e", *cli.flags(settings)]
    return {
        "command": " ".join(
            [
                *(f"{k}={shlex.quote(given[k])}" for k in cli.DEVICE_ENV if k in given),
                shlex.join(command),
            ]
        ),
        "device": job.device,
        "settings": given,
        "versions": {
            "vllm": version_of("vllm"),
            "vllm-ascend": version_of("vllm-ascend"),
            "python": platform.python_version(),
        },
        "models": {"target": scenario.target, "draft": scenario.draft, "method": scenario.method},
        "commit": commit.stdout.strip() if commit.returncode == 0 else None,
        "started": now(),
    }


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def start_run(job: Job, dry_run: bool = False) -> dict:
    """Clears the run's folder and records in it what produces the run: after every check
    (the settings', the install's, the pairing's) has passed."""
    own_folder(job.out, dry_run)
    produced = provenance(job)
    (job.out / RUN_RECORD).write_text(json.dumps(produced, indent=2) + "\n")
    return produced


def record_plan(
    out_dir: Path,
    scenario: Scenario,
    planned: list[Run],
    sweeps: list[sweep_plan.Sweep],
    settings: study.Settings | None = None,
) -> None:
    """Adds the run's plan to its record (run.json): the scenario, its runs, its sweeps and
    the study's settings, which ``--check`` reads back to check what the printed commands
    wrote into the folder."""
    record = json.loads((out_dir / RUN_RECORD).read_text())
    record["plan"] = {
        "scenario": dataclasses.asdict(scenario)
        | {"golden": scenario.golden and str(scenario.golden)},
        "runs": [dataclasses.asdict(run) for run in planned],
        "sweeps": [one.name for one in sweeps],
        # What the servers were given: each sweep's vllm serve and its environment.
        "servers": {one.name: {"serve": shlex.join(one.serve), "env": one.env} for one in sweeps},
        "study": None if settings is None else dataclasses.asdict(settings),
    }
    (out_dir / RUN_RECORD).write_text(json.dumps(record, indent=2) + "\n")


def check_results(folder: Path, asked: dict[str, str] | None = None) -> int:
    """``make e2e-check RESULTS=folder``: the checks of a real run over what the dry run's
    commands wrote into ``folder`` (each sweep's summary.csv and its servers' log beside
    it): lossless (``lossless.py``), the acceptance within the run (and a golden where one
    was recorded), the window's start-up lines; a report as a run writes it. The plan comes
    from the folder's run.json, the runs and workloads from the parameter files the
    commands read. LOSSLESS and MIN_IDENTICAL given to the check (``asked``) are the
    check's: both come from it, over the run's."""
    record_file = folder / RUN_RECORD
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
    done = collect(sweeps, since=record_file.stat().st_mtime)
    failures += done["failures"]
    missing_runs = [run.name for run in planned if run.name not in done["results"]]
    if missing_runs and not failures:
        failures.append(f"no results for {', '.join(missing_runs)} in {folder}")
    if failures:
        return report_failures(failures)
    workloads = sweeps[0].workloads
    produced = {key: value for key, value in record.items() if key != "plan"}
    by = " ".join(f"{k}={v}" for k, v in asked.items())
    produced["checked"] = f"{now()} by --check ({folder}){f' with {by}' if by else ''}"
    settings = None if plan["study"] is None else study.Settings(**plan["study"])
    job = Job(scenario, device, folder, given, produced, settings)
    print(f"[e2e] checking {folder}: {scenario.name} on {device}, {job.policy.describe()}")
    if settings is not None:
        return finish_study(job, study_results(done, planned, workloads, settings), workloads)
    return finish_scenario(job, scenario_results(done, workloads))


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int, start: int = 8123) -> int:
    """The first port from ``start`` on with ``count`` free ports from it: a server already
    on a run's port (another run's) would answer its requests, and its own would not start."""
    for base in range(start, start + 1000):
        if all(_port_free(base + i) for i in range(count)):
            return base
    raise SystemExit(f"no {count} free ports from {start}: set PORT (--port)")


def host_problem(device: str, name: str, given: dict[str, str]) -> str | None:
    """What this host lacks for the run: the committed tiny models (CPU, the tiny scenario),
    the device's cards, vllm-ascend on Ascend; None where it lacks nothing."""
    if (device == "cpu" or name == "tiny") and "TARGET_MODEL" not in given:
        trained = trained_models()
        try:
            trained.committed()
        except trained.FixtureError as error:
            return f"needs the committed tiny models and their held-out text: {error}"
    probe = {"ascend": "npu-smi", "cuda": "nvidia-smi"}.get(device)
    if probe is not None and shutil.which(probe) is None:
        return f"needs {'Ascend NPUs' if device == 'ascend' else 'CUDA GPUs'}: {probe} not found"
    if device == "ascend" and version_of("vllm-ascend") is None:
        return "needs vllm-ascend installed in this environment"
    return None


def main(argv: list[str] | None = None) -> int:
    """``python -m e2e``: the command line (``cli``), then the run it asks for."""
    options = cli.parse(argv)
    if options.check is not None:
        return check_results(options.check, options.given)
    scenario, device, settings = options.scenario, options.device, options.settings
    if options.prepare:
        install(device)
        check_pairing(scenario.method)
        return 0
    given = options.given
    port = int(given.get("PORT") or 8123)
    if options.on("DRY_RUN"):
        print("\n".join(dry_run(scenario, device, port, options.out, settings, given)))
        return 0
    problem = host_problem(device, scenario.name, given)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    if "PORT" not in given:
        # One port per sweep: PARALLEL of V2's, and V1's.
        port = free_ports((settings.parallel if settings else 1) + 1, port)
    record = options.on("RECORD_GOLDEN")
    if settings is not None:
        return run_study(scenario, device, port, options.out, settings, record, given)
    return run_scenario(scenario, device, port, options.out, record, given)
