# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The long-context study of the end-to-end harness, as far as it runs without NPUs: its
plan per context, its prompts and their token counts, its metrics arithmetic from recorded
metrics text, its checks, its report and its refusal without NPUs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "e2e"))

import study  # noqa: E402

import e2e  # noqa: E402

# The same code on every vLLM line: run once, in .venv (design/testing.md).
pytestmark = pytest.mark.release_independent

STUDY_ENV = (
    *("E2E_SCENARIO", "DEVICE", "DRY_RUN", "TARGET_MODEL", "DRAFT_MODEL", "TP", "SINKS"),
    *("MIN_CONTEXT", "DCP", "DCP_INTERLEAVE", "WINDOW"),
    *("STUDY", "MAX_CONTEXT", "PROMPTS_PER_CONTEXT", "OUTPUT_TOKENS", "BLOCK_SIZE"),
    *("CONTEXTS", "STUDY_TEXT", "LONG_CONTEXT", "SHORT_CONTEXT", "PARALLEL", "MAX_MODEL_LEN"),
    *("NO_SPECULATION", "AUTO", "MORE_WINDOWS"),
)


@pytest.fixture(scope="module")
def text():
    return study.corpus()


def dry_run(capsys, monkeypatch, **env):
    for key in STUDY_ENV:
        monkeypatch.delenv(key, raising=False)
    for key, value in {"STUDY": "long", "DRY_RUN": "1", **env}.items():
        monkeypatch.setenv(key, value)
    assert e2e.main([]) == 0
    return capsys.readouterr().out.splitlines()


def test_the_plan_serves_each_run_once_and_sends_every_context_its_prompts(capsys, monkeypatch):
    lines = dry_run(capsys, monkeypatch)
    assert "contexts [4096, 8192, 16384, 32768]; 3 prompts each, 256 output tokens" in lines[1]
    serves = [line for line in lines if " serve " in line]
    # Without speculation (the reference), V2 with the window, V2 without, V1 with the window.
    assert len(serves) == 4
    assert all("--max-model-len 33024" in line for line in serves)
    assert "--speculative-config" not in serves[0] and "--additional-config" not in serves[0]
    assert """--additional-config '{"draft_window_size": 512}'""" in serves[1]
    assert "--speculative-config" in serves[2] and "--additional-config" not in serves[2]
    assert serves[3].startswith("VLLM_USE_V2_MODEL_RUNNER=0 ")
    requests = [line for line in lines if "/v1/chat/completions" in line]
    assert len(requests) == 4 * 4 * 3
    for ctx in (4096, 8192, 16384, 32768):
        assert sum(f"# context {ctx}: a prompt of" in line for line in requests) == 12
        assert sum(f"context {ctx}" in line and "/metrics" in line for line in lines) == 8
    assert sum("kill -INT" in line for line in lines) == 4


def test_min_context_goes_to_the_v2_window_run_and_sinks_are_a_run_of_their_own(
    capsys, monkeypatch
):
    lines = dry_run(capsys, monkeypatch, MIN_CONTEXT="8192", SINKS="64", NO_SPECULATION="0")
    serves = [line for line in lines if " serve " in line]
    assert len(serves) == 4
    assert (
        """--additional-config '{"draft_window_size": 512, "draft_window_min_context": 8192}'"""
    ) in serves[0]
    assert "--additional-config" not in serves[1]
    assert (
        """--additional-config '{"draft_window_size": 512, "draft_attention_sinks": 64}'"""
    ) in serves[2]
    # V1 windows every context and has no sinks: its run keeps the plain window.
    assert """--additional-config '{"draft_window_size": 512}'""" in serves[3]
    assert study.golden_path(ROOT, "eagle3", 512, 8192).name == "study_eagle3_w512_m8192.json"


def test_auto_and_more_windows_are_runs_of_their_own(capsys, monkeypatch):
    lines = dry_run(capsys, monkeypatch, AUTO="1", MORE_WINDOWS="1024,4096", DEVICE="cuda")
    serves = [line for line in lines if " serve " in line]
    assert len(serves) == 6
    assert """--additional-config '{"draft_window_size": "auto"}'""" in serves[3]
    assert """--additional-config '{"draft_window_size": 1024}'""" in serves[4]
    assert """--additional-config '{"draft_window_size": 4096}'""" in serves[5]
    for bad in ("0", "a,1"):
        for key in STUDY_ENV:
            monkeypatch.delenv(key, raising=False)
        monkeypatch.setenv("STUDY", "long")
        monkeypatch.setenv("MORE_WINDOWS", bad)
        with pytest.raises(SystemExit):
            e2e.main(["--dry-run"])
        assert f"MORE_WINDOWS must be positive token counts, comma-separated; got {bad!r}" in (
            capsys.readouterr().err
        )


