# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""`make gpu-check` on CPU: its checks under Triton's interpreter on tiny shapes, the checks
catching a wrong kernel and a wrong window, its graph and measurement code with the device
boundary stood in, and its one-line stop without a GPU (also without vLLM)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tools.gpu_check import checks as gpu_checks
from tools.gpu_check import cli as gpu_check
from tools.gpu_check import measure as gpu_measure
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import fused

# The same code on every vLLM line: run once, in .venv (design/testing.md).
pytestmark = pytest.mark.release_independent

ROOT = Path(__file__).resolve().parent.parent


def rows(out: Path) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip("|").split("|")]
        for line in (out / "gpu.md").read_text().splitlines()
        if line.startswith("| ") and not line.startswith("| part")
    ]


def test_every_check_passes_under_the_interpreter(tmp_path, capsys):
    assert gpu_check.main(["--interpret", "--out", str(tmp_path)]) == 0
    table = rows(tmp_path)
    kernels = [r for r in table if r[0] == "refresh kernel"]
    assert len(kernels) == 9 and all(r[2] == "ok" for r in kernels)
    assert kernels[-1][1:] == ["start-up self-check", "ok", "trusted"]
    (attention,) = [r for r in table if r[0] == "attention"]
    assert attention[2] == "ok" and "max abs error" in attention[3]
    assert (tmp_path / "gpu.md").read_text().startswith("# The draft window on a GPU")
    assert "[gpu-check] passed" in capsys.readouterr().out


