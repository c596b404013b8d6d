# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""End-to-end check of the draft window with `vllm serve` on Ascend NPUs (or CUDA GPUs),
measured with vLLM's own benchmark tools (`vllm bench sweep serve`, `vllm bench serve`).

    make e2e-ascend                   # default scenario: Qwen3-8B + EAGLE3, W=512, TP=2
    make e2e-ascend DRY_RUN=1         # write the parameter files, print the commands to paste
    E2E_SCENARIO=dspark make e2e-ascend
    DEVICE=cuda make e2e-ascend       # the same harness on vLLM's CUDA V2 runner
    DEVICE=cuda E2E_SCENARIO=tiny make e2e-ascend   # the committed tiny models, downloads nothing
    SINKS=64 make e2e-ascend          # V2 with the window and 64 attention sinks
    STUDY=long make e2e-ascend        # acceptance and throughput by context (``study``)
    STUDY=long MIN_CONTEXT=8192 make e2e-ascend   # the window engaged from 8k contexts on
    DCP=2 make e2e-ascend             # every run with decode context parallelism over 2 ranks
    DCP=4 DCP_INTERLEAVE=16 make e2e-ascend       # ... and cp_kv_cache_interleave_size 16
    make study-cpu                    # the study here, on CPU: the committed tiny models
    python -m e2e --help              # every setting's flag (the Makefile passes SINKS=64
                                      # as --sinks 64)

For each run of the scenario (V2 runner with the window, V2 without it, V1 runner with the
window) ``vllm bench sweep serve`` starts `vllm serve` and sends three workloads with ``vllm
bench serve`` (``sweep_plan``; planned in ``scenarios``, run in ``harness``): the golden
prompt (longer than W, the upstream MRV1 end-to-end test's), seven more long prompts and two
short ones, greedy; ``vllm bench serve`` reads the spec-decode counters around each. The
harness then asserts: greedy outputs identical across runs (the target decides the output;
on a device at least MIN_IDENTICAL of them: ``lossless``), every run's acceptance by
position with K entries, V2 with the window at least V2 without it minus 0.1 on the long
prompts (the acceptance checked within the run), per-position acceptance of V2 with the
window on the golden prompt within 0.1 of the golden file where one was recorded under the
run's conditions (device, runner, sampling, EOS, graphs, dtype, block size: written beside
it; one recorded with the run's sampling under other conditions is its floor, V2 with the
window failing below half its tokens per draft, so that a drafter broken on every runner
fails: the committed one, vllm-ascend Model Runner V1's greedy figure, is each greedy run's;
one sampled otherwise the report shows as a reference; a greedy run no golden bounds fails
under 0.5 tokens per draft there), and V2 with the window at least V1
with the window minus 0.05 on the long prompts; and writes a JSON and markdown report (with
what produced it) and a plot of acceptance by position. Every setting is checked against
every other before anything runs or is deleted; a run clears its own folder (run.json marks
it) after every check has passed, and a dry run never deletes results. Each printed sweep
fails where vLLM's fails (pipefail) and stops where its experiment folder exists (pasted
again); ``--check`` tells a log of another paste, or stale results, from a window that did
not engage.
Model locations come from TARGET_MODEL and DRAFT_MODEL (local paths
work with no network). With SINKS, the V2 run with the window also keeps that many attention
sinks (its golden file is one of its own); V1 has no sinks, so its run keeps the plain window
as the floor to compare with. MIN_CONTEXT sets draft_window_min_context on the V2 run with
the window the same way (V1 windows every context). DCP=N serves every run (V2 with and
without the window, V1: the same parallelism for the comparison) with
--decode-context-parallel-size N, and DCP_INTERLEAVE=I with --cp-kv-cache-interleave-size I.
vLLM shards the KV over the tensor-parallel ranks, so TP must be a multiple of N: a
scenario's own TP is raised to the smallest multiple, a TP set by hand that is not one stops
the harness. Under DCP the window aligns to N blocks (one on each rank), so the draft reads
up to W + N b - 1 tokens: the run has a golden file of its own (``_dcpN``). STUDY=long does
not take DCP (its golden files and draft KV estimates are for one rank's layout).

DEVICE=cpu runs the long-context study only, in this project's ``.venv`` (``make
study-cpu``): vLLM's CPU worker in the engine environment of
``tools/cpu_engine.py``, the committed tiny models (``trained_models/``:
``draft_model`` and ``eagle3`` scenarios) and their held-out text (rebuilt from .venv's vLLM:
``make heldout``), contexts from inside the drafter's training context to 16 times it.
"""
