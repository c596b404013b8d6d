# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Real vLLM engines on CPU over the tiny models, from the tests, ``make demo`` and ``make
bench``: ``offline`` runs a list of ``Run`` through ``LLM`` in one engine process of its
own (``offline.py``), ``Server`` a ``vllm serve`` on 127.0.0.1. Both start in a scratch
directory, so that the project is imported as installed, never from this checkout."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests
from vllm.benchmarks.sweep.server import ServerProcess
from vllm.utils.network_utils import get_open_port

from testbed.engine.models import NUM_SPEC, VOCAB, TinyModels
from testbed.engine.offline import SPEC_DECODE
from tools.cpu_engine import engine_env, model_info_cache

OFFLINE = Path(__file__).with_name("offline.py")
LOAD = Path(__file__).with_name("load.py")
ROOT = Path(__file__).resolve().parents[2]
# The KV-cache block size (the CPU attention backend takes multiples of 32): the window's
# start moves in steps of one block.
BLOCK = 32
MAX_MODEL_LEN = 1024
# Prompt lengths around the window: the shortest never cropped, the longest always.
PROMPT_LENS = (9, 40, 77, 118)


@dataclass(frozen=True)
class Run:
    """One engine: its draft method (None: no speculation), the window's keys, how many
    tokens each prompt generates, and its draft checkpoint (``TinyModels.draft``; by
    default the one named as the method)."""

    name: str
    method: str | None = None
    window: dict = field(default_factory=dict)
    max_tokens: int = 24
    draft: str | None = None

    def plan(self, models: TinyModels) -> dict:
        spec = None
        if self.method is not None:
            spec = {
                "method": self.method,
                "model": models.draft(self.draft or self.method),
                "num_speculative_tokens": NUM_SPEC,
            }
        return {
            "name": self.name,
            "max_tokens": self.max_tokens,
            "speculative_config": spec,
            "additional_config": dict(self.window),
        }


def prompts() -> list[list[int]]:
    """Seeded prompts of token ids (no special tokens), of ``PROMPT_LENS`` tokens."""
    rng = random.Random(7)
    return [[rng.randrange(4, VOCAB) for _ in range(n)] for n in PROMPT_LENS]


def environment() -> dict[str, str]:
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import versions

    return engine_env(model_info_cache(), versions.has_model_runner_v1())


@dataclass
class Offline:
    """What ``offline`` returns: each run's result (``offline.py``) and its engine log."""

    results: dict[str, dict]
    logs: dict[str, str]
    wall_s: float


def offline(
    models: TinyModels,
    runs: list[Run],
    workdir: Path,
    env: dict[str, str] | None = None,
    inspect_in_process: bool = False,
) -> Offline:
    """Every run, one engine after another, in one process of this environment's Python
    (``env``: variables over the engine's environment; ``inspect_in_process``: vLLM inspects
    the model classes in that process, not in a subprocess of its own, ``offline.py``; off
    by default: ``test_cpu_ops.py`` checks the build that subprocess loads)."""
    plan = {
        "target": models.target,
        "max_model_len": MAX_MODEL_LEN,
        "block_size": BLOCK,
        "prompts": prompts(),
        "runs": [run.plan(models) for run in runs],
        "inspect_in_process": inspect_in_process,
    }
    return engine_script(OFFLINE, plan, workdir, env)