def test_the_plan_reaches_128k_where_the_model_allows_and_cuda_has_no_v1_run(capsys, monkeypatch):
    lines = dry_run(
        capsys,
        monkeypatch,
        MAX_CONTEXT="140000",
        DEVICE="cuda",
        E2E_SCENARIO="dspark",
        PROMPTS_PER_CONTEXT="2",
    )
    assert "contexts [4096, 8192, 16384, 32768, 65536, 131072]; 2 prompts each" in lines[1]
    serves = [line for line in lines if " serve " in line]
    assert len(serves) == 3 and all("--max-model-len 131328" in line for line in serves)
    assert any("context 131072: a prompt of 130976 tokens" in line for line in lines)


def test_the_study_needs_real_models(capsys, monkeypatch):
    for key in STUDY_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("STUDY", "long")
    with pytest.raises(SystemExit) as info:
        e2e.main(["--dry-run", "--device", "cuda", "--scenario", "tiny"])
    assert info.value.code == 2 and "needs a real target" in capsys.readouterr().err


def test_estimated_prompts_fill_their_context_with_distinct_natural_text(text):
    counter = study.TokenCounter()
    prompts = study.build_prompts(8192, 3, counter, text)
    budget = 8192 - study.TEMPLATE_MARGIN
    assert [p.tokens for p in prompts] == [budget] * 3
    assert len({p.text for p in prompts}) == 3
    for p, question in zip(prompts, study.QUESTIONS, strict=False):
        assert p.text.endswith("\n\n" + question)
        # The estimate rounds up: the text fills its last estimated token.
        assert (budget - 1) * study.CHARS_PER_TOKEN < len(p.text) <= budget * study.CHARS_PER_TOKEN
    assert "The with statement" in text or "with_stmt" in text  # the language reference


def test_a_local_target_tokenizer_counts_the_tokens(tmp_path, text):
    """A real BPE tokenizer, trained here and saved as a local model directory."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["[UNK]"])
    bpe.train_from_iterator([text[:200_000]], trainer)
    PreTrainedTokenizerFast(tokenizer_object=bpe).save_pretrained(tmp_path)
    counter = study.TokenCounter.for_target(str(tmp_path))
    assert counter.source == f"the target's tokenizer ({tmp_path})"
    (prompt,) = study.build_prompts(4096, 1, counter, text)
    budget = 4096 - study.TEMPLATE_MARGIN
    assert prompt.tokens == len(bpe.encode(prompt.text).ids)
    assert budget - 8 <= prompt.tokens <= budget
    # A target that is not a local directory falls back to the estimate.
    assert study.TokenCounter.for_target("Qwen/Qwen3-8B").encode is None


# What vLLM's /metrics shows (prometheus text), before and after one context's prompts.
METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="0"}} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="1"}} {p1}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="2"}} {p2}
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",model_name="m"}} {tokens}
# TYPE vllm:request_decode_time_seconds histogram
vllm:request_decode_time_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {n}
vllm:request_decode_time_seconds_count{{engine="0",model_name="m"}} {n}
vllm:request_decode_time_seconds_sum{{engine="0",model_name="m"}} {decode}
vllm:request_time_per_output_token_seconds_count{{engine="0",model_name="m"}} {n}
vllm:request_time_per_output_token_seconds_sum{{engine="0",model_name="m"}} {tpot}
"""


def metrics(drafts, p, tokens, n, decode, tpot):
    return METRICS.format(
        drafts=drafts, p0=p[0], p1=p[1], p2=p[2], tokens=tokens, n=n, decode=decode, tpot=tpot
    )


def test_context_metrics_come_from_the_deltas_of_two_scrapes():
    before = metrics(10.0, (5.0, 2.0, 1.0), 100.0, 2, 3.0, 0.05)
    after = metrics(210.0, (145.0, 82.0, 41.0), 868.0, 5, 6.84, 0.074)
    got = study.context_metrics(before, after, 3)
    assert got["drafts"] == 200 and got["per_position"] == pytest.approx([0.7, 0.4, 0.2])
    assert got["mean_length"] == pytest.approx(2.3)
    assert got["output_tokens"] == 768
    # 768 tokens of 3 requests, 3 of them from their prefills: 765 decoded in 3.84 s.
    assert got["decode_tokens_per_s"] == pytest.approx(765 / 3.84)
    assert got["tpot_ms"] == pytest.approx(8.0)  # 24 ms over 3 requests
    with pytest.raises(RuntimeError, match="no speculative drafts"):
        study.context_metrics(before, before, 3)


