# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""`make gpu-check`: the window's kernels checked, and measured, on a CUDA GPU.

    python -m tools.gpu_check [--out DIR] [--quick]   (from the repository root)

1. Correctness: the one-launch refresh (``overlay/fused.py``) compiled by Triton for the GPU, bit
   for bit against the torch path, over a grid of shapes (batch 1-1024, tables up to 128k
   tokens at blocks of 16 and 128, one and two groups, sinks, actual lengths, draft prefill
   chunks, padded rows), and the start-up self-check's verdict; vLLM's
   ``unified_attention`` (bf16, 32 query / 8 KV heads of 128) over windowed metadata equal
   to dense attention over exactly the window.
2. Graph safety: the refresh captured in a CUDA graph and replayed with new lengths and
   tables equals eager; no allocation during replay; no host sync in the refresh.
3. Measurements with CUDA events: draft attention windowed against full, and the refresh
   per propose (fused, torch path, the released MRV1 adapter where its file is given).

Writes ``gpu.md`` (and ``gpu.png`` with matplotlib) into ``--out``. Needs torch and Triton;
vLLM only for the attention parts (``VLLM_PY``: a directory to import vLLM's Python files
from), the MRV1 adapter only for its timing (``MRV1_ADAPTER``: its ``spec_decode/utils.py``).
``--interpret`` runs the checks on CPU under Triton's interpreter on tiny shapes (how the CPU
tests cover this command); it measures nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

from tools.gpu_check.checks import (
    Result,
    check_attention,
    check_graphs,
    check_kernels,
)

DEFAULT_OUT = Path("benchmarks") / "results"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where gpu.md goes")
    parser.add_argument("--quick", action="store_true", help="a smaller grid, no timings")
    parser.add_argument(
        "--interpret",
        action="store_true",
        help="CPU, Triton's interpreter, tiny shapes (for tests)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.interpret:
        from testbed import use_triton_interpreter

        use_triton_interpreter()  # before Triton's and vLLM's first import
    import torch

    if not args.interpret and not torch.cuda.is_available():
        print(
            "make gpu-check needs a CUDA GPU: torch.cuda.is_available() is False "
            f"(torch {torch.__version__}).",
            file=sys.stderr,
        )
        return 2
    if os.environ.get("VLLM_PY"):
        sys.path.insert(0, os.environ["VLLM_PY"])
    device = torch.device("cpu" if args.interpret else "cuda")
    tiny = args.interpret
    results = check_kernels(device, tiny, args.quick)
    results += check_attention(device, tiny)
    if device.type == "cuda":
        results += check_graphs(device)
        if not args.quick:
            from tools.gpu_check.measure import measure

            results += measure(device)
    write_report(args.out, results, device)
    failed = [r for r in results if r.ok is False]
    for r in results:
        mark = {True: "ok", False: "FAILED", None: "--"}[r.ok]
        print(f"[gpu-check] {mark:6} {r.section}: {r.name}: {r.detail}")
    print(
        f"[gpu-check] {'passed' if not failed else f'{len(failed)} failed'}; report in "
        f"{args.out / 'gpu.md'}"
    )
    return 1 if failed else 0


def write_report(out: Path, results: list[Result], device) -> None:
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    machine = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"CPU ({platform.machine()}), Triton's interpreter"
    )
    lines = [
        "# The draft window on a GPU (`make gpu-check`)",
        "",
        f"Machine: {machine}; torch {torch.__version__}, Triton {triton_version}, "
        f"Python {platform.python_version()}.",
        "",
        "| part | check | result | detail |",
        "|---|---|---|---|",
    ]
    for r in results:
        mark = {True: "ok", False: "FAILED", None: "-"}[r.ok]
        lines.append(f"| {r.section} | {r.name} | {mark} | {r.detail} |")
    out.mkdir(parents=True, exist_ok=True)
    if plot(out / "gpu.png", [r.values for r in results if r.values]):
        lines += ["", "![refresh and attention on the GPU](gpu.png)"]
    (out / "gpu.md").write_text("\n".join(lines) + "\n")


def plot(path: Path, values: list[dict]) -> bool:
    """Refresh time per propose against batch, and attention window/full against context."""
    try:
        import matplotlib
    except ImportError:
        return False
    if not values:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    refresh = [v for v in values if "k" in v]
    for k in sorted({v["k"] for v in refresh}):
        for key, style in (("fused_us", "-"), ("torch_us", "--")):
            rows = [v for v in refresh if v["k"] == k]
            left.plot(
                [v["batch"] for v in rows],
                [v[key] for v in rows],
                style,
                marker="o",
                label=f"K={k} {key[:-3]}",
            )
    attention = [v for v in values if "ratio" in v]
    for batch in sorted({v["batch"] for v in attention}):
        rows = [v for v in attention if v["batch"] == batch]
        right.plot(
            [v["context"] for v in rows],
            [v["ratio"] for v in rows],
            marker="o",
            label=f"batch {batch}",
        )
    if attention:
        rows = [v for v in attention if v["batch"] == attention[0]["batch"]]
        right.plot([v["context"] for v in rows], [v["ideal"] for v in rows], "k:", label="ideal")
    for ax, title in ((left, "refresh per propose (us)"), (right, "attention window / full")):
        ax.set_xscale("log", base=2)
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


if __name__ == "__main__":
    raise SystemExit(main())
