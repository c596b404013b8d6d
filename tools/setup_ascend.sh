#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
#
# Builds the test environment of one supported vllm-ascend release (make setup):
#   tools/setup_ascend.sh VENV VERSION [SAME_CODE_VERSION ...]
# vLLM of the release's pairing on CPU torch, the Python package of vllm-ascend VERSION from
# its pinned source distribution (nothing is compiled), and the test-only torch_npu
# stand-ins. SAME_CODE_VERSION: releases the window serves as VERSION (the same code): their
# source distributions are fetched and unpacked too, for the test that compares the trees.
# This project itself is installed by `make test` (pip install --no-deps ., as on a host).
set -euo pipefail
UV=${UV:?"the Makefile's uv (make setup)"}
TORCH_CPU=${TORCH_CPU:?"the Makefile's CPU torch (make setup)"}
VENV=$1
VERSION=$2
shift 2
PYTHON=${PYTHON:-python3}

# Every vllm-ascend release the tests run pairs with one vLLM (its Dockerfile's VLLM_TAG);
# both files are sha256 pinned (requirements/pinned-files.txt), and the extra pure-Python
# packages they import are in requirements/.
vllm_of() {
  case $1 in
    0.30.0*) echo 0.30.0 ;;
    0.29.0*) echo 0.29.0 ;;
  esac
}

test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# The stand-ins load torch in every process: off while this script installs.
rm -f "$SITE/_draft_window_npu_stand_ins.pth"
# Installed by uv (the Makefile's UV and TORCH_CPU), pinned.
INSTALL="$UV pip install -q --python $VENV/bin/python"
# CPU torch and the test tools, resolved with their own dependencies.
# shellcheck disable=SC2086  # TORCH_CPU is two arguments
$INSTALL $TORCH_CPU -r requirements/test.txt setuptools-scm==10.3.4
VLLM_WHEEL=$(tools/fetch_pinned.sh .cache/wheels "vllm==$(vllm_of "$VERSION")")
$INSTALL --no-deps "$VLLM_WHEEL"
$INSTALL --no-deps -r requirements/cpu-ascend.txt -r requirements/bench.txt

# The sdist only, unpacked into .cache/vllm-ascend-V/: its metadata step wants setuptools_scm
# and a SOC_VERSION, no build.
fetch() {
  local version=$1 cache=.cache/vllm-ascend-$1 sdist
  sdist=$(SOC_VERSION=ascend910b1 COMPILE_CUSTOM_KERNELS=0 PYTHON=$VENV/bin/python \
    tools/fetch_pinned.sh "$cache" "vllm-ascend==$version")
  test -d "$cache/vllm_ascend-$version" || tar -xzf "$sdist" -C "$cache"
}
fetch "$VERSION"
for same in "$@"; do fetch "$same"; done

CACHE=.cache/vllm-ascend-$VERSION
rm -rf "$SITE/vllm_ascend" "$SITE"/vllm_ascend-*.dist-info
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
# The releases served as this one, for the test that compares their trees with it.
printf '%s\n' "$@" > "$VENV/vllm-ascend-same-code.txt"

# Test-only stand-ins for torch_npu and the other NPU-only modules, loaded by every Python
# process of this environment (vLLM inspects models in subprocesses): an Ascend host without
# an NPU.
cp tests/ascend/npu_testbed/stand_ins.py "$SITE/_draft_window_npu_stand_ins.py"
echo 'import _draft_window_npu_stand_ins; _draft_window_npu_stand_ins.install()' \
  > "$SITE/_draft_window_npu_stand_ins.pth"