@pytest.mark.parametrize(
    ("context", "window", "sinks"),
    [
        (32768, 512, 0),
        (32768, 512, 64),
        (4096, 2048, 0),
        (300, 512, 0),
        (1000, 512, 200),
    ],
)
def test_the_draft_kv_read_is_the_longest_read_of_any_context_up_to_it(context, window, sinks):
    """Against the window's own length arithmetic over every context up to `context`."""
    from vllm_ascend.worker.v2.spec_decode.draft_window.window import (
        WindowSpec,
        align_sinks,
        window_seq_lens,
    )

    spec = WindowSpec(window, 128, align_sinks(sinks, 128))
    lengths = torch.arange(1, context + 1, dtype=torch.int32)
    reads = torch.empty_like(lengths)
    window_seq_lens(lengths, spec, skip_out=torch.empty_like(lengths), out=reads)
    assert study.draft_kv_read(context, window, sinks, 128) == int(reads.max())
    assert study.draft_kv_read(context, None, sinks, 128) == context


@pytest.mark.parametrize(
    ("context", "min_context"),
    [(8000, 8192), (8192, 8192), (9000, 8192), (32768, 8192), (4096, 300)],
)
def test_the_draft_kv_read_with_a_threshold(context, min_context):
    """Below the threshold the whole context (what the window's arithmetic reads there);
    from it on, the plain window's bound (300 <= S + W + a: no threshold)."""
    from vllm_ascend.worker.v2.spec_decode.draft_window.window import WindowSpec, window_seq_lens

    read = study.draft_kv_read(context, 512, 0, 128, min_context)
    if context < min_context and min_context == 8192:
        spec = WindowSpec(512, 128, 0, min_context)
        length = torch.tensor([context], dtype=torch.int32)
        out = torch.empty_like(length)
        window_seq_lens(length, spec, skip_out=torch.empty_like(length), out=out)
        assert read == int(out[0]) == context
    else:
        assert read == study.draft_kv_read(context, 512, 0, 128) == min(context, 639)


def run(outputs, lengths):
    return {
        "outputs": outputs,
        "contexts": {str(c): {"mean_length": m} for c, m in lengths.items()},
    }


def test_checks_flag_every_rule():
    on = run(["a"], {4096: 3.0, 32768: 2.5, 65536: 2.4})
    off = run(["a"], {4096: 3.05, 32768: 1.2, 65536: 1.1})
    v1 = run(["a"], {4096: 3.0, 32768: 2.48, 65536: 2.4})
    golden = {"4096": 3.0, "32768": 2.5, "65536": 2.4}
    assert study.check({"v2_window": on, "v2_no_window": off, "v1_window": v1}, golden, 0.15) == []
    bad_on = run(["a"], {4096: 2.8, 32768: 1.0, 65536: 2.4})
    bad_off = run(["b"], {4096: 3.05, 32768: 1.2, 65536: 1.1})
    failures = study.check(
        {"v2_window": bad_on, "v2_no_window": bad_off, "v1_window": v1}, golden, 0.15
    )
    assert "greedy outputs of v2_no_window differ from v2_window" in failures
    assert any(
        f.startswith("4096: acceptance with the window 2.800 is not within 0.1") for f in failures
    )
    assert any(
        f.startswith("32768: acceptance with the window 1.000 < without 1.200") for f in failures
    )
    assert any(
        f.startswith("32768: V2 with the window 1.000 is not within 0.05 of V1") for f in failures
    )
    assert any(f.startswith("32768: mean acceptance length 1.000, golden 2.500") for f in failures)


def test_checks_below_the_threshold_compare_with_the_window_off():
    on = run(["a"], {4096: 3.0, 16384: 2.0, 32768: 2.5})
    off = run(["a"], {4096: 3.05, 16384: 2.5, 32768: 1.2})
    v1 = run(["a"], {4096: 2.0, 16384: 2.0, 32768: 2.5})  # V1 windows every context
    assert study.check({"v2_window": on, "v2_no_window": off}, None, 0.15) == []
    failures = study.check(
        {"v2_window": on, "v2_no_window": off, "v1_window": v1}, None, 0.15, 20000
    )
    assert failures == [
        "16384: below draft_window_min_context=20000, acceptance with the window "
        "2.000 is not within 0.1 of without 2.500"
    ]


