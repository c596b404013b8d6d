# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""End-to-end check of the draft window with `vllm serve` on Ascend NPUs (or CUDA GPUs).

    make e2e-ascend                   # default scenario: Qwen3-8B + EAGLE3, W=512, TP=2
    make e2e-ascend DRY_RUN=1         # print every command, run nothing
    E2E_SCENARIO=dspark make e2e-ascend
    DEVICE=cuda make e2e-ascend       # the same harness on vLLM's CUDA V2 runner
    DEVICE=cuda E2E_SCENARIO=tiny make e2e-ascend   # random tiny models, downloads nothing
    SINKS=64 make e2e-ascend          # V2 with the window and 64 attention sinks
    STUDY=long make e2e-ascend        # acceptance and throughput by context (study.py)
    STUDY=long MIN_CONTEXT=8192 make e2e-ascend   # the window engaged from 8k contexts on
    DCP=2 make e2e-ascend             # every run with decode context parallelism over 2 ranks
    DCP=4 DCP_INTERLEAVE=16 make e2e-ascend       # ... and cp_kv_cache_interleave_size 16
    make study-cpu                    # the study here, on CPU: the tiny models trained here

For each run of the scenario (V2 runner with the window, V2 without it, V1 runner with the
window) it starts `vllm serve`, waits for health, sends prompts longer and shorter than W,
reads vLLM's speculative-decoding metrics and the greedy outputs, and stops the server (also
on failure). It then asserts: greedy outputs identical across runs (the target decides the
output), per-position acceptance of V2 with the window within 0.1 of the golden file, and V2
with the window at least V1 with the window minus 0.05; and writes a JSON and markdown
report with a plot of acceptance by position. Model locations come from TARGET_MODEL and
DRAFT_MODEL (local paths work with no network). With SINKS, the V2 run with the window also
keeps that many attention sinks (its golden file is one of its own); V1 has no sinks, so
its run keeps the plain window as the floor to compare with. MIN_CONTEXT sets
draft_window_min_context on the V2 run with the window the same way (V1 windows every
context). DCP=N serves every run (V2 with and without the window, V1: the same parallelism
for the comparison) with --decode-context-parallel-size N, and DCP_INTERLEAVE=I with
--cp-kv-cache-interleave-size I. vLLM shards the KV over the tensor-parallel ranks, so TP
must be a multiple of N: a scenario's own TP is raised to the smallest multiple, a TP set
by hand that is not one stops the harness. Under DCP the window aligns to N blocks (one on
each rank), so the draft reads up to W + N b - 1 tokens: the run has a golden file of its
own (``_dcpN``). STUDY=long does not take DCP (its golden files and draft KV estimates are
for one rank's layout).

DEVICE=cpu runs the long-context study only, in this project's ``.venv`` (``make
study-cpu``): vLLM's CPU worker with the test bed's engine environment
(``tests/testbed/engine/environment.py``), the models trained here
(``tests/testbed/engine/trained.py``: ``draft_model`` and ``eagle3`` scenarios) and their
held-out text, contexts from inside the drafter's training context to 16 times it.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

import study  # noqa: E402  (beside this file)

KEY = "draft_window_size"
SINKS_KEY = "draft_attention_sinks"
MIN_CONTEXT_KEY = "draft_window_min_context"
PLUGIN_MODULE = "vllm_ascend.worker.v2.spec_decode.draft_window.plugin"
FILLER = "This is a padding sentence for testing sliding window draft attention. "


@dataclass
class Scenario:
    name: str
    target: str
    draft: str
    method: str
    num_spec: int
    window: int
    tp: int
    max_model_len: int
    golden: Path | None
    extra_args: list[str] = field(default_factory=list)
    sinks: int = 0
    # draft_window_min_context of the V2 run with the window (0: every context)
    min_context: int = 0
    token_prompts: bool = False  # tiny random models: token ids instead of text
    # decode_context_parallel_size of every run, and its cp_kv_cache_interleave_size (None:
    # vLLM's default)
    dcp: int = 1
    dcp_interleave: int | None = None


