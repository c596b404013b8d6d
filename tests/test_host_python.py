# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Setup's first step on a ``python3`` that is not 3.11 (``make host-python``, before
``make host-cpu`` and any install): one message naming the interpreter, its version and the
fix, and a failing exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tools import host_python

# The Makefile and its tools are the same on every line: once, in .venv.
pytestmark = pytest.mark.release_independent

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("version", [(3, 10, 13), (3, 12, 1), (3, 13, 0), (2, 7, 18)])
def test_a_python_other_than_3_11_is_named_with_the_fix(version):
    message = host_python.problem("/usr/bin/python3", version)
    dotted = ".".join(map(str, version))
    assert message.startswith(f"make setup: /usr/bin/python3 is Python {dotted};")
    assert "need Python 3.11" in message and "make setup PYTHON=python3.11" in message


def test_python_3_11_passes():
    assert host_python.problem("/usr/bin/python3.11", (3, 11, 7)) is None


def test_make_setup_stops_at_its_first_step_on_another_python(tmp_path):
    """A ``PYTHON`` reporting 3.10 (this interpreter, told it is 3.10): ``make host-cpu``,
    the step every setup starts with, stops with the one message, before the CPU check."""
    fake = tmp_path / "python3"
    fake.write_text(
        "#!/bin/sh\n"
        f'exec {sys.executable} -c "import runpy, sys; sys.version_info = (3, 10, 13); '
        'sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name=\'__main__\')" "$@"\n'
    )
    fake.chmod(0o755)
    result = subprocess.run(
        ["make", "--no-print-directory", "host-cpu", f"PYTHON={fake}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert "is Python 3.10.13; the test environments need Python 3.11" in result.stderr
    assert "x86-64" not in result.stderr and result.stdout == ""
