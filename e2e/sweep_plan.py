# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What the end-to-end runs, the long-context study and ``make bench`` are made of: vLLM's
own benchmark tools, as a vLLM user runs them, and what the project reads back.

- Prompts of an exact token length: ``python -m
  vllm.benchmarks.datasets.create_txt_slices_dataset`` over a plain text with the target's
  tokenizer, a custom dataset (JSONL) per context.
- The servers and the requests: ``vllm bench sweep serve``, one ``vllm serve`` per run (its
  serve parameters: the speculative config and the window's keys) and one ``vllm bench
  serve`` per workload (its bench parameters: the dataset, the prompts, the concurrency),
  greedy, each result saved with its generated texts (``--save-detailed``). ``vllm bench
  serve`` reads the spec-decode counters of ``/metrics`` before and after each workload:
  acceptance rate, length and by position come from it, beside throughput and latency.
- What the project adds, in the callers: which runs to compare, the lossless check (every
  run's texts against the run without speculation), the golden check, the tables.

Runs whose server needs an environment of its own (Model Runner V1 on the releases that
still have it), or that run beside each other (``PARALLEL``, one port each), are sweeps of
their own, started together.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

# The start-up lines of the window a server logged (kept in the reports).
WINDOW_LINE = re.compile(r"(Draft KV window .*|draft_window_size=auto\b.*)$")
SERVER_NAME = re.compile(r"Server overrides: .*'_benchmark_name': '([^']+)'")


def vllm_command() -> str:
    """The ``vllm`` of this interpreter's environment (``vllm bench sweep serve`` resets a
    server's caches between workloads only where the server command is ``vllm``)."""
    beside = Path(sys.executable).parent / "vllm"
    return str(beside) if beside.exists() else "vllm"


@dataclass(frozen=True)
class Workload:
    """One ``vllm bench serve`` per run: a custom dataset, how many of its prompts, how many
    at once, and the output tokens of each."""

    name: str
    dataset: Path
    num_prompts: int
    concurrency: int
    output_tokens: int

    def params(self) -> dict:
        return {
            "_benchmark_name": self.name,
            "dataset_path": str(self.dataset),
            "num_prompts": self.num_prompts,
            "max_concurrency": self.concurrency,
            "custom_output_len": self.output_tokens,
        }


@dataclass(frozen=True)
class Serving:
    """One server per run: its name and the ``vllm serve`` parameters over the base command
    (``--speculative-config``, ``--additional-config``)."""

    name: str
    params: dict = field(default_factory=dict)

    def record(self) -> dict:
        return {"_benchmark_name": self.name, **self.params}


# vLLM's cutter of prompts of an exact token length out of a plain text.
CUTTER = "vllm.benchmarks.datasets.create_txt_slices_dataset"


def slices_command(text: Path, out: Path, tokenizer: str, prompts: int, tokens: int, output: int):
    """``prompts`` prompts of exactly ``tokens`` tokens of ``text`` (the target's tokenizer),
    each asking for ``output`` tokens: vLLM's own cutter."""
    return [
        sys.executable,
        "-m",
        CUTTER,
        *("--input", str(text), "--output", str(out), "--tokenizer", tokenizer),
        *("--num-prompts", str(prompts), "--input-len", str(tokens)),
        *("--output-len", str(output), "--seed", "0"),
    ]


def shared_prefix_command(prefix: Path, suffixes: Path, out: Path) -> list[str]:
    """A dataset whose prompts all begin with ``prefix``'s one prompt, each continuing with
    one of ``suffixes``'s: prefix-cache hits with real text (vLLM's ``prefix_repetition``
    dataset repeats random tokens, which no drafter predicts)."""
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "shared-prefix",
        *map(str, (prefix, suffixes, out)),
    ]


def join_shared_prefix(prefix: Path, suffixes: Path, out: Path) -> None:
    (head,) = [json.loads(line) for line in prefix.read_text().splitlines()]
    tails = [json.loads(line) for line in suffixes.read_text().splitlines()]
    write_dataset(out, [head["prompt"] + t["prompt"] for t in tails], tails[0]["output_tokens"])


def write_dataset(path: Path, prompts: list[str], output_tokens: int) -> None:
    """A custom dataset (``vllm bench serve --dataset-name custom``) of ``prompts``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"prompt": p, "output_tokens": output_tokens}) for p in prompts]
    path.write_text("\n".join(lines) + "\n")


def bench_command(
    target: str, port: int, chat: bool, sampling: dict[str, str] | None = None
) -> list[str]:
    """``vllm bench serve`` against the server on ``port``: greedy unless ``sampling`` gives
    the user's (``temperature``, ``top_p``, ``top_k``, and the requests' ``seed``), every
    output token generated (``--ignore-eos``), the texts kept; plain text prompts where the
    tokenizer has no chat template (``chat`` False)."""
    sampling = {"temperature": "0", **(sampling or {})}
    seed = sampling.pop("seed", None)
    return [
        vllm_command(),
        *("bench", "serve", "--backend", "vllm", "--model", target),
        *("--host", "127.0.0.1", "--port", str(port), "--dataset-name", "custom"),
        *(w for key, value in sampling.items() for w in (f"--{key.replace('_', '-')}", value)),
        # vLLM's per-request seed (SamplingParams.seed) in every request's body.
        *(("--extra-body", json.dumps({"seed": int(seed)})) if seed is not None else ()),
        *("--ignore-eos", "--save-detailed", "--disable-tqdm"),
        *(() if chat else ("--skip-chat-template",)),
    ]


@dataclass
class Sweep:
    """One ``vllm bench sweep serve``: its runs one after another on ``port``, every
    workload against each, with ``env`` over the caller's environment."""

    name: str
    serve: list[str]
    bench: list[str]
    runs: list[Serving]
    workloads: list[Workload]
    env: dict[str, str]
    out: Path

    @property
    def experiment(self) -> Path:
        return self.out / self.name

    @property
    def log(self) -> Path:
        """Where ``run`` writes the sweep's output, its servers' included."""
        return self.out / f"{self.name}.log"

    def files(self) -> dict[Path, str]:
        """The parameter files the command reads."""
        serve = [run.record() for run in self.runs]
        bench = [workload.params() for workload in self.workloads]
        return {
            self.out / f"{self.name}_serve_params.json": json.dumps(serve, indent=1) + "\n",
            self.out / f"{self.name}_bench_params.json": json.dumps(bench, indent=1) + "\n",
        }

    def command(self) -> list[str]:
        serve_params, bench_params = self.files()
        return [
            vllm_command(),
            *("bench", "sweep", "serve", "--serve-cmd", shlex.join(self.serve)),
            *("--bench-cmd", shlex.join(self.bench)),
            *("--serve-params", str(serve_params), "--bench-params", str(bench_params)),
            *("--output-dir", str(self.out), "--experiment-name", self.name),
            *("--num-runs", "1", "--server-ready-timeout", "1800", "--show-stdout"),
        ]

    @classmethod
    def read(cls, name: str, out: Path) -> Sweep:
        """The sweep ``name`` of ``out`` as far as its results are read (its runs and
        workloads), from the parameter files its command read (``files``)."""
        serve = json.loads((out / f"{name}_serve_params.json").read_text())
        bench = json.loads((out / f"{name}_bench_params.json").read_text())
        runs = [Serving(r.pop("_benchmark_name"), r) for r in serve]
        workloads = [
            Workload(
                w["_benchmark_name"],
                Path(w["dataset_path"]),
                w["num_prompts"],
                w["max_concurrency"],
                w["custom_output_len"],
            )
            for w in bench
        ]
        return cls(name, [], [], runs, workloads, {}, out)

    def shell_lines(self) -> list[str]:
        """The command as a user pastes it: its output, its servers' included, kept in
        ``log`` as a run keeps it (unbuffered, so that the sweep's lines and each server's
        come in order), where ``--check`` reads the window's start-up lines. In a subshell
        that fails where the sweep fails (``pipefail``: ``tee`` exits 0) and that stops
        before the sweep where its experiment folder exists (pasted again: vLLM would refuse
        it, and ``tee`` would replace the log of the sweep that wrote the results)."""
        env = {**self.env, "PYTHONUNBUFFERED": "1"}
        words = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        refusal = (
            f"{self.experiment} exists: this sweep already ran into it (its log: {self.log}); "
            "to run it again, remove both"
        )
        guard = (
            f"if [ -e {shlex.quote(str(self.experiment))} ]; then echo "
            f"{shlex.quote(refusal)} >&2; exit 1; fi;"
        )
        return [
            f"( set -o pipefail; {guard} {words} {shlex.join(self.command())} 2>&1 "
            f"| tee {shlex.quote(str(self.log))} )"
        ]


