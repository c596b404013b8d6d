# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The blocks each KV-cache group holds per request, in vLLM's offline engine driven step by
step (``LLMEngine``, as ``load.py`` drives it): the most blocks one request holds in each
group after any step (``most_held``) and after the steps where each running request is past
its first decode step (``decode_held``: steady decode), from vLLM's KV cache manager in this
process (the null block, which stands for a freed one, not counted); each finished request's
tokens, vLLM's counters, the most requests it ran at once, each group's spec (``kv_groups``)
and the lookahead slots its scheduler allocates a step (``lookahead``):

    python decode_held.py PLAN.json RESULTS.json

Run as a script from a directory outside the checkout (the project imported as installed).
PLAN: {"target": path, "max_model_len": n, "block_size": b, "max_tokens": n, "requests":
{id: [ids]}, "runs": [{"name", "speculative_config", "additional_config", "engine": {LLM
keyword arguments}}]}.
"""

from __future__ import annotations

import sys

# Beside this script, whose folder Python puts first on the path.
from load import counters, running
from offline import read_plan, release_engine, run_plan


def held_now(scheduler) -> list[int]:
    """The most blocks one request holds now, per KV-cache group."""
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    return [
        max((sum(not b.is_null for b in blocks) for blocks in m.req_to_blocks.values()), default=0)
        for m in managers
    ]


def group_specs(scheduler) -> list[dict]:
    """Each KV-cache group's spec as vLLM's KV cache manager holds it: its block size and,
    of a sliding-window group, its window and the tokens it retains below it."""
    specs = [m.kv_cache_spec for m in scheduler.kv_cache_manager.coordinator.single_type_managers]
    return [
        {
            "block_size": spec.block_size,
            "sliding_window": getattr(spec, "sliding_window", None),
            "extra_retained_tokens": getattr(spec, "extra_retained_tokens", 0),
        }
        for spec in specs
    ]


def run(plan: dict, spec: dict) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=plan["target"],
        dtype="float32",
        enforce_eager=True,
        block_size=plan["block_size"],
        max_model_len=plan["max_model_len"],
        seed=0,
        disable_log_stats=False,
        speculative_config=spec["speculative_config"],
        additional_config=spec["additional_config"],
        **spec["engine"],
    )
    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler
    params = SamplingParams(temperature=0.0, max_tokens=plan["max_tokens"], ignore_eos=True)
    for request_id, ids in plan["requests"].items():
        engine.add_request(request_id, TokensPrompt(prompt_token_ids=ids), params)
    finished, most_running, most_held, decode_held, decode_steps = {}, 0, None, None, 0
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = list(output.outputs[0].token_ids)
        most_running = max(most_running, running(llm))
        now = held_now(scheduler)
        most_held = now if most_held is None else list(map(max, most_held, now))
        # Past its first decode step: a request's last prefill chunk is the step before its
        # first token, and vLLM frees a sliding-window group's blocks before the window when
        # it next allocates, at that first decode step.
        decoding = scheduler.running and all(r.num_output_tokens >= 2 for r in scheduler.running)
        if decoding:
            decode_held = now if decode_held is None else list(map(max, decode_held, now))
            decode_steps += 1
    found = counters(llm)
    groups, lookahead = group_specs(scheduler), scheduler.num_lookahead_tokens
    del llm, engine, scheduler
    release_engine()
    return {
        "name": spec["name"],
        "tokens": finished,
        "counters": found,
        "most_running": most_running,
        "most_held": most_held,
        "decode_held": decode_held,
        "decode_steps": decode_steps,
        "kv_groups": groups,
        "lookahead": lookahead,
    }


def main(plan_path: str, results_path: str) -> int:
    return run_plan(read_plan(plan_path), results_path, run)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
