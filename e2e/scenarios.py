# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What a run of the harness serves and sends: its scenario (target, draft, window, the
settings given), its runs (V2 with and without the window, V1 where the host has it; the
study's more), and the ``vllm bench sweep serve`` commands that serve them (``sweep_plan``),
with their workloads. The settings come by the Makefile's names (``cli.SETTINGS``), checked
before they reach here."""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from e2e import study, sweep_plan

ROOT = Path(__file__).resolve().parent.parent

KEY = "draft_window_size"

SINKS_KEY = "draft_attention_sinks"

MIN_CONTEXT_KEY = "draft_window_min_context"

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


def scenarios(given: dict[str, str], device: str = "ascend") -> dict[str, Scenario]:
    if device == "cpu":
        return cpu_scenarios(given)
    golden = ROOT / "e2e" / "golden"
    sinks, min_context = int(given.get("SINKS", 0)), int(given.get("MIN_CONTEXT", 0))
    dcp, dcp_interleave = dcp_settings(given)
    # Sinks, a threshold and DCP (its alignment) change what the draft reads: golden files
    # of their own.
    suffix = golden_suffix(sinks, min_context, dcp)
    window = int(given.get("WINDOW", 512))

    def qwen3_8b(name: str, draft: str, num_spec: int, tp: int = 1) -> Scenario:
        """A Qwen3-8B target with ``draft`` (TARGET_MODEL, DRAFT_MODEL, WINDOW, TP override)."""
        return Scenario(
            name,
            given.get("TARGET_MODEL", "Qwen/Qwen3-8B"),
            given.get("DRAFT_MODEL", draft),
            name,
            num_spec,
            window,
            int(given.get("TP", tp)),
            4096,
            golden / f"{name}_qwen3_8b_w{window}{suffix}.json",
            served_flags(given),
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
        "tiny": trained_scenario("tiny", "eagle3", given, served_flags(given)),
    }
    for scenario in found.values():
        scenario.sinks, scenario.min_context = sinks, min_context
        scenario.dcp, scenario.dcp_interleave = dcp, dcp_interleave
    return found


def served_flags(given: dict[str, str]) -> list[str]:
    """The settings every server is given as vLLM's own flags on a device (DTYPE:
    ``--dtype``, BLOCK_SIZE: ``--block-size``), so that what run.json records is what the
    servers served (the CPU study passes its own: ``cpu_scenarios``)."""
    found = []
    if given.get("DTYPE"):
        found += ["--dtype", given["DTYPE"]]
    if given.get("BLOCK_SIZE"):
        found += ["--block-size", given["BLOCK_SIZE"]]
    return found


def trained_models() -> object:
    """The committed tiny models' package (``trained_models/``, the CPU study's: beside this
    package, importable wherever it is)."""
    import trained_models as trained

    return trained


def trained_scenario(name: str, draft: str, given: dict[str, str], extra_args: list[str]):
    """The target trained here with its draft model or its EAGLE3 head (``draft``);
    ``TARGET_MODEL`` and ``DRAFT_MODEL`` override them. Plain text prompts: the byte
    tokenizer has no chat template."""
    trained = trained_models()
    models = trained.COMMITTED
    # The window "auto" picks for a drafter declaring its training context C (the reads, W
    # to W + a - 1 tokens, within C) with blocks of 32: C - 32 + 1.
    block = int(given.get("BLOCK_SIZE", CPU_BLOCK_SIZE))
    window = int(given.get("WINDOW", trained.DRAFT_CONTEXT - block + 1))
    return Scenario(
        name,
        given.get("TARGET_MODEL", models.target),
        given.get("DRAFT_MODEL", models.draft_model if draft == "draft_model" else models.eagle3),
        draft,
        trained.NUM_SPEC,
        window,
        int(given.get("TP", 1)),
        trained.TARGET_CONTEXT,
        None,
        extra_args,
        sinks=int(given.get("SINKS", 0)),
        min_context=int(given.get("MIN_CONTEXT", 0)),
        chat=False,
    )


def cpu_scenarios(given: dict[str, str]) -> dict[str, Scenario]:
    """The CPU study's scenarios: the models trained here, served by vLLM's CPU worker as
    the test bed's engine runs (float32 unless DTYPE says otherwise, eager, KV blocks of
    ``BLOCK_SIZE``, a KV cache for the most prompts in flight)."""
    prompts = int(given.get("PROMPTS_PER_CONTEXT", CPU_PROMPTS))
    in_flight = max([prompts, *(int(c) for c in given.get("CONCURRENCY", "").split(",") if c)])
    cpu_args = [
        *("--dtype", given.get("DTYPE") or "float32", "--enforce-eager", "--seed", "0"),
        *("--block-size", given.get("BLOCK_SIZE", str(CPU_BLOCK_SIZE))),
        *("--kv-cache-memory-bytes", str(CPU_KV_BYTES * -(-in_flight // CPU_PROMPTS))),
        *("--max-num-seqs", str(in_flight)),
    ]
    return {
        name: trained_scenario(name, name, given, cpu_args) for name in ("draft_model", "eagle3")
    }


# The CPU study's models, committed (trained_models/; their held-out text is rebuilt into
# .cache by make heldout).
TRAINED_ROOT = ROOT / "trained_models"


# The CPU study's defaults (the settings given override each): KV blocks of 32 tokens (the CPU
# attention backend's smallest), 8 prompts per context sent together, 16 output tokens each:
# so small a model's greedy continuation soon repeats itself (design/usage.md), so the study
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
    """What a vLLM engine needs on this CPU-only host (``tools/cpu_engine.py``, imported
    here only: a run on a device needs nothing of ``tools/``)."""
    from tools.cpu_engine import engine_env, model_info_cache

    full = engine_env(model_info_cache(), host_has_model_runner_v1())
    return {key: value for key, value in full.items() if os.environ.get(key) != value}


def golden_suffix(sinks: int, min_context: int, dcp: int = 1) -> str:
    return (
        f"{f'_s{sinks}' if sinks else ''}{f'_m{min_context}' if min_context else ''}"
        f"{f'_dcp{dcp}' if dcp > 1 else ''}"
    )


def dcp_settings(given: dict[str, str]) -> tuple[int, int | None]:
    """DCP and DCP_INTERLEAVE (each checked by the command line), the interleave only with
    DCP > 1."""
    dcp = int(given.get("DCP") or 1)
    interleave = int(given["DCP_INTERLEAVE"]) if given.get("DCP_INTERLEAVE") else None
    if interleave is not None and dcp == 1:
        raise ValueError(
            f"DCP_INTERLEAVE={interleave} needs DCP > 1: the interleave shards "
            f"nothing without decode context parallelism"
        )
    return dcp, interleave


def sampling(given: dict[str, str]) -> dict[str, str]:
    """The user's sampling (TEMPERATURE, TOP_P, TOP_K) for ``vllm bench serve``; greedy
    where none is given. Sampled requests carry vLLM's per-request seed (SEED, 0 unless
    given), so that a rerun draws the same tokens and gives the same figures."""
    asked = {key.lower(): given.get(key, "") for key in ("TEMPERATURE", "TOP_P", "TOP_K")}
    chosen = {key: value for key, value in asked.items() if value}
    if float(chosen.get("temperature", 0)) > 0:
        chosen["seed"] = given.get("SEED") or "0"
    return chosen


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


# Asks the host's vLLM (this interpreter's) whether it still has Model Runner V1, as the
# plugin asks it at start-up.
V1_PROBE = (
    "from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.versions import "
    "has_model_runner_v1; print(has_model_runner_v1())"
)


@functools.cache
def host_has_model_runner_v1() -> bool:
    """Whether the host's vLLM still has Model Runner V1 and ``VLLM_USE_V2_MODEL_RUNNER``
    (``versions.has_model_runner_v1``, run in the host's Python from this checkout, so that
    it answers before the install too): vLLM 0.34 removed both (it refuses the variable
    unless 1, and warns that 1 is redundant), so there every run is Model Runner V2 with
    nothing to set. Where it cannot answer (no vLLM yet, or an installed vllm-ascend without
    this package: its releases have V1), the releases that have V1 are assumed."""
    probe = subprocess.run(
        [sys.executable, "-c", V1_PROBE], capture_output=True, text=True, cwd=ROOT
    )
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


def study_runs(scenario: Scenario, device: str, given: dict[str, str]) -> list[Run]:
    """The study's runs: without speculation (the reference of every output and of the
    throughput; NO_SPECULATION=0 leaves it out), V2 with the window (and MIN_CONTEXT), V2
    without, V2 with the window and SINKS attention sinks, V2 with ``draft_window_size``
    "auto" (AUTO=1), V2 with each of MORE_WINDOWS, and V1 with the window on Ascend."""
    out = []
    if given.get("NO_SPECULATION", "1") != "0":
        out.append(Run("no_speculation", True, None, speculative=False))
    out += [
        Run("v2_window", True, scenario.window, 0, scenario.min_context),
        Run("v2_no_window", True, None),
    ]
    if scenario.sinks:
        out.append(Run("v2_window_sinks", True, scenario.window, scenario.sinks))
    if given.get("AUTO", "0") not in ("", "0"):
        out.append(Run("v2_auto", True, "auto", 0, scenario.min_context))
    for window in (int(w) for w in given.get("MORE_WINDOWS", "").split(",") if w.strip()):
        out.append(Run(f"v2_window_{window}", True, window, 0, scenario.min_context))
    if device == "ascend" and host_has_model_runner_v1():
        out.append(Run("v1_window", False, scenario.window))
    return out


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
        params["additional_config"] = additional_config(run)
    return sweep_plan.Serving(run.name, params)


def additional_config(run: Run) -> dict:
    additional = {}
    if run.window is not None:
        additional[KEY] = run.window
        if run.sinks:
            additional[SINKS_KEY] = run.sinks
        if run.min_context:
            additional[MIN_CONTEXT_KEY] = run.min_context
    return additional


# The variable that names a server's cards, by device.
VISIBLE_DEVICES = {"ascend": "ASCEND_RT_VISIBLE_DEVICES", "cuda": "CUDA_VISIBLE_DEVICES"}


def device_split(
    scenario: Scenario, device: str, parallel: int, given: dict[str, str]
) -> list[str] | None:
    """The cards of each of ``parallel`` servers side by side, split from the ones the
    user's ``ASCEND_RT_VISIBLE_DEVICES`` (NPU) or ``CUDA_VISIBLE_DEVICES`` (CUDA) names:
    --tensor-parallel-size cards each (decode context parallelism shards within them). None
    where nothing is split (one server at a time, or CPU); a ValueError naming the settings
    where the cards given do not fit."""
    if parallel == 1 or device not in VISIBLE_DEVICES:
        return None
    name, tp = VISIBLE_DEVICES[device], scenario.tp
    named = [d.strip() for d in given.get(name, "").split(",") if d.strip()]
    need = parallel * tp
    if len(named) < need:
        raise ValueError(
            f"PARALLEL={parallel} with --tensor-parallel-size {tp} needs {need} cards, "
            f"{tp} per server: {name}={given.get(name, '')!r} names {len(named)}; name at least "
            f"{need}, or lower PARALLEL"
        )
    return [",".join(named[i * tp : (i + 1) * tp]) for i in range(parallel)]


def plan_sweeps(
    scenario: Scenario,
    planned: list[Run],
    workloads: list[sweep_plan.Workload],
    device: str,
    port: int,
    out: Path,
    parallel: int = 1,
    given: dict[str, str] | None = None,
) -> list[sweep_plan.Sweep]:
    """The runs as ``vllm bench sweep serve`` commands: Model Runner V2's dealt over
    ``parallel`` sweeps that run side by side (a port each, and on a device cards of their
    own: ``device_split``), V1's in one of its own (its runner variable; only where the
    host's vLLM still has V1), which runs after them on the first one's cards."""
    base = cpu_engine_env() if device == "cpu" else {}
    cards = device_split(scenario, device, parallel, given or {})
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
                    scenario.target, lane_port, scenario.chat, sampling(given or {})
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
    0.05. The models trained here take stretches of their held-out text spread over it,
    as text: whole characters."""
    if not scenario.chat:
        models = trained_models().COMMITTED

        def stretch(k: int, length: int) -> str:
            cut = models.prompt(k * models.heldout_tokens // 10, length)
            return bytes(cut).decode("utf-8", errors="ignore")

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


def study_plan(scenario, device, port, settings, given, out) -> tuple[list, list, list]:
    """(the dataset commands, the workloads, the sweeps) of the long-context study."""
    # Plain completions: a prompt is exactly its context, with no template around it.
    served = dataclasses.replace(scenario, max_model_len=settings.served_len, chat=False)
    workloads, commands = study_datasets(served, settings, out)
    planned = study_runs(served, device, given)
    sweeps = plan_sweeps(served, planned, workloads, device, port, out, settings.parallel, given)
    return commands, workloads, sweeps
