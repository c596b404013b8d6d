# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Runs vLLM's offline engine under serving load, once per run of a plan, one engine after
another in this process, driving ``LLMEngine`` step by step as a server does: every request
added at once (more than ``max_num_seqs``, so requests join and leave a running batch), one
of them aborted once it has generated ``abort_after`` tokens, the rest run to the end. It
writes each finished request's tokens, which request was aborted and after how many tokens,
and vLLM's own counters (preemptions, prefix-cache queries and hits, spec decode):

    python load.py PLAN.json RESULTS.json

Run as a script from a directory outside the checkout (the project imported as installed).
PLAN: {"target": path, "max_model_len": n, "block_size": b, "requests": {id: [ids]},
"abort": id, "abort_after": n, "max_tokens": n, "runs": [{"name", "speculative_config" (or
null), "additional_config", "engine": {LLM keyword arguments}, "requests" (optional: this
run's own, none aborted)}], "keep_going" (optional: a run whose engine raises is recorded
as its error, {"name", "error"}, and the next one runs)}. Each run also records the most
requests vLLM had running at once (its ``vllm:num_requests_running`` gauge after each
step) and, per KV-cache group, the most blocks one request held after a step (vLLM's KV
cache manager, in this process: the engine core runs in process here).
"""

from __future__ import annotations

import sys

# Beside this script, whose folder Python puts first on the path.
from offline import read_plan, release_engine, run_plan

RUNNING = "vllm:num_requests_running"
COUNTERS = (
    "vllm:num_preemptions",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)


def running(llm) -> int:
    return sum(int(getattr(m, "value", 0)) for m in llm.get_metrics() if m.name == RUNNING)


def counters(llm) -> dict[str, int]:
    found = dict.fromkeys(COUNTERS, 0)
    for metric in llm.get_metrics():
        if metric.name in found:
            found[metric.name] += int(getattr(metric, "value", 0))
    return found


def most_held(llm, found: list[int]) -> list[int]:
    """``found`` raised to the blocks each request holds now, per KV-cache group (the null
    block, which stands for a freed one, not counted)."""
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    found = found or [0] * len(managers)
    for group, manager in enumerate(managers):
        for blocks in manager.req_to_blocks.values():
            found[group] = max(found[group], sum(not block.is_null for block in blocks))
    return found


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
    params = SamplingParams(temperature=0.0, max_tokens=plan["max_tokens"], ignore_eos=True)
    requests = spec.get("requests") or plan["requests"]
    abort = None if "requests" in spec else plan["abort"]
    for request_id, ids in requests.items():
        engine.add_request(request_id, TokensPrompt(prompt_token_ids=ids), params)
    finished, aborted, most_running, held = {}, None, 0, []
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
        held = most_held(llm, held)
    found = counters(llm)
    del llm, engine
    release_engine()
    return {
        "name": spec["name"],
        "tokens": finished,
        "aborted": aborted,
        "counters": found,
        "most_running": most_running,
        "most_held": held,
    }


def main(plan_path: str, results_path: str) -> int:
    plan = read_plan(plan_path)
    return run_plan(plan, results_path, run, keep_going=plan.get("keep_going", False))


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
