# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The long-context study in vLLM's offline engine: one engine per run of a plan, one after
another in this process, each generating 16 tokens (``max_tokens``) after the prompts of
every context in turn, greedy and then as each ``sampling`` entry says, and writing, per
context and sampling, what each prompt generated and what vLLM's own spec-decode counters
counted over that context's requests:

    python study_engine.py PLAN.json RESULTS.json

Run as a script from a directory outside the checkout (the project imported as installed).
PLAN: {"target": path, "max_model_len": n, "block_size": b, "max_tokens": n, "prompts":
{context: [[ids]]}, "sampling": [{"temperature", "seed"}], "runs": [{"name",
"speculative_config" (or null), "additional_config"}]}. Each run's engine log is framed by
``=== run NAME`` and ``=== end NAME`` lines on stdout.
"""

from __future__ import annotations

import sys
import time

# Beside this script, whose folder Python puts first on the path.
from offline import counters, make_llm, read_plan, release_engine, run_plan, since


def run(plan: dict, spec: dict) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    started = time.perf_counter()
    in_flight = max(len(prompts) for prompts in plan["prompts"].values())
    llm = make_llm(plan, spec, kv_cache_memory_bytes=64 * 1024 * 1024, max_num_seqs=in_flight)
    contexts = {}
    for sampling in plan["sampling"]:
        label = "greedy" if sampling["temperature"] == 0 else f"t{sampling['temperature']}"
        for context, prompts in plan["prompts"].items():
            before = counters(llm)
            outputs = llm.generate(
                [TokensPrompt(prompt_token_ids=ids) for ids in prompts],
                SamplingParams(max_tokens=plan["max_tokens"], ignore_eos=True, **sampling),
                use_tqdm=False,
            )
            contexts.setdefault(label, {})[context] = {
                "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
                "counters": since(before, counters(llm)),
            }
    del llm
    release_engine()
    return {
        "name": spec["name"],
        "contexts": contexts,
        "seconds": round(time.perf_counter() - started, 1),
    }


def main(plan_path: str, results_path: str) -> int:
    return run_plan(read_plan(plan_path), results_path, run, keep_going=True)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