def scenarios(env: dict[str, str], device: str = "ascend") -> dict[str, Scenario]:
    if device == "cpu":
        return cpu_scenarios(env)
    golden = ROOT / "e2e" / "golden"
    sinks, min_context = int(env.get("SINKS", 0)), int(env.get("MIN_CONTEXT", 0))
    dcp, dcp_interleave = dcp_settings(env)
    # Sinks, a threshold and DCP (its alignment) change what the draft reads: golden files
    # of their own.
    suffix = golden_suffix(sinks, min_context, dcp)
    window = int(env.get("WINDOW", 512))

    def qwen3_8b(name: str, draft: str, num_spec: int, tp: int = 1) -> Scenario:
        """A Qwen3-8B target with ``draft`` (TARGET_MODEL, DRAFT_MODEL, WINDOW, TP override)."""
        return Scenario(
            name,
            env.get("TARGET_MODEL", "Qwen/Qwen3-8B"),
            env.get("DRAFT_MODEL", draft),
            name,
            num_spec,
            window,
            int(env.get("TP", tp)),
            4096,
            golden / f"{name}_qwen3_8b_w{window}{suffix}.json",
        )

    found = {
        # As the upstream MRV1 end-to-end test of the window: Qwen3-8B, EAGLE3, K=3, W=512.
        "eagle3": qwen3_8b("eagle3", "RedHatAI/Qwen3-8B-speculator.eagle3", 3, tp=2),
        "dspark": qwen3_8b("dspark", "deepseek-ai/dspark_qwen3_8b_block7", 7),
        # A small model of the target's family drafting for it (vLLM's draft_model).
        "draft_model": qwen3_8b("draft_model", "Qwen/Qwen3-0.6B", 3),
        # DFlash drafts a block of 16 (K = 15) in one parallel pass.
        "dflash": qwen3_8b("dflash", "z-lab/Qwen3-8B-DFlash-b16", 15),
        "tiny": Scenario(
            "tiny",
            "",
            "",
            "eagle3",
            3,
            int(env.get("WINDOW", 64)),
            1,
            2048,
            None,
            ["--load-format", "dummy", "--skip-tokenizer-init", "--enforce-eager"],
            token_prompts=True,
        ),
    }
    for scenario in found.values():
        scenario.sinks, scenario.min_context = sinks, min_context
        scenario.dcp, scenario.dcp_interleave = dcp, dcp_interleave
    return found


def trained_models() -> object:
    """The tiny models ``make trained-models`` trained here (the CPU study's)."""
    sys.path.insert(0, str(ROOT))
    from tests.testbed.engine import trained

    return trained


def cpu_scenarios(env: dict[str, str]) -> dict[str, Scenario]:
    """The CPU study's scenarios: the target trained here with its draft model or its EAGLE3
    head (``TARGET_MODEL`` and ``DRAFT_MODEL`` override them), served by vLLM's CPU worker
    as the test bed's engine runs (float32, eager, KV blocks of ``BLOCK_SIZE``)."""
    trained = trained_models()
    models = trained.TrainedModels(TRAINED_ROOT)
    # The window "auto" picks for a drafter declaring its training context C (the reads, W
    # to W + a - 1 tokens, within C): C - a + 1.
    block = int(env.get("BLOCK_SIZE", CPU_BLOCK_SIZE))
    window = int(env.get("WINDOW", trained.DRAFT_CONTEXT - block + 1))
    cpu_args = [
        *("--host", "127.0.0.1", "--dtype", "float32", "--enforce-eager", "--seed", "0"),
        *("--block-size", env.get("BLOCK_SIZE", str(CPU_BLOCK_SIZE))),
        *("--kv-cache-memory-bytes", str(64 * 1024 * 1024)),
        *("--max-num-seqs", env.get("PROMPTS_PER_CONTEXT", str(CPU_PROMPTS))),
    ]
    found = {}
    for name, draft in (("draft_model", models.draft_model), ("eagle3", models.eagle3)):
        found[name] = Scenario(
            name,
            env.get("TARGET_MODEL", models.target),
            env.get("DRAFT_MODEL", draft),
            name,
            trained.NUM_SPEC,
            window,
            1,
            trained.TARGET_CONTEXT,
            None,
            cpu_args,
            sinks=int(env.get("SINKS", 0)),
            min_context=int(env.get("MIN_CONTEXT", 0)),
        )
    return found


# Where `make trained-models` writes the CPU study's models.
TRAINED_ROOT = ROOT / ".cache" / "trained-models"
# The CPU study's defaults (the environment overrides each): KV blocks of 32 tokens (the CPU
# attention backend's smallest), 8 prompts per context sent together, 16 output tokens each:
# so small a model's greedy continuation soon repeats itself (design/e2e.md), so the study
# measures the tokens right after each stretch of real text.
CPU_BLOCK_SIZE = 32
CPU_PROMPTS = 8
CPU_OUTPUT_TOKENS = 16