def test_the_report_marks_which_contexts_engage_the_window(tmp_path):
    results = {name: {"outputs": ["a"], "contexts": {}} for name in ("v2_window", "v2_no_window")}
    for name in results:
        for ctx in (4096, 32768):
            results[name]["contexts"][str(ctx)] = {
                "mean_length": 2.0,
                "per_position": [1.0],
                "decode_tokens_per_s": None,
                "client_tokens_per_s": 10.0,
                "tpot_ms": None,
                "draft_kv_read": study.draft_kv_read(
                    ctx, 512 if name == "v2_window" else None, 0, 128, 8192
                ),
            }
    meta = {
        "scenario": "dspark",
        "device": "ascend",
        "window": 512,
        "sinks": 0,
        "min_context": 8192,
        "contexts": [4096, 32768],
        "prompts_per_context": 1,
        "output_tokens": 16,
        "token_counts": "estimate",
    }
    study.write_report(tmp_path, meta, results, [])
    md = (tmp_path / "report.md").read_text()
    assert md.startswith(
        "# Long-context study: dspark on ascend, W = 512, draft_window_min_context 8192\n"
    )
    assert "| 4096 | no | v2_window | 2.000 | 100.0% | 1.00 | - | - | 10.0 | 4096 |" in md
    assert "| 32768 | yes | v2_window | 2.000 | 100.0% | 1.00 | - | - | 10.0 | 639 |" in md
    assert json.loads((tmp_path / "report.json").read_text())["min_context"] == 8192


def test_the_report_is_written_from_recorded_metrics(tmp_path):
    contexts = [4096, 32768]
    results = {}
    for name, lengths in (("v2_window", (3.0, 2.5)), ("v2_no_window", (3.0, 1.2))):
        results[name] = {"outputs": ["a"], "contexts": {}}
        for ctx, mean in zip(contexts, lengths, strict=True):
            before = metrics(0, (0, 0, 0), 0, 0, 0, 0)
            m = study.context_metrics(
                before, metrics(100, ((mean - 1) * 100, 0, 0), 500, 2, 2.5, 0.02), 3
            )
            m["draft_kv_read"] = study.draft_kv_read(
                ctx, 512 if name == "v2_window" else None, 0, 128
            )
            results[name]["contexts"][str(ctx)] = m
    meta = {
        "scenario": "eagle3",
        "device": "ascend",
        "window": 512,
        "sinks": 0,
        "contexts": contexts,
        "prompts_per_context": 3,
        "output_tokens": 256,
        "token_counts": "estimate: 4 characters per token",
    }
    study.write_report(tmp_path, meta, results, [])
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["runs"]["v2_window"]["contexts"]["32768"]["mean_length"] == pytest.approx(2.5)
    md = (tmp_path / "report.md").read_text()
    # 500 tokens of 2 requests, 498 decoded in 2.5 s.
    assert (
        "| 32768 | yes | v2_window | 2.500 | 50.0% | 1.50, 0.00, 0.00 | 199.2 | 10.00 | - | 639 |"
        in md
    )
    assert (
        "| 32768 | yes | v2_no_window | 1.200 | 6.7% | 0.20, 0.00, 0.00 | 199.2 | 10.00 | - "
        "| 32768 |"
    ) in md
    assert "vllm-ascend #12103" in md and "Failures: none" in md
    assert (tmp_path / "study.png").stat().st_size > 0


def test_a_missing_study_golden_stops_before_any_server_starts(tmp_path, monkeypatch):
    scenario = e2e.scenarios({"WINDOW": "640"})["eagle3"]
    monkeypatch.setattr(e2e, "install", lambda device: pytest.fail("installed before the check"))
    settings = study.Settings([4096], 1, 16, 128)
    with pytest.raises(SystemExit, match=r"study_eagle3_w640\.json: run once with RECORD_GOLDEN=1"):
        e2e.run_study(scenario, "ascend", 1, tmp_path, settings, study.TokenCounter(), False)


