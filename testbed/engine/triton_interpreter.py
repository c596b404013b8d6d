# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Triton's interpreter, the device boundary of every Triton kernel on this CPU-only host,
made to type comparisons as compiled Triton does. Imports neither vLLM nor the project: the
engine process (``offline.py``, beside it) and the unit test bed (``shims``) both call it."""

from __future__ import annotations


def label_comparisons_int1() -> None:
    """Triton's interpreter (3.9) labels a comparison's boolean result with its operands'
    dtype, so a load or store masked by it after a broadcast (``mask & (state >= 0)``) fails
    ("mask has unsupported dtype"); compiled Triton types it int1. vLLM's slot-mapping
    kernel takes that path under decode context parallelism, and the candidate sampler of
    DFlash2 and LiLiCorr (``_selector_walk_kernel``) at every draft. Label boolean results
    int1, as compiled Triton does."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.binary_op, "labels_int1", False):
        return
    real = builder.binary_op

    def binary_op(self, lhs, rhs, op):
        result = real(self, lhs, rhs, op)
        if result.data.dtype == np.bool_ and result.dtype != tl.int1:
            return interpreter.TensorHandle(result.data, tl.int1)
        return result

    binary_op.labels_int1 = True
    builder.binary_op = binary_op


def find_builtins_once() -> None:
    """Triton's interpreter (3.9) rebinds every builtin of ``triton.language`` before each
    launch and finds them anew with ``inspect.getmembers`` each time, about a fifth of what
    a launch costs here. Find each module's builtins once; what is rebound is the same."""
    import inspect

    import triton.language as tl
    from triton.runtime import interpreter

    if getattr(interpreter._patch_builtin, "finds_once", False):
        return
    found: dict[int, list] = {}

    def patch_builtin(pkg, builder, scope) -> None:
        members = found.get(id(pkg))
        if members is None:
            members = [(n, m) for n, m in inspect.getmembers(pkg) if tl.core.is_builtin(m)]
            found[id(pkg)] = members
        for name, member in members:
            interpreter._patch_attr(pkg, name, member, builder, scope)

    patch_builtin.finds_once = True
    patch_builtin.each_launch = interpreter._patch_builtin
    interpreter._patch_builtin = patch_builtin