def write_files(sweeps: list[Sweep]) -> None:
    for sweep in sweeps:
        for path, text in sweep.files().items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)


def run(sweeps: list[Sweep], environ: dict[str, str], cwd: Path, at_once: int = 1) -> dict:
    """The sweeps, ``at_once`` at a time (each on its own port), each logging to
    ``<out>/<name>.log``; their exit codes. The servers start in ``cwd``."""
    write_files(sweeps)

    def one(sweep: Sweep) -> int:
        # Unbuffered: the sweep's own lines ([BEGIN SERVER], the server's name) land in the
        # log in order with the server's, which writes to the same file.
        env = {**environ, **sweep.env, "PYTHONUNBUFFERED": "1"}
        with sweep.log.open("w") as log:
            done = subprocess.run(
                sweep.command(), env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT
            )
        return done.returncode

    if not sweeps:
        return {}
    with ThreadPoolExecutor(max_workers=at_once) as pool:
        return dict(zip((s.name for s in sweeps), pool.map(one, sweeps), strict=True))


def log_tail(sweep: Sweep, lines: int = 40) -> str:
    """The last ``lines`` lines of the sweep's log (where vLLM's error is)."""
    if not sweep.log.exists():
        return f"(no log at {sweep.log})"
    return "\n".join(sweep.log.read_text(errors="replace").splitlines()[-lines:])


