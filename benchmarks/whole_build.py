# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Section 5: the whole draft metadata build through vLLM's real path (a DSpark speculator,
vLLM's ``_build_uniform_attn_metadata`` and Triton attention builder), windowed against
vLLM's own build, and the path check's share of it."""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.measure import BLOCK_SIZE, interleaved, listed, markdown_table, timed, windows


def bench_whole_build(rounds: int, iters: int) -> list[dict]:
    import tempfile

    from testbed.shims import apply_cpu_shims
    from testbed.speculators import tiny_model_dir

    apply_cpu_shims()
    context = 32 * 1024
    model_dir = tiny_model_dir(Path(tempfile.mkdtemp()) / "tiny", context + 1024)
    rows = []
    for batch in (1, 64, 256):
        row = whole_build_row(model_dir, batch, context, 2048, rounds, iters)
        rows.append(row)
        print(
            f"  batch {batch:>4}: vLLM {row['plain']:.1f} us, windowed {row['ours']:.1f} us "
            f"(x{row['ours'] / row['plain']:.2f}); path check "
            f"{row['watched'] - row['unwatched']:+.1f} us"
        )
    return rows


def whole_build_row(
    model_dir, batch: int, context: int, window: int, rounds: int, iters: int
) -> dict:
    """vLLM's own DSpark build, the windowed one, and the windowed one without the path check's
    builder watchers, on the same batch."""
    import numpy as np
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor

    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import plugin

    num_spec, q = 3, 4  # K, and the tokens of each request's query
    data, (plain, ours, unwatched) = _dspark_speculators(model_dir, batch, context, window, q)
    desc = BatchExecutionDescriptor(cg_mode=CUDAGraphMode.NONE, num_tokens=batch * q, num_reqs=None)
    bound = torch.from_numpy(data.seq_lens.astype(np.int32) - q)

    def build(speculator):
        return lambda: speculator._build_uniform_attn_metadata(
            batch_desc=desc,
            num_reqs=batch,
            num_query_per_req=q,
            seq_lens_cpu_upper_bound=bound,
            step=q,
        )

    try:
        for speculator in (plain, ours, unwatched):  # first builds: the path check's one check
            timed(build(speculator), iters)
        t_plain, t_ours = interleaved(build(plain), build(ours), rounds, iters)
        t_watched, t_unwatched = interleaved(build(ours), build(unwatched), rounds, iters)
    finally:
        plugin.unregister()
    return {
        "batch": batch,
        "context": context,
        "window": window,
        "num_spec": num_spec,
        "plain": t_plain,
        "ours": t_ours,
        "watched": t_watched,
        "unwatched": t_unwatched,
    }


def _dspark_speculators(model_dir, batch: int, context: int, window: int, q: int):
    """A batch of ``q``-token queries, and three DSpark speculators over it: vLLM's own
    (the plugin unregistered), the windowed one, and the windowed one without the path
    check's builder watchers (the plugin left registered)."""
    import numpy as np

    from testbed.buffers import make_mrv2_batch
    from testbed.speculators import (
        SPECULATOR_CLASSES,
        GroupLayout,
        make_vllm_config,
        wire_speculator,
    )
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import plugin

    lengths = [context - 7 * i for i in range(batch)]
    data = make_mrv2_batch(
        [BLOCK_SIZE], lengths, q, batch, batch, context, np.random.default_rng(0)
    )

    def wired(additional_config):
        config = make_vllm_config(model_dir, context, batch, additional_config)
        layout = [GroupLayout(BLOCK_SIZE)]
        return wire_speculator(
            SPECULATOR_CLASSES["dspark"], data, layout, config, "dspark", q - 1, record=False
        ).speculator

    plugin.unregister()
    plain = wired({})
    plugin.register()
    ours, unwatched = wired({"draft_window_size": window}), wired({"draft_window_size": window})
    for group in unwatched.attn_groups[0]:
        for builder in group.metadata_builders:
            for name in ("build", "build_for_cudagraph_capture", "update_draft_decode_metadata"):
                builder.__dict__.pop(name, None)
    return data, (plain, ours, unwatched)


def whole_build_lines(rows: list[dict]) -> list[str]:
    """Section 5: the whole draft metadata build, and the path check's share."""
    return [
        "## The whole draft metadata build, and the path check's share",
        "",
        "A DSpark speculator's `_build_uniform_attn_metadata` through vLLM's real path and "
        f"Triton attention metadata builder (one KV-cache group of {BLOCK_SIZE}-token blocks, "
        f"W = {windows(rows)}, K = {listed(r['num_spec'] for r in rows)}, "
        f"contexts near {rows[0]['context'] // 1024}k), median microseconds per build, "
        "interleaved. Windowed: the "
        "wrapper (signature bind, view swaps, path name), the refresh, the host bound, and "
        "the path check's builder watchers after their one check; against vLLM's own "
        "build without the plugin. Path check: the same windowed build with the watchers "
        "removed from the builders. On CPU every device op of the refresh runs eagerly "
        "(section 1 measures it alone); the rest of the difference is the wrapper's Python.",
        "",
        *markdown_table(
            ["batch", "vLLM build us", "windowed build us", "ratio", "path check's share us"],
            [
                [
                    str(r["batch"]),
                    *(f"{r[k]:.1f}" for k in ("plain", "ours")),
                    f"{r['ours'] / r['plain']:.2f}",
                    f"{r['watched'] - r['unwatched']:+.1f}",
                ]
                for r in rows
            ],
        ),
        "",
    ]
