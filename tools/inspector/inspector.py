# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Window inspector: what the draft window does to a batch, through vLLM's real build path.

    python -m tools.inspector [--window 2048] ...

Runs a batch through vLLM 0.33.0's real Model Runner V2 draft metadata build on CPU
(DSpark: its one query pass; EAGLE3: a draft decode step), with the window on and off, and
prints per request the window start, the windowed length, the blocks and KV bytes the
draft reads against the full context, whether the window engaged (with --min-context, a
shorter context reads whole), and the checks it ran: slot mappings identical with and
without the window, and the reference paged attention through the windowed metadata equal
to dense attention over exactly the window (and the attention sinks, with --sinks). With
--dcp N (decode context parallelism, ``dcp.py``): every rank's build, and per rank the
tokens it reads of the window and of the context. Then, unless --no-serve, what the window
is for: a draft trained at a short context, served by a real vLLM engine at contexts up to
16 times it, with the window off and on (``served.py``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from tools.inspector.common import (
    CHECK_HEAD_DIM,
    CHECK_HEADS,
    DEFAULT_METHODS,
    METHODS,
    REQUEST_COLUMNS,
    draft_metadata,
    kv_cells,
    kv_columns,
    query_len,
    request_cells,
    show_window_lines,
    text_table,
    title,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.config import (
    KEY,
    MIN_CONTEXT_KEY,
    SINKS_KEY,
    DraftWindowConfig,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.window import ceil_div

DEFAULT_SEQ_LENS = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from tools.inspector import dcp as inspector_dcp

    parser = argparse.ArgumentParser(
        prog="python -m tools.inspector",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--window", default="2048", help=f"{KEY} (default 2048)")
    parser.add_argument(
        "--sinks", default="0", help=f"{SINKS_KEY}: first tokens kept besides the window"
    )
    parser.add_argument(
        "--min-context",
        default="0",
        help=f"{MIN_CONTEXT_KEY}: the context from which the window engages (0: every one)",
    )
    parser.add_argument(
        "--block-sizes", default="128", help="block size of each draft KV group, comma-separated"
    )
    parser.add_argument(
        "--seq-lens",
        default=",".join(map(str, DEFAULT_SEQ_LENS)),
        help="context length of each request, comma-separated",
    )
    parser.add_argument(
        "--method",
        action="append",
        choices=METHODS,
        help="speculative method; repeat for several (default: dspark and eagle3)",
    )
    parser.add_argument("--num-spec-tokens", type=int, default=3)
    parser.add_argument("--draft-layers", type=int, default=1, help="draft attention layers")
    parser.add_argument("--kv-heads", type=int, default=8, help="draft KV heads")
    parser.add_argument("--head-dim", type=int, default=128, help="draft head dimension")
    parser.add_argument("--dtype-bytes", type=int, default=2, help="bytes per KV element")
    parser.add_argument("--plot", type=Path, help="write a PNG of the blocks each side reads")
    parser.add_argument(
        "--no-serve",
        action="store_true",
        help="skip serving a tiny model with a real vLLM engine after the tables",
    )
    inspector_dcp.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        config = DraftWindowConfig.from_additional_config(
            {
                KEY: args.window,
                SINKS_KEY: args.sinks,
                MIN_CONTEXT_KEY: args.min_context,
            }
        )
        if config.draft_window_size is None:
            raise ValueError(f"--window: {KEY} must be set to inspect a window")
        args.window, args.sinks = config.draft_window_size, config.draft_attention_sinks
        args.min_context = config.draft_window_min_context
        args.block_sizes = _positive_ints("--block-sizes", args.block_sizes)
        args.seq_lens = _positive_ints("--seq-lens", args.seq_lens)
        inspector_dcp.check_arguments(args)
        for name in ("num_spec_tokens", "draft_layers", "kv_heads", "head_dim", "dtype_bytes"):
            if getattr(args, name) < 1:
                raise ValueError(
                    f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}"
                )
        if args.window < args.num_spec_tokens + 1:
            raise ValueError(
                f"--window {args.window} is smaller than the draft's query "
                f"stretch of {args.num_spec_tokens + 1} tokens"
            )
    except ValueError as error:
        parser.error(str(error))
    args.method = args.method or DEFAULT_METHODS
    return args


def _positive_ints(flag: str, text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(
            f"{flag} must be comma-separated positive integers, got {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise ValueError(f"{flag} must be comma-separated positive integers, got {text!r}")
    return values


def inspect_method(args, method: str, model_dir: Path) -> list[dict]:
    """Build the draft metadata with the window on and off; check it; one row a request."""
    from testbed.buffers import make_mrv2_batch

    query = query_len(method, args.num_spec_tokens)
    seq_lens = [length + query for length in args.seq_lens]
    max_model_len = ceil_div(max(seq_lens) + args.num_spec_tokens + 1, 1024) * 1024
    rng = np.random.default_rng(0)
    n = len(seq_lens)
    batch = make_mrv2_batch(
        args.block_sizes,
        seq_lens,
        query,
        n,
        n,
        max_model_len,
        rng,
        lookahead_tokens=args.num_spec_tokens,
    )
    windowed = _build(args, method, model_dir, batch, max_model_len, args.window)
    plain = _build(args, method, model_dir, batch, max_model_len, None)
    return [
        _request_row(args, batch, windowed, plain, i, length, query)
        for i, length in enumerate(batch.seq_lens.tolist())
    ]


def _build(args, method: str, model_dir: Path, batch, max_model_len: int, window: int | None):
    """One speculator wired to ``batch`` through the real build: (wired, metadata)."""
    from testbed.speculators import (
        SPECULATOR_CLASSES,
        GroupLayout,
        make_speculative_vllm_config,
        make_vllm_config,
        wire_speculator,
    )

    n, k_spec = len(args.seq_lens), args.num_spec_tokens
    query = query_len(method, k_spec)
    additional = {}
    if window:
        additional = {KEY: window, SINKS_KEY: args.sinks, MIN_CONTEXT_KEY: args.min_context}
    if method == "draft_model":
        # Its speculator reads its speculative config when it builds (the draft's KV dtype).
        config = make_speculative_vllm_config(model_dir, additional, max_model_len, method)
        config.scheduler_config.max_num_seqs = n
    else:
        config = make_vllm_config(model_dir, max_model_len, n, additional)
    # An EAGLE decode step reads its own buffers, laid out one token per request.
    draft_buffers = batch.input_buffers if query == 1 else None
    layouts = [GroupLayout(b) for b in args.block_sizes]
    wired = wire_speculator(
        SPECULATOR_CLASSES[method],
        batch,
        layouts,
        config,
        method,
        k_spec,
        draft_input_buffers=draft_buffers,
    )
    return wired, draft_metadata(wired.speculator, batch, n, query)


def _request_row(args, batch, windowed, plain, i: int, length: int, query: int) -> dict:
    """Request ``i``'s row: what it reads with the window, and whether every check holds."""
    from testbed.reference import positions_read

    (windowed_wired, windowed_metadata), (plain_wired, plain_metadata) = windowed, plain
    spec = windowed_wired.speculator.draft_window.spec
    positions, qsl = batch.input_buffers.positions, batch.query_start_loc_np
    engaged = length >= spec.min_context
    checks = []
    for g, b in enumerate(args.block_sizes):
        name = f"draft.{g}"
        # Slots stay absolute: each query token's slot is its block (in the request's
        # full block list) times b plus its offset, window on or off.
        ids = batch.req_block_ids[g][i]
        truth = [ids[int(p) // b] * b + int(p) % b for p in positions[qsl[i] : qsl[i + 1]]]
        for wired in (windowed_wired, plain_wired):
            slots = wired.received[g][-1].slot_mapping[qsl[i] : qsl[i + 1]]
            checks.append(slots.tolist() == truth)
        read = int(windowed_metadata[name].seq_lens[i])
        # What the read covers: the sinks, then [start, L); everything if nothing is
        # left out.
        start, kept = positions_read(length, read, spec.sink_size)
        # Below the threshold the whole context; from it the window's own bounds:
        # block-aligned start, at least min(L, S + W) tokens, at most S + W + a - 1
        # (DFlash/DSpark: the query stretch is within W).
        checks.append(start % spec.alignment == 0)
        if engaged:
            checks.append(min(length, spec.sink_size + args.window) <= read < spec.reach)
        else:
            checks.append(read == length)
        table = windowed_metadata[name].block_table[i]
        checks.append(_reference_check(batch, g, b, i, length, start, spec, kept, query, table))
        checks.append(int(plain_metadata[name].seq_lens[i]) == length)
    b0 = args.block_sizes[0]
    per_token = 2 * args.draft_layers * args.kv_heads * args.head_dim * args.dtype_bytes
    return {
        "context": length - query,
        "seq_len": length,
        "start": start,
        "windowed": read,
        "blocks": ceil_div(read, b0) if read else 0,
        "full_blocks": ceil_div(length, b0),
        "kv_bytes": read * per_token,
        "full_kv_bytes": length * per_token,
        "ok": all(checks),
        "alignment": spec.alignment,
        "sinks": spec.sink_size,
        "engaged": engaged,
        "min_context": spec.min_context,
    }


def _reference_check(batch, g, b, i, length, start, spec, kept, query, table) -> bool:
    """Reference paged attention through the windowed table equals dense attention over
    exactly the sinks and [start, length), and reads only their blocks."""
    import torch

    from testbed.reference import PagedKVCache, dense_attention

    gen = torch.Generator().manual_seed(i)
    shape = (length, CHECK_HEADS, CHECK_HEAD_DIM)
    k = torch.randn(shape, generator=gen, dtype=torch.float64)
    v = torch.randn(shape, generator=gen, dtype=torch.float64)
    ids = batch.req_block_ids[g][i]
    cache = PagedKVCache(max(ids) + 1, b, CHECK_HEADS, CHECK_HEAD_DIM)
    cache.write(torch.tensor(ids, dtype=torch.int32), torch.arange(length), k, v)
    q = k[length - query : length]
    got, touched = cache.read(q, table, len(kept))
    expected = dense_attention(q, k, v, start, length, spec.sink_size)
    return bool(torch.allclose(got, expected)) and touched == {ids[p // b] for p in kept.tolist()}


def print_table(method: str, args, rows: list[dict]) -> None:
    mib = 1 << 20
    sinks = rows[0]["sinks"]
    print(f"{title(method, args, rows)}; blocks of {args.block_sizes[0]} tokens")
    columns = [*REQUEST_COLUMNS, *kv_columns("blocks", "KV MiB read")]
    print("\n".join(text_table(columns, [[*request_cells(r), *kv_cells(r)] for r in rows])))
    total = sum(r["kv_bytes"] for r in rows), sum(r["full_kv_bytes"] for r in rows)
    print(
        f"batch: the draft reads {total[0] / mib:.1f} MiB of KV instead of "
        f"{total[1] / mib:.1f} MiB ({total[1] / max(total[0], 1):.1f}x less). Checks: slot "
        f"mappings absolute with and without the window; window start block-aligned, length "
        f"between min(L, S + W) and S + W + a - 1 (S: sinks, {sinks} here), or the whole "
        f"context where the window is not engaged; reference paged attention through the "
        f"windowed metadata equals dense attention over the sinks and the window."
    )


def plot(path: Path, method: str, args, rows: list[dict]) -> None:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b = args.block_sizes[0]
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.5))
    sliver = max(r["full_blocks"] for r in rows) / 150
    for y, r in enumerate(rows):
        ax.barh(
            y,
            r["full_blocks"],
            height=0.7,
            color="#c8d6e5",
            label="target reads" if y == 0 else None,
        )
        # Blocks the draft reads: the sinks (when the window has left them), the window.
        sink_blocks = r["sinks"] // b if r["start"] > r["sinks"] else 0
        if sink_blocks:
            # At least a sliver wide, so that one sink block shows beside 1,000 others.
            ax.barh(
                y,
                max(sink_blocks, sliver),
                height=0.7,
                color="#5f27cd",
                label="draft reads (sinks)" if y == len(rows) - 1 else None,
            )
        ax.barh(
            y,
            r["blocks"] - sink_blocks,
            left=r["start"] // b,
            height=0.7,
            color="#ee5253",
            label="draft reads" if y == 0 else None,
        )
        ax.text(r["full_blocks"], y, f"  {r['blocks']}/{r['full_blocks']}", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [f"{r['context']:,}" for r in rows])
    ax.set_xlim(0, max(r["full_blocks"] for r in rows) * 1.12)
    ax.set_xlabel(f"KV block index ({b} tokens each)")
    ax.set_ylabel("context (tokens)")
    sinks = f", {SINKS_KEY}={args.sinks}" if args.sinks else ""
    ax.set_title(f"{method}, {KEY}={args.window}{sinks}: blocks each side reads per request")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from testbed import use_model_info_cache, use_triton_interpreter
    from tools.inspector import served

    use_triton_interpreter()  # before vLLM's first import, in tables()
    use_model_info_cache()
    # The study's first seconds (its checks, vLLM's dataset cutter) take one core: they run
    # beside the tables.
    study = None if args.no_serve else served.start_study()
    try:
        failed = not tables(args)
    except BaseException:
        if study is not None:
            study.stop()
        raise
    if study is not None:
        failed |= not served.finish_study(study)
    return 1 if failed else 0


def tables(args: argparse.Namespace) -> bool:
    """The inspector's tables (and ``--plot``); False where a check failed."""
    from testbed.shims import apply_cpu_shims

    show_window_lines()
    apply_cpu_shims()

    from testbed.speculators import tiny_model_dir
    from tools.inspector import dcp as inspector_dcp
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import plugin

    plugin.register()
    # With --dcp N, every rank's build (dcp.py).
    inspect, show = (
        (inspector_dcp.inspect_method, inspector_dcp.print_table)
        if args.dcp > 1
        else (inspect_method, print_table)
    )
    ok = True
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = tiny_model_dir(Path(tmp), max_position_embeddings=1 << 22)
        for method in args.method:
            print(
                f"Checking {method}: {len(args.seq_lens)} requests of "
                f"{min(args.seq_lens)}-{max(args.seq_lens)} tokens through vLLM's draft "
                "metadata build, window on and off ...",
                file=sys.stderr,
                flush=True,
            )
            results.append((method, inspect(args, method, model_dir)))
    for method, rows in results:
        show(method, args, rows)
        ok &= all(r["ok"] for r in rows)
    if args.plot:
        plot(args.plot, results[0][0], args, results[0][1])
    return ok


if __name__ == "__main__":
    raise SystemExit(main())
