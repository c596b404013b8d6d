# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Triton's interpreter as the test bed sets it up: what a launch rebinds when each module's
builtins are found once is what Triton rebinds when it finds them at every launch."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.runtime import interpreter

from testbed.engine.triton_interpreter import find_builtins_once


@triton.jit
def _add_one(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(x_ptr + offsets, tl.math.exp(tl.load(x_ptr + offsets, mask=mask) * 0.0) + 1, mask)


def _is_rebinding(member: object) -> bool:
    return getattr(member, "__qualname__", "") == "_patch_attr.<locals>.<lambda>"


def rebound(patch_builtin) -> list[tuple[int, str, object]]:
    """What one launch of ``_add_one`` rebinds with this ``_patch_builtin``: each object,
    name and the member it held (or "rebound": a name of ``triton.language`` that is also one
    of ``triton.language.core`` is rebound twice); restored afterwards."""
    before = interpreter._patch_builtin
    interpreter._patch_builtin = patch_builtin
    try:
        scope = interpreter._patch_lang(_add_one.fn)
    finally:
        interpreter._patch_builtin = before
    changes = [
        (id(obj), name, "rebound" if _is_rebinding(original) else original)
        for obj, name, original in scope._changes
    ]
    scope.restore()
    return changes


def test_a_launch_rebinds_what_triton_rebinds_and_restores_it():
    find_builtins_once()
    each_launch = interpreter._patch_builtin.each_launch
    load = tl.load
    triton_own = rebound(each_launch)
    for _ in range(2):  # found on the first launch, reused on the second
        assert rebound(interpreter._patch_builtin) == triton_own
    assert len(triton_own) > 100
    assert tl.load is load and tl.core.is_builtin(tl.load)
