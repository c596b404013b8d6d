# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""``make compare-trained-models``: the tiny models retrained here (``make trained-models``,
``.cache/trained-models``) against the committed ones (``trained_models/``) by what the
study measures with them, not by their bytes: another CPU may train other weights, and
what must hold is the curve a reader gets.

Both sets are served by the CPU study of ``make study-cpu`` (``python -m e2e``, vLLM's own
``vllm bench sweep serve``), each drafter (the draft model and the EAGLE3 head) without the
window and with W = 33, at 32 tokens (inside the training context), 512 and 1024 (8 and 16
times it). Each mean acceptance length of the retrained set must be within ``TOLERANCE``
(default 0.25: what two runs of one server differ by at 1024 tokens, as
``benchmarks/results/README.md`` states) of the committed set's, measured in the same run
of this tool, on the same machine. Exit status 1 where a point is farther apart, 2 where a
study did not run.

    python -m tools.compare_trained .cache/trained-models
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from e2e import cpu_study

ROOT = Path(__file__).resolve().parent.parent
CONTEXTS = (32, 512, 1024)
RUNS = {"v2_no_window": "no window", "v2_window": "W = 33"}
SCENARIOS = {"draft_model": ("draft", "draft model"), "eagle3": ("eagle3", "EAGLE3")}
TOLERANCE = 0.25


def curve(scenario: str, models: Path | None, out: Path) -> dict[str, dict[int, float]]:
    """One study of ``scenario`` over the models under ``models`` (None: the committed
    ones): mean acceptance length by run and context."""
    settings = {"CONTEXTS": ",".join(map(str, CONTEXTS)), "NO_SPECULATION": "0", "PARALLEL": "2"}
    if models is not None:
        settings["TARGET_MODEL"] = str(models / "target")
        settings["DRAFT_MODEL"] = str(models / SCENARIOS[scenario][0])
    runs = cpu_study.run(scenario, out, settings)[0]["runs"]
    return {
        run: {int(c): m["mean_length"] for c, m in runs[run]["contexts"].items()} for run in RUNS
    }


def compare(retrained: Path, out: Path, tolerance: float = TOLERANCE) -> list[str]:
    """Serves both sets and prints the curves side by side; the points farther apart than
    ``tolerance`` (none: the retrained models give the committed curve)."""
    print(
        f"Mean acceptance length, committed (trained_models/) against retrained ({retrained}), "
        f"K = 3, 8 prompts per context; within {tolerance} of each other:",
        flush=True,
    )
    far = []
    for scenario, (_, label) in SCENARIOS.items():
        committed = curve(scenario, None, out / "committed")
        again = curve(scenario, retrained, out / "retrained")
        for run, name in RUNS.items():
            cells = []
            for c in CONTEXTS:
                a, b = committed[run][c], again[run][c]
                apart = round(abs(a - b), 3)  # the study reports 3 decimals
                cells.append(f"{c}: {a:.2f} / {b:.2f}{'' if apart <= tolerance else ' FAR'}")
                if apart > tolerance:
                    far.append(f"{label}, {name}, {c} tokens: {a:.2f} against {b:.2f}")
            print(f"  {label}, {name}: " + "; ".join(cells), flush=True)
    return far


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    tolerance = float(os.environ.get("TOLERANCE", TOLERANCE))
    try:
        far = compare(Path(argv[0]).resolve(), ROOT / "e2e" / "results" / "compare", tolerance)
    except RuntimeError as error:
        print(error, file=sys.stderr)
        return 2
    if far:
        print(f"The retrained models' curve is more than {tolerance} from the committed one:")
        print("\n".join(f"  {line}" for line in far))
        return 1
    print(f"The retrained models give the committed curve, within {tolerance} at every point.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
