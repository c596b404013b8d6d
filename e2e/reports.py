# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""A run's results as the report gives them (``report.json``, ``report.md``, the plots), its
verdict and exit code; a golden recorded from a run."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from e2e import checks, host, lossless, study, sweep_plan
from e2e.scenarios import (
    Run,
    additional_config,
    sampling,
)


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
            "acceptance": checks.acceptance(by_workload["golden"]),
            "all_long": checks.acceptance(by_workload["long"]),
            # The start-up line and the line of the first windowed build.
            "window_active": "Draft KV window on for" in log and "Draft KV window active" in log,
        }
    return results


def finish_scenario(job: host.Job, results: dict, record: bool = False) -> int:
    """The scenario's checks over its runs' results (``check``, the window's start-up lines),
    its report, and its exit code: a run's or ``--check``'s."""
    scenario = job.scenario
    golden = checks.load_golden(scenario, record)
    conditions = checks.run_conditions(scenario, job.device, job.given)
    gating = checks.gate(golden, conditions)
    tolerance = 0.1 if gating is None else gating.tolerance
    values = None if gating is None else gating.values
    floor = None if golden is None else golden.floor(conditions)
    # Greedy with no golden at all: the drafter's own floor (sampled, none is comparable).
    least = checks.MIN_ACCEPTED if golden is None and conditions["sampling"] == "greedy" else None
    failures = checks.check(
        results, values, tolerance, scenario.num_spec, job.policy, floor=floor, min_accepted=least
    )
    if not results["v2_window"]["window_active"]:
        failures.append("the V2 server with the window did not log the window on and active")
    if results["v2_no_window"]["window_active"]:
        failures.append("the V2 server without the window logged the window as on")
    produced = {**(job.produced or {}), "finished": host.now()}
    note = golden and golden.describe(conditions, floor=floor is not None)
    write_report(
        job.out, scenario, job.device, results, golden, failures, produced, job.policy, note
    )
    return report_failures(failures, job.out)


def write_report(
    out_dir, scenario, device, results, golden, failures, produced=None, policy=None, note=None
) -> None:
    """report.json, report.md and acceptance.png; ``golden`` (a ``Golden`` or None) with
    ``note``: whether it gated this run, bounded it from below or is shown as a reference."""
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


def finish_study(job: host.Job, results: dict, workloads: list, record: bool = False) -> int:
    """The study's checks over its runs' results (``study.check``, the window's start-up
    lines), its report, and its exit code: a run's or ``--check``'s."""
    scenario, settings, policy = job.scenario, job.settings, job.policy
    golden = checks.study_golden(scenario, job.device, record)
    conditions = checks.run_conditions(scenario, job.device, job.given)
    gating = checks.gate(golden, conditions)
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
    failures += checks.startup_failures(results)
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
        "produced_by": {**(job.produced or {}), "finished": host.now()},
    }
    study.write_report(job.out, meta, results, failures)
    return report_failures(failures, job.out)


def write_golden(path: Path, key: str, measured, tolerance: float, conditions: dict) -> None:
    """Records what the V2 run with the window measured as the golden (RECORD_GOLDEN=1),
    with the conditions it was measured under (it gates runs of the same only)."""
    data = {"source": f"recorded by python -m e2e on {conditions['device']}", key: measured}
    data |= {"tolerance": tolerance, "recorded": conditions}
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"[e2e] recorded {path}")
