# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Where ``make setup`` takes PyTorch's CPU build from (the Makefile's ``TORCH_CPU``, which
every environment's install and ``tools/setup_ascend.sh`` pass to uv): the first local folder
that holds its wheel (``TORCH_CPU_WHEELS``: ``PIP_FIND_LINKS``, ``/opt/wheels``), else
PyTorch's own CPU wheel index (``TORCH_CPU_INDEX``). PyTorch's index cannot be reached from
the machines the suites run on: a local folder stands in for it, and uv resolves from it
with the very arguments the Makefile chose."""

from __future__ import annotations

import base64
import hashlib
import os
import shlex
import subprocess
import zipfile
from pathlib import Path

import pytest

# What runs here is the Makefile's, the same on every vLLM line: once, in .venv.
pytestmark = pytest.mark.release_independent

ROOT = Path(__file__).resolve().parent.parent
UV = ROOT / ".cache" / "uv-tool" / "bin" / "uv"
VERSION = "2.13.0+cpu"
WHEEL = f"torch-{VERSION}-cp311-cp311-manylinux_2_28_x86_64.whl"
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def torch_cpu(**env: str) -> list[str]:
    """The Makefile's TORCH_CPU with ``env`` (and no PIP_FIND_LINKS, TORCH_CPU_WHEELS or
    TORCH_CPU_INDEX but those given), split as the shell splits it."""
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PIP_FIND_LINKS", "TORCH_CPU_WHEELS", "TORCH_CPU_INDEX", "MAKEFLAGS")
    }
    result = subprocess.run(
        [
            "make",
            "-s",
            "--no-print-directory",
            "--eval",
            "print-torch-cpu: ; @echo $(TORCH_CPU)",
            "print-torch-cpu",
        ],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return shlex.split(result.stdout)


def fake_wheel(folder: Path, version: str, tag: str = "py3-none-any") -> Path:
    """A wheel of ``torch`` ``version`` with nothing in it, for uv to resolve."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"torch-{version}-{tag}.whl"
    info = f"torch-{version}.dist-info"
    files = {
        "torch/__init__.py": b"",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: {tag}\n".encode(),
    }
    record = []
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{name},sha256={digest.decode()},{len(data)}")
        wheel.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    return path


def resolve(args: list[str], tmp_path: Path) -> str:
    """What uv resolves ``args`` (the Makefile's TORCH_CPU) to, offline, from no index but
    the locations in them: the ``torch==`` line of ``uv pip compile``."""
    options, requirement = args[:-1], args[-1]
    (tmp_path / "requirements.in").write_text(requirement + "\n")
    offline = ["-q", "--offline", "--no-index", "--no-header", "--python-version", "3.11"]
    result = subprocess.run(
        [str(UV), "pip", "compile", *offline, *options, str(tmp_path / "requirements.in")],
        env={**os.environ, "UV_CACHE_DIR": str(tmp_path / "uv-cache")},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    return next(line for line in result.stdout.splitlines() if line.startswith("torch=="))


def test_a_local_folder_with_the_wheel_is_used_as_it(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / WHEEL).touch()
    assert torch_cpu(PIP_FIND_LINKS=str(wheels)) == [
        "--find-links",
        str(wheels),
        f"torch=={VERSION}",
    ]
    # pip's spelling of a folder too, and the first folder that holds it.
    found = torch_cpu(TORCH_CPU_WHEELS=f"{tmp_path / 'none'} file://{wheels}")
    assert found == ["--find-links", str(wheels), f"torch=={VERSION}"]


def test_without_a_local_wheel_pytorchs_cpu_index_is_the_default(tmp_path):
    # A folder of other wheels (another torch, another build) is no local wheel.
    other = tmp_path / "other"
    other.mkdir()
    (other / WHEEL.replace(VERSION, "2.12.0+cpu")).touch()
    (other / WHEEL.replace("+cpu", "")).touch()
    for env in (
        {"TORCH_CPU_WHEELS": str(other)},
        {"PIP_FIND_LINKS": str(other), "TORCH_CPU_WHEELS": ""},
    ):
        assert torch_cpu(**env) == [
            "--find-links",
            f"{PYTORCH_CPU_INDEX}/torch/",
            f"torch=={VERSION}",
        ]


def test_a_folder_standing_in_for_the_index_serves_the_cpu_build_never_a_cuda_one(tmp_path):
    """TORCH_CPU_INDEX overrides the index; uv reads its torch page (here a folder, as
    PyTorch's https://download.pytorch.org/whl/cpu/torch/ lists the wheels) and picks the CPU
    build among a CUDA build and a plain one of the same version."""
    index = tmp_path / "index"
    for version in ("2.13.0", "2.13.0+cu130", VERSION, "2.14.0+cpu"):
        fake_wheel(index / "torch", version)
    args = torch_cpu(TORCH_CPU_WHEELS=str(tmp_path / "none"), TORCH_CPU_INDEX=str(index))
    assert args == ["--find-links", f"{index}/torch/", f"torch=={VERSION}"]
    assert resolve(args, tmp_path) == f"torch=={VERSION}"


def test_a_local_folder_resolves_too(tmp_path):
    wheels = tmp_path / "wheels"
    fake_wheel(wheels, VERSION)
    fake_wheel(wheels, "2.13.0+cu130")
    args = torch_cpu(PIP_FIND_LINKS=str(wheels), TORCH_CPU_INDEX=str(tmp_path / "unused"))
    assert args[:2] == ["--find-links", str(wheels)]
    assert resolve(args, tmp_path) == f"torch=={VERSION}"