# The columns of vLLM's summary.csv that hold a list (written as Python's repr).
LIST_COLUMNS = ("generated_texts", "spec_decode_per_position_acceptance_rates", "errors")


def results(sweep: Sweep) -> dict[tuple[str, str], dict]:
    """Each (run, workload)'s ``vllm bench serve`` result, from the sweep's ``summary.csv``
    (vLLM's table: a row per run and workload, the result beside the run's serve and the
    workload's bench parameters). A row's workload is its ``_benchmark_name`` (the bench
    parameters', which vLLM writes over the run's), its run the one whose serve parameters
    it carries; a column a row has no value in is left out of its result."""
    import pandas as pd

    path = sweep.experiment / "summary.csv"
    if not path.exists():
        return {}
    table = pd.read_csv(path, index_col=0)
    keys = sorted({key for run in sweep.runs for key in run.params})

    def value(row, key):
        cell = row.get(key)
        return None if cell is None or (not isinstance(cell, str) and pd.isna(cell)) else cell

    runs = {tuple(_cell(run.params.get(k)) for k in keys): run.name for run in sweep.runs}
    found = {}
    for _, row in table.iterrows():
        name = runs.get(tuple(_cell(value(row, k)) for k in keys))
        result = {k: value(row, k) for k in table.columns if value(row, k) is not None}
        for key in LIST_COLUMNS:
            if isinstance(result.get(key), str):
                result[key] = ast.literal_eval(result[key])
        found[(name, result["_benchmark_name"])] = result
    return found


def _cell(value) -> str | None:
    """A serve parameter as summary.csv holds it (a dict as its repr)."""
    return None if value is None else str(value)


def server_logs(sweep: Sweep) -> dict[str, str]:
    """Each run's part of the sweep's log: its server's output, from ``[BEGIN SERVER]`` to
    ``[END SERVER]``."""
    path = sweep.log
    logs: dict[str, list[str]] = {}
    name = None
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        found = SERVER_NAME.search(line)
        if found:
            name = found.group(1)
            logs[name] = []
        elif line.startswith("[END SERVER]"):
            name = None
        elif name is not None:
            logs[name].append(line)
    return {name: "\n".join(lines) for name, lines in logs.items()}


def window_lines(log: str) -> list[str]:
    """The window's start-up lines in a server's log, each once."""
    lines: list[str] = []
    for line in log.splitlines():
        found = WINDOW_LINE.search(line)
        if found and found.group(1) not in lines:
            lines.append(found.group(1))
    return lines


if __name__ == "__main__":
    # python e2e/sweep_plan.py shared-prefix PREFIX.jsonl SUFFIXES.jsonl OUT.jsonl
    command, *paths = sys.argv[1:]
    if command != "shared-prefix" or len(paths) != 3:
        raise SystemExit("usage: sweep_plan.py shared-prefix PREFIX.jsonl SUFFIXES.jsonl OUT.jsonl")
    join_shared_prefix(*map(Path, paths))
