# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The harness's command line: a flag for every setting (``python -m e2e --help``), each
checked before anything runs, a bad value stopped with one error that names the flag, the
setting as the Makefile names it (``make e2e-ascend SINKS=32`` passes ``--sinks 32``), the
value and what it takes; then the checks across settings, every one before anything runs
or is deleted: a setting that does not apply to the device, the study or the scenario is
refused by name (never dropped), the study's settings against each other (a shared prefix
within the longest context, a window no other run has), the cards for PARALLEL servers, and
the folder (OUT): a folder, and one a dry run may write into without deleting results."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from e2e import lossless, scenarios, study
from e2e.scenarios import ROOT, VISIBLE_DEVICES, Scenario

DEVICES = ("ascend", "cuda", "cpu")
STUDIES = ("long",)
DTYPES = ("auto", "bfloat16", "float16", "float32")
# The device's own variables, which vLLM reads: they stay the environment's, and the report
# records them beside the settings.
DEVICE_ENV = ("ASCEND_RT_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def _within(text: str, low: float, high: float = float("inf"), kind: type = int) -> bool:
    try:
        value = kind(text)
    except ValueError:
        return False
    return math.isfinite(value) and low <= value <= high


def one_of(choices: tuple[str, ...]) -> tuple[Callable[[str], bool], str]:
    return (lambda text: text in choices), f"is not one of: {', '.join(choices)}"


def at_least(low: int) -> tuple[Callable[[str], bool], str]:
    return (lambda text: _within(text, low)), f"is not an integer >= {low}"


def number(low: float, high: float, what: str = "a number") -> tuple[Callable, str]:
    return (lambda text: _within(text, low, high, float)), f"is not {what} from {low} to {high}"


def between(low: int, high: int) -> tuple[Callable[[str], bool], str]:
    return (lambda text: _within(text, low, high)), f"is not an integer from {low} to {high}"


def _integers(text: str) -> bool:
    """A comma-separated list of integers >= 1, none empty, none twice (each is a run or a
    workload of its own)."""
    words = [w.strip() for w in text.split(",")]
    return all(_within(w, 1) for w in words) and len({int(w) for w in words}) == len(words)


INTEGERS = _integers, "is not a comma-separated list of distinct integers >= 1"
ANY = (lambda text: True), ""
SWITCH = one_of(("0", "1"))
FILE = (lambda text: Path(text).is_file()), "is not a file"
# A model is a name on the hub or a local folder, never a file.
MODEL = (lambda text: not Path(text).is_file()), "is a file, not a model's folder or name"

TOP_P_IS = "is not a number above 0 and at most 1"

# Every setting, by the name the Makefile (and the README) gives it: its flag (vLLM's where
# the setting is passed to vLLM as that flag), what it takes and what it does, by what it
# sets. The report records the settings given (what produced it).
RUN = {
    "DEVICE": ("--device", one_of(DEVICES), "where vllm serve runs (default: ascend)"),
    "E2E_SCENARIO": ("--scenario", ANY, "the scenario (default: eagle3)"),
    "STUDY": ("--study", one_of(STUDIES), "the long-context study (study.py)"),
    "DRY_RUN": ("--dry-run", SWITCH, "write the parameter files, print the commands"),
}
MODELS = {
    "TARGET_MODEL": ("--target-model", MODEL, "the target's name or local path"),
    "DRAFT_MODEL": ("--draft-model", MODEL, "the drafter's name or local path"),
}
WINDOW_KEYS = {
    "WINDOW": ("--window", at_least(1), "draft_window_size of the runs with the window"),
    "SINKS": ("--sinks", at_least(0), "draft_attention_sinks of the V2 run with the window"),
    "MIN_CONTEXT": ("--min-context", at_least(0), "draft_window_min_context of that run"),
}
PARALLELISM = {
    "TP": ("--tensor-parallel-size", at_least(1), "every server's (default: the scenario's)"),
    "DCP": ("--decode-context-parallel-size", at_least(1), "every server's"),
    "DCP_INTERLEAVE": ("--cp-kv-cache-interleave-size", at_least(1), "with DCP > 1"),
}
SERVERS = {
    "PORT": ("--port", between(1, 65535), "the first server's port (default: the first free)"),
    "BLOCK_SIZE": ("--block-size", at_least(1), "the KV block size (the window's alignment)"),
    "DTYPE": ("--dtype", one_of(DTYPES), "the served dtype (CPU: float32 by default)"),
}
CHECKS = {
    "RECORD_GOLDEN": ("--record-golden", SWITCH, "record the golden file, then check"),
    "LOSSLESS": ("--lossless", one_of(lossless.MODES), "exact or fraction (lossless.py)"),
    "MIN_IDENTICAL": ("--min-identical", number(0, 1, "a fraction"), "for --lossless fraction"),
}
SAMPLING = {
    "TEMPERATURE": ("--temperature", number(0, 100), "sampling (default: greedy)"),
    "TOP_P": (
        "--top-p",
        ((lambda t: _within(t, 0, 1, float) and float(t) > 0), TOP_P_IS),
        "sampling",
    ),
    "TOP_K": ("--top-k", ((lambda t: t == "-1" or _within(t, 1)), at_least(1)[1]), "sampling"),
    "SEED": ("--seed", at_least(0), "every sampled request's seed (default: 0)"),
}
THE_STUDY = {
    "PARALLEL": ("--parallel", at_least(1), "servers side by side (cards of their own)"),
    "CONTEXTS": ("--contexts", INTEGERS, "the study's contexts, e.g. 32,512,1024"),
    "MAX_CONTEXT": ("--max-context", at_least(0), "the study's longest context"),
    "CONCURRENCY": ("--concurrency", INTEGERS, "each context at each (default: all)"),
    "SHARED_PREFIX": ("--shared-prefix", at_least(0), "prompts sharing their first tokens"),
    "AUTO": ("--auto", SWITCH, 'also a run with draft_window_size "auto"'),
}
# The study's own: what the project's study code passes (the CPU study's defaults,
# ``scenarios.cpu_study_defaults``; make bench's and make compare-trained-models' studies,
# ``cpu_study.py``). Flags of python -m e2e as the others are, but not variables of make
# e2e-ascend, whose settings are what a user on an NPU or GPU sets.
STUDY_OWN = {
    "PROMPTS_PER_CONTEXT": ("--prompts-per-context", at_least(1), "the study's prompts"),
    "OUTPUT_TOKENS": ("--output-tokens", at_least(1), "each prompt's"),
    "MAX_MODEL_LEN": ("--max-model-len", at_least(0), "every server's (default: the study's)"),
    "LONG_CONTEXT": ("--long-context", at_least(1), "the study's window helps from here"),
    "SHORT_CONTEXT": ("--short-context", at_least(1), "and changes little up to here"),
    "STUDY_TEXT": ("--study-text", FILE, "the text the prompts are cut from"),
    "MORE_WINDOWS": ("--more-windows", INTEGERS, "also a run with each of these windows"),
    "NO_SPECULATION": ("--no-speculation", SWITCH, "the run without speculation (default 1)"),
}
SETTINGS = {
    **RUN,
    **MODELS,
    **WINDOW_KEYS,
    **PARALLELISM,
    **SERVERS,
    **CHECKS,
    **SAMPLING,
    **THE_STUDY,
    **STUDY_OWN,
}


# The settings only the long-context study reads, and those only sampled requests read
# (TEMPERATURE above 0): given elsewhere they would change nothing, so they are refused.
STUDY_ONLY = (*THE_STUDY, *STUDY_OWN)
SAMPLED_ONLY = tuple(name for name in SAMPLING if name != "TEMPERATURE")
# The settings of --check (make e2e-check): the check's own, over the run's.
CHECK_SETTINGS = ("LOSSLESS", "MIN_IDENTICAL")

# The record of what produced a run, written first into its folder: a folder holding one is a
# run's of this harness, cleared by the next run into it.
RUN_RECORD = "run.json"

# The harness's own results folders (ignored by git): anything under them is a run's.
OWN_RESULTS = (ROOT / "e2e" / "results", ROOT / "benchmarks" / "results" / "study")


def is_result(path: Path) -> bool:
    """What a run (or the pasted commands) measured, as opposed to what a dry run writes
    (run.json, the parameter files, the datasets): an experiment folder, a log, a report,
    a plot."""
    return (
        path.is_dir()
        or path.suffix in (".log", ".png")
        or path.name in ("report.json", "report.md")
    )


def folder_problem(out: Path, dry_run: bool) -> str | None:
    """Why ``out`` cannot be the run's folder, or None: a file in its place (or above it), a
    folder holding files no run of this harness wrote, or, for a dry run, a folder holding
    results (a dry run never deletes results; a real run clears its own folder)."""
    existing = out
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a folder: pass OUT=a folder (created where missing)"
    if out != existing or not any(out.iterdir()):
        return None
    resolved = out.resolve()
    ours = (out / RUN_RECORD).is_file() or any(
        resolved != r and resolved.is_relative_to(r) for r in OWN_RESULTS
    )
    if not ours:
        return (
            f"{out} holds files no run of this harness wrote (no {RUN_RECORD}): "
            "remove them or pass another OUT"
        )
    results = sorted(p.name for p in out.iterdir() if is_result(p))
    if dry_run and results:
        return (
            f"{out} holds a run's results ({', '.join(results[:6])}): a dry run never "
            "deletes results; remove them, or pass another OUT"
        )
    return None


def sampled(given: dict[str, str]) -> bool:
    return float(given.get("TEMPERATURE") or 0) > 0


def lossless_problem(given: dict[str, str], device: str) -> str | None:
    """LOSSLESS and MIN_IDENTICAL against the device and the sampling (a run's, or those
    given to --check over the run's)."""
    for name in CHECK_SETTINGS:
        if name in given and sampled(given):
            return (
                f"{name}={given[name]!r} chooses how greedy texts are checked; sampled "
                f"(TEMPERATURE={given['TEMPERATURE']}) they are counted, never checked: "
                f"leave {name} out"
            )
    mode = given.get("LOSSLESS") or ("exact" if device == "cpu" else "fraction")
    if "MIN_IDENTICAL" in given and mode == "exact":
        why = "LOSSLESS=exact" if given.get("LOSSLESS") else f"exact on DEVICE={device}"
        return (
            f"MIN_IDENTICAL={given['MIN_IDENTICAL']!r} applies to LOSSLESS=fraction, the "
            f"check is {why}: set LOSSLESS=fraction, or leave MIN_IDENTICAL out"
        )
    return None


def combination_problem(given: dict[str, str], device: str) -> str | None:
    """The first setting that does not apply where it is given (the study's outside the
    study, sampling's to greedy requests, the device's), or None."""
    study_asked = "STUDY" in given
    if device == "cpu" and not study_asked:
        return "DEVICE=cpu runs the long-context study only: set STUDY=long"
    for name in STUDY_ONLY:
        if name in given and not study_asked:
            return (
                f"{name}={given[name]!r} is the long-context study's: set STUDY=long, or "
                f"leave {name} out"
            )
    for name in SAMPLED_ONLY:
        if name in given and not sampled(given):
            return (
                f"{name}={given[name]!r} applies to sampled requests only: set TEMPERATURE "
                f"above 0, or leave {name} out"
            )
    problem = lossless_problem(given, device)
    if problem:
        return problem
    if device == "cpu":
        for name in ("TOP_P", "TOP_K"):
            if name in given:
                # vLLM applies top-p/top-k with its Triton kernel wherever Triton is
                # installed (vllm/v1/sample/ops/topk_topp_triton.py), and Triton's
                # interpreter, which runs every kernel here, fails in it (its loop index
                # is a Python int).
                return (
                    f"{name}={given[name]!r} is not run by vLLM's CPU engine (its top-p/top-k "
                    f"Triton kernel fails under Triton's interpreter): on DEVICE=cpu sample with "
                    f"TEMPERATURE alone"
                )
        if "TP" in given:
            return (
                f"TP={given['TP']!r} does not apply to DEVICE=cpu (one CPU worker a server): "
                "leave TP out"
            )
        if "RECORD_GOLDEN" in given:
            return (
                f"RECORD_GOLDEN={given['RECORD_GOLDEN']!r}: the CPU study has no golden (its "
                "acceptance is checked within the run): leave RECORD_GOLDEN out"
            )
    if "RECORD_GOLDEN" in given and given.get("DRY_RUN", "0") != "0":
        return (
            "RECORD_GOLDEN=1 with DRY_RUN=1: a dry run measures nothing to record; "
            "record with a real run"
        )
    if "MAX_CONTEXT" in given and "CONTEXTS" in given:
        return (
            f"MAX_CONTEXT={given['MAX_CONTEXT']!r} with CONTEXTS={given['CONTEXTS']!r}: "
            "CONTEXTS names every context; give one of the two"
        )
    cards = VISIBLE_DEVICES.get(device)
    named = [c.strip() for c in given.get(cards or "", "").split(",") if c.strip()]
    twice = sorted({c for c in named if named.count(c) > 1})
    if twice:
        return f"{cards}={given[cards]!r} names card {', '.join(twice)} twice: name each card once"
    return None


def study_problem(
    given: dict[str, str], scenario: Scenario, settings: study.Settings
) -> str | None:
    """The study's settings against each other, or None."""
    if not settings.contexts:
        return (
            f"MAX_CONTEXT={given.get('MAX_CONTEXT', '')!r}: no study context "
            f"({', '.join(map(str, study.CONTEXTS))}) fits with OUTPUT_TOKENS="
            f"{settings.output_tokens}: raise MAX_CONTEXT, or set CONTEXTS"
        )
    longest = max(settings.contexts)
    if settings.shared_prefix >= longest:
        return (
            f"SHARED_PREFIX={settings.shared_prefix} does not fit the longest context {longest} "
            f"(each prompt goes on past the shared prefix): set SHARED_PREFIX below {longest}"
        )
    if settings.max_model_len and settings.max_model_len < longest + settings.output_tokens:
        return (
            f"MAX_MODEL_LEN={settings.max_model_len} does not hold the longest context {longest} "
            f"and its OUTPUT_TOKENS={settings.output_tokens}: set MAX_MODEL_LEN to at least "
            f"{longest + settings.output_tokens}, or leave it out"
        )
    if settings.short_to >= settings.long_from:
        return (
            f"SHORT_CONTEXT={settings.short_to} is not below LONG_CONTEXT={settings.long_from}: "
            "the window must change little up to the one and help from the other"
        )
    if scenario.min_context > longest:
        return (
            f"MIN_CONTEXT={scenario.min_context} engages the window at none of the contexts "
            f"(the longest: {longest}): set it at most {longest}"
        )
    more = [int(w) for w in given.get("MORE_WINDOWS", "").split(",") if w.strip()]
    if scenario.window in more:
        return (
            f"MORE_WINDOWS={given['MORE_WINDOWS']!r} repeats the run with the window "
            f"(WINDOW={scenario.window}): leave {scenario.window} out of MORE_WINDOWS"
        )
    return None


def run_folder(out: Path, scenario: str, study: bool) -> Path:
    """Where a run of ``scenario`` writes under OUT: a folder of its name, the study's
    ``study_`` and its name."""
    return out / (f"study_{scenario}" if study else scenario)


def flags(given: dict[str, str]) -> list[str]:
    """The command line of settings given by the Makefile's names: ``{"SINKS": "32"}`` ->
    ``["--sinks", "32"]``; an empty value is not given; a name that is no setting is refused
    (a ValueError naming it)."""
    unknown = [name for name in given if name not in SETTINGS]
    if unknown:
        raise ValueError(f"not a setting of python -m e2e: {', '.join(unknown)}")
    return [w for name, v in given.items() if v != "" for w in (SETTINGS[name][0], str(v))]


def checked(name: str, accepts: Callable[[str], bool], what: str) -> Callable[[str], str]:
    """The argparse type of a setting: its text, or an error naming it, the value and what
    it takes."""

    def check(text: str) -> str:
        if text == "" or accepts(text):
            return text
        raise argparse.ArgumentTypeError(f"{name}={text!r} {what}")

    return check


def parser() -> argparse.ArgumentParser:
    found = argparse.ArgumentParser(
        prog="python -m e2e",
        usage="%(prog)s [--FLAG VALUE ...] (%(prog)s --help: every flag)",
        description="The draft window end to end: vllm serve measured with vLLM's own "
        "benchmark tools (Ascend NPUs, CUDA GPUs; the long-context study also on CPU).",
        epilog="make e2e-ascend and make study-cpu pass each make variable as its flag "
        "(SINKS=32: --sinks 32).",
    )
    for name, (flag, spec, text) in SETTINGS.items():
        # A switch alone is on (--dry-run); the Makefile passes its 0 or 1.
        switch = {"nargs": "?", "const": "1"} if spec is SWITCH else {}
        own = " (the study's own: no make variable)" if name in STUDY_OWN else ""
        found.add_argument(
            flag, dest=name, type=checked(name, *spec), help=f"{name}{own}: {text}", **switch
        )
    found.add_argument("--out", type=Path, default=ROOT / "e2e" / "results")
    found.add_argument(
        "--prepare",
        action="store_true",
        help="install this project into the host's environment (checking that no vllm-ascend "
        "file changed and that it imports) and check the host's release pairing, then stop: "
        "the dry run's first command",
    )
    found.add_argument(
        "--check",
        metavar="RESULTS",
        help="run the checks over the results the dry run's printed vllm bench commands "
        "wrote into RESULTS (the folder the dry run wrote; make e2e-check RESULTS=...), then stop; "
        "LOSSLESS and MIN_IDENTICAL given here are the check's (over the run's)",
    )
    return found


@dataclass
class Options:
    """What the command line asks: the settings given (the Makefile's names, with the
    device's own variables of the environment), the scenario and the study's settings they
    make, where the run writes."""

    given: dict[str, str]
    device: str
    scenario: Scenario | None = None
    settings: study.Settings | None = None
    out: Path | None = None
    check: Path | None = None
    prepare: bool = False

    def on(self, name: str) -> bool:
        return self.given.get(name, "0") != "0"


def check_problem(results: str, given: dict[str, str]) -> str | None:
    """What ``--check RESULTS`` cannot take: a folder that is not one, a setting of the
    run's rather than the check's."""
    if results == "" or not Path(results).is_dir():
        return f"RESULTS={results!r} is not a folder: pass the folder the dry run wrote"
    for name in given:
        if name not in CHECK_SETTINGS and name not in DEVICE_ENV:
            return (
                f"{name}={given[name]!r} is the run's, not the check's (the folder's "
                f"{RUN_RECORD} says how it ran): only {' and '.join(CHECK_SETTINGS)} apply "
                "to --check"
            )
    return None


def scenario_problem(given: dict[str, str], scenario: Scenario, device: str) -> str | None:
    """What the chosen scenario cannot take from the other settings."""
    study_asked, name = given.get("STUDY"), scenario.name
    if study_asked and scenario.dcp > 1:
        return (
            f"STUDY=long does not take DCP={scenario.dcp}: its golden files and draft "
            f"KV estimates are for one rank's layout"
        )
    if name == "tiny" and device != "cuda":
        return "E2E_SCENARIO=tiny runs on vLLM's CUDA V2 runner: set DEVICE=cuda"
    if "RECORD_GOLDEN" in given and scenario.golden is None and not study_asked:
        return (
            f"RECORD_GOLDEN={given['RECORD_GOLDEN']!r}: E2E_SCENARIO={name} has no golden "
            "file (its acceptance is checked within the run): leave RECORD_GOLDEN out"
        )
    return None


def parse(argv: list[str] | None = None) -> Options:
    """The command line, every setting and their combination checked (argparse's error,
    exit code 2, on the first that does not hold), before anything runs or is deleted."""
    found = parser()
    args = found.parse_args(argv)
    given = {name: getattr(args, name) for name in SETTINGS if getattr(args, name)}
    given |= {name: os.environ[name] for name in DEVICE_ENV if os.environ.get(name)}
    device = given.get("DEVICE", "ascend")
    options = Options(given, device, check=args.check, prepare=args.prepare)
    if args.check is not None:
        problem = check_problem(args.check, given)
        if problem:
            found.error(problem)
        options.check = Path(args.check)
        return options
    problem = combination_problem(given, device)
    if problem:
        found.error(problem)
    study_asked = given.get("STUDY")
    try:
        table = scenarios.scenarios(given, device)
    except ValueError as error:
        found.error(str(error))
    name = given.get("E2E_SCENARIO", "eagle3")
    if name not in table:
        found.error(f"argument --scenario: E2E_SCENARIO={name!r} is not one of: {', '.join(table)}")
    scenario = options.scenario = table[name]
    problem = scenario_problem(given, scenario, device)
    if problem:
        found.error(problem)
    try:
        tp_note = scenarios.fit_tp_to_dcp(scenario, "TP" in given)
    except ValueError as error:
        found.error(str(error))
    sweeps = 2
    if study_asked:
        defaults = scenarios.cpu_study_defaults() if device == "cpu" else None
        options.settings = study.Settings.given(given, scenario.target, device, defaults)
        problem = study_problem(given, scenario, options.settings)
        if problem:
            found.error(problem)
        sweeps = options.settings.parallel + 1
        try:
            scenarios.device_split(scenario, device, options.settings.parallel, given)
        except ValueError as error:
            found.error(str(error))
    if int(given.get("PORT") or 8123) + sweeps - 1 > 65535:
        found.error(f"PORT={given['PORT']!r} leaves no port for each of {sweeps} sweeps: lower it")
    options.out = run_folder(Path(args.out), name, bool(study_asked))
    problem = folder_problem(options.out, options.on("DRY_RUN"))
    if problem:
        found.error(f"OUT={str(args.out)!r}: {problem}")
    if tp_note:
        print(f"# {tp_note}" if options.on("DRY_RUN") else f"[e2e] {tp_note}", flush=True)
    return options
