# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""End-to-end check of the draft window with `vllm serve` on Ascend NPUs (or CUDA GPUs),
measured with vLLM's own benchmark tools (`vllm bench sweep serve`, `vllm bench serve`).

    make e2e-ascend                   # default scenario: Qwen3-8B + EAGLE3, W=512, TP=2
    make e2e-ascend DRY_RUN=1         # write the parameter files, print the commands to paste
    E2E_SCENARIO=dspark make e2e-ascend
    DEVICE=cuda make e2e-ascend       # the same harness on vLLM's CUDA V2 runner
    DEVICE=cuda E2E_SCENARIO=tiny make e2e-ascend   # the committed tiny models, downloads nothing
    SINKS=64 make e2e-ascend          # V2 with the window and 64 attention sinks
    STUDY=long make e2e-ascend        # acceptance and throughput by context (study.py)
    STUDY=long MIN_CONTEXT=8192 make e2e-ascend   # the window engaged from 8k contexts on
    DCP=2 make e2e-ascend             # every run with decode context parallelism over 2 ranks
    DCP=4 DCP_INTERLEAVE=16 make e2e-ascend       # ... and cp_kv_cache_interleave_size 16
    make study-cpu                    # the study here, on CPU: the committed tiny models

For each run of the scenario (V2 runner with the window, V2 without it, V1 runner with the
window) ``vllm bench sweep serve`` starts `vllm serve` and sends three workloads with ``vllm
bench serve`` (``sweep_plan.py``): the golden prompt (longer than W, the upstream MRV1 end-to-end
test's), seven more long prompts and two short ones, greedy; ``vllm bench serve`` reads the
spec-decode counters around each. The harness then asserts: greedy outputs identical across
runs (the target decides the output; on a device at least MIN_IDENTICAL of them: lossless.py),
every run's acceptance by position with K entries, V2 with the window at least V2 without it
minus 0.1 on the long prompts (the acceptance checked within the run), per-position
acceptance of V2 with the window on the golden prompt within 0.1 of the golden file where the
scenario has one, and V2 with the window at least V1 with the window minus 0.05 on the long
prompts; and writes a JSON and markdown report (with what produced it) and a plot of
acceptance by position. Each run clears its own folder first (run.json marks it).
Model locations come from TARGET_MODEL and DRAFT_MODEL (local paths
work with no network). With SINKS, the V2 run with the window also keeps that many attention
sinks (its golden file is one of its own); V1 has no sinks, so its run keeps the plain window
as the floor to compare with. MIN_CONTEXT sets draft_window_min_context on the V2 run with
the window the same way (V1 windows every context). DCP=N serves every run (V2 with and
without the window, V1: the same parallelism for the comparison) with
--decode-context-parallel-size N, and DCP_INTERLEAVE=I with --cp-kv-cache-interleave-size I.
vLLM shards the KV over the tensor-parallel ranks, so TP must be a multiple of N: a
scenario's own TP is raised to the smallest multiple, a TP set by hand that is not one stops
the harness. Under DCP the window aligns to N blocks (one on each rank), so the draft reads
up to W + N b - 1 tokens: the run has a golden file of its own (``_dcpN``). STUDY=long does
not take DCP (its golden files and draft KV estimates are for one rank's layout).

DEVICE=cpu runs the long-context study only, in this project's ``.venv`` (``make
study-cpu``): vLLM's CPU worker with the test bed's engine environment
(``testbed/engine/environment.py``), the committed tiny models (``trained_models/``:
``draft_model`` and ``eagle3`` scenarios) and their held-out text (rebuilt from .venv's vLLM:
``make heldout``), contexts from inside the drafter's training context to 16 times it.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import datetime
import functools
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
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

import lossless  # noqa: E402  (beside this file)
import study  # noqa: E402  (beside this file)
import sweep_plan  # noqa: E402  (beside this file)

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
    # Prompts in the target's chat template (False: plain text, for a tokenizer without one)
    chat: bool = True
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
        # The committed tiny models (trained_models/): downloads nothing.
        "tiny": trained_scenario("tiny", "eagle3", env, []),
    }
    for scenario in found.values():
        scenario.sinks, scenario.min_context = sinks, min_context
        scenario.dcp, scenario.dcp_interleave = dcp, dcp_interleave
    return found


def trained_models() -> object:
    """The committed tiny models' package (``trained_models/``, the CPU study's)."""
    sys.path.insert(0, str(ROOT))
    import trained_models as trained

    return trained