def test_without_npus_the_study_stops_at_once_with_exit_code_2():
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "STUDY": "long"}
    result = subprocess.run(
        ["make", "-s", "e2e-ascend"], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert result.returncode == 2
    assert "needs Ascend NPUs: npu-smi not found" in result.stderr


def test_every_drafting_method_has_a_scenario(capsys, monkeypatch):
    for name, method in (
        ("eagle3", "eagle3"),
        ("dspark", "dspark"),
        ("dflash", "dflash"),
        ("draft_model", "draft_model"),
    ):
        lines = dry_run(capsys, monkeypatch, E2E_SCENARIO=name, DEVICE="cuda")
        serves = [line for line in lines if " serve " in line]
        # Every run but the one without speculation drafts with the scenario's method.
        assert "--speculative-config" not in serves[0]
        assert all(f'"method": "{method}"' in line for line in serves[1:])


def test_a_real_run_counts_with_the_served_targets_tokenizer(text):
    """vLLM's /tokenize, as the harness calls it (here answered by a stand-in that splits
    on whitespace)."""
    asked = []

    def http(url, body):
        asked.append((url, body["model"], body["add_special_tokens"]))
        return json.dumps({"tokens": body["prompt"].split(), "count": len(body["prompt"].split())})

    counter = study.TokenCounter.remote(http, "http://127.0.0.1:1", "m")
    (prompt,) = study.build_prompts(4096, 1, counter, text)
    assert prompt.tokens == len(prompt.text.split()) <= 4096 - study.TEMPLATE_MARGIN
    assert asked[0] == ("http://127.0.0.1:1/tokenize", "m", False)
    assert counter.source == "the served target's tokenizer (http://127.0.0.1:1/tokenize)"


def test_the_cpu_study_serves_the_trained_models_on_vllms_cpu_worker(capsys, monkeypatch):
    """DEVICE=cpu: the models make trained-models wrote, the test bed's engine environment,
    the held-out text cut to each context exactly, plain completions."""
    from tests.testbed.engine import trained

    lines = dry_run(capsys, monkeypatch, DEVICE="cpu", AUTO="1")
    assert lines[0] == f"# check: {e2e.PLUGIN_MODULE} imports (make installed this project)"
    assert "contexts [32, 64, 128, 256, 512, 1024]; 8 prompts each, 16 output tokens" in lines[1]
    assert f"the target's tokenizer ({e2e.TRAINED_ROOT / 'target'})" in lines[1]
    serves = [line for line in lines if " serve " in line]
    assert [("--speculative-config" in s, "--additional-config" in s) for s in serves] == [
        (False, False),
        (True, True),
        (True, False),
        (True, True),
    ]
    for serve in serves:
        # What the server's environment adds to this one's (which has Triton's interpreter on).
        assert "VLLM_TARGET_DEVICE=cpu" in serve
        assert f"serve {e2e.TRAINED_ROOT / 'target'} " in serve
        assert "--max-model-len 1040" in serve and "--block-size 32" in serve
        assert "--dtype float32" in serve and "--max-num-seqs 8" in serve
    assert f'"model": "{e2e.TRAINED_ROOT / "eagle3"}"' in serves[1]
    # The window auto picks for a head declaring 64 tokens with blocks of 32: 64 - 32 + 1.
    assert """--additional-config '{"draft_window_size": 33}'""" in serves[1]
    assert """--additional-config '{"draft_window_size": "auto"}'""" in serves[3]
    requests = [line for line in lines if "/v1/completions" in line]
    assert len(requests) == 4 * 6 * 8 and not any("chat" in line for line in lines)
    for ctx in (32, 1024):
        assert sum(f"context {ctx}: a prompt of {ctx} tokens," in r for r in requests) == 32
    assert trained.DRAFT_CONTEXT == 64


def test_the_cpu_study_runs_the_study_only(capsys, monkeypatch):
    for key in STUDY_ENV:
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(SystemExit) as info:
        e2e.main(["--dry-run", "--device", "cpu"])
    assert info.value.code == 2 and "DEVICE=cpu runs the long-context study only" in (
        capsys.readouterr().err
    )


def test_held_out_prompts_are_plain_stretches_of_exactly_their_context():
    from tests.testbed.engine.trained import TrainedModels

    models = TrainedModels(e2e.TRAINED_ROOT)
    text = models.heldout.read_text(encoding="utf-8")
    counter = study.TokenCounter.for_target(models.target)
    prompts = study.build_prompts(512, 4, counter, text, with_question=False)
    assert [p.tokens for p in prompts] == [512] * 4
    assert all(len(p.text.encode()) == 512 and p.text in text for p in prompts)


def test_checks_compare_every_output_with_the_run_without_speculation_and_take_the_drafters_scale():
    alone = run(["a"], {32: None, 512: None})
    on = run(["a"], {32: 3.8, 512: 3.2})
    off = run(["a"], {32: 3.8, 512: 1.7})
    results = {"no_speculation": alone, "v2_window": on, "v2_no_window": off}
    assert study.check(results, None, 0.15, 0, long_from=512, short_to=32) == []
    worse = {**results, "v2_window": run(["b"], {32: 3.5, 512: 1.5})}
    assert study.check(worse, None, 0.15, 0, long_from=512, short_to=32) == [
        "greedy outputs of v2_window differ from no_speculation",
        "32: acceptance with the window 3.500 is not within 0.1 of without 3.800",
        "512: acceptance with the window 1.500 < without 1.700",
    ]
