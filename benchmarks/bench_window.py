# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""`make bench`: what the draft window buys and what it costs, measured side by side in one run.

0. What it is for, end to end in a real vLLM engine on CPU: a draft model and an EAGLE3 head
   trained at 64 tokens, served at contexts up to 16 times it, without the window and with
   it: acceptance by context and output tokens/s as ratios (``benchmarks/long_context.py``).
1. Window cost per build: the device and host work the MRV2 hook adds to one metadata build
   (`DraftWindow.refresh` plus the host bound) against one released MRV1
   `SlidingWindowAdapter.apply`, on identical inputs, interleaved, as a ratio, for batch
   sizes x windows x block-table widths. Not in it: the wrapper's Python overhead per build
   (a signature bind and three attribute swaps), and how often each runs: DFlash/DSpark build
   once per propose on both runners, while an EAGLE propose on MRV2 refreshes once per draft
   step (and for its prefill) where MRV1 applies once (``step_cost.py``, as 2 and 3; what
   the cost sections share: ``measure.py``).
2. Allocations per step after warm-up (torch profiler memory events).
3. Attention sinks: the same per-build work with ``draft_attention_sinks`` against the plain
   window, on identical inputs, interleaved: the extra per-step cost of the sinks. The same
   for ``draft_window_min_context``: the threshold against the plain window, with device
   op counts; and for decode context parallelism: one rank's window (cp 2, 4, 8, interleave
   1) against the same window without DCP, with and without the DCP-local lengths a draft
   prefill adds.
4. The draft's attention cost with and without the window (the reference paged attention),
   next to the ideal ratio (W + a) / L, and with sinks added to the window
   (``attention.py``).
5. The whole draft metadata build through vLLM's real path (a DSpark speculator, vLLM's
   `_build_uniform_attn_metadata` and Triton attention builder), windowed (wrapper, refresh,
   host bound, path check) against vLLM's own build; and the path check's share of it, against
   the same windowed build with the path check's builder watchers removed
   (``whole_build.py``).
6. Device kernel launches and CPU time per propose: MRV1's apply, the MRV2 torch path and
   the fused refresh (one launch per refresh), for DFlash/DSpark and EAGLE at K = 3, 5, 7,
   batch 1 to 1024, against the goals (``launch_cost.py``).
7. End to end in a real vLLM engine on CPU: generate time with a window that never crops
   against none, same acceptance (``benchmarks/engine.py``).
8. ``draft_window_free_kv``: the groups vLLM forms, the blocks a request holds and the
   concurrency, with the key and without, for four target/drafter shapes, with vLLM's own
   functions; and the requests of 1024 tokens the CPU engine runs at once in the same KV
   bytes (``benchmarks/kv_reclaim.py``).

Each section's rows go to benchmarks/results/rows/<section>.json (with the machine and the
date), and the results are written from those files: ``make bench SECTION=attention`` (or
``--section attention``) measures that section again and writes the results with the
other sections' rows as they are.

Results go to benchmarks/results/ as markdown and PNG plots. Timings here are CPU timings
of device-agnostic torch; on an accelerator the same ops launch kernels instead. The run
fixes glibc's mmap threshold (it re-executes itself with ``MALLOC_MMAP_THRESHOLD_`` set):
with the default dynamic threshold, a freed buffer of one size makes the next slightly
larger allocation a fresh mmap with page faults, which timed a read of 2,176 tokens at
twice one of 2,048.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent

from testbed import use_model_info_cache, use_triton_interpreter  # noqa: E402

use_triton_interpreter()  # before vLLM's first import
use_model_info_cache()

from benchmarks import attention, launch_cost, long_context, measure, step_cost, whole_build  # noqa: E402
from benchmarks.engine import bench_engine, engine_lines  # noqa: E402
from benchmarks.kv_reclaim import bench_kv_reclaim, kv_reclaim_lines  # noqa: E402
from testbed.mrv1_adapter import load_mrv1_adapter_module  # noqa: E402


def machine() -> str:
    import vllm

    from tools import cpu_ops

    package = Path(vllm.__file__).parent
    return (
        f"{cpu_ops.cpu_model()} ({platform.machine()}, {os.cpu_count()} cores; torch's CPU "
        f"capability {torch.backends.cpu.get_cpu_capability()}, vLLM's CPU ops "
        f"{cpu_ops.installed_build(package)}), {torch.get_num_threads()} torch threads, "
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"torch {torch.__version__}, vLLM {vllm.__version__}, "
        f"released MRV1 adapter: vllm-ascend 0.26.0rc1, "
        f"MALLOC_MMAP_THRESHOLD_={os.environ.get('MALLOC_MMAP_THRESHOLD_')}"
    )


