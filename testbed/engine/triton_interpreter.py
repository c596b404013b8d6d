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


def drop_overflow_checks_unless_debug() -> None:
    """Triton's interpreter (3.9) checks every 32-bit integer add, sub and mul for overflow
    in 64 bits (``sanitize_overflow``, on by default) and then drops the check unless
    ``debug`` is on (``device_assert`` returns first), as compiled Triton drops it: about a
    quarter of what vLLM's kernels cost here, for nothing. Without ``debug``, do not compute
    it; the results are the same."""
    import dataclasses

    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    if not builder.options.debug and builder.options.sanitize_overflow:
        builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)


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


def patch_device_calls_once() -> None:
    """Triton's interpreter (3.9) rebinds ``triton.language`` again at every call of a
    ``@triton.jit`` function from inside a kernel, once per program of the grid, and never
    restores that rebinding (the launch restores what it rebound itself): what the kernel's
    launch rebound already holds. Rebind at a device call only what the launch has not (a
    function that sees a ``triton.language`` module the kernel does not)."""
    import triton.language as tl
    from triton.runtime import interpreter

    if getattr(interpreter._patch_lang, "once_per_launch", False):
        return
    each_call = interpreter._patch_lang
    rebound: list[set[int]] = []  # the language modules of each launch in progress

    def modules(fn) -> set[int]:
        return {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}

    def patch_lang(fn):
        seen = modules(fn)
        if rebound and seen <= rebound[-1]:
            return interpreter._LangPatchScope()  # nothing to restore
        scope = each_call(fn)
        if rebound:  # a device call seeing another module: Triton's own, kept as it is
            return scope
        rebound.append(seen)
        restore = scope.restore

        def restore_and_end() -> None:
            rebound.pop()
            restore()

        scope.restore = restore_and_end
        return scope

    patch_lang.once_per_launch = True
    patch_lang.each_call = each_call
    interpreter._patch_lang = patch_lang


def set_up_interpreter() -> None:
    """All of the above, once per process, before the first launch."""
    label_comparisons_int1()
    find_builtins_once()
    drop_overflow_checks_unless_debug()
    patch_device_calls_once()
