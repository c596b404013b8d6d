# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""`make gpu-check`: the window's kernels checked and measured on a CUDA GPU (``cli.py``)."""
