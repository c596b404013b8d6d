# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The long-context study of a committed drafter in vLLM's offline engine on CPU
(``study_engine.py``, in a process of its own): prompts of held-out text at each context,
the drafter without the window, with a window and with ``"auto"``, against the target
alone; mean acceptance length from vLLM's own spec-decode counters."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from testbed.engine.runs import BLOCK, Offline, engine_script

STUDY_ENGINE = Path(__file__).with_name("study_engine.py")
# Prompts per context, sent together, and the tokens each generates (as the served study).
PROMPTS = 8
OUTPUT_TOKENS = 16
# Sampled as users serve: every request seeded.
SAMPLED = {"temperature": 0.8, "seed": 0}
GREEDY = {"temperature": 0.0}


@dataclass(frozen=True)
class StudyRun:
    """One engine: its draft method (None: the target alone) and the window's keys."""

    name: str
    method: str | None = None
    window: dict | None = None


def held_out_prompts(text: Path, contexts: tuple[int, ...], count: int = PROMPTS) -> dict:
    """``count`` stretches of the held-out text per context, as token ids (the byte
    tokenizer's ids are the text's bytes), seeded by the context: a context's prompts are
    the same whatever other contexts a study runs."""
    data = Path(text).read_bytes()
    found = {}
    for context in contexts:
        rng = random.Random(context)
        starts = [rng.randrange(len(data) - context) for _ in range(count)]
        found[str(context)] = [list(data[s : s + context]) for s in starts]
    return found


def run_study(
    target: str,
    draft: str,
    heldout: Path,
    runs: list[StudyRun],
    contexts: tuple[int, ...],
    workdir: Path,
    num_spec: int,
    max_model_len: int,
    sampling: tuple[dict, ...] = (GREEDY,),
) -> Offline:
    """Every run, one engine after another, over the prompts of every context."""
    plan = {
        "target": target,
        "max_model_len": max_model_len,
        "block_size": BLOCK,
        "max_tokens": OUTPUT_TOKENS,
        "prompts": held_out_prompts(heldout, contexts),
        "sampling": list(sampling),
        "runs": [
            {
                "name": run.name,
                "speculative_config": None
                if run.method is None
                else {"method": run.method, "model": draft, "num_speculative_tokens": num_spec},
                "additional_config": dict(run.window or {}),
            }
            for run in runs
        ],
    }
    return engine_script(STUDY_ENGINE, plan, workdir)


def mean_lengths(result: dict, sampling: str = "greedy") -> dict[int, float]:
    """Mean acceptance length by context (vLLM's: 1 + accepted / drafts)."""
    return {
        int(context): 1 + found["num_accepted_tokens"] / found["num_drafts"]
        for context, found in result["contexts"][sampling].items()
    }
