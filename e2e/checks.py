# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What a run's sweeps left, checked: their results collected (and a pasted run's told from a
stale or mixed folder), the texts, the acceptance within the run and against a golden
recorded under the same conditions, the window's start-up lines."""

from __future__ import annotations

import json
from dataclasses import dataclass

from e2e import cli, lossless, study, sweep_plan
from e2e.scenarios import (
    KEY,
    ROOT,
    Scenario,
    sampling,
)

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
            f"{planned.name}: {summary} is older than the dry run's {cli.RUN_RECORD}: stale "
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


def acceptance(result: dict) -> dict:
    """What ``vllm bench serve`` measured of speculative decoding in one workload."""
    return {
        "drafts": result.get("spec_decode_num_drafts", 0),
        "per_position": result.get("spec_decode_per_position_acceptance_rates", []),
        "mean_length": result.get("spec_decode_acceptance_length"),
    }


# A golden recorded under other conditions than the run's (another runner, EOS honoured,
# eager, another device) but with its sampling moves the acceptance by a few tenths of a
# token per draft, not by half: a V2 run with the window below this share of its tokens per
# draft fails, even where every runner of the run is as low (a drafter broken everywhere).
FLOOR_SHARE = 0.5
# Where no golden bounds a greedy run: on the golden prompt (inside every window) a drafter
# that works accepts more tokens per draft than this (the committed golden: 1.4), one
# broken on every runner of the run fewer, however well the runners agree.
MIN_ACCEPTED = 0.5
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
    floor: list[float] | None = None,
    min_accepted: float | None = None,
) -> list[str]:
    """The assertions; returns the failures (empty when everything holds). Every run's
    texts against the V2 run with the window's (``policy``: exact unless it says otherwise;
    each run's result under ``results[run]["lossless"]``); every run's acceptance by
    position has ``num_spec`` entries; the acceptance checked within the run (the window
    against no window, ``WINDOW_MARGIN``), against the golden where there is one, against
    ``floor`` (a golden recorded under other conditions: ``Golden.floor``), and against
    ``min_accepted`` tokens per draft (``MIN_ACCEPTED``, where no golden bounds it)."""
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
    if floor is not None:
        accepted, reference = sum(ours["per_position"]), sum(floor)
        if accepted < FLOOR_SHARE * reference:
            failures.append(
                f"V2 with the window accepts {accepted:.2f} tokens per draft on the golden "
                f"prompt, under {FLOOR_SHARE:.0%} of the {reference:.2f} of the golden "
                "recorded under other conditions: a drafter this far below it is broken, "
                "whichever runner agrees with it"
            )
    if min_accepted is not None and sum(ours["per_position"]) < min_accepted:
        failures.append(
            f"V2 with the window accepts {sum(ours['per_position']):.2f} tokens per draft on "
            f"the golden prompt, under {min_accepted}: no golden bounds this run, and a "
            "drafter this low is broken, whichever runner agrees with it"
        )
    if "v1_window" in results:
        v2 = results["v2_window"]["all_long"]["mean_length"]
        v1 = results["v1_window"]["all_long"]["mean_length"]
        if v2 < v1 - 0.05:
            failures.append(
                f"V2 with the window: mean acceptance {v2:.3f} < V1 with the window {v1:.3f} - 0.05"
            )
    return failures


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


@dataclass(frozen=True)
class Golden:
    """A golden file: its figures, their tolerance, where they come from, and the conditions
    they were recorded under (``recorded``: ``run_conditions``'s keys). It gates only a run
    of the same conditions; recorded with the run's sampling, it is a run's floor (``floor``);
    elsewhere the report shows it as a reference."""

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

    def floor(self, conditions: dict) -> list | None:
        """Its figures where they bound this run from below (``FLOOR_SHARE``): recorded
        under other conditions but with the run's sampling. None where it gates the run, or
        was sampled otherwise (the acceptance of another sampling is not comparable)."""
        differs = self.differences(conditions)
        same_sampling = self.recorded.get("sampling") == conditions.get("sampling")
        return self.values if differs and same_sampling else None

    def describe(self, conditions: dict, floor: bool = False) -> str:
        differs = self.differences(conditions)
        if not differs:
            return f"gates this run (+-{self.tolerance}): {self.source}"
        if floor:
            return (
                f"a floor, not a gate (recorded with {', '.join(differs)}): the run fails "
                f"below {FLOOR_SHARE:.0%} of its tokens per draft: {self.source}"
            )
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


def gate(golden: Golden | None, conditions: dict) -> Golden | None:
    """The golden where it gates this run (recorded under its conditions), else None."""
    return golden if golden is not None and not golden.differences(conditions) else None
