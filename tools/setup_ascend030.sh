#!/usr/bin/env bash
# Builds .venv-030, the Ascend pairing's test environment: vLLM 0.30.0 on CPU torch, the
# Python package of vllm-ascend 0.30.0rc2 from its pinned source distribution (nothing is
# compiled), and the test-only torch_npu stand-ins. This project itself is installed by
# `make test` (pip install --no-deps ., as on an Ascend host).
set -euo pipefail
VENV=${1:-.venv-030}
PYTHON=${PYTHON:-python3}
VERSION=0.30.0rc2
SHA256=05cb51448c0cd174ea338b16ebbfc8e215f44b373ea2a0d65f1314523a01152f
CACHE=.cache/vllm-ascend-$VERSION

test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# The stand-ins load torch in every process: off while this script installs.
rm -f "$SITE/_draft_window_npu_stand_ins.pth"
PIP="$VENV/bin/python -m pip"
# CPU torch: this exact version is the CPU build; a range would pull a CUDA build.
$PIP install -q torch==2.13.0
# The test tools first, resolved with their own dependencies: installed after vLLM, pip
# would check vLLM's full (GPU) requirements and print every one it lacks.
$PIP install -q -r requirements/test.txt setuptools-scm==10.3.4
$PIP install -q --no-deps vllm==0.30.0
$PIP install -q --no-deps -r requirements/cpu-030.txt

# The sdist only: its metadata step wants setuptools_scm and a SOC_VERSION, no build.
mkdir -p "$CACHE"
if ! echo "$SHA256  $CACHE/vllm_ascend-$VERSION.tar.gz" | sha256sum -c --status 2>/dev/null; then
  SOC_VERSION=ascend910b1 COMPILE_CUSTOM_KERNELS=0 $PIP download -q --no-deps \
    --no-build-isolation "vllm-ascend==$VERSION" -d "$CACHE"
  echo "$SHA256  $CACHE/vllm_ascend-$VERSION.tar.gz" | sha256sum -c --quiet
fi
rm -rf "$SITE/vllm_ascend" "$SITE"/vllm_ascend-*.dist-info
tar -xzf "$CACHE/vllm_ascend-$VERSION.tar.gz" -C "$CACHE"
cp -r "$CACHE/vllm_ascend-$VERSION/vllm_ascend" "$SITE/"
# What vllm-ascend's build writes beside its Python package (setup.py, gen_build_info), for
# the SOC the sdist is fetched for (ascend910b1: an A2 device).
printf "# Auto-generated file\n__device_type__ = 'A2'\n" > "$SITE/vllm_ascend/_build_info.py"
# A dist-info with the sdist's entry points: vLLM discovers vllm-ascend's plugins as on a host.
DIST="$SITE/vllm_ascend-$VERSION.dist-info"
mkdir -p "$DIST"
printf 'Metadata-Version: 2.1\nName: vllm-ascend\nVersion: %s\n' "$VERSION" > "$DIST/METADATA"
cp "$CACHE/vllm_ascend-$VERSION/vllm_ascend.egg-info/entry_points.txt" "$DIST/"
# Every file vllm-ascend ships, with its sha256: the overlay test checks none is replaced.
(cd "$SITE" && find vllm_ascend -type f -print0 | sort -z | xargs -0 sha256sum) \
  > "$VENV/vllm-ascend-files.sha256"

# Test-only stand-ins for torch_npu and the other NPU-only modules, loaded by every Python
# process of this environment (vLLM inspects models in subprocesses): an Ascend host without
# an NPU.
cp tests/ascend/npu_testbed/stand_ins.py "$SITE/_draft_window_npu_stand_ins.py"
echo 'import _draft_window_npu_stand_ins; _draft_window_npu_stand_ins.install()' \
  > "$SITE/_draft_window_npu_stand_ins.pth"
