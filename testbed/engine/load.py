# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Runs vLLM's offline engine under serving load, once per run of a plan, one engine after
another in this process, driving ``LLMEngine`` step by step as a server does: every request
added at once (more than ``max_num_seqs``, so requests join and leave a running batch), one
of them aborted once it has generated ``abort_after`` tokens (where the plan names one), the
rest run to the end. It writes each finished request's tokens, which request was aborted and
after how many tokens, and vLLM's own counters (preemptions, prefix-cache queries and hits,
spec decode):

    python load.py PLAN.json RESULTS.json

Run as a script from a directory outside the checkout (the project imported as installed).
PLAN: {"target": path, "max_model_len": n, "block_size": b, "requests": {id: [ids]},
"abort" (optional): id, "abort_after": n, "max_tokens": n, "runs": [{"name",
"speculative_config" (or null), "additional_config", "engine": {LLM keyword arguments},
"requests" (optional: this run's own, none aborted)}], "keep_going" (optional: a run whose
engine raises is recorded as its error, {"name", "error"}, and the next one runs)}.

Each run also records the most requests vLLM had running at once (its
``vllm:num_requests_running`` gauge after each step) and, from vLLM's KV cache manager in
this process (the engine core runs in process here), the blocks each KV-cache group holds
per request: the most one request holds after any step (``most_held``) and after the steps
where each running request is past its first decode step (``decode_held``: steady decode;
the null block, which stands for a freed one, not counted); each group's spec
(``kv_groups``) and the lookahead slots its scheduler allocates a step (``lookahead``).
"""

from __future__ import annotations

import sys

# Beside this script, whose folder Python puts first on the path.
from offline import SPEC_DECODE, counters, greedy, make_llm, read_plan, release_engine, run_plan

RUNNING = "vllm:num_requests_running"
COUNTERS = (
    "vllm:num_preemptions",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    *SPEC_DECODE,
)


def running(llm) -> int:
    """The requests vLLM runs now (its gauge)."""
    return counters(llm, (RUNNING,))[RUNNING]


def add_requests(llm, requests: dict[str, list[int]], max_tokens: int):
    """Every request added to the engine at once, greedy, ``max_tokens`` each, as a server
    adds what arrives together; the engine they were added to."""
    from vllm.inputs import TokensPrompt

    engine = llm.llm_engine
    for request_id, ids in requests.items():
        engine.add_request(request_id, TokensPrompt(prompt_token_ids=ids), greedy(max_tokens))
    return engine


def held_now(scheduler) -> list[int]:
    """The most blocks one request holds now, per KV-cache group (the null block, which
    stands for a freed one, not counted)."""
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    return [
        max((sum(not b.is_null for b in blocks) for blocks in m.req_to_blocks.values()), default=0)
        for m in managers
    ]


def most(so_far: list[int] | None, now: list[int]) -> list[int]:
    """Each group's most blocks so far, with ``now``'s."""
    return now if so_far is None else list(map(max, so_far, now))


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
    llm = make_llm(plan, spec, **spec["engine"])
    requests = spec.get("requests") or plan["requests"]
    abort = None if "requests" in spec else plan.get("abort")
    engine = add_requests(llm, requests, plan["max_tokens"])
    scheduler = engine.engine_core.engine_core.scheduler
    finished, aborted, most_running = {}, None, 0
    most_held, decode_held, decode_steps = None, None, 0
    while engine.has_unfinished_requests():
        for output in engine.step():
            tokens = list(output.outputs[0].token_ids)
            if output.finished:
                finished[output.request_id] = tokens
            elif output.request_id == abort and len(tokens) >= plan["abort_after"]:
                # A client gone mid-generation: the server aborts its request.
                engine.abort_request([output.request_id])
                aborted = {"request": output.request_id, "after_tokens": len(tokens)}
        most_running = max(most_running, running(llm))
        now = held_now(scheduler)
        most_held = most(most_held, now)
        # Past its first decode step: a request's last prefill chunk is the step before its
        # first token, and vLLM frees a sliding-window group's blocks before the window when
        # it next allocates, at that first decode step.
        if scheduler.running and all(r.num_output_tokens >= 2 for r in scheduler.running):
            decode_held = most(decode_held, now)
            decode_steps += 1
    found = counters(llm, COUNTERS)
    groups, lookahead = group_specs(scheduler), scheduler.num_lookahead_tokens
    del llm, engine, scheduler
    release_engine()
    return {
        "name": spec["name"],
        "tokens": finished,
        "aborted": aborted,
        "counters": found,
        "most_running": most_running,
        "most_held": most_held,
        "decode_held": decode_held,
        "decode_steps": decode_steps,
        "kv_groups": groups,
        "lookahead": lookahead,
    }


def main(plan_path: str, results_path: str) -> int:
    plan = read_plan(plan_path)
    return run_plan(plan, results_path, run, keep_going=plan.get("keep_going", False))


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
