# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The dry run's printed commands read by the installed vLLM's own command line: its
``vllm`` parser built as ``vllm``'s main builds it (each subcommand's ``cmd_init`` and
``subparser_init``), the sweep's serve and bench commands completed with each run's and
workload's parameters by vLLM's own ``ParameterSweepItem.apply_to_cmd``. Only parsed:
nothing starts. Used by tests/test_e2e_cli.py (vLLM 0.33 and 0.34) and
tests/ascend/test_e2e_cli.py (0.30 and 0.29)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The dry runs whose commands a user pastes: make e2e-ascend's (Ascend, CUDA, the settings
# that change its commands), its long-context study's, make study-cpu's.
DRY_RUNS = {
    "ascend": {},
    "ascend-sinks-min-context": {"SINKS": "64", "MIN_CONTEXT": "1024"},
    "ascend-dcp": {"DCP": "2", "DCP_INTERLEAVE": "16", "E2E_SCENARIO": "dspark"},
    "cuda": {"DEVICE": "cuda"},
    "cuda-dtype-block-size": {"DEVICE": "cuda", "DTYPE": "float16", "BLOCK_SIZE": "32"},
    "ascend-study": {"STUDY": "long", "CONTEXTS": "4096,8192", "SHARED_PREFIX": "1000"},
    "cuda-study-sampled": {
        **{"STUDY": "long", "DEVICE": "cuda", "CONTEXTS": "4096", "PARALLEL": "2"},
        **{"CUDA_VISIBLE_DEVICES": "0,1,2,3", "TEMPERATURE": "0.8", "TOP_P": "0.95"},
    },
    "cpu-study": {"STUDY": "long", "DEVICE": "cpu", "AUTO": "1", "DTYPE": "bfloat16"},
}


def vllm_parser():
    """The installed vLLM's ``vllm`` parser with its ``serve`` and ``bench`` subcommands."""
    from vllm.entrypoints.cli.benchmark import main as bench
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(required=True, dest="subparser")
    # vLLM builds the bench subcommands' parsers only when invoked as `vllm bench`.
    argv, sys.argv = sys.argv, ["vllm", "bench"]
    try:
        for command in bench.cmd_init():
            command.subparser_init(subparsers)
    finally:
        sys.argv = argv
    # `vllm serve`'s parser as its subcommand builds it (make_arg_parser over the serve
    # subparser), from the function's home on each line: the subcommand's module imports the
    # server's runtime, which the Ascend lines' test environments leave out.
    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser  # 0.33, 0.34
    except ImportError:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser  # 0.29, 0.30
    make_arg_parser(subparsers.add_parser("serve", usage="vllm serve [model_tag] [options]"))
    return parser


def commands(line: str) -> list[list[str]]:
    """The ``vllm`` commands of a printed line, its program's name first: the line's own
    (without the environment before it or the ``| tee`` after it) and, for ``vllm bench
    sweep serve``, each server's and each workload's as the sweep completes them."""
    from vllm.benchmarks.sweep.param_sweep import ParameterSweep

    words = shlex.split(line)
    at = next(i for i, w in enumerate(words) if Path(w).name == "vllm")
    end = words.index("|") if "|" in words else len(words)
    own = [w for w in words[at:end] if w != "2>&1"]
    found = [own]
    if own[1:4] == ["bench", "sweep", "serve"]:
        args = dict(zip(own[4::2], own[5::2], strict=False))
        for cmd, params in (("--serve-cmd", "--serve-params"), ("--bench-cmd", "--bench-params")):
            base = shlex.split(args[cmd])
            for item in ParameterSweep.read_json(Path(args[params])):
                found.append(item.apply_to_cmd(base))
    return found


def unparsed(lines: list[str]) -> tuple[int, list[str]]:
    """(how many commands were parsed, each that the parser refused with its error)."""
    parser = vllm_parser()
    count, refused = 0, []
    for line in lines:
        if " bench " not in line or line.startswith("#"):
            continue
        for command in commands(line):
            count += 1
            try:
                parser.parse_args(command[1:])
            except SystemExit:
                refused.append(shlex.join(command))
    return count, refused


def sweep_words(line: str) -> tuple[dict[str, str], list[str]]:
    """A printed ``vllm bench sweep serve`` line's environment (the assignments after the
    guard's last ``;``) and its words from ``vllm`` on."""
    words = shlex.split(line)
    at = next(i for i, w in enumerate(words) if w.endswith("vllm"))
    start = max((i + 1 for i, w in enumerate(words[:at]) if w.endswith(";")), default=0)
    return dict(w.split("=", 1) for w in words[start:at]), words[at:]


def printed_sweeps(lines) -> list[dict]:
    """Each ``vllm bench sweep serve`` line: its environment, its serve and bench commands,
    and the parameter files it names, read."""
    found = []
    for line in lines:
        if " bench sweep serve " not in line:
            continue
        env, words = sweep_words(line)
        # Every sweep's output kept in the folder, in order (e2e/sweep_plan.py's shell_lines).
        assert env.pop("PYTHONUNBUFFERED") == "1"
        args = dict(zip(words[4::2], words[5::2], strict=False))
        found.append(
            {
                "env": env,
                "serve": args["--serve-cmd"],
                "bench": args["--bench-cmd"],
                "runs": json.loads(Path(args["--serve-params"]).read_text()),
                "workloads": json.loads(Path(args["--bench-params"]).read_text()),
            }
        )
    return found


def runs_of(found) -> dict[str, dict]:
    return {run.pop("_benchmark_name"): run for s in found for run in s["runs"]}


def dry_run_lines(name: str, out: Path, monkeypatch, capsys) -> list[str]:
    """What ``python -m e2e --dry-run`` prints for the dry run ``name`` (``DRY_RUNS``: the
    settings by the Makefile's names, passed as their flags; the cards as the environment's)
    into ``out``."""
    from e2e import cli, harness

    given = dict(DRY_RUNS[name])
    for key in cli.DEVICE_ENV:
        monkeypatch.delenv(key, raising=False)
        if key in given:
            monkeypatch.setenv(key, given.pop(key))
    assert harness.main(["--dry-run", *cli.flags(given), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(" bench sweep serve " in line for line in lines), lines
    return lines


def served_json(namespace) -> dict:
    """A parsed ``vllm serve``'s speculative and additional config, as JSON (read back)."""
    return {
        key: json.loads(json.dumps(getattr(namespace, key, None), default=str))
        for key in ("speculative_config", "additional_config")
    }
