# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""``python -m trained_models check | heldout [OUT] | train DIR | compare DIR | adopt DIR``
(the package's docstring)."""

from __future__ import annotations

import sys
from pathlib import Path

import trained_models


def main(argv: list[str]) -> int:
    command, *rest = argv or ["help"]
    try:
        if command == "check" and not rest:
            problems = trained_models.check_files()
            for line in problems:
                print(line)
            if not problems:
                print(f"the committed models match {trained_models.MANIFEST}")
            return 1 if problems else 0
        if command == "heldout" and len(rest) <= 1:
            out = trained_models.build_heldout(*(Path(p) for p in rest))
            print(f"the held-out text, checked by its sha256: {out}")
            return 0
        if command == "train" and len(rest) == 1:
            from trained_models import recipe

            return recipe.main(rest)
        if command == "compare" and len(rest) == 1:
            # Informative: a retrained model that differs is what another CPU trains.
            trained_models.compare(Path(rest[0]))
            return 0
        if command == "adopt" and len(rest) == 1:
            trained_models.adopt(Path(rest[0]))
            print(f"committed models replaced from {rest[0]}: {trained_models.MANIFEST}")
            return 0
    except trained_models.FixtureError as error:
        print(error, file=sys.stderr)
        return 2
    print(trained_models.__doc__.strip(), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
