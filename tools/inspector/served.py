# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""After the inspector's tables (``make demo``; ``--no-serve`` skips it): the window inside a
real vLLM engine. ``vllm serve`` on CPU (vLLM's CPU worker, Model Runner V2) of a tiny
random model drafting for itself (method ``draft_model``), without and with the window:
the same tokens both ways, and the draft's acceptance from the server's own metrics. A
draft that is the target has every token accepted unless the window crops what it reads.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from vllm_ascend.worker.v2.spec_decode.draft_window.config import KEY

ROOT = Path(__file__).resolve().parents[2]
WINDOW = 32


def serve_both_ways() -> bool:
    """Serves without and with the window and prints what each gave; False when a server
    did not start or the tokens differ."""
    from tests.testbed.engine.models import make_tiny_models
    from tests.testbed.engine.runs import (
        BLOCK,
        NUM_SPEC,
        PROMPT_LENS,
        Run,
        Server,
        spec_counter,
    )

    models = make_tiny_models(ROOT / ".cache" / "tiny-engine-models")
    runs = [
        Run(f"without {KEY}", "draft_model"),
        Run(f"{KEY}={WINDOW}", "draft_model", {KEY: WINDOW}),
    ]
    print(
        f"\nA real vLLM engine: vllm serve on CPU (Model Runner V2), a tiny random model "
        f"drafting for itself (draft_model, {NUM_SPEC} speculative tokens); "
        f"{len(PROMPT_LENS)} prompts of {', '.join(map(str, PROMPT_LENS))} tokens, "
        f"{runs[0].max_tokens} new tokens each, greedy; KV blocks of {BLOCK} tokens.",
        flush=True,
    )
    print(f"  {'run':<26}{'drafted':>8}{'accepted':>10}{'acceptance':>12}  tokens", flush=True)
    reference = None
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            with Server(models, run, Path(tmp)) as server:
                if not server.wait():
                    print(f"  {run.name}: vllm serve did not start:\n{server.log[-3000:]}")
                    return False
                token_ids = server.completions(models, run.max_tokens)
                metrics = server.get("/metrics")
                window_line = next(
                    (line for line in server.log.splitlines() if "Draft KV window on" in line),
                    None,
                )
            drafted = spec_counter(metrics, "num_draft_tokens")
            accepted = spec_counter(metrics, "num_accepted_tokens")
            if reference is None:
                reference, tokens = token_ids, f"{token_ids[-1][:6]} ... (the reference)"
            else:
                tokens = "the same" if token_ids == reference else "DIFFERENT"
            share = f"{accepted / drafted:.1%}" if drafted else "-"
            print(
                f"  {run.name:<26}{drafted:>8.0f}{accepted:>10.0f}{share:>12}  {tokens}",
                flush=True,
            )
            if window_line:
                print(f"    the server said: {window_line.split('] ', 1)[-1]}", flush=True)
    return token_ids == reference