def engine_script(
    script: Path, plan: dict, workdir: Path, env: dict[str, str] | None = None
) -> Offline:
    """``script PLAN RESULTS`` (``offline.py``, ``load.py``) in a process of this
    environment's Python, started in ``workdir``: its results by run name, and each run's
    part of its log."""
    workdir.mkdir(parents=True, exist_ok=True)
    plan_path, results_path = workdir / "plan.json", workdir / "results.json"
    plan_path.write_text(json.dumps(plan))
    started = time.perf_counter()
    process = subprocess.run(
        [sys.executable, str(script), str(plan_path), str(results_path)],
        cwd=workdir,
        env={**environment(), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wall = time.perf_counter() - started
    (workdir / "engine.log").write_text(process.stdout)
    if process.returncode != 0 or not results_path.exists():
        raise RuntimeError(
            f"the engine process failed (exit {process.returncode}):\n{process.stdout[-6000:]}"
        )
    results = {r["name"]: r for r in json.loads(results_path.read_text())}
    return Offline(results, _split(process.stdout), wall)


def _split(output: str) -> dict[str, str]:
    """Each run's part of the engine log, between its ``=== run`` and ``=== end`` lines."""
    logs, name, lines = {}, None, []
    for line in output.splitlines():
        if line.startswith("=== run "):
            name, lines = line.removeprefix("=== run "), []
        elif line.startswith("=== end ") and name is not None:
            logs[name], name = "\n".join(lines), None
        elif name is not None:
            lines.append(line)
    return logs


class Server(ServerProcess):
    """``vllm serve`` of the tiny target on 127.0.0.1, in its own process group (stopped,
    with everything it started, on exit), printing to ``log``; vLLM's sweep server, whose
    readiness check (``wait_until_ready``, its address read from the command) it keeps."""

    def __init__(self, models: TinyModels, run: Run, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"serve-{run.name}.log"
        plan = run.plan(models)
        command = [
            sys.executable,
            "-m",
            "vllm.entrypoints.cli.main",
            "serve",
            models.target,
            *("--host", "127.0.0.1", "--port", str(get_open_port()), "--dtype", "float32"),
            *("--enforce-eager", "--block-size", str(BLOCK), "--seed", "0"),
            *("--kv-cache-memory-bytes", str(64 * 1024 * 1024)),
            *("--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(len(PROMPT_LENS))),
        ]
        if plan["speculative_config"] is not None:
            command += ["--speculative-config", json.dumps(plan["speculative_config"])]
        if plan["additional_config"]:
            command += ["--additional-config", json.dumps(plan["additional_config"])]
        super().__init__(command, [], show_stdout=False)
        self.url = self._get_vllm_server_address()
        self.workdir = workdir
        self.answered = False

    def start(self) -> None:
        # vLLM's runs in the caller's directory and environment and drops what it prints: the
        # engine needs the scratch directory and its CPU environment, the tests its log.
        with open(self.log_path, "w") as log:
            self._server_process = subprocess.Popen(
                self.server_cmd,
                cwd=self.workdir,
                env=environment(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def process(self) -> subprocess.Popen:
        return self._server_process

    def wait(self, timeout: float = 300) -> bool:
        """Until the server answers /health (True) or exits (False: a refused start-up is a
        result here, where vLLM's ``wait_until_ready`` raises)."""
        try:
            self.wait_until_ready(timeout)
        except RuntimeError:
            if self.process.poll() is None:
                raise
            return False
        self.answered = True
        return True

    def post(self, path: str, body: dict) -> dict:
        response = requests.post(f"{self.url}{path}", json=body, timeout=600)
        response.raise_for_status()
        return response.json()

    def get(self, path: str) -> str:
        response = requests.get(f"{self.url}{path}", timeout=60)
        response.raise_for_status()
        return response.text

    def completions(self, models: TinyModels, max_tokens: int) -> list[list[int]]:
        """The token ids each prompt generates, greedily, in one request."""
        body = {
            "model": models.target,
            "prompt": prompts(),
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        choices = sorted(self.post("/v1/completions", body)["choices"], key=lambda c: c["index"])
        return [list(c["token_ids"]) for c in choices]

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> None:
        # vLLM's SIGKILLs the group at once, which leaves the server's semaphore in /dev/shm
        # (and 0.33's spares an engine whose API server exited first): SIGTERM first.
        if self.process.poll() is None:
            self.process.terminate()  # the API server stops its engine itself
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):  # whatever is left of its group
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def served_counters(metrics: str, names: tuple[str, ...] = SPEC_DECODE) -> dict[str, float]:
    """vLLM's counters ``names`` in a server's /metrics text, each summed over its labels."""
    from prometheus_client.parser import text_string_to_metric_families

    found = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(metrics):
        if family.name in found:
            total = f"{family.name}_total"
            found[family.name] += sum(s.value for s in family.samples if s.name == total)
    return found