@dataclass(frozen=True)
class Section:
    """One measurement: what it prints before it runs, and how it measures (its rows)."""

    name: str
    title: str
    measure: Callable[[argparse.Namespace], object]


SECTIONS = (
    Section(
        "long_context",
        f"What the window is for: drafters trained short, served to {long_context.LONGEST}:",
        lambda args: long_context.bench_long_context(args.out),
    ),
    Section(
        "steps",
        "Per-step window cost (MRV2 hook vs released MRV1 adapter):",
        lambda args: step_cost.bench_step_cost(args.mrv1, args.rounds, args.iters),
    ),
    Section(
        "sinks",
        "Attention sinks against the plain window, per build:",
        lambda args: step_cost.bench_sinks_cost(args.rounds, args.iters),
    ),
    Section(
        "threshold",
        "draft_window_min_context against the plain window, per build:",
        lambda args: step_cost.bench_threshold_cost(args.rounds, args.iters),
    ),
    Section(
        "dcp",
        "Decode context parallelism against the same window without it, per build:",
        lambda args: step_cost.bench_dcp_cost(args.rounds, args.iters),
    ),
    Section(
        "attention",
        "Draft attention with and without the window:",
        lambda args: attention.bench_attention(max(args.rounds // 2, 3)),
    ),
    Section(
        "whole_build",
        "Whole draft metadata build through vLLM's real path:",
        lambda args: whole_build.bench_whole_build(args.rounds, args.iters),
    ),
    Section(
        "launches",
        "Device launches and CPU time per propose (MRV1, torch path, fused):",
        lambda args: launch_cost.bench_launches(args.mrv1, args.rounds, args.iters),
    ),
    Section(
        "engine",
        "A real vLLM engine, a window that never crops against none:",
        lambda args: bench_engine(),
    ),
    Section(
        "kv_reclaim",
        "draft_window_free_kv: groups, blocks held and concurrency (vLLM's own functions):",
        lambda args: bench_kv_reclaim(),
    ),
)
BY_NAME = {section.name: section for section in SECTIONS}


def rows_path(out: Path, name: str) -> Path:
    return out / "rows" / f"{name}.json"


def save_rows(out: Path, name: str, rows: object, info: str, started: str) -> None:
    """``rows`` of section ``name``, with the machine and the start of the run (UTC, ISO
    8601) that measured them."""
    path = rows_path(out, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"machine": info, "started": started, "date": started[:10], "rows": _encode(rows)}
    path.write_text(json.dumps(record, indent=1) + "\n")


# JSON has string keys and lists only: a dict with other keys and a tuple are kept as these,
# so the rows read back are the rows measured, types included.
ITEMS, TUPLE = "__items__", "__tuple__"


def _encode(value: object) -> object:
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {k: _encode(v) for k, v in value.items()}
        return {ITEMS: [[_encode(k), _encode(v)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {TUPLE: [_encode(v) for v in value]}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    return value


def _decode(value: object) -> object:
    if isinstance(value, dict):
        if set(value) == {ITEMS}:
            return {_decode(k): _decode(v) for k, v in value[ITEMS]}
        if set(value) == {TUPLE}:
            return tuple(_decode(v) for v in value[TUPLE])
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def load_rows(out: Path) -> dict[str, dict]:
    """Every section's saved record (``machine``, ``date``, ``rows``), by name."""
    records = {}
    for section in SECTIONS:
        record = json.loads(rows_path(out, section.name).read_text())
        records[section.name] = {**record, "rows": _decode(record["rows"])}
    return records


def missing_rows(out: Path, measured: list[str]) -> list[str]:
    """The sections neither measured now nor saved in ``out`` before."""
    return [
        s.name for s in SECTIONS if s.name not in measured and not rows_path(out, s.name).is_file()
    ]


def provenance(records: dict[str, dict]) -> str:
    """The machine and date of the rows: one line when one run measured them all, else each
    run's sections. A record saved before runs were told apart by their start stands for a
    run of its own day."""
    runs: dict[tuple[str, str], list[str]] = {}
    for name, record in records.items():
        run = record.get("started", record["date"])
        runs.setdefault((record["machine"], run), []).append(name)
    if len(runs) == 1:
        (info, run), _ = next(iter(runs.items()))
        return f"Machine: {info}. Written by `make bench` ({run[:10]})."
    parts = [f"{', '.join(names)}: {info} ({run})" for (info, run), names in runs.items()]
    return "Measured in more than one run (`make bench SECTION=...`): " + "; ".join(parts) + "."


def write_results(out: Path, records: dict[str, dict]) -> None:
    rows = {name: record["rows"] for name, record in records.items()}
    steps, attention_rows, studies = rows["steps"], rows["attention"], rows["long_context"]
    out.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Draft window benchmarks",
        "",
        provenance(records),
        "",
        *long_context.long_context_lines(studies),
        f"Sections below: block size {measure.BLOCK_SIZE}.",
        "",
        *step_cost.step_lines(steps),
        *step_cost.sinks_lines(rows["sinks"]),
        *step_cost.threshold_lines(rows["threshold"]),
        *step_cost.dcp_lines(rows["dcp"]),
        *attention.attention_lines(attention_rows),
        *whole_build.whole_build_lines(rows["whole_build"]),
        *launch_cost.launch_lines(rows["launches"]),
        *engine_lines(rows["engine"]),
        *kv_reclaim_lines(rows["kv_reclaim"]),
        "Not measured here: device allocations and host syncs on an accelerator (no GPU or "
        "NPU was available; on CUDA, `torch.cuda.memory_stats` and "
        "`torch.cuda.set_sync_debug_mode` would count them), and the cost of running the "
        "EAGLE draft prefill without FULL graphs when the window is on (graphs need an "
        "accelerator).",
        "",
        "![per-step cost](window_cost.png)",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines))
    plot(out / "window_cost.png", steps, attention_rows)
    long_context.plot(out / "long_context.png", studies)


def plot(path: Path, steps: list[dict], attention_rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for context in sorted({r["context"] for r in steps}):
        for w in sorted({r["window"] for r in steps}):
            rs = [r for r in steps if r["context"] == context and r["window"] == w]
            left.plot(
                [r["batch"] for r in rs],
                [r["ratio"] for r in rs],
                marker="o",
                label=f"{context // 1024}k, W={w}",
            )
    left.axhline(1.0, color="gray", linestyle="--")
    left.set_xscale("log", base=2)
    left.set_xlabel("batch size")
    left.set_ylabel("per-step cost, MRV2 / MRV1")
    left.set_title("Window cost per step (lower is better)")
    left.legend(fontsize=7, ncol=3)
    xs = [r["context"] // 1024 for r in attention_rows]
    right.plot(xs, [r["ratio"] for r in attention_rows], marker="o", label="measured")
    right.plot(
        xs, [r["ideal"] for r in attention_rows], marker="x", linestyle="--", label="(W + a) / L"
    )
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xlabel("context (k tokens)")
    right.set_ylabel("draft attention time, window / full")
    right.set_title(f"Draft attention with W = {measure.windows(attention_rows)}")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# 1 GiB: every buffer here comes from the heap, none from a per-call mmap.
MMAP_THRESHOLD = str(1 << 30)


def main() -> None:
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") != MMAP_THRESHOLD:
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD}
        # Run again as this module (python -m benchmarks.bench_window, from the checkout).
        os.chdir(ROOT)
        os.execve(sys.executable, [sys.executable, "-m", __spec__.name, *sys.argv[1:]], env)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds per point")
    parser.add_argument("--iters", type=int, default=30, help="calls per round")
    parser.add_argument(
        "--section",
        action="append",
        choices=list(BY_NAME),
        help="measure only this section (repeatable); the others' rows are read as saved",
    )
    args = parser.parse_args()
    sections = [BY_NAME[name] for name in args.section] if args.section else list(SECTIONS)
    missing = missing_rows(args.out, [s.name for s in sections])
    if missing:
        parser.error(
            f"--section: {args.out / 'rows'} has no saved rows of {', '.join(missing)}; "
            "run make bench (every section) once first, or name those sections too"
        )
    torch.set_num_threads(1)
    args.mrv1 = load_mrv1_adapter_module()
    info, started = machine(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for section in sections:
        print(section.title)
        save_rows(args.out, section.name, section.measure(args), info, started)
    records = load_rows(args.out)
    write_results(args.out, records)
    print(
        f"Wrote {args.out / 'README.md'}, {args.out / 'long_context.png'} and "
        f"{args.out / 'window_cost.png'}"
    )
    # The report says each failed check where it measured it; the run fails on any.
    failed = studies_failures(records["long_context"]["rows"])
    if failed:
        raise SystemExit("make bench: the studies' checks failed:\n" + "\n".join(failed))


def studies_failures(studies: dict) -> list[str]:
    reports = {**long_context.greedy_reports(studies), **long_context.sampled_reports(studies)}
    failed = long_context.failed_checks(reports)
    dflash = studies["dflash"]
    if dflash["identical"] < dflash["total"]:
        failed.append(
            f"DFlash: {dflash['identical']} of {dflash['total']} greedy texts the target's alone"
        )
    return failed


if __name__ == "__main__":
    main()
