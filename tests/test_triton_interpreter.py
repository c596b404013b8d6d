# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Triton's interpreter as the test bed sets it up: what a launch rebinds when each module's
builtins are found once is what Triton rebinds when it finds them at every launch, and a
kernel's integer arithmetic gives the same results without the overflow checks Triton drops
unless ``debug`` is on, and a kernel calling device functions rebinds once per launch what
Triton rebinds at every call, with the same results."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

from testbed.engine.triton_interpreter import (
    drop_overflow_checks_unless_debug,
    find_builtins_once,
    patch_device_calls_once,
)


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


@triton.jit
def _int32_arithmetic(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, (x * 65599 + x) - (x * 7) * x + 2_000_000_000, mask)


def _run_int32_arithmetic(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    _int32_arithmetic[(1,)](x, out, x.numel(), BLOCK=64)
    return out


@pytest.fixture
def interpreter_options():
    builder = interpreter.interpreter_builder
    saved = builder.options
    yield builder
    builder.options = saved


def test_without_debug_the_overflow_checks_go_and_the_results_stay(interpreter_options):
    builder = interpreter_options
    builder.options = interpreter.InterpreterOptions()  # Triton's own: checked, not debug
    assert builder.options.sanitize_overflow and not builder.options.debug
    # Values whose products wrap around 32 bits, as a compiled kernel wraps them.
    x = torch.arange(-32, 32, dtype=torch.int32) * 40_000
    checked = _run_int32_arithmetic(x)
    drop_overflow_checks_unless_debug()
    assert not builder.options.sanitize_overflow
    assert torch.equal(_run_int32_arithmetic(x), checked)
    wrapped = (x.long() * 65599 + x.long()) - (x.long() * 7) * x.long() + 2_000_000_000
    assert torch.equal(checked, ((wrapped + 2**31) % 2**32 - 2**31).to(torch.int32))


def test_with_debug_the_overflow_checks_stay(interpreter_options):
    builder = interpreter_options
    builder.options = dataclasses.replace(interpreter.InterpreterOptions(), debug=True)
    drop_overflow_checks_unless_debug()
    assert builder.options.sanitize_overflow


@triton.jit
def _scaled(x, scale):
    return x * scale + tl.full(x.shape, 1, x.dtype)


@triton.jit
def _with_device_calls(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, _scaled(_scaled(x, 3), pid + 1), mask)


def _run_with_device_calls(x: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(x)
    _with_device_calls[(triton.cdiv(x.numel(), 8),)](x, out, x.numel(), BLOCK=8)
    return out


def test_device_calls_rebind_once_per_launch_with_the_same_results(monkeypatch):
    x = torch.arange(-20, 20, dtype=torch.int32)
    load = tl.load
    calls = []
    tritons = interpreter._patch_lang
    tritons = getattr(tritons, "each_call", tritons)

    def counted(fn):
        calls.append(fn.__name__)
        return tritons(fn)

    monkeypatch.setattr(interpreter, "_patch_lang", counted)
    expected = _run_with_device_calls(x)
    # Triton's own: the launch, then each program's two device calls, each rebinding again.
    assert calls == ["_with_device_calls"] + ["_scaled"] * 2 * 5
    assert tl.load is load
    calls.clear()
    patch_device_calls_once()
    assert torch.equal(_run_with_device_calls(x), expected)
    assert calls == ["_with_device_calls"]
    assert tl.load is load  # restored after the launch, as Triton restores it
    x_expected = ((x * 3 + 1) * (torch.arange(40) // 8 + 1) + 1).to(torch.int32)
    assert torch.equal(expected, x_expected)
    assert torch.equal(_run_with_device_calls(x), expected)  # and again, a second launch
