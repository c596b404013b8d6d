# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The harness's command line: a flag for every setting (``python -m e2e --help``), each
checked before anything runs, a bad value stopped with one error that names the flag, the
setting as the Makefile names it (``make e2e-ascend SINKS=32`` passes ``--sinks 32``), the
value and what it takes; then the checks across settings (the scenario against the
device's table, DCP against TP and the study, the cards for PARALLEL servers)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from e2e import lossless, scenarios, study
from e2e.scenarios import ROOT, Scenario

DEVICES = ("ascend", "cuda", "cpu")
STUDIES = ("long",)
DTYPES = ("auto", "bfloat16", "float16", "float32")
# The device's own variables, which vLLM reads: they stay the environment's, and the report
# records them beside the settings.
DEVICE_ENV = ("ASCEND_RT_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def _within(text: str, low: float, high: float = float("inf"), kind: type = int) -> bool:
    try:
        return low <= kind(text) <= high
    except ValueError:
        return False


def one_of(choices: tuple[str, ...]) -> tuple[Callable[[str], bool], str]:
    return (lambda text: text in choices), f"is not one of: {', '.join(choices)}"


def at_least(low: int) -> tuple[Callable[[str], bool], str]:
    return (lambda text: _within(text, low)), f"is not an integer >= {low}"


def number(low: float, high: float, what: str = "a number") -> tuple[Callable, str]:
    return (lambda text: _within(text, low, high, float)), f"is not {what} from {low} to {high}"


INTEGERS = (
    lambda text: all(_within(w, 1) for w in text.split(",") if w.strip()),
    "is not a comma-separated list of integers >= 1",
)
ANY = (lambda text: True), ""
SWITCH = one_of(("0", "1"))

# Every setting, by the name the Makefile (and the README) gives it: its flag (vLLM's where
# the setting is passed to vLLM as that flag), what it takes and what it does. The report
# records the settings given (what produced it).
SETTINGS = {
    "DEVICE": ("--device", one_of(DEVICES), "where vllm serve runs (default: ascend)"),
    "E2E_SCENARIO": ("--scenario", ANY, "the scenario (default: eagle3)"),
    "STUDY": ("--study", one_of(STUDIES), "the long-context study (study.py)"),
    "DRY_RUN": ("--dry-run", SWITCH, "write the parameter files, print the commands"),
    "TARGET_MODEL": ("--target-model", ANY, "the target's name or local path"),
    "DRAFT_MODEL": ("--draft-model", ANY, "the drafter's name or local path"),
    "WINDOW": ("--window", at_least(1), "draft_window_size of the runs with the window"),
    "SINKS": ("--sinks", at_least(0), "draft_attention_sinks of the V2 run with the window"),
    "MIN_CONTEXT": ("--min-context", at_least(0), "draft_window_min_context of that run"),
    "TP": ("--tensor-parallel-size", at_least(1), "every server's (default: the scenario's)"),
    "DCP": ("--decode-context-parallel-size", at_least(1), "every server's"),
    "DCP_INTERLEAVE": ("--cp-kv-cache-interleave-size", at_least(1), "with DCP > 1"),
    "PARALLEL": ("--parallel", at_least(1), "servers side by side (cards of their own)"),
    "PORT": ("--port", at_least(1), "the first server's port (default: the first free)"),
    "RECORD_GOLDEN": ("--record-golden", SWITCH, "record the golden file, then check"),
    "LOSSLESS": ("--lossless", one_of(lossless.MODES), "exact or fraction (lossless.py)"),
    "MIN_IDENTICAL": ("--min-identical", number(0, 1, "a fraction"), "for --lossless fraction"),
    "TEMPERATURE": ("--temperature", number(0, float("inf")), "sampling (default: greedy)"),
    "TOP_P": ("--top-p", number(0, 1), "sampling"),
    "TOP_K": ("--top-k", ((lambda t: t == "-1" or _within(t, 1)), at_least(1)[1]), "sampling"),
    "SEED": ("--seed", at_least(0), "every sampled request's seed (default: 0)"),
    "CONTEXTS": ("--contexts", INTEGERS, "the study's contexts, e.g. 32,512,1024"),
    "MAX_CONTEXT": ("--max-context", at_least(0), "the study's longest context"),
    "CONCURRENCY": ("--concurrency", INTEGERS, "each context at each (default: all)"),
    "SHARED_PREFIX": ("--shared-prefix", at_least(0), "prompts sharing their first tokens"),
    "PROMPTS_PER_CONTEXT": ("--prompts-per-context", at_least(1), "the study's prompts"),
    "OUTPUT_TOKENS": ("--output-tokens", at_least(1), "each prompt's"),
    "BLOCK_SIZE": ("--block-size", at_least(1), "the KV block size (the window's alignment)"),
    "MAX_MODEL_LEN": ("--max-model-len", at_least(0), "every server's (default: the study's)"),
    "LONG_CONTEXT": ("--long-context", at_least(1), "the study's window helps from here"),
    "SHORT_CONTEXT": ("--short-context", at_least(1), "and changes little up to here"),
    "STUDY_TEXT": ("--study-text", ANY, "the text the prompts are cut from"),
    "AUTO": ("--auto", SWITCH, 'also a run with draft_window_size "auto"'),
    "MORE_WINDOWS": ("--more-windows", INTEGERS, "also a run with each of these windows"),
    "NO_SPECULATION": ("--no-speculation", SWITCH, "the run without speculation (default 1)"),
    "DTYPE": ("--dtype", one_of(DTYPES), "the served dtype (CPU: float32 by default)"),
}


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
        found.add_argument(
            flag, dest=name, type=checked(name, *spec), help=f"{name}: {text}", **switch
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
        type=Path,
        metavar="RESULTS",
        help="run the checks over the results the dry run's printed vllm bench commands "
        "wrote into RESULTS (the folder the dry run wrote; make e2e-check RESULTS=...), then stop",
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


def parse(argv: list[str] | None = None) -> Options:
    """The command line, every setting and their combination checked (argparse's error,
    exit code 2, on the first that does not hold)."""
    found = parser()
    args = found.parse_args(argv)
    given = {name: getattr(args, name) for name in SETTINGS if getattr(args, name)}
    given |= {name: os.environ[name] for name in DEVICE_ENV if os.environ.get(name)}
    device = given.get("DEVICE", "ascend")
    options = Options(given, device, check=args.check, prepare=args.prepare)
    if args.check is not None:
        if not args.check.is_dir():
            found.error(f"RESULTS={str(args.check)!r} is not a folder")
        return options
    study_asked = given.get("STUDY")
    if device == "cpu" and not study_asked:
        found.error("DEVICE=cpu runs the long-context study only: set STUDY=long")
    for name in ("TOP_P", "TOP_K"):
        if device == "cpu" and name in given:
            # vLLM applies top-p/top-k with its Triton kernel wherever Triton is installed
            # (vllm/v1/sample/ops/topk_topp_triton.py), and Triton's interpreter, which runs
            # every kernel here, fails in it (its loop index is a Python int).
            found.error(
                f"{name}={given[name]!r} is not run by vLLM's CPU engine (its top-p/top-k "
                f"Triton kernel fails under Triton's interpreter): on DEVICE=cpu sample with "
                f"TEMPERATURE alone"
            )
    try:
        table = scenarios.scenarios(given, device)
    except ValueError as error:
        found.error(str(error))
    name = given.get("E2E_SCENARIO", "eagle3")
    if name not in table:
        found.error(f"argument --scenario: E2E_SCENARIO={name!r} is not one of: {', '.join(table)}")
    scenario = options.scenario = table[name]
    if study_asked and scenario.dcp > 1:
        found.error(
            f"STUDY=long does not take DCP={scenario.dcp}: its golden files and draft "
            f"KV estimates are for one rank's layout"
        )
    try:
        # The tiny scenario keeps its own TP whatever TP says.
        tp_note = scenarios.fit_tp_to_dcp(scenario, "TP" in given and name != "tiny")
    except ValueError as error:
        found.error(str(error))
    if tp_note:
        print(f"# {tp_note}" if options.on("DRY_RUN") else f"[e2e] {tp_note}", flush=True)
    if name == "tiny" and device != "cuda":
        found.error("E2E_SCENARIO=tiny runs on vLLM's CUDA V2 runner: set DEVICE=cuda")
    if study_asked:
        defaults = scenarios.cpu_study_defaults() if device == "cpu" else None
        options.settings = study.Settings.given(given, scenario.target, device, defaults)
        try:
            scenarios.device_split(scenario, device, options.settings.parallel, given)
        except ValueError as error:
            found.error(str(error))
    options.out = args.out / (f"study_{name}" if study_asked else name)
    return options
