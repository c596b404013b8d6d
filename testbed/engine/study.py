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

import trained_models as trained
from testbed.engine.load_plan import speculative
from testbed.engine.offline import mean_length
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


def held_out_prompts(
    models: trained.TrainedModels, contexts: tuple[int, ...], count: int = PROMPTS
) -> dict:
    """``count`` stretches of the held-out text per context, seeded by the context: a
    context's prompts are the same whatever other contexts a study runs."""
    found = {}
    for context in contexts:
        rng = random.Random(context)
        starts = [rng.randrange(models.heldout_tokens - context) for _ in range(count)]
        found[str(context)] = [models.prompt(start, context) for start in starts]
    return found


def run_study(
    models: trained.TrainedModels,
    draft: str,
    runs: list[StudyRun],
    contexts: tuple[int, ...],
    workdir: Path,
    sampling: tuple[dict, ...] = (GREEDY,),
) -> Offline:
    """Every run of ``draft`` for the target of ``models``, one engine after another, over
    the prompts of every context."""
    plan = {
        "target": models.target,
        "max_model_len": trained.TARGET_CONTEXT,
        "block_size": BLOCK,
        "max_tokens": OUTPUT_TOKENS,
        "prompts": held_out_prompts(models, contexts),
        "sampling": list(sampling),
        "runs": [
            {
                "name": run.name,
                "speculative_config": run.method and speculative(run.method, draft),
                "additional_config": dict(run.window or {}),
            }
            for run in runs
        ],
    }
    return engine_script(STUDY_ENGINE, plan, workdir)


def mean_lengths(result: dict, sampling: str = "greedy") -> dict[int, float]:
    """Mean acceptance length by context."""
    return {
        int(context): mean_length(found["counters"])
        for context, found in result["contexts"][sampling].items()
    }
