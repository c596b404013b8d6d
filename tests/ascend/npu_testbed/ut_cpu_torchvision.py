# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""A pytest plugin (``-p ut_cpu_torchvision``) for vllm-ascend's own unit tests on CPU: lets
PyPI's torchvision wheel (a CUDA build, which vllm-ascend's requirements name) import on CPU
torch.

Stand-in for the device boundary: torchvision's compiled ops. Its ``_C`` extension cannot
load without the CUDA runtime, so its C++ operators are never registered, and its meta
registrations then fail on ``torchvision::nms`` and ``torchvision::qnms``. Declaring those
two schemas, without kernels, lets the pure-Python parts import (``transforms.v2``, which
transformers' Qwen2-VL image processor imports through vLLM's Qwen3-VL model, which
vllm-ascend's patches import when its unit tests' conftest runs).
"""

import torch

_library = None
try:
    torch.ops.torchvision.nms  # noqa: B018
except (AttributeError, RuntimeError):
    _library = torch.library.Library("torchvision", "DEF")
    _library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