def test_a_wrong_kernel_fails_the_command(tmp_path, monkeypatch, capsys):
    real = fused.FusedRefresh.launch

    def off_by_one(self, *args, **kwargs):
        real(self, *args, **kwargs)
        self.cropped_tables[-1][0, 0] += 1

    monkeypatch.setattr(fused.FusedRefresh, "launch", off_by_one)
    assert gpu_check.main(["--interpret", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert (
        "FAILED refresh kernel: batch 1, 300 tokens, blocks [16], sinks 0: decode: group 0 table"
        in out
    )
    # Every kernel check, and the attention read through the kernel's tables.
    assert "[gpu-check] 10 failed" in out


@pytest.mark.parametrize("wrong", ["table", "length"])
def test_a_read_that_leaves_the_window_fails_the_attention_check(wrong, monkeypatch):
    """The window's tables shifted by one column, or its lengths one block longer (within the
    cropped table): the kernel reads other tokens than dense attention over the window."""
    real = fused.FusedRefresh.launch

    def shifted(self, *args, **kwargs):
        real(self, *args, **kwargs)
        if wrong == "table":
            for table in self.cropped_tables:
                table.copy_(torch.roll(table, 1, dims=1))
        else:
            # One block (16 tokens) longer, as far as the cropped table goes: a read past its
            # last column would leave the buffer (under the interpreter, a segfault).
            columns = self.cropped_tables[0].shape[1]
            self.seq_lens_out.add_(16).clamp_(max=columns * 16)

    monkeypatch.setattr(fused.FusedRefresh, "launch", shifted)
    (result,) = gpu_checks.check_attention(torch.device("cpu"), tiny=True)
    assert result.ok is False and "max abs error" in result.detail


class ReplayStandIn:
    """Stand-in for a CUDA graph (no device here): the capture keeps the work, a replay runs
    it again on the same tensors, as the graph replays its kernels."""

    def __call__(self, fn):
        fn()
        return fn


def test_the_graph_check_compares_replays_with_eager_refreshes(monkeypatch):
    # The device boundary: graph capture, allocation counters and sync debug mode.
    monkeypatch.setattr(gpu_checks, "capture", ReplayStandIn())
    monkeypatch.setattr(gpu_checks, "allocations", lambda: 0)
    monkeypatch.setattr(gpu_checks, "sync_errors", gpu_checks.contextmanager(lambda: (yield)))
    results = gpu_checks.check_graphs(torch.device("cpu"), batch=6, context=400, window_size=64)
    assert [r.ok for r in results] == [True, True, True, True]
    assert results[0].detail == "equal to eager, 3 replays"

    # A capture that froze the first lengths is caught.
    def frozen(fn):
        fn()
        snapshot = None

        def replay():
            nonlocal snapshot
            return snapshot

        return replay

    monkeypatch.setattr(gpu_checks, "capture", frozen)
    results = gpu_checks.check_graphs(torch.device("cpu"), batch=6, context=400, window_size=64)
    assert results[0].ok is False and "replay 0: lengths" in results[0].detail


def test_the_measurements_run_and_write_a_plot(tmp_path, monkeypatch):
    # CUDA events stand in as a host timer (no device here; timings mean nothing).
    def host_ms(fn, rounds=2):
        start = time.perf_counter()
        for _ in range(rounds):
            fn()
        return (time.perf_counter() - start) * 1000 / rounds

    monkeypatch.setattr(gpu_measure, "cuda_ms", host_ms)
    monkeypatch.setenv("MRV1_ADAPTER", str(mrv1_file()))
    sizes = gpu_measure.Sizes(
        batches=(1, 3),
        context=512,
        window_size=128,
        contexts=(256, 512),
        attention_batches=(1, 2),
        heads=(4, 2, 32),
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        results = gpu_measure.measure(torch.device("cpu"), sizes)
    refresh = [r for r in results if r.name.startswith("refresh per propose")]
    assert len(refresh) == 8 and all("MRV1 apply" in r.detail for r in refresh)
    attention = [r for r in results if r.name.startswith("draft attention")]
    assert len(attention) == 4 and all("ideal" in r.detail for r in attention)
    gpu_check.write_report(tmp_path, results, torch.device("cpu"))
    assert (tmp_path / "gpu.png").stat().st_size > 0
    assert "![refresh and attention on the GPU](gpu.png)" in (tmp_path / "gpu.md").read_text()


def mrv1_file() -> Path:
    from testbed.mrv1_adapter import (
        MEMBER,
        VLLM_ASCEND_VERSION,
        WHEEL_DIR,
        load_mrv1_adapter_module,
    )

    load_mrv1_adapter_module()  # unpacks the file beside the wheel
    return WHEEL_DIR / f"vllm_ascend-{VLLM_ASCEND_VERSION}" / MEMBER


def test_without_a_gpu_it_stops_with_one_line(capsys):
    assert not torch.cuda.is_available()
    assert gpu_check.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"make gpu-check needs a CUDA GPU: torch.cuda.is_available() is False "
        f"(torch {torch.__version__})."
    ]


def test_make_gpu_check_without_a_gpu_exits_non_zero():
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable}
    result = subprocess.run(
        ["make", "-s", "gpu-check"], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert result.returncode == 2
    assert "make gpu-check needs a CUDA GPU" in result.stderr


def test_make_gpu_check_without_torch_stops_with_one_line():
    """A Python that cannot import torch (here: without its site-packages) is told what to
    install, in one line, with exit code 2, before anything imports torch."""
    env = {"PATH": "/usr/bin:/bin", "PYTHON": f"{sys.executable} -S"}
    result = subprocess.run(
        ["make", "-s", "gpu-check"], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert result.returncode == 2
    # make adds its own "make: *** [...] Error 2" after the command's line.
    ours = [line for line in result.stderr.splitlines() if not line.startswith("make: ***")]
    assert ours == [
        f"make gpu-check needs torch, which {sys.executable} cannot import: install a CUDA "
        f"build of PyTorch (pip install torch), or run it with PYTHON=<a Python that has it>."
    ]
    assert result.stdout == ""


def test_the_kernel_checks_need_no_vllm(tmp_path):
    """On a machine without vLLM the kernels are still checked; the attention part says it
    was skipped."""
    code = (
        "import sys; sys.modules['vllm'] = None; "
        "from tools.gpu_check.cli import main; "
        f"raise SystemExit(main(['--interpret', '--out', {str(tmp_path)!r}]))"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert (
        "--     attention: vLLM unified_attention: skipped: vLLM is not importable" in result.stdout
    )
    assert sum(r[2] == "ok" for r in rows(tmp_path)) == 9