def trained_scenario(name: str, draft: str, env: dict[str, str], extra_args: list[str]):
    """The target trained here with its draft model or its EAGLE3 head (``draft``);
    ``TARGET_MODEL`` and ``DRAFT_MODEL`` override them. Plain text prompts: the byte
    tokenizer has no chat template."""
    trained = trained_models()
    models = trained.COMMITTED
    # The window "auto" picks for a drafter declaring its training context C (the reads, W
    # to W + a - 1 tokens, within C) with blocks of 32: C - 32 + 1.
    block = int(env.get("BLOCK_SIZE", CPU_BLOCK_SIZE))
    window = int(env.get("WINDOW", trained.DRAFT_CONTEXT - block + 1))
    return Scenario(
        name,
        env.get("TARGET_MODEL", models.target),
        env.get("DRAFT_MODEL", models.draft_model if draft == "draft_model" else models.eagle3),
        draft,
        trained.NUM_SPEC,
        window,
        1,
        trained.TARGET_CONTEXT,
        None,
        extra_args,
        sinks=int(env.get("SINKS", 0)),
        min_context=int(env.get("MIN_CONTEXT", 0)),
        chat=False,
    )


def cpu_scenarios(env: dict[str, str]) -> dict[str, Scenario]:
    """The CPU study's scenarios: the models trained here, served by vLLM's CPU worker as
    the test bed's engine runs (float32 unless DTYPE says otherwise, eager, KV blocks of
    ``BLOCK_SIZE``, a KV cache for the most prompts in flight)."""
    prompts = int(env.get("PROMPTS_PER_CONTEXT", CPU_PROMPTS))
    in_flight = max([prompts, *(int(c) for c in env.get("CONCURRENCY", "").split(",") if c)])
    cpu_args = [
        *("--dtype", env.get("DTYPE") or "float32", "--enforce-eager", "--seed", "0"),
        *("--block-size", env.get("BLOCK_SIZE", str(CPU_BLOCK_SIZE))),
        *("--kv-cache-memory-bytes", str(CPU_KV_BYTES * -(-in_flight // CPU_PROMPTS))),
        *("--max-num-seqs", str(in_flight)),
    ]
    return {name: trained_scenario(name, name, env, cpu_args) for name in ("draft_model", "eagle3")}


# The CPU study's models, committed (trained_models/; their held-out text is rebuilt into
# .cache by make heldout).
TRAINED_ROOT = ROOT / "trained_models"
# The CPU study's defaults (the environment overrides each): KV blocks of 32 tokens (the CPU
# attention backend's smallest), 8 prompts per context sent together, 16 output tokens each:
# so small a model's greedy continuation soon repeats itself (design/e2e.md), so the study
# measures the tokens right after each stretch of real text. A KV cache of 64 MiB holds 8
# prompts of the longest context with both models' KV.
CPU_BLOCK_SIZE = 32
CPU_PROMPTS = 8
CPU_OUTPUT_TOKENS = 16
CPU_KV_BYTES = 64 * 1024 * 1024


def cpu_study_defaults() -> dict[str, str]:
    """The CPU study's settings from the trained drafter's context C: contexts C/2 (inside
    it) to 16 C, the window expected to help from 8 C and to change nothing at C/2, the
    prompts cut from the held-out text."""
    trained = trained_models()
    c = trained.DRAFT_CONTEXT
    models = trained.COMMITTED
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
    from testbed.engine.environment import engine_env

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
    problem = _setting_problem(name, text, INTEGER_AT_LEAST[name])
    if problem:
        raise ValueError(problem)
    return int(text)


# The settings the harness reads (the Makefile passes them through), and what each accepts:
# every one is checked before anything runs, a bad value stopping with one error that names
# the setting, the value and the choices.
DEVICES = ("ascend", "cuda", "cpu")
STUDIES = ("long",)
DTYPES = ("auto", "bfloat16", "float16", "float32")
INTEGER_AT_LEAST = {
    **dict.fromkeys(("SINKS", "MIN_CONTEXT", "SHARED_PREFIX", "MAX_CONTEXT", "MAX_MODEL_LEN"), 0),
    "SEED": 0,
    **dict.fromkeys(("PARALLEL", "WINDOW", "TP", "DCP", "DCP_INTERLEAVE", "PORT"), 1),
    **dict.fromkeys(("PROMPTS_PER_CONTEXT", "OUTPUT_TOKENS", "BLOCK_SIZE"), 1),
    **dict.fromkeys(("LONG_CONTEXT", "SHORT_CONTEXT"), 1),
}
INTEGER_LISTS = ("CONTEXTS", "CONCURRENCY", "MORE_WINDOWS")
CHOICES = {
    "DEVICE": DEVICES,
    "STUDY": STUDIES,
    "DTYPE": DTYPES,
    "LOSSLESS": lossless.MODES,
    **dict.fromkeys(("AUTO", "NO_SPECULATION", "DRY_RUN", "RECORD_GOLDEN"), ("0", "1")),
}
# Every setting the harness reads, kept in each report (what produced it).
SETTINGS = (
    *CHOICES,
    *INTEGER_AT_LEAST,
    *INTEGER_LISTS,
    *("E2E_SCENARIO", "TARGET_MODEL", "DRAFT_MODEL", "STUDY_TEXT", "MIN_IDENTICAL"),
    *("ASCEND_RT_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "TEMPERATURE", "TOP_P", "TOP_K"),
)


def sampling(env: dict[str, str]) -> dict[str, str]:
    """The user's sampling (TEMPERATURE, TOP_P, TOP_K) for ``vllm bench serve``; greedy
    where none is given. Sampled requests carry vLLM's per-request seed (SEED, 0 unless
    given), so that a rerun draws the same tokens and gives the same figures."""
    given = {key.lower(): env.get(key, "") for key in ("TEMPERATURE", "TOP_P", "TOP_K")}
    chosen = {key: value for key, value in given.items() if value}
    if float(chosen.get("temperature", 0)) > 0:
        chosen["seed"] = env.get("SEED") or "0"
    return chosen


def _setting_problem(name: str, text: str, at_least: int) -> str | None:
    try:
        ok = int(text) >= at_least
    except ValueError:
        ok = False
    return None if ok else f"{name}={text!r} is not an integer >= {at_least}"


def setting_problems(env: dict[str, str]) -> list[str]:
    """Every setting given in ``env`` that the harness cannot take, one line each (the
    scenario is checked against the device's table afterwards: ``main``)."""
    problems = []
    for name, choices in CHOICES.items():
        if env.get(name, "") not in ("", *choices):
            problems.append(f"{name}={env[name]!r} is not one of: {', '.join(choices)}")
    for name, at_least in INTEGER_AT_LEAST.items():
        if env.get(name, "") != "":
            problems.append(_setting_problem(name, env[name], at_least))
    for name in INTEGER_LISTS:
        words = [w.strip() for w in env.get(name, "").split(",") if w.strip()]
        if any(_setting_problem(name, w, 1) for w in words):
            problems.append(f"{name}={env[name]!r} is not a comma-separated list of integers >= 1")
    for name, low, high in (("TEMPERATURE", 0, float("inf")), ("TOP_P", 0, 1)):
        text = env.get(name, "")
        try:
            ok = text == "" or low <= float(text) <= high
        except ValueError:
            ok = False
        if not ok:
            problems.append(f"{name}={text!r} is not a number from {low} to {high}")
    if env.get("TOP_K", "") not in ("", "-1"):
        problems.append(_setting_problem("TOP_K", env["TOP_K"], 1))
    text = env.get("MIN_IDENTICAL", "")
    try:
        fraction_ok = text == "" or 0 <= float(text) <= 1
    except ValueError:
        fraction_ok = False
    if not fraction_ok:
        problems.append(f"MIN_IDENTICAL={text!r} is not a fraction from 0 to 1")
    return [p for p in problems if p]


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


def serve_base(scenario: Scenario, port: int) -> list[str]:
    """``vllm serve`` of the scenario's target, before a run's own parameters (``serving``)."""
    cmd = [
        sweep_plan.vllm_command(),
        *("serve", scenario.target, "--host", "127.0.0.1", "--port", str(port)),
        *("--tensor-parallel-size", str(scenario.tp)),
        *("--max-model-len", str(scenario.max_model_len)),
        *scenario.extra_args,
    ]
    # Every run alike: the runs compare the window, not the parallelism.
    if scenario.dcp > 1:
        cmd += ["--decode-context-parallel-size", str(scenario.dcp)]
    if scenario.dcp_interleave is not None:
        cmd += ["--cp-kv-cache-interleave-size", str(scenario.dcp_interleave)]
    return cmd


def serving(scenario: Scenario, run: Run) -> sweep_plan.Serving:
    """A run's serve parameters: its speculative config and the window's keys."""
    params: dict = {}
    if run.speculative:
        params["speculative_config"] = {
            "method": scenario.method,
            "model": scenario.draft,
            "num_speculative_tokens": scenario.num_spec,
        }
    if run.window is not None:
        params["additional_config"] = _additional_config(run)
    return sweep_plan.Serving(run.name, params)


# The variable that names a server's cards, by device.
VISIBLE_DEVICES = {"ascend": "ASCEND_RT_VISIBLE_DEVICES", "cuda": "CUDA_VISIBLE_DEVICES"}


def device_split(
    scenario: Scenario, device: str, parallel: int, env: dict[str, str]
) -> list[str] | None:
    """The cards of each of ``parallel`` servers side by side, split from the ones the
    user's ``ASCEND_RT_VISIBLE_DEVICES`` (NPU) or ``CUDA_VISIBLE_DEVICES`` (CUDA) names:
    --tensor-parallel-size cards each (decode context parallelism shards within them). None
    where nothing is split (one server at a time, or CPU); a ValueError naming the settings
    where the cards given do not fit."""
    if parallel == 1 or device not in VISIBLE_DEVICES:
        return None
    name, tp = VISIBLE_DEVICES[device], scenario.tp
    given = [d.strip() for d in env.get(name, "").split(",") if d.strip()]
    need = parallel * tp
    if len(given) < need:
        raise ValueError(
            f"PARALLEL={parallel} with --tensor-parallel-size {tp} needs {need} cards, "
            f"{tp} per server: {name}={env.get(name, '')!r} names {len(given)}; name at least "
            f"{need}, or lower PARALLEL"
        )
    return [",".join(given[i * tp : (i + 1) * tp]) for i in range(parallel)]


def plan_sweeps(
    scenario: Scenario,
    planned: list[Run],
    workloads: list[sweep_plan.Workload],
    device: str,
    port: int,
    out: Path,
    parallel: int = 1,
    env: dict[str, str] | None = None,
) -> list[sweep_plan.Sweep]:
    """The runs as ``vllm bench sweep serve`` commands: Model Runner V2's dealt over
    ``parallel`` sweeps that run side by side (a port each, and on a device cards of their
    own: ``device_split``), V1's in one of its own (its runner variable; only where the
    host's vLLM still has V1), which runs after them on the first one's cards."""
    base = cpu_engine_env() if device == "cpu" else {}
    cards = device_split(scenario, device, parallel, env or {})
    v2 = [run for run in planned if run.v2]
    lanes = [("v2" if parallel == 1 else f"v2_{i}", v2[i::parallel]) for i in range(parallel)]
    lanes.append(("v1", [run for run in planned if not run.v2]))
    sweeps = []
    for i, (name, lane) in enumerate(lanes):
        if not lane:
            continue
        lane_env = dict(base)
        if cards is not None:
            lane_env[VISIBLE_DEVICES[device]] = cards[i % parallel]
        if host_has_model_runner_v1():
            lane_env["VLLM_USE_V2_MODEL_RUNNER"] = "1" if lane[0].v2 else "0"
        lane_port = port + len(sweeps)
        sweeps.append(
            sweep_plan.Sweep(
                name,
                serve_base(scenario, lane_port),
                sweep_plan.bench_command(
                    scenario.target, lane_port, scenario.chat, sampling(env or {})
                ),
                [serving(scenario, run) for run in lane],
                workloads,
                lane_env,
                out,
            )
        )
    return sweeps


def prompts(scenario: Scenario) -> tuple[list[str], list[str], list[str]]:
    """(the golden prompt, more prompts longer than W, a few shorter ones). The golden one
    mirrors the upstream MRV1 end-to-end test of the window, whose per-position acceptance
    the golden file records; the others give the V1/V2 comparison enough drafts to resolve
    0.05. The models trained here take stretches of their held-out text (a byte a token)."""
    if not scenario.chat:
        text = trained_models().COMMITTED.heldout.read_text(encoding="utf-8")

        def stretch(k: int, length: int) -> str:
            return text[k * len(text) // 10 :][:length]

        long = 4 * scenario.window
        return (
            [stretch(0, long)],
            [stretch(k, long) for k in range(1, 8)],
            [stretch(k, scenario.window // 2) for k in (8, 9)],
        )
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


def e2e_workloads(scenario: Scenario, out: Path) -> list[sweep_plan.Workload]:
    """The golden prompt (32 tokens), the long prompts (128 tokens each, together) and the
    short ones (32 tokens), each a custom dataset written into ``out``."""
    golden, more, short = prompts(scenario)
    workloads = []
    for name, texts, tokens in (("golden", golden, 32), ("long", more, 128), ("short", short, 32)):
        dataset = out / f"{name}.jsonl"
        sweep_plan.write_dataset(dataset, texts, tokens)
        workloads.append(sweep_plan.Workload(name, dataset, len(texts), len(texts), tokens))
    return workloads


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
    """(per-position golden, tolerance) where the scenario has a golden file; (None, 0.1)
    where it has none: the acceptance is then checked within the run (``check``)."""
    if scenario.golden is None or record or not scenario.golden.exists():
        return None, 0.1
    data = json.loads(scenario.golden.read_text())
    return data["per_position"], float(data.get("tolerance", 0.1))


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


def collect(sweeps: list[sweep_plan.Sweep], codes: dict[str, int] | None = None) -> dict:
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
    env: dict[str, str] | None = None,
) -> int:
    env = dict(os.environ) if env is None else env
    golden, tolerance = load_golden(scenario, record)
    if golden is None and not record:
        print(
            f"[e2e] no golden file {scenario.golden}: acceptance checked within the run, the "
            "window against no window",
            flush=True,
        )
    policy = lossless.Policy.for_run(device, env)
    produced = start_run(out_dir, scenario, device, env)
    install(device)
    check_pairing(scenario.method)
    workloads = e2e_workloads(scenario, out_dir)
    planned = runs(scenario, device)
    sweeps = plan_sweeps(scenario, planned, workloads, device, port, out_dir, 1, env)
    record_plan(out_dir, scenario, planned, sweeps)
    for one in sweeps:
        print(f"[e2e] {one.shell_lines()[0]}", flush=True)
    done = run_sweeps(sweeps, out_dir)
    if done["failures"]:
        for failure in done["failures"]:
            print(f"[e2e] FAILED: {failure}")
        return 1
    results = scenario_results(done, workloads)
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
    return finish_scenario(scenario, device, out_dir, results, golden, tolerance, policy, produced)


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


def finish_scenario(scenario, device, out_dir, results, golden, tolerance, policy, produced) -> int:
    """The scenario's checks over its runs' results (``check``, the window's start-up lines),
    its report, and its exit code: a run's or ``--check``'s."""
    failures = check(results, golden, tolerance, scenario.num_spec, policy)
    if not results["v2_window"]["window_active"]:
        failures.append("the V2 server with the window did not log the window on and active")
    if results["v2_no_window"]["window_active"]:
        failures.append("the V2 server without the window logged the window as on")
    produced = {**(produced or {}), "finished": now()}
    write_report(out_dir, scenario, device, results, golden, failures, produced, policy)
    for failure in failures:
        print(f"[e2e] FAILED: {failure}")
    print(f"[e2e] {'passed' if not failures else 'failed'}; report in {out_dir}")
    return 1 if failures else 0


def write_report(
    out_dir, scenario, device, results, golden, failures, produced=None, policy=None
) -> None:
    policy = policy or lossless.Policy()
    report = {
        "scenario": scenario.name,
        "device": device,
        "window": scenario.window,
        "runs": results,
        "golden": golden,
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
    lines += [
        "",
        *study.lossless_lines(policy.describe(), results),
        "",
        *study.produced_by_lines(produced),
        "",
        "Failures: " + ("none" if not failures else "; ".join(failures)),
        "",
        "![acceptance](acceptance.png)",
        "",
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


def study_datasets(
    scenario: Scenario, settings: study.Settings, out: Path
) -> tuple[list[sweep_plan.Workload], list[list[str]]]:
    """The study's workloads, and the commands that cut their datasets from the text
    (``out/study_text.txt``): each context's prompts at each concurrency, and with
    SHARED_PREFIX the longest context's prompts sharing their first tokens."""
    text = out / "study_text.txt"
    p, tokens = settings.prompts_per_context, settings.output_tokens
    workloads, commands = [], []
    for context in settings.contexts:
        dataset = out / f"context_{context}.jsonl"
        commands.append(
            sweep_plan.slices_command(text, dataset, scenario.target, p, context, tokens)
        )
        for k in settings.concurrencies:
            workloads.append(
                sweep_plan.Workload(f"context_{context}_concurrency_{k}", dataset, p, k, tokens)
            )
    if settings.shared_prefix:
        prefix, context = settings.shared_prefix, max(settings.contexts)
        parts = out / f"prefix_{prefix}.jsonl", out / f"suffixes_{context - prefix}.jsonl"
        dataset = out / f"shared_prefix_{prefix}_context_{context}.jsonl"
        commands += [
            sweep_plan.slices_command(text, parts[0], scenario.target, 1, prefix, tokens),
            sweep_plan.slices_command(text, parts[1], scenario.target, p, context - prefix, tokens),
            sweep_plan.shared_prefix_command(*parts, dataset),
        ]
        k = max(settings.concurrencies)
        name = f"shared_prefix_{prefix}_context_{context}_concurrency_{k}"
        workloads.append(sweep_plan.Workload(name, dataset, p, k, tokens))
    return workloads, commands


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
        "additional_config": _additional_config(run),
    }


def study_plan(scenario, device, port, settings, env, out) -> tuple[list, list, list]:
    """(the dataset commands, the workloads, the sweeps) of the long-context study."""
    # Plain completions: a prompt is exactly its context, with no template around it.
    served = dataclasses.replace(scenario, max_model_len=settings.served_len, chat=False)
    workloads, commands = study_datasets(served, settings, out)
    planned = study_runs(served, device, env)
    sweeps = plan_sweeps(served, planned, workloads, device, port, out, settings.parallel, env)
    return commands, workloads, sweeps


# The record of what produced a run, written first into its folder: a folder holding one is a
# run's of this harness, cleared by the next run into it.
RUN_RECORD = "run.json"
# The harness's own results folders (ignored by git): anything under them is a run's.
OWN_RESULTS = (ROOT / "e2e" / "results", ROOT / "benchmarks" / "results" / "study")


def own_folder(out_dir: Path) -> None:
    """Gives the run an empty ``out_dir``: a run's folder is cleared (vLLM's sweep refuses to
    write into an experiment folder that exists, and nothing of an earlier run may reach
    this run's report); a folder that is not empty and that no run of this harness wrote
    (no run.json, not under e2e/results or benchmarks/results/study) is refused."""
    if out_dir.is_dir() and any(out_dir.iterdir()):
        resolved = out_dir.resolve()
        ours = (out_dir / RUN_RECORD).exists() or any(
            resolved != r and resolved.is_relative_to(r) for r in OWN_RESULTS
        )
        if not ours:
            raise SystemExit(
                f"{out_dir} holds files no run of this harness wrote (no {RUN_RECORD}): "
                "remove it or pass another --out"
            )
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)


def version_of(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def provenance(scenario: Scenario, device: str, env: dict[str, str]) -> dict:
    """What produces a run: the command, the settings given, the versions of the host's
    vLLM and vllm-ascend (the servers' environment), the models, the checkout, the time."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return {
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "device": device,
        "settings": {name: env[name] for name in SETTINGS if env.get(name)},
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


def start_run(out_dir: Path, scenario: Scenario, device: str, env: dict[str, str]) -> dict:
    """Clears the run's folder and records in it what produces the run."""
    own_folder(out_dir)
    produced = provenance(scenario, device, env)
    (out_dir / RUN_RECORD).write_text(json.dumps(produced, indent=2) + "\n")
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
        "study": None if settings is None else dataclasses.asdict(settings),
    }
    (out_dir / RUN_RECORD).write_text(json.dumps(record, indent=2) + "\n")


def check_results(folder: Path) -> int:
    """``make e2e-check RESULTS=folder``: the checks of a real run over what the dry run's
    commands wrote into ``folder`` (each sweep's summary.csv and its servers' log beside
    it): lossless (``lossless.py``), the acceptance within the run (and a golden where one
    was recorded), the window's start-up lines; a report as a run writes it. The plan comes
    from the folder's run.json, the runs and workloads from the parameter files the
    commands read."""
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
    env, device = record.get("settings", {}), record["device"]
    given = plan["scenario"]
    scenario = Scenario(**given | {"golden": given["golden"] and Path(given["golden"])})
    planned = [Run(**run) for run in plan["runs"]]
    policy = lossless.Policy.for_run(device, env)
    sweeps, failures = [], []
    for name in plan["sweeps"]:
        try:
            sweeps.append(sweep_plan.Sweep.read(name, folder))
        except FileNotFoundError as missing:
            failures.append(f"{name}: no {missing.filename} (the dry run writes it)")
    done = collect(sweeps)
    failures += done["failures"]
    missing_runs = [run.name for run in planned if run.name not in done["results"]]
    if missing_runs and not failures:
        failures.append(f"no results for {', '.join(missing_runs)} in {folder}")
    if failures:
        for failure in failures:
            print(f"[e2e] FAILED: {failure}")
        return 1
    workloads = sweeps[0].workloads
    produced = {key: value for key, value in record.items() if key != "plan"}
    produced["checked"] = f"{now()} by --check ({folder})"
    print(f"[e2e] checking {folder}: {scenario.name} on {device}, {policy.describe()}")
    if plan["study"] is not None:
        settings = study.Settings(**plan["study"])
        golden, tolerance = study_golden(scenario, device, False)
        results = study_results(done, planned, workloads, settings)
        return finish_study(
            scenario,
            device,
            folder,
            results,
            workloads,
            settings,
            golden,
            tolerance,
            policy,
            produced,
            env,
        )
    golden, tolerance = load_golden(scenario, False)
    results = scenario_results(done, workloads)
    return finish_scenario(scenario, device, folder, results, golden, tolerance, policy, produced)


def study_golden(scenario: Scenario, device: str, record: bool) -> tuple[dict | None, float]:
    """(the golden mean acceptance length by context, its tolerance) where one was recorded
    on a device; (None, 0.15) elsewhere: the acceptance is checked within the run, the
    window against no window (study.check)."""
    golden_file = study.golden_path(ROOT, scenario.name, scenario.window, scenario.min_context)
    if record or device == "cpu" or not golden_file.exists():
        return None, 0.15
    data = json.loads(golden_file.read_text())
    return data["mean_length"], float(data.get("tolerance", 0.15))


def run_study(
    scenario: Scenario,
    device: str,
    port: int,
    out_dir: Path,
    settings: study.Settings,
    record: bool,
    env: dict[str, str] | None = None,
) -> int:
    env = dict(os.environ) if env is None else env
    golden_file = study.golden_path(ROOT, scenario.name, scenario.window, scenario.min_context)
    golden, tolerance = study_golden(scenario, device, record)
    if not settings.contexts:
        raise SystemExit("no study context fits the model: set MAX_CONTEXT")
    policy = lossless.Policy.for_run(device, env)
    produced = start_run(out_dir, scenario, device, env)
    install(device)
    check_pairing(scenario.method)
    (out_dir / "study_text.txt").write_text(settings.text(), encoding="utf-8")
    commands, workloads, sweeps = study_plan(scenario, device, port, settings, env, out_dir)
    planned = study_runs(scenario, device, env)
    record_plan(out_dir, scenario, planned, sweeps, settings)
    cut_datasets(commands, settings.parallel)
    for one in sweeps:
        print(f"[e2e] study: {one.shell_lines()[0]}", flush=True)
    # The servers start in the study's folder (on CPU: they import this project as installed).
    done = run_sweeps(sweeps, out_dir, settings.parallel)
    if done["failures"]:
        for failure in done["failures"]:
            print(f"[e2e] FAILED: {failure}")
        return 1
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
    return finish_study(
        scenario,
        device,
        out_dir,
        results,
        workloads,
        settings,
        golden,
        tolerance,
        policy,
        produced,
        env,
    )


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


def finish_study(
    scenario,
    device,
    out_dir,
    results,
    workloads,
    settings,
    golden,
    tolerance,
    policy,
    produced,
    env,
) -> int:
    """The study's checks over its runs' results (``study.check``, the window's start-up
    lines), its report, and its exit code: a run's or ``--check``'s."""
    failures = study.check(
        results,
        golden,
        tolerance,
        scenario.min_context,
        settings.long_from,
        settings.short_to,
        policy=policy,
        num_spec=scenario.num_spec,
    )
    failures += startup_failures(results)
    meta = {
        "scenario": scenario.name,
        "device": device,
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
        "sampling": sampling(env) or {"temperature": "0"},
        "produced_by": {**(produced or {}), "finished": now()},
    }
    study.write_report(out_dir, meta, results, failures)
    for failure in failures:
        print(f"[e2e] FAILED: {failure}")
    print(f"[e2e] {'passed' if not failures else 'failed'}; report in {out_dir}")
    return 1 if failures else 0


def cut_datasets(commands: list[list[str]], at_once: int) -> None:
    """vLLM's cutter, a process per dataset, as many at once as servers will run."""
    with ThreadPoolExecutor(max_workers=at_once) as pool:
        list(pool.map(lambda c: subprocess.run(c, check=True, capture_output=True), commands))


def dry_run(scenario, device, port, out, settings=None, env=None) -> list[str]:
    """Writes the parameter files and the e2e datasets into ``out`` and returns every
    command, as a user pastes them: the install, vLLM's cutter for the study's datasets,
    and one ``vllm bench sweep serve`` per sweep (with the environment it needs). The folder
    is the run's own, as a real run's is (``start_run``)."""
    start_run(out, scenario, device, env or {})
    # The install and its checks, and the pairing check, as the real run does them: a
    # command that stops with the reason where one fails.
    prepare = [sys.executable, str(Path(__file__).resolve()), "--prepare", "--device", device]
    prepare += ["--scenario", scenario.name, *(("--study", "long") if settings else ())]
    lines = [shlex.join(prepare)]
    if settings is None:
        workloads = e2e_workloads(scenario, out)
        planned = runs(scenario, device)
        sweeps = plan_sweeps(scenario, planned, workloads, device, port, out, 1, env or {})
        record_plan(out, scenario, planned, sweeps)
    else:
        # The text the datasets are cut from, written as a real run writes it.
        (out / "study_text.txt").write_text(settings.text(), encoding="utf-8")
        text = settings.text_path or "the documentation CPython ships (study.corpus())"
        lines.append(f"# wrote {out / 'study_text.txt'}: {text}")
        commands, _, sweeps = study_plan(scenario, device, port, settings, env or {}, out)
        record_plan(out, scenario, study_runs(scenario, device, env or {}), sweeps, settings)
        lines += [shlex.join(command) for command in commands]
    sweep_plan.write_files(sweeps)
    for planned in sweeps:
        lines += planned.shell_lines()
    return lines


def _additional_config(run: Run) -> dict:
    additional = {}
    if run.window is not None:
        additional[KEY] = run.window
        if run.sinks:
            additional[SINKS_KEY] = run.sinks
        if run.min_context:
            additional[MIN_CONTEXT_KEY] = run.min_context
    return additional


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
    raise SystemExit(f"no {count} free ports from {start}: set PORT")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Every setting is checked before anything runs (the dry run included).
    problems = setting_problems(dict(os.environ))
    if problems:
        parser.error("; ".join(problems))
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default=os.environ.get("DEVICE") or "ascend",
    )
    parser.add_argument("--scenario", default=os.environ.get("E2E_SCENARIO") or "eagle3")
    parser.add_argument(
        "--dry-run", action="store_true", default=os.environ.get("DRY_RUN", "") not in ("", "0")
    )
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT") or 8123))
    parser.add_argument("--out", type=Path, default=ROOT / "e2e" / "results")
    parser.add_argument(
        "--study",
        choices=STUDIES,
        default=os.environ.get("STUDY") or None,
        help="the long-context study (study.py)",
    )
    parser.add_argument(
        "--prepare",
        action="store_true",
        help="install this project into the host's environment (checking that no vllm-ascend "
        "file changed and that it imports) and check the host's release pairing, then stop: "
        "the dry run's first command",
    )
    parser.add_argument(
        "--check",
        type=Path,
        metavar="RESULTS",
        help="run the checks over the results the dry run's printed vllm bench commands "
        "wrote into RESULTS (the folder the dry run wrote; make e2e-check RESULTS=...), then stop",
    )
    args = parser.parse_args(argv)
    if args.check is not None:
        if not args.check.is_dir():
            parser.error(f"RESULTS={str(args.check)!r} is not a folder")
        return check_results(args.check)
    if args.device == "cpu" and not args.study:
        parser.error("DEVICE=cpu runs the long-context study only: set STUDY=long")
    try:
        table = scenarios(dict(os.environ), args.device)
        _more_windows(dict(os.environ))
    except ValueError as error:
        parser.error(str(error))
    if args.scenario not in table:
        parser.error(f"E2E_SCENARIO={args.scenario!r} is not one of: {', '.join(table)}")
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
    settings = None
    if args.study:
        defaults = cpu_study_defaults() if args.device == "cpu" else None
        settings = study.Settings.from_env(dict(os.environ), scenario.target, args.device, defaults)
        try:
            device_split(scenario, args.device, settings.parallel, dict(os.environ))
        except ValueError as error:
            parser.error(str(error))
    out = args.out / (f"study_{scenario.name}" if args.study else scenario.name)
    if args.prepare:
        install(args.device)
        check_pairing(scenario.method)
        return 0
    if args.dry_run:
        print("\n".join(dry_run(scenario, args.device, args.port, out, settings, dict(os.environ))))
        return 0
    probe = {"ascend": "npu-smi", "cuda": "nvidia-smi"}.get(args.device)
    needs_trained = args.device == "cpu" or scenario.name == "tiny"
    if needs_trained and "TARGET_MODEL" not in os.environ:
        trained = trained_models()
        try:
            trained.committed()
        except trained.FixtureError as error:
            print(
                f"needs the committed tiny models and their held-out text: {error}", file=sys.stderr
            )
            return 2
    if args.device != "cpu" and shutil.which(probe) is None:
        what = "Ascend NPUs" if args.device == "ascend" else "CUDA GPUs"
        print(f"needs {what}: {probe} not found", file=sys.stderr)
        return 2
    if args.device == "ascend":
        try:
            metadata.version("vllm-ascend")
        except metadata.PackageNotFoundError:
            print("needs vllm-ascend installed in this environment", file=sys.stderr)
            return 2
    record = os.environ.get("RECORD_GOLDEN", "") not in ("", "0")
    if not os.environ.get("PORT"):
        # One port per sweep: PARALLEL of V2's, and V1's.
        args.port = free_ports((settings.parallel if settings else 1) + 1, args.port)
    if args.study:
        return run_study(scenario, args.device, args.port, out, settings, record)
    return run_scenario(scenario, args.device, args.port, out, record)


if __name__ == "__main__":
    raise SystemExit(main())