def cpu_study_defaults() -> dict[str, str]:
    """The CPU study's settings from the trained drafter's context C: contexts C/2 (inside
    it) to 16 C, the window expected to help from 8 C and to change nothing at C/2, the
    prompts cut from the held-out text."""
    trained = trained_models()
    c = trained.DRAFT_CONTEXT
    models = trained.TrainedModels(TRAINED_ROOT)
    return {
        "CONTEXTS": ",".join(str(c * k // 2) for k in (1, 2, 4, 8, 16, 32)),
        "OUTPUT_TOKENS": str(CPU_OUTPUT_TOKENS),
        "PROMPTS_PER_CONTEXT": str(CPU_PROMPTS),
        "BLOCK_SIZE": str(CPU_BLOCK_SIZE),
        "STUDY_TEXT": str(models.heldout),
        "LONG_CONTEXT": str(8 * c),
        "SHORT_CONTEXT": str(c // 2),
    }


def cpu_engine_env() -> dict[str, str]:
    """What a vLLM engine needs on this CPU-only host (the test bed's engine environment)."""
    sys.path.insert(0, str(ROOT))
    from tests.testbed.engine.environment import engine_env

    cache = ROOT / ".cache" / f"vllm-{metadata.version('vllm')}"
    full = engine_env(cache, host_has_model_runner_v1())
    return {key: value for key, value in full.items() if os.environ.get(key) != value}


def golden_suffix(sinks: int, min_context: int, dcp: int = 1) -> str:
    return (
        f"{f'_s{sinks}' if sinks else ''}{f'_m{min_context}' if min_context else ''}"
        f"{f'_dcp{dcp}' if dcp > 1 else ''}"
    )


def dcp_settings(env: dict[str, str]) -> tuple[int, int | None]:
    """DCP and DCP_INTERLEAVE: positive integers, the interleave only with DCP > 1."""
    dcp = _positive_env(env, "DCP") or 1
    interleave = _positive_env(env, "DCP_INTERLEAVE")
    if interleave is not None and dcp == 1:
        raise ValueError(
            f"DCP_INTERLEAVE={interleave} needs DCP > 1: the interleave shards "
            f"nothing without decode context parallelism"
        )
    return dcp, interleave


def _positive_env(env: dict[str, str], name: str) -> int | None:
    text = env.get(name, "")
    if text == "":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {text!r}")
    return value


def fit_tp_to_dcp(scenario: Scenario, tp_set_by_hand: bool) -> str | None:
    """vLLM's DCP shards the KV over the tensor-parallel ranks, so TP must be a multiple of
    DCP. A scenario's own TP is raised to the smallest multiple (returns a note saying so);
    a TP set by hand that is not one stops with a ValueError naming both."""
    tp, dcp = scenario.tp, scenario.dcp
    if tp % dcp == 0:
        return None
    fitted = -(-tp // dcp) * dcp
    if tp_set_by_hand:
        raise ValueError(
            f"DCP={dcp} needs a tensor parallel size that is a multiple of it "
            f"(vLLM shards the KV over the TP ranks): TP={tp} is not; set "
            f"TP={fitted}, or leave TP unset"
        )
    scenario.tp = fitted
    return (
        f"DCP={dcp}: --tensor-parallel-size {fitted}, the {scenario.name} scenario's "
        f"TP={tp} raised to a multiple of DCP"
    )


@dataclass
class Run:
    name: str
    v2: bool
    # draft_window_size: tokens, "auto" or None (no window)
    window: int | str | None
    sinks: int = 0
    min_context: int = 0
    # False: served without --speculative-config (the study's reference)
    speculative: bool = True


# Asks the host's vLLM (this interpreter's) whether it still has Model Runner V1.
V1_PROBE = (
    "from vllm import envs; "
    "print('VLLM_USE_V2_MODEL_RUNNER' in getattr(envs, 'environment_variables', {}))"
)


@functools.cache
def host_has_model_runner_v1() -> bool:
    """Whether the host's vLLM still has Model Runner V1 and ``VLLM_USE_V2_MODEL_RUNNER``:
    vLLM 0.34 removed both (it refuses the variable unless 1, and warns that 1 is
    redundant), so there every run is Model Runner V2 with nothing to set. Before vLLM is
    importable (a dry run on a bare host), the releases that have V1 are assumed."""
    probe = subprocess.run([sys.executable, "-c", V1_PROBE], capture_output=True, text=True)
    return probe.returncode != 0 or probe.stdout.strip() != "False"


def shell_line(env: dict[str, str], cmd: list[str]) -> str:
    """A command with its environment, as a shell would show it."""
    return " ".join([*(f"{k}={v}" for k, v in env.items()), shlex.join(cmd)])


def runs(scenario: Scenario, device: str) -> list[Run]:
    out = [
        Run("v2_window", True, scenario.window, scenario.sinks, scenario.min_context),
        Run("v2_no_window", True, None),
    ]
    # vllm-ascend's own Model Runner V1 window: the floor V2's is compared with.
    if device == "ascend" and host_has_model_runner_v1():
        out.append(Run("v1_window", False, scenario.window))
    return out


def study_runs(scenario: Scenario, device: str, env: dict[str, str]) -> list[Run]:
    """The study's runs: without speculation (the reference of every output and of the
    throughput; NO_SPECULATION=0 leaves it out), V2 with the window (and MIN_CONTEXT), V2
    without, V2 with the window and SINKS attention sinks, V2 with ``draft_window_size``
    "auto" (AUTO=1), V2 with each of MORE_WINDOWS, and V1 with the window on Ascend."""
    out = []
    if env.get("NO_SPECULATION", "1") != "0":
        out.append(Run("no_speculation", True, None, speculative=False))
    out += [
        Run("v2_window", True, scenario.window, 0, scenario.min_context),
        Run("v2_no_window", True, None),
    ]
    if scenario.sinks:
        out.append(Run("v2_window_sinks", True, scenario.window, scenario.sinks))
    if env.get("AUTO", "0") not in ("", "0"):
        out.append(Run("v2_auto", True, "auto", 0, scenario.min_context))
    for window in _more_windows(env):
        out.append(Run(f"v2_window_{window}", True, window, 0, scenario.min_context))
    if device == "ascend" and host_has_model_runner_v1():
        out.append(Run("v1_window", False, scenario.window))
    return out


def _more_windows(env: dict[str, str]) -> list[int]:
    """MORE_WINDOWS: windows to compare beside WINDOW, comma-separated token counts."""
    text = env.get("MORE_WINDOWS", "")
    try:
        windows = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        windows = [0]
    if any(w < 1 for w in windows):
        raise ValueError(
            f"MORE_WINDOWS must be positive token counts, comma-separated; got {text!r}"
        )
    return windows


def serve_command(
    scenario: Scenario, run: Run, port: int, device: str = "ascend"
) -> tuple[dict[str, str], list[str]]:
    env = cpu_engine_env() if device == "cpu" else {}
    if host_has_model_runner_v1():
        env["VLLM_USE_V2_MODEL_RUNNER"] = "1" if run.v2 else "0"
    spec = {
        "method": scenario.method,
        "model": scenario.draft,
        "num_speculative_tokens": scenario.num_spec,
    }
    # The vllm of this interpreter's environment, not whichever is first on PATH.
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        scenario.target,
        "--port",
        str(port),
        "--tensor-parallel-size",
        str(scenario.tp),
        "--max-model-len",
        str(scenario.max_model_len),
        *(("--speculative-config", json.dumps(spec)) if run.speculative else ()),
        *scenario.extra_args,
    ]
    # Every run alike: the runs compare the window, not the parallelism.
    if scenario.dcp > 1:
        cmd += ["--decode-context-parallel-size", str(scenario.dcp)]
    if scenario.dcp_interleave is not None:
        cmd += ["--cp-kv-cache-interleave-size", str(scenario.dcp_interleave)]
    if run.window is not None:
        cmd += ["--additional-config", json.dumps(_additional_config(run))]
    return env, cmd


def prompts(scenario: Scenario) -> tuple[list, list, list]:
    """(the golden prompt, more prompts longer than W, a few shorter ones). The golden one
    mirrors the upstream MRV1 end-to-end test of the window, whose per-position acceptance
    the golden file records; the others give the V1/V2 comparison enough drafts to resolve
    0.05."""
    if scenario.token_prompts:
        long = [(7 * i) % 200 + 10 for i in range(3 * scenario.window)]
        more = [[(t + k) % 200 + 10 for t in long] for k in range(1, 8)]
        return [long], more, [long[: scenario.window // 2], list(range(10, 40))]
    filler = FILLER * max(80, scenario.window // 6)
    questions = [
        "What is 3+5?",
        "Name three primary colors.",
        "What is the capital of Italy?",
        "Spell the word window backwards.",
        "What is 12 times 12?",
        "Which planet is closest to the sun?",
        "Translate 'thank you' to French.",
    ]
    return (
        [filler + " What is 2+2?"],
        [filler + " " + q for q in questions],
        ["What is the capital of France?", "Count from one to five."],
    )


def complete(base: str, model: str, scenario: Scenario, prompt, max_tokens: int = 32) -> object:
    """One greedy completion: chat for text (the server applies the chat template), plain
    completion for token ids."""
    if scenario.token_prompts:
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "return_token_ids": True,
        }
        choice = json.loads(_http(f"{base}/v1/completions", body))["choices"][0]
        return choice.get("token_ids") or choice["text"]
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    return json.loads(_http(f"{base}/v1/chat/completions", body))["choices"][0]["message"][
        "content"
    ]


def plan(scenario: Scenario, device: str, port: int) -> list[str]:
    """Every command the harness runs, in order, as a shell would show it."""
    py = shlex.quote(sys.executable)
    lines = [f"{py} -m pip install --no-deps {shlex.quote(str(ROOT))}"]
    if device == "ascend":
        lines.append("# verify: no vllm-ascend file was replaced (RECORD hashes before = after)")
    lines.append(PAIRING_LINE.format(method=scenario.method))
    for run in runs(scenario, device):
        env, cmd = serve_command(scenario, run, port)
        lines.append(shell_line(env, cmd))
        lines.append(f"curl -sf http://127.0.0.1:{port}/health  # until healthy")
        _, more, short = prompts(scenario)
        endpoint = "completions" if scenario.token_prompts else "chat/completions"
        url = f"http://127.0.0.1:{port}"
        lines.append(f"curl -s {url}/metrics  # before")
        lines.append(
            f"curl -s {url}/v1/{endpoint}  # the golden prompt, longer than "
            f"W={scenario.window}, greedy, 32 tokens"
        )
        lines.append(f"curl -s {url}/metrics  # acceptance by position (golden check)")
        lines.append(f"curl -s {url}/v1/{endpoint}  # {len(more)} more long prompts, 128 tokens")
        lines.append(f"curl -s {url}/metrics  # acceptance over all long prompts (V1/V2 check)")
        lines.append(f"curl -s {url}/v1/{endpoint}  # {len(short)} shorter prompt(s), greedy")
        lines.append("kill -INT <server process group>  # also on failure")
    return lines


def acceptance(before: str, after: str, num_spec: int) -> dict:
    """Per-position acceptance and mean acceptance length from two /metrics scrapes."""

    def counters(text: str) -> tuple[float, list[float]]:
        drafts, per_pos = 0.0, [0.0] * num_spec
        for line in text.splitlines():
            if line.startswith("vllm:spec_decode_num_drafts_total"):
                drafts += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total"):
                pos = int(re.search(r'position="(\d+)"', line).group(1))
                if pos < num_spec:
                    per_pos[pos] += float(line.rsplit(" ", 1)[1])
        return drafts, per_pos

    d0, p0 = counters(before)
    d1, p1 = counters(after)
    drafts = d1 - d0
    if drafts <= 0:
        raise RuntimeError("no speculative drafts were counted: is speculative decoding on?")
    per_pos = [(b - a) / drafts for a, b in zip(p0, p1, strict=True)]
    return {"drafts": drafts, "per_position": per_pos, "mean_length": 1 + sum(per_pos)}


def check(
    results: dict[str, dict], golden: list[float] | None, tolerance: float = 0.1
) -> list[str]:
    """The assertions; returns the failures (empty when everything holds)."""
    failures = []
    outputs = {name: r["outputs"] for name, r in results.items()}
    reference = outputs["v2_window"]
    for name, out in outputs.items():
        if out != reference:
            failures.append(f"greedy outputs of {name} differ from v2_window")
    ours = results["v2_window"]["acceptance"]
    if golden is not None:
        for i, (got, want) in enumerate(zip(ours["per_position"], golden, strict=False)):
            if abs(got - want) > tolerance:
                failures.append(
                    f"acceptance at position {i}: {got:.3f}, golden {want:.3f} (+-{tolerance})"
                )
    if "v1_window" in results:
        v2 = results["v2_window"].get("all_long", ours)["mean_length"]
        v1 = results["v1_window"].get("all_long", results["v1_window"]["acceptance"])
        if v2 < v1["mean_length"] - 0.05:
            failures.append(
                f"V2 with the window: mean acceptance {v2:.3f} < V1 with the "
                f"window {v1['mean_length']:.3f} - 0.05"
            )
    return failures


def _http(url: str, payload: dict | None = None, timeout: float = 600) -> str:
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read().decode()


class Server:
    """`vllm serve` in its own process group, stopped on exit whatever happens."""

    def __init__(
        self, env: dict[str, str], cmd: list[str], log: Path, port: int, cwd: Path | None = None
    ):
        self.port = port
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                raise RuntimeError(f"port {port} is already in use: set PORT to a free one")
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            cmd,
            env={**os.environ, **env},
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=cwd,
        )

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"vllm serve exited with {self.proc.returncode}; see {self.log.name}"
                )
            try:
                _http(f"http://127.0.0.1:{self.port}/health", timeout=5)
                return
            except OSError:
                time.sleep(1)
        raise TimeoutError(f"vllm serve not healthy after {timeout:.0f} s; see {self.log.name}")

    def stop(self) -> None:
        # The whole group, even if the main process is gone: its workers hold the devices.
        for sig, wait in ((signal.SIGINT, 60), (signal.SIGKILL, 30)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            if sig == signal.SIGINT:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)  # leftover workers
            break
        self.log.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


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


PAIRING_LINE = (
    "# check: the host's vLLM pairing is a release the draft window supports, serving {method}; "
    "else stop"
)
# Run in the host's Python after the install: the versions and the supported releases.
PAIRING_PROBE = """
import sys
from vllm_ascend.worker.v2.spec_decode.draft_window import releases, versions
installed = versions.installed_versions()
line = releases.release_for(installed["vllm"])
print(f"host: {versions.describe_versions()}; supported: {releases.SUPPORTED}")
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


def load_golden(scenario: Scenario, record: bool) -> tuple[list[float] | None, float]:
    """(per-position golden, tolerance); stops before any server starts when missing."""
    if scenario.golden is None or record:
        return None, 0.1
    if not scenario.golden.exists():
        raise SystemExit(
            f"no golden file {scenario.golden}: run once with RECORD_GOLDEN=1 on a "
            "trusted setup to write it"
        )
    data = json.loads(scenario.golden.read_text())
    return data["per_position"], float(data.get("tolerance", 0.1))


def run_scenario(
    scenario: Scenario, device: str, port: int, out_dir: Path, record: bool = False
) -> int:
    out_dir.mkdir(parents=True, exist_ok=True)
    golden, tolerance = load_golden(scenario, record)
    install(device)
    check_pairing(scenario.method)
    results = {}
    for run in runs(scenario, device):
        env, cmd = serve_command(scenario, run, port)
        print(
            f"[e2e] {run.name}: {shell_line(env, cmd)}",
            flush=True,
        )
        with Server(env, cmd, out_dir / f"{run.name}.log", port) as server:
            server.wait_healthy(timeout=1800)
            base = f"http://127.0.0.1:{port}"
            model = json.loads(_http(f"{base}/v1/models"))["data"][0]["id"]
            golden_prompts, more, short = prompts(scenario)
            before = _http(f"{base}/metrics")
            outputs = [complete(base, model, scenario, p) for p in golden_prompts]
            after_golden = _http(f"{base}/metrics")
            outputs += [complete(base, model, scenario, p, max_tokens=128) for p in more]
            after_long = _http(f"{base}/metrics")
            outputs += [complete(base, model, scenario, p) for p in short]
        log = (out_dir / f"{run.name}.log").read_text(errors="replace")
        results[run.name] = {
            "outputs": outputs,
            "acceptance": acceptance(before, after_golden, scenario.num_spec),
            "all_long": acceptance(before, after_long, scenario.num_spec),
            # The start-up line and the line of the first windowed build.
            "window_active": "Draft KV window on for" in log and "Draft KV window active" in log,
        }
    if record and scenario.golden is not None:
        measured = results["v2_window"]["acceptance"]["per_position"]
        scenario.golden.write_text(
            json.dumps(
                {
                    "source": f"recorded by e2e.py on {device}",
                    "per_position": measured,
                    "tolerance": 0.1,
                },
                indent=2,
            )
            + "\n"
        )
        print(f"[e2e] recorded {scenario.golden}")
    failures = check(results, golden, tolerance)
    if not results["v2_window"]["window_active"]:
        failures.append("the V2 server with the window did not log the window on and active")
    if results["v2_no_window"]["window_active"]:
        failures.append("the V2 server without the window logged the window as on")
    write_report(out_dir, scenario, device, results, golden, failures)
    for failure in failures:
        print(f"[e2e] FAILED: {failure}")
    print(f"[e2e] {'passed' if not failures else 'failed'}; report in {out_dir}")
    return 1 if failures else 0


def write_report(out_dir, scenario, device, results, golden, failures) -> None:
    report = {
        "scenario": scenario.name,
        "device": device,
        "window": scenario.window,
        "runs": results,
        "golden": golden,
        "failures": failures,
    }
    (out_dir / "report.json").write_text(json.dumps(report, indent=2, default=str))
    lines = [
        f"# Draft window end to end: {scenario.name} on {device}",
        "",
        "| run | mean acceptance length | per-position acceptance |",
        "|---|---:|---|",
    ]
    for name, r in results.items():
        a = r["acceptance"]
        lines.append(
            f"| {name} | {a['mean_length']:.3f} | "
            f"{', '.join(f'{x:.2f}' for x in a['per_position'])} |"
        )
    lines += [
        "",
        "Failures: " + ("none" if not failures else "; ".join(failures)),
        "",
        "![acceptance](acceptance.png)",
        "",
    ]
    (out_dir / "report.md").write_text("\n".join(lines))
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


def study_plan(
    scenario: Scenario,
    device: str,
    port: int,
    settings: study.Settings,
    counter: study.TokenCounter,
    env: dict[str, str],
) -> list[str]:
    """Every server and request of the long-context study, per context."""
    python, root = shlex.quote(sys.executable), shlex.quote(str(ROOT))
    install_line = f"{python} -m pip install --no-deps {root}"
    if device == "cpu":
        install_line = f"# check: {PLUGIN_MODULE} imports (make installed this project)"
    lines = [
        install_line,
        f"# contexts {settings.contexts}; {settings.prompts_per_context} prompts each, "
        f"{settings.output_tokens} output tokens, greedy; token counts: {counter.source}",
        PAIRING_LINE.format(method=scenario.method),
    ]
    text = settings.text()
    served = dataclasses.replace(scenario, max_model_len=settings.served_len)
    endpoint = "chat/completions" if settings.chat else "completions"
    for index, run in enumerate(study_runs(served, device, env)):
        run_port = port + index % settings.parallel
        url = f"http://127.0.0.1:{run_port}"
        serve_env, cmd = serve_command(served, run, run_port, device)
        lines.append(shell_line(serve_env, cmd))
        lines.append(f"curl -sf {url}/health  # until healthy")
        for ctx in settings.contexts:
            prompts_ = study.build_prompts(
                ctx, settings.prompts_per_context, counter, text, settings.chat
            )
            lines.append(f"curl -s {url}/metrics  # before context {ctx}")
            for p in prompts_:
                lines.append(
                    f"curl -s {url}/v1/{endpoint}  # context {ctx}: a prompt of "
                    f"{p.tokens} tokens, max_tokens {settings.output_tokens}"
                )
            lines.append(f"curl -s {url}/metrics  # after context {ctx}")
        lines.append("kill -INT <server process group>  # also on failure")
    return lines


# The start-up lines of the window a study run's server logged (shown in its report).
WINDOW_LINE = re.compile(r"(Draft KV window .*|draft_window_size=auto\b.*)$")


def study_one_run(
    served: Scenario,
    run: Run,
    device: str,
    port: int,
    out_dir: Path,
    settings: study.Settings,
    prompts_by_context: dict,
    text: str = "",
) -> dict:
    """One study run: its server, every context's prompts sent together, the metrics. The
    first run cuts every run's prompts (into ``prompts_by_context``) with the served target's
    own tokenizer, where they were not cut before (the target not a local directory)."""
    env, cmd = serve_command(served, run, port, device)
    print(f"[e2e] study {run.name}: {shlex.join(cmd)}", flush=True)
    contexts, outputs = {}, []
    log_path = out_dir / f"{run.name}.log"
    started = time.monotonic()
    # On CPU the server starts in the study's folder: it imports this project as installed.
    cwd = out_dir if device == "cpu" else None
    with Server(env, cmd, log_path, port, cwd) as server:
        server.wait_healthy(timeout=1800)
        base = f"http://127.0.0.1:{port}"
        model = json.loads(_http(f"{base}/v1/models"))["data"][0]["id"]
        if not prompts_by_context:
            remote = study.TokenCounter.remote(_http, base, model)
            prompts_by_context.update(_study_prompts(settings, remote, text))
            prompts_by_context["source"] = remote.source
        for ctx in settings.contexts:
            before = _http(f"{base}/metrics")
            batch = prompts_by_context[ctx]
            begun = time.monotonic()
            with ThreadPoolExecutor(max_workers=len(batch)) as pool:
                replies = list(
                    pool.map(
                        lambda p: study.timed_completion(
                            _http, base, model, p.text, settings.output_tokens, settings.chat
                        ),
                        batch,
                    )
                )
            seconds = time.monotonic() - begun
            outputs += [text for text, _, _ in replies]
            metrics = study.context_metrics(
                before, _http(f"{base}/metrics"), served.num_spec, run.speculative
            )
            tokens = sum(n for _, n, _ in replies)
            metrics["client_tokens_per_s"] = tokens / seconds if seconds else None
            contexts[str(ctx)] = metrics
            mean = metrics["mean_length"]
            print(
                f"[e2e] study {run.name} {ctx}: mean acceptance length "
                f"{'-' if mean is None else f'{mean:.3f}'}, "
                f"{metrics['client_tokens_per_s']:.1f} output tokens/s",
                flush=True,
            )
    log = log_path.read_text(errors="replace")
    lines = []
    for line in log.splitlines():
        found = WINDOW_LINE.search(line)
        if found and found.group(1) not in lines:
            lines.append(found.group(1))
    # "auto" reads as the window its start-up line says it became.
    window = run.window
    if window == "auto":
        became = [re.match(r"draft_window_size=auto became W=(\d+)", line) for line in lines]
        window = next((int(m.group(1)) for m in became if m), None)
    for ctx, metrics in contexts.items():
        metrics["draft_kv_read"] = (
            None
            if not run.speculative
            else study.draft_kv_read(
                int(ctx), window, run.sinks, settings.alignment, run.min_context
            )
        )
    return {
        "outputs": outputs,
        "contexts": contexts,
        "window_lines": lines,
        "additional_config": _additional_config(run),
        "seconds": round(time.monotonic() - started, 1),
    }


def run_study(
    scenario: Scenario,
    device: str,
    port: int,
    out_dir: Path,
    settings: study.Settings,
    counter: study.TokenCounter,
    record: bool,
    env: dict[str, str] | None = None,
) -> int:
    env = dict(os.environ) if env is None else env
    golden_file = study.golden_path(ROOT, scenario.name, scenario.window, scenario.min_context)
    golden, tolerance = None, 0.15
    # On CPU the suites assert the study's margins instead (tests/test_engine_study.py).
    if not record and device != "cpu":
        if not golden_file.exists():
            raise SystemExit(
                f"no golden file {golden_file}: run once with RECORD_GOLDEN=1 on a "
                "trusted setup to write it"
            )
        data = json.loads(golden_file.read_text())
        golden, tolerance = data["mean_length"], float(data.get("tolerance", 0.15))
    if not settings.contexts:
        raise SystemExit("no study context fits the model: set MAX_CONTEXT")
    out_dir.mkdir(parents=True, exist_ok=True)
    install(device)
    check_pairing(scenario.method)
    text = settings.text()
    served = dataclasses.replace(scenario, max_model_len=settings.served_len)
    planned = study_runs(served, device, env)
    prompts_by_context = {}
    if counter.encode is not None:
        prompts_by_context = _study_prompts(settings, counter, text)
    results = {}
    parallel = settings.parallel if prompts_by_context else 1
    if parallel > 1:
        # One port per server at once; every run's prompts were cut before any started.
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            futures = {
                run.name: pool.submit(
                    study_one_run,
                    served,
                    run,
                    device,
                    port + index % parallel,
                    out_dir,
                    settings,
                    prompts_by_context,
                    text,
                )
                for index, run in enumerate(planned)
            }
            results = {name: future.result() for name, future in futures.items()}
    else:
        for run in planned:
            results[run.name] = study_one_run(
                served, run, device, port, out_dir, settings, prompts_by_context, text
            )
    if counter.encode is None:
        counter = study.TokenCounter(source=prompts_by_context.get("source", counter.source))
        prompts_by_context.pop("source", None)
    if record:
        measured = {c: m["mean_length"] for c, m in results["v2_window"]["contexts"].items()}
        golden_file.write_text(
            json.dumps(
                {
                    "source": f"recorded by e2e.py STUDY=long on {device}",
                    "mean_length": measured,
                    "tolerance": 0.15,
                },
                indent=2,
            )
            + "\n"
        )
        print(f"[e2e] recorded {golden_file}")
    failures = study.check(
        results, golden, tolerance, scenario.min_context, settings.long_from, settings.short_to
    )
    meta = {
        "scenario": scenario.name,
        "device": device,
        "method": scenario.method,
        "target": scenario.target,
        "draft": scenario.draft,
        "window": scenario.window,
        "num_spec": scenario.num_spec,
        "alignment": settings.alignment,
        "sinks": scenario.sinks,
        "min_context": scenario.min_context,
        "contexts": settings.contexts,
        "prompts_per_context": settings.prompts_per_context,
        "output_tokens": settings.output_tokens,
        "token_counts": counter.source,
        "long_from": settings.long_from,
        "short_to": settings.short_to,
    }
    study.write_report(out_dir, meta, results, failures)
    for failure in failures:
        print(f"[e2e] FAILED: {failure}")
    print(f"[e2e] {'passed' if not failures else 'failed'}; report in {out_dir}")
    return 1 if failures else 0


def _study_prompts(settings: study.Settings, counter: study.TokenCounter, text: str) -> dict:
    return {
        ctx: study.build_prompts(ctx, settings.prompts_per_context, counter, text, settings.chat)
        for ctx in settings.contexts
    }


def _additional_config(run: Run) -> dict:
    additional = {}
    if run.window is not None:
        additional[KEY] = run.window
        if run.sinks:
            additional[SINKS_KEY] = run.sinks
        if run.min_context:
            additional[MIN_CONTEXT_KEY] = run.min_context
    return additional


def tiny_models(root: Path, scenario: Scenario) -> None:
    """Random tiny target and EAGLE3 draft configs, loaded with load_format=dummy."""
    target = root / "target"
    draft = root / "draft"
    target.mkdir(parents=True)
    draft.mkdir(parents=True)
    common = {
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "vocab_size": 1024,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16",
    }
    (target / "config.json").write_text(
        json.dumps(
            {
                **common,
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "num_hidden_layers": 4,
            }
        )
    )
    (draft / "config.json").write_text(
        json.dumps(
            {
                **common,
                "architectures": ["LlamaForCausalLMEagle3"],
                "model_type": "llama",
                "num_hidden_layers": 1,
                "draft_vocab_size": 1024,
            }
        )
    )
    scenario.target, scenario.draft = str(target), str(draft)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--device",
        choices=["ascend", "cuda", "cpu"],
        default=os.environ.get("DEVICE", "ascend"),
    )
    parser.add_argument("--scenario", default=os.environ.get("E2E_SCENARIO", "eagle3"))
    parser.add_argument(
        "--dry-run", action="store_true", default=os.environ.get("DRY_RUN", "") not in ("", "0")
    )
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8123)))
    parser.add_argument("--out", type=Path, default=ROOT / "e2e" / "results")
    parser.add_argument(
        "--study",
        choices=["long"],
        default=os.environ.get("STUDY") or None,
        help="the long-context study (study.py)",
    )
    args = parser.parse_args(argv)
    if args.device == "cpu" and not args.study:
        parser.error("DEVICE=cpu runs the long-context study only: set STUDY=long")
    try:
        table = scenarios(dict(os.environ), args.device)
        _more_windows(dict(os.environ))
    except ValueError as error:
        parser.error(str(error))
    if args.scenario not in table:
        parser.error(f"E2E_SCENARIO={args.scenario!r} is not one of {sorted(table)}")
    scenario = table[args.scenario]
    if args.study and scenario.dcp > 1:
        parser.error(
            f"STUDY=long does not take DCP={scenario.dcp}: its golden files and draft "
            f"KV estimates are for one rank's layout"
        )
    try:
        # The tiny scenario keeps its own TP whatever TP says.
        tp_note = fit_tp_to_dcp(scenario, "TP" in os.environ and scenario.name != "tiny")
    except ValueError as error:
        parser.error(str(error))
    if tp_note:
        print(f"# {tp_note}" if args.dry_run else f"[e2e] {tp_note}", flush=True)
    if scenario.name == "tiny" and args.device != "cuda":
        parser.error("E2E_SCENARIO=tiny runs on vLLM's CUDA V2 runner: set DEVICE=cuda")
    if args.study and scenario.token_prompts:
        parser.error("STUDY=long needs a real target and draft: not E2E_SCENARIO=tiny")
    if args.study:
        defaults = cpu_study_defaults() if args.device == "cpu" else None
        settings = study.Settings.from_env(dict(os.environ), scenario.target, args.device, defaults)
        counter = study.TokenCounter.for_target(scenario.target)
    if args.dry_run and args.study:
        lines = study_plan(scenario, args.device, args.port, settings, counter, dict(os.environ))
        print("\n".join(lines))
        return 0
    if args.dry_run:
        if scenario.name == "tiny":
            scenario.target, scenario.draft = "<tmp>/target", "<tmp>/draft"
        print("\n".join(plan(scenario, args.device, args.port)))
        return 0
    probe = {"ascend": "npu-smi", "cuda": "nvidia-smi"}.get(args.device)
    if args.device == "cpu":
        if not (TRAINED_ROOT / ".complete").exists() and ("TARGET_MODEL" not in os.environ):
            print("needs the trained tiny models: run `make trained-models`", file=sys.stderr)
            return 2
    elif shutil.which(probe) is None:
        what = "Ascend NPUs" if args.device == "ascend" else "CUDA GPUs"
        print(f"needs {what}: {probe} not found", file=sys.stderr)
        return 2
    if args.device == "ascend":
        try:
            metadata.version("vllm-ascend")
        except metadata.PackageNotFoundError:
            print("needs vllm-ascend installed in this environment", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory() as tmp:
        if scenario.name == "tiny":
            tiny_models(Path(tmp), scenario)
        record = os.environ.get("RECORD_GOLDEN", "") not in ("", "0")
        if args.study:
            return run_study(
                scenario,
                args.device,
                args.port,
                args.out / f"study_{scenario.name}",
                settings,
                counter,
                record,
            )
        return run_scenario(scenario, args.device, args.port, args.out / scenario.name, record)


if __name__ == "__main__":
    raise SystemExit(main())
