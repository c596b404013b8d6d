# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The wheel only adds files, under draft_window/ and one Triton kernel module beside
vllm-ascend's own: installed beside vllm-ascend it never replaces one of vllm-ascend's files."""

import ast
import importlib.metadata
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

# The same code on every vLLM line: run once, in .venv (design/testing.md).
pytestmark = pytest.mark.release_independent

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "vllm_ascend/worker/v2/spec_decode/draft_window/"
PARENTS = [
    "vllm_ascend",
    "vllm_ascend/worker",
    "vllm_ascend/worker/v2",
    "vllm_ascend/worker/v2/spec_decode",
]


def build_wheel(out_dir: Path) -> Path:
    # setuptools builds in the source tree's build/: a module removed since an earlier build
    # would still ship from there (as make's wheel rule does, it goes before and after).
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "--wheel-dir",
            str(out_dir),
            str(ROOT),
        ],
        check=True,
    )
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    (wheel,) = out_dir.glob("*.whl")
    return wheel


def test_parent_folders_have_no_init_file():
    for parent in PARENTS:
        assert not (ROOT / parent / "__init__.py").exists(), parent


# What a server runs, and nothing else. The core (what the upstream patch adds to
# vllm-ascend, byte for byte): the settings, the window arithmetic, the group and refusal
# policy, the window, the release vllm-ascend names at its call sites. The overlay (the
# plugin form only): the entry point, the hook installer, the hooks (one module per
# speculator family), the other supported releases, the path check on the builders its
# hooks wrap by name, and the one-launch refresh (its Triton kernel and start-up
# self-check). The inspector, the GPU check and the CPU test bed live in
# tools/ and tests/; a module added here is a deliberate change to what a host installs.
CORE_MODULES = {
    "__init__.py",
    "ascend.py",
    "autoregressive.py",
    "config.py",
    "dcp.py",
    "declared.py",
    "groups.py",
    "methods.py",
    "window_buffers.py",
    "plan.py",
    "policy.py",
    "release.py",
    "speculator.py",
    "views.py",
    "window.py",
}
OVERLAY_MODULES = {
    f"overlay/{name}"
    for name in (
        "__init__.py",
        "install.py",
        "patches.py",
        "plugin.py",
        "log.py",
        "supported.py",
        "plugin_release.py",
        "free_kv.py",
        "kv_reclaim.py",
        "path_check.py",
        "fused.py",
        "fused_check.py",
        "refresh_kernel.py",
        "versions.py",
        "vllm_backends.py",
        "hooks/__init__.py",
        "hooks/common.py",
        "hooks/kv_cache.py",
        "hooks/speculator.py",
        "hooks/dflash.py",
        "hooks/autoregressive.py",
        "hooks/ascend/__init__.py",
        "hooks/ascend/autoregressive.py",
        "hooks/ascend/dspark.py",
    )
}
SERVING_MODULES = CORE_MODULES | OVERLAY_MODULES


def test_the_core_imports_nothing_of_the_overlay():
    """The upstream patch is the core by construction: no core module reaches the overlay,
    by any import (at the top, inside a function, or under TYPE_CHECKING)."""
    folder = ROOT / PACKAGE
    core = sorted(p for p in folder.rglob("*.py") if "overlay" not in p.relative_to(folder).parts)
    assert {str(p.relative_to(folder)) for p in core} == CORE_MODULES
    overlay = PACKAGE.replace("/", ".") + "overlay"
    for path in core:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            assert not [n for n in names if n.startswith(overlay)], (path.name, names)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def test_the_wheel_ships_only_what_a_server_runs(wheel):
    with zipfile.ZipFile(wheel) as zf:
        shipped = {n.removeprefix(PACKAGE) for n in zf.namelist() if n.startswith(PACKAGE)}
    assert shipped == SERVING_MODULES
    for tool in ("inspector", "gpu_check", "testbed", "test_"):
        assert not [n for n in shipped if tool in n], tool


def test_wheel_installs_only_the_draft_window_package_and_the_entry_point(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        dist_info = {n.split("/")[0] for n in names if ".dist-info/" in n}
        assert len(dist_info) == 1
        (dist_info,) = dist_info
        outside = [n for n in names if not n.startswith((PACKAGE, dist_info + "/"))]
        assert outside == []
        assert PACKAGE + "__init__.py" in names
        assert PACKAGE + "window.py" in names
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
    assert "[vllm.general_plugins]" in entry_points
    assert (
        "draft_window = vllm_ascend.worker.v2.spec_decode.draft_window.overlay.plugin:register"
        in entry_points
    )


def test_the_wheel_requires_no_vllm_and_no_torch(wheel):
    """A plain ``pip install .`` on a host with any vLLM (0.29, or an NPU source build whose
    version pip reads differently) never replaces the host's vLLM, vllm-ascend or torch."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as zf:
        (metadata,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        requires = [
            Requirement(line.split(": ", 1)[1])
            for line in zf.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist: ")
        ]
    unconditional = [r for r in requires if r.marker is None]
    assert [str(r) for r in unconditional] == ["pydantic>=2"]
    for requirement in requires:
        assert requirement.name not in {"vllm", "torch", "vllm-ascend", "torch-npu"}, requirement


def test_pip_installs_the_wheel_and_nothing_else_beside_a_host_vllm(wheel):
    """pip's own resolver, offline, in this environment (a host with vLLM and torch): the
    wheel is the one thing it would install."""
    import json

    pip = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--quiet"]
    result = subprocess.run(
        [*pip, "--report", "-", str(wheel)],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(result.stdout)
    installed = [item["metadata"]["name"] for item in report["install"]]
    # make installs this project into the environment (as on a host), which satisfies the
    # wheel itself when their versions match: nothing else may be pulled in.
    same = importlib.metadata.version("vllm-ascend-draft-window") == wheel.name.split("-")[1]
    assert installed == ([] if same else ["vllm-ascend-draft-window"]), installed
