# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Runs vLLM's offline engine (``LLM.generate``, greedy) once per run of a plan, one engine
after another in this process, and writes what each generated and what vLLM's own
spec-decode metrics counted:

    python offline.py PLAN.json RESULTS.json

Run as a script from a directory outside the checkout, so that the project is imported as
installed (its ``vllm.general_plugins`` entry point, as on a host). Each run's engine log is
framed by ``=== run NAME`` and ``=== end NAME`` lines on stdout.

PLAN: {"target": path, "max_model_len": n, "block_size": b, "prompts": [[ids]],
"runs": [{"name", "max_tokens", "speculative_config" (or null), "additional_config"}],
"inspect_in_process": whether vLLM inspects each model class here (``inspect_in_process``)}.

The engine scripts beside it (``load.py``, ``study_engine.py``) build
their engines and read vLLM's counters with what is here; the tests read the counters'
names and the mean acceptance length they give from here too (``SPEC_DECODE``,
``mean_length``: this module imports nothing of vLLM's at load).
"""

from __future__ import annotations

import gc
import json
import sys
import time
from collections.abc import Callable

# vLLM's spec-decode counters (vllm/v1/metrics), by vLLM's names: read before and after
# each generate.
SPEC_DECODE = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)


def counters(llm, names: tuple[str, ...] = SPEC_DECODE) -> dict[str, int]:
    """vLLM's own metrics ``names`` in this engine now, each summed over its labels."""
    found = dict.fromkeys(names, 0)
    for metric in llm.get_metrics():
        if metric.name in found:
            found[metric.name] += int(getattr(metric, "value", 0))
    return found


def since(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """What each counter counted between two readings."""
    return {name: after[name] - before[name] for name in after}


def mean_length(counted: dict[str, int]) -> float:
    """vLLM's mean acceptance length over what the spec-decode counters counted: one token
    per draft (the bonus) and the draft tokens it accepted."""
    drafts = counted["vllm:spec_decode_num_drafts"]
    return 1 + counted["vllm:spec_decode_num_accepted_tokens"] / drafts


def make_llm(plan: dict, spec: dict, **settings):
    """vLLM's offline engine (``LLM``) of a run of ``plan`` as every engine script builds
    it: the plan's target, block size and ``max_model_len``, float32, eager, seeded, its
    metrics kept, the run's speculative config and the window's keys; ``settings``: the
    script's own (the KV cache, the batch)."""
    from vllm import LLM

    return LLM(
        model=plan["target"],
        dtype="float32",
        enforce_eager=True,
        block_size=plan["block_size"],
        max_model_len=plan["max_model_len"],
        seed=0,
        disable_log_stats=False,
        speculative_config=spec["speculative_config"],
        additional_config=spec["additional_config"],
        **settings,
    )


def greedy(max_tokens: int):
    """Greedy sampling of ``max_tokens`` tokens, the end-of-sequence token ignored."""
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def release_engine() -> None:
    """What one engine leaves behind before the next in the same process: its model
    parallel groups and the one-rank process group."""
    import torch
    from vllm.distributed.parallel_state import (
        destroy_distributed_environment,
        destroy_model_parallel,
    )

    destroy_model_parallel()
    destroy_distributed_environment()
    gc.collect()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def inspect_in_process() -> None:
    """vLLM inspects each model class its cache (``VLLM_CACHE_ROOT``) lacks in a subprocess
    of its own, kept clear of CUDA, which imports vLLM again: 9 s (0.33) to 12 s (0.34) of
    CPU per class, against 1 to 2 s in this process, which has no CUDA to keep clear of.
    The same model info, written to the same cache by vLLM's own code."""
    from vllm.model_executor.models import registry

    registry._run_in_subprocess = lambda fn: fn()


def run(plan: dict, spec: dict) -> dict:
    from vllm.inputs import TokensPrompt

    started = time.perf_counter()
    llm = make_llm(
        plan, spec, kv_cache_memory_bytes=64 * 1024 * 1024, max_num_seqs=len(plan["prompts"])
    )
    built = time.perf_counter()
    before = counters(llm)
    outputs = llm.generate(
        [TokensPrompt(prompt_token_ids=ids) for ids in plan["prompts"]],
        greedy(spec["max_tokens"]),
        use_tqdm=False,
    )
    done = time.perf_counter()
    counted = since(before, counters(llm))
    del llm
    release_engine()
    return {
        "name": spec["name"],
        "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
        "counters": counted,
        "construct_s": round(built - started, 2),
        "generate_s": round(done - built, 3),
    }


def read_plan(plan_path: str) -> dict:
    """The plan an engine script runs, read once Triton's interpreter is set up."""
    # Beside this script, whose folder Python puts first on the path (the project is
    # imported as installed, never from this checkout).
    from triton_interpreter import set_up_interpreter

    set_up_interpreter()
    with open(plan_path) as f:
        return json.load(f)


def freeze_heap() -> None:
    """Freeze every object alive now (vLLM's and torch's modules, what ``release_engine``
    left of earlier engines) so that the garbage collector skips it: vLLM collects a dozen
    times while it builds an engine, each time over that whole heap otherwise (about 0.3 s
    of CPU here). vLLM's engine core freezes its own start-up heap the same way and
    unfreezes everything at shutdown, so this is done again before each engine."""
    import vllm.entrypoints.llm  # noqa: F401  (the modules every engine imports)

    gc.freeze()


def run_plan(plan: dict, results_path: str, run: Callable, keep_going: bool = False) -> int:
    """Each run of ``plan`` in turn, marked in the log, its results written at the end; with
    ``keep_going`` a run that raises is recorded as its error and the next one runs."""
    results = []
    for spec in plan["runs"]:
        freeze_heap()
        print(f"=== run {spec['name']}", flush=True)
        try:
            results.append(run(plan, spec))
        except Exception as error:
            if not keep_going:
                raise
            import traceback

            traceback.print_exc()
            results.append({"name": spec["name"], "error": f"{type(error).__name__}: {error}"})
            release_engine()  # what a refused start-up set up before it stopped
        print(f"=== end {spec['name']}", flush=True)
    with open(results_path, "w") as f:
        json.dump(results, f)
    return 0


def main(plan_path: str, results_path: str) -> int:
    plan = read_plan(plan_path)
    if plan.get("inspect_in_process"):
        inspect_in_process()
    return run_plan(plan, results_path, run, keep_going=True)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
