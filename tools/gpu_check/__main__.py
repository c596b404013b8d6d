# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""``python -m tools.gpu_check``: stop with one line when torch or Triton is missing, before
anything imports them; then the checks (``cli.py``)."""

import importlib.util
import sys

# What the checks import, and how to get it on a CUDA host.
NEEDS = (
    ("torch", "a CUDA build of PyTorch (pip install torch)"),
    ("triton", "Triton (a CUDA build of PyTorch brings it; else pip install triton)"),
)


def missing() -> str | None:
    """The line saying what this Python lacks, or None."""
    for module, how in NEEDS:
        if importlib.util.find_spec(module) is None:
            return (
                f"make gpu-check needs {module}, which {sys.executable} cannot import: "
                f"install {how}, or run it with PYTHON=<a Python that has it>."
            )
    return None


if __name__ == "__main__":
    problem = missing()
    if problem is not None:
        print(problem, file=sys.stderr)
        raise SystemExit(2)
    from tools.gpu_check.cli import main

    raise SystemExit(main())
