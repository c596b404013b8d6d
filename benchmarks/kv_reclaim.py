# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""`make bench`, section 8: what ``draft_window_free_kv`` gives back, with vLLM's own functions.

For four target and drafter shapes as served on an accelerator (bf16, 8 KV heads of 128,
blocks of 16, W = 2048: a 36-layer target with a one-layer EAGLE3 head, a 3-layer DSpark
draft or a 5-layer DFlash draft, and a 64-layer target with a 28-layer draft model) and the
CPU engine's (a 2-layer target and 2-layer draft model, float32, blocks of 32, W = 33), with
and without the key: vLLM's grouping of the model's KV-cache specs
(``get_global_kv_cache_groups``; with the key the draft's full-attention layers are a
``SlidingWindowSpec`` of N = W + a - b tokens, planned by the package itself), the device
bytes the extra groups' block tables take against the draft KV freed per request, the
blocks one request holds at 32k and 128k tokens (4k and 1k on the CPU shape)
through vLLM's ``KVCacheManager`` (a prefill in chunks of 8192, then 8 speculative decode
steps), in GiB; the concurrency vLLM reports for that many tokens per request
(``get_max_concurrency_for_kv_cache_config``, its "Maximum concurrency" line) and the
steady one (the pool over the blocks a request holds), in a 60 GiB pool (1 GiB on the CPU
shape); and whether the key serves the shape or refuses it, and why. Then the real CPU
engine: the requests of 1024 tokens it runs at once in the same KV bytes with the key and
without it (``tests/test_engine_load.py``'s admission runs).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from benchmarks.measure import markdown_table
from testbed import kv_manager
from testbed.kv_manager import Shape
from testbed.shims import apply_cpu_shims
from testbed.speculators import make_vllm_config, tiny_model_dir
from testbed.vllm_line import get_block_table_width
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import free_kv

ROOT = Path(__file__).resolve().parent.parent
GIB = 1 << 30
MIB = 1 << 20
# (shape, W, contexts, pool bytes)
SHAPES = (
    (Shape("36-layer target + EAGLE3 (1 layer)", 36, 1), 2048, (32768, 131072), 60 * GIB),
    (Shape("36-layer target + DSpark (3 layers)", 36, 3), 2048, (32768, 131072), 60 * GIB),
    (Shape("36-layer target + DFlash (5 layers)", 36, 5), 2048, (32768, 131072), 60 * GIB),
    (Shape("64-layer target + draft model (28 layers)", 64, 28), 2048, (32768, 131072), 60 * GIB),
    (
        Shape(
            "CPU engine: 2-layer target + draft model (2 layers)", 2, 2, 32, 4, 32, torch.float32
        ),
        33,
        (1024, 4096),
        GIB,
    ),
)


def held_bytes(vllm_config, specs, context: int, k: int = 7) -> int:
    """The bytes one request holds at ``context`` tokens, through vLLM's manager."""
    served = vllm_config_for(vllm_config, 2 * context)
    one = kv_manager.kv_cache_config(served, specs, 4 * context * _bytes_per_token(specs))
    kv = kv_manager.manager(served, one, 2 * context)
    block = max(g.kv_cache_spec.block_size for g in one.kv_cache_groups)
    req = kv_manager.request("r", [1 + i % 1000 for i in range(context)], block)
    assert kv_manager.prefill(kv, req, 8192, k) and kv_manager.decode(kv, req, 8, k, 2)
    return sum(kv_manager.held(kv, "r")) * block_bytes(one)


def block_bytes(config) -> int:
    """The memory one block id holds, in whichever group it serves: a page of each layer of
    a group (vLLM's groups are equal in size, padded where the layers do not divide)."""
    layers = max(len(group.layer_names) for group in config.kv_cache_groups)
    return layers * config.kv_cache_groups[0].kv_cache_spec.page_size_bytes


def _bytes_per_token(specs) -> int:
    return int(sum(spec.page_size_bytes / spec.block_size for spec in specs.values()))


def row(vllm_config, shape: Shape, window: int, contexts, pool: int) -> dict:
    whole = shape.specs()
    # The package's own planning (N = W + a - b in the block size vLLM's grouping gives the
    # draft), and its verdict: served, or the refusal's reason.
    freed, found = free_kv.free_draft_kv(
        vllm_config,
        whole,
        shape.draft_names,
        window,
        table_width=get_block_table_width,
        refuse=False,
    )
    why = found.refusal()
    verdict = "served" if why is None else f"refused: {why}"
    result = {"shape": shape.name, "groups": found.groups, "padding": found.padding_layers}
    result["share"] = found.draft_share
    result["verdict"] = verdict
    result["tables"] = (found.table_bytes, found.kv_bytes_freed)
    for label, specs in (("today", whole), ("freed", freed)):
        config = kv_manager.kv_cache_config(vllm_config, specs, pool)
        per_block = block_bytes(config)
        for context in contexts:
            held = held_bytes(vllm_config, specs, context)
            long = vllm_config_for(vllm_config, context)
            result[label, context] = {
                "gib": held / GIB,
                "reported": kv_manager.max_concurrency(long, config),
                "steady": config.num_blocks * per_block / held,
            }
    return result


def vllm_config_for(vllm_config, context: int):
    """The config with ``max_model_len`` the context, which vLLM's report is for."""
    import copy

    probe = copy.copy(vllm_config)
    probe.model_config = copy.copy(vllm_config.model_config)
    probe.model_config.max_model_len = context
    return probe


def bench_kv_reclaim() -> dict:
    # vLLM's config needs a platform, which the shims give a CPU-only host (run alone too).
    apply_cpu_shims()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = tiny_model_dir(Path(tmp), max_position_embeddings=1 << 18)
        vllm_config = make_vllm_config(model_dir, 131072, 256, {})
        rows = [row(vllm_config, *entry) for entry in SHAPES]
    return {"rows": rows, "engine": engine_admission()}


def engine_admission() -> dict:
    """The CPU engine's admission runs of tests/test_engine_load.py (their plan:
    testbed/engine/load_plan.py): four requests of 1024 tokens, KV bytes for one with the
    draft's whole KV, with the key and without."""
    import trained_models as trained
    from testbed.engine.load_plan import ADMISSION, FREE_KV, WINDOW, long_requests, speculative
    from testbed.engine.runs import LOAD, engine_script

    models = trained.committed()
    draft = speculative("draft_model", models.draft_model)
    long = {f"1024 tokens ({k})": ids for k, ids in enumerate(long_requests(models))}
    runs = [("whole", WINDOW), ("freed", FREE_KV)]
    plan = {
        "target": models.target,
        "max_model_len": trained.TARGET_CONTEXT,
        "block_size": 32,
        "requests": long,
        "abort": None,
        "abort_after": 1,
        "max_tokens": 48,
        "runs": [
            {"name": n, "speculative_config": draft, "additional_config": w, "engine": ADMISSION}
            for n, w in runs
        ],
    }
    with tempfile.TemporaryDirectory() as tmp:
        done = engine_script(LOAD, plan, Path(tmp))
    found = {name: done.results[name] for name, _ in runs}
    # What the engines ran, for the report's words.
    lengths = sorted({len(ids) for ids in long.values()})
    return {
        **found,
        "window": WINDOW["draft_window_size"],
        "requests": len(long),
        "lengths": lengths,
    }


def kv_reclaim_lines(found: dict) -> list[str]:
    lines = [
        "## The draft's KV beyond the window freed (`draft_window_free_kv`)",
        "",
        __doc__.split("\n\n", 1)[1].strip().replace("\n", " "),
        "",
    ]
    cells = []
    for r in found["rows"]:
        contexts = sorted(key[1] for key in r if isinstance(key, tuple) and key[0] == "today")
        for context in contexts:
            today, freed = r["today", context], r["freed", context]
            cells.append(
                [
                    r["shape"],
                    f"{r['groups']} ({r['padding']}), {r['share']:.1%}",
                    f"{r['tables'][0] / MIB:.2f} / {r['tables'][1] / MIB:.2f}",
                    r["verdict"],
                    str(context),
                    *(f"{today[k]:.2f} -> {freed[k]:.2f}" for k in ("gib", "reported")),
                    f"{today['steady']:.2f} -> {freed['steady']:.2f} "
                    f"(x{freed['steady'] / today['steady']:.3f})",
                ]
            )
    heads = [
        "shape",
        "with the key: groups (padding layers), draft share",
        "extra groups' block tables / draft KV freed per request at max_model_len, MiB",
        *("key", "context", "GiB per request, today -> freed"),
        *("reported concurrency, today -> freed", "steady concurrency, today -> freed (x)"),
    ]
    lines += markdown_table(heads, cells, "llllrlll")
    engine = found["engine"]
    whole, freed = engine["whole"], engine["freed"]
    same = "the same" if whole["tokens"] == freed["tokens"] else "DIFFERENT"
    preempted = [r["counters"]["vllm:num_preemptions"] for r in (whole, freed)]
    requests, lengths = engine["requests"], " or ".join(map(str, engine["lengths"]))
    lines += [
        "",
        f"The real CPU engine (the draft model trained here, W = {engine['window']}, {requests} "
        f"requests of {lengths} tokens in KV bytes for one with the draft's whole KV): at most "
        f"{whole['most_running']} "
        f"running at once without the key, {freed['most_running']} with it "
        f"(vLLM's `vllm:num_requests_running`); preemptions {preempted[0]} -> {preempted[1]}; "
        f"tokens {same}.",
        "",
    ]
    return lines
