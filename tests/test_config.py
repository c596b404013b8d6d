# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""`draft_window_size`, `draft_attention_sinks` and `draft_window_min_context` validation,
and what each speculator does with them at start-up."""

import re
from types import SimpleNamespace

import numpy as np
import pytest
from vllm.v1.worker.gpu.spec_decode.gemma4.speculator import Gemma4Speculator
from vllm.v1.worker.gpu.spec_decode.multi_module_mtp.speculator import (
    MultiModuleMTPSpeculator,
)

from testbed.buffers import make_mrv2_batch
from testbed.speculators import (
    SPECULATOR_CLASSES,
    GroupLayout,
    make_vllm_config,
    wire_speculator,
)
from testbed.vllm_line import RELEASE
from vllm_ascend.worker.v2.spec_decode.draft_window.config import DraftWindowConfig
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import plugin

MAX_MODEL_LEN = 1024
ONE_GROUP = (GroupLayout(16),)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (1, 1),
        (4096, 4096),
        ("4096", 4096),
        (" 512 ", 512),
        (2048.0, 2048),
        ("auto", "auto"),
    ],
)
def test_accepted_values(value, expected):
    config = DraftWindowConfig.from_additional_config({"draft_window_size": value})
    assert config.draft_window_size == expected
    assert config.enabled == (expected is not None)


@pytest.mark.parametrize("additional_config", [None, {}, {"other_key": 1}])
def test_absent_key_is_off(additional_config):
    assert not DraftWindowConfig.from_additional_config(additional_config).enabled


@pytest.mark.parametrize("value", [0, -4, True, False, 4.5, "abc", "", "1e3", [64], {"w": 1}])
def test_rejected_values_name_the_key_the_value_and_what_is_allowed(value):
    with pytest.raises(ValueError) as info:
        DraftWindowConfig.from_additional_config({"draft_window_size": value})
    message = str(info.value)
    assert 'additional_config["draft_window_size"]' in message
    assert repr(value) in message
    assert "positive integer" in message and "null" in message
    assert '"auto" to size it from the training context the draft checkpoint declares' in message


def test_auto_is_the_one_word_and_sizes_from_the_draft_checkpoint():
    config = DraftWindowConfig.from_additional_config({"draft_window_size": "auto"})
    assert config.enabled and config.auto
    assert not DraftWindowConfig.from_additional_config({"draft_window_size": 512}).auto


@pytest.mark.parametrize("value", ["Auto", "AUTO", "auto ", " auto", "automatic", "on"])
def test_anything_but_auto_exactly_is_refused_naming_the_key_the_value_and_the_fix(value):
    with pytest.raises(ValueError) as info:
        DraftWindowConfig.from_additional_config({"draft_window_size": value})
    assert str(info.value) == (
        'additional_config["draft_window_size"] must be a positive integer number of tokens '
        '(an integral string such as "4096" is accepted), "auto" to size it from the training '
        "context the draft checkpoint declares, or null to turn the draft window off; got "
        f"{value!r} (str)"
    )


@pytest.mark.parametrize(
    ("key", "value"), [("draft_attention_sinks", 64), ("draft_window_min_context", 8192)]
)
def test_auto_takes_sinks_and_a_threshold_as_a_number_does(key, value):
    config = DraftWindowConfig.from_additional_config({"draft_window_size": "auto", key: value})
    assert config.draft_window_size == "auto" and getattr(config, key) == value


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, 0),
        (0, 0),
        (1, 1),
        (64, 64),
        ("64", 64),
        (" 16 ", 16),
        (32.0, 32),
    ],
)
def test_accepted_sinks(value, expected):
    config = DraftWindowConfig.from_additional_config(
        {"draft_window_size": 512, "draft_attention_sinks": value}
    )
    assert config.draft_attention_sinks == expected and config.draft_window_size == 512


def test_sinks_default_to_zero():
    assert (
        DraftWindowConfig.from_additional_config({"draft_window_size": 512}).draft_attention_sinks
        == 0
    )


@pytest.mark.parametrize("value", [-1, True, False, 4.5, "abc", "", [64]])
def test_rejected_sinks_name_the_key_the_value_and_what_is_allowed(value):
    with pytest.raises(ValueError) as info:
        DraftWindowConfig.from_additional_config(
            {"draft_window_size": 512, "draft_attention_sinks": value}
        )
    message = str(info.value)
    assert 'additional_config["draft_attention_sinks"]' in message
    assert repr(value) in message and "integer number of tokens >= 0" in message


@pytest.mark.parametrize("window", [None, "absent"])
@pytest.mark.parametrize("sinks", [0, 64])
def test_sinks_without_a_window_are_rejected(window, sinks):
    additional = {"draft_attention_sinks": sinks}
    if window != "absent":
        additional["draft_window_size"] = window
    with pytest.raises(ValueError) as info:
        DraftWindowConfig.from_additional_config(additional)
    message = str(info.value)
    assert f'additional_config["draft_attention_sinks"]={sinks}' in message
    assert 'needs additional_config["draft_window_size"]' in message
    assert "Set draft_window_size too, or remove draft_attention_sinks." in message


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, 0),
        (0, 0),
        (8192, 8192),
        ("8192", 8192),
        (" 4096 ", 4096),
        (2048.0, 2048),
    ],
)
def test_accepted_thresholds(value, expected):
    config = DraftWindowConfig.from_additional_config(
        {"draft_window_size": 512, "draft_window_min_context": value, "draft_attention_sinks": 64}
    )
    assert config.draft_window_min_context == expected
    assert (config.draft_window_size, config.draft_attention_sinks) == (512, 64)


@pytest.mark.parametrize("value", [-1, True, False, 4.5, "abc", "", "8k", [8192]])
def test_rejected_thresholds_name_the_key_the_value_and_what_is_allowed(value):
    with pytest.raises(ValueError) as info:
        DraftWindowConfig.from_additional_config(
            {"draft_window_size": 512, "draft_window_min_context": value}
        )
    message = str(info.value)
    assert 'additional_config["draft_window_min_context"]' in message
    assert repr(value) in message and "integer number of tokens >= 0" in message


@pytest.mark.parametrize("window", [None, "absent"])
def test_a_threshold_without_a_window_is_rejected(window):
    additional = {"draft_window_min_context": 8192}
    if window != "absent":
        additional["draft_window_size"] = window
    with pytest.raises(ValueError, match=r"remove draft_window_min_context\."):
        DraftWindowConfig.from_additional_config(additional)


@pytest.fixture
def log(window_log):
    plugin.register()
    yield SimpleNamespace(calls=window_log)
    plugin.unregister()


def start(
    model_dir,
    monkeypatch,
    window,
    method="dspark",
    num_spec=3,
    parallel=None,
    layouts=ONE_GROUP,
    model_type=None,
    sinks=None,
    min_context=None,
    cp=(1, 0, 1),
    cls=None,
):
    batch = make_mrv2_batch(
        [g.block_size for g in layouts],
        [100],
        num_spec + 1,
        1,
        4,
        MAX_MODEL_LEN,
        np.random.default_rng(0),
        cp=cp,
    )
    additional = {"draft_window_size": window}
    if sinks is not None:
        additional["draft_attention_sinks"] = sinks
    if min_context is not None:
        additional["draft_window_min_context"] = min_context
    config = make_vllm_config(model_dir, MAX_MODEL_LEN, 4, additional)
    if model_type is not None:
        config.model_config.hf_config.model_type = model_type
    for name, size in (parallel or {}).items():
        setattr(config.parallel_config, name, size)
    # The decision reads `method` first; other methods borrow the DFlash class for wiring.
    cls = cls or SPECULATOR_CLASSES.get(method, SPECULATOR_CLASSES["dflash"])
    wired = wire_speculator(cls, batch, list(layouts), config, method, num_spec)
    return wired.speculator


def test_window_on_logs_one_start_up_line(model_dir, monkeypatch, log):
    layouts = (GroupLayout(16), GroupLayout(64, kernel_block_size=32))
    s = start(model_dir, monkeypatch, 512, layouts=layouts)
    assert s.draft_window is not None
    assert log.calls == [
        (
            "info",
            "Draft KV window on for dspark: draft_window_size=512, the draft reads at most 575 "
            "tokens per request; block sizes per KV-cache group {0: 16, 1: 64}, alignment 64.",
        )
    ]


def test_start_up_line_under_dcp_says_what_one_rank_reads(model_dir, monkeypatch, log):
    s = start(model_dir, monkeypatch, 512, layouts=(GroupLayout(16),), cp=(4, 1, 1))
    assert s.draft_window.spec.alignment == 64
    assert log.calls == [
        (
            "info",
            "Draft KV window on for dspark: draft_window_size=512, the draft reads at most 575 "
            "tokens per request, about 143 per rank (at most 144 on one rank of "
            "decode_context_parallel_size=4 (rank 1), cp_kv_cache_interleave_size=1); tokens per "
            "table column (a sharded table's column spans every rank) per KV-cache group {0: 64}, "
            "alignment 64.",
        )
    ]


@pytest.mark.parametrize(
    ("sinks", "phrase"),
    [
        (64, "with the first 64 tokens as attention sinks, the draft reads at most 639"),
        (
            20,
            "with the first 64 tokens as attention sinks (draft_attention_sinks=20 rounded up to "
            "the alignment 64), the draft reads at most 639",
        ),
        (0, "draft_window_size=512, the draft reads at most 575"),
    ],
)
def test_start_up_line_names_the_sinks_as_the_window_keeps_them(
    sinks, phrase, model_dir, monkeypatch, log
):
    layouts = (GroupLayout(16), GroupLayout(64, kernel_block_size=32))
    s = start(model_dir, monkeypatch, 512, layouts=layouts, sinks=sinks)
    assert s.draft_window.spec.sink_size == (64 if sinks else 0)
    ((level, message),) = log.calls
    assert level == "info" and phrase in message


def test_start_up_line_of_eagle_says_what_a_long_prefill_chunk_reads(model_dir, monkeypatch, log):
    start(model_dir, monkeypatch, 512, method="eagle3", sinks=20)
    ((_, message),) = log.calls
    assert (
        "the draft reads at most 559 tokens per request (a draft prefill chunk longer than "
        "the window: the chunk and at most 47 more);" in message
    )


def test_window_smaller_than_the_query_stretch_is_rejected(model_dir, monkeypatch, log):
    with pytest.raises(
        ValueError,
        match=r"draft_window_size=7 is smaller than the 8 query "
        r"tokens .* Use draft_window_size >= 8",
    ):
        start(model_dir, monkeypatch, 7, num_spec=7)


@pytest.mark.parametrize("method", ["dspark", "eagle3"])
def test_prefill_context_parallelism_is_rejected_by_name(method, model_dir, monkeypatch, log):
    with pytest.raises(ValueError) as error:
        start(
            model_dir,
            monkeypatch,
            512,
            method=method,
            parallel={"prefill_context_parallel_size": 2},
        )
    message = str(error.value)
    assert message.startswith(
        "draft_window_size=512 does not support "
        "prefill_context_parallel_size=2: the draft prefill builds "
        "metadata for the global batch"
    )
    assert message.endswith("Use prefill_context_parallel_size=1, or remove draft_window_size.")


@pytest.mark.parametrize(("window", "block_size"), [(1024, 16), (1000, 64), (1009, 16)])
def test_window_that_never_crops_stays_off_with_one_line(
    window, block_size, model_dir, monkeypatch, log
):
    """The start moves in steps of the alignment: with max_model_len 1024, a window
    within one block of it never crops."""
    s = start(model_dir, monkeypatch, window, layouts=(GroupLayout(block_size),))
    assert s.draft_window is None
    assert log.calls == [
        (
            "info",
            f"draft_window_size={window} never crops with max_model_len=1024 (the window start "
            f"moves in steps of {block_size} tokens); the draft window stays off.",
        )
    ]


@pytest.mark.parametrize(
    ("window", "sinks", "on"), [(896, 64, True), (897, 64, False), (960, 0, True), (961, 0, False)]
)
def test_sinks_count_where_a_window_starts_to_leave_tokens_out(
    window, sinks, on, model_dir, monkeypatch, log
):
    """With max_model_len 1024 and 64-token blocks, a read leaves tokens out only once the
    window start passes the sinks: L - W >= S + 64 for some L <= 1024."""
    s = start(model_dir, monkeypatch, window, layouts=(GroupLayout(64),), sinks=sinks)
    assert (s.draft_window is not None) == on
    if not on:
        assert log.calls == [
            (
                "info",
                f"draft_window_size={window}{' with 64 attention sinks' if sinks else ''} never "
                f"crops with max_model_len=1024 (the window start moves in steps of 64 tokens); "
                f"the draft window stays off.",
            )
        ]


def test_window_one_token_short_of_cropping_stays_on(model_dir, monkeypatch, log):
    s = start(model_dir, monkeypatch, 1024 - 64, layouts=(GroupLayout(64, kernel_block_size=32),))
    assert s.draft_window is not None


@pytest.mark.parametrize("sinks", [None, 64])
def test_mtp_ignores_the_window_with_one_warning(sinks, model_dir, monkeypatch, log):
    s = start(model_dir, monkeypatch, 512, method="mtp", sinks=sinks)
    assert s.draft_window is None
    ((level, message),) = log.calls
    assert level == "warning" and "ignored for method 'mtp' (MTPSpeculator)" in message
    # vLLM's MTPSpeculator loads MTP layers with a KV cache of their own.
    assert "its MTP layers keep a KV cache of their own" in message
    assert "share the target's KV" not in message
    assert ("draft_attention_sinks=64" in message) == (sinks is not None)


@pytest.mark.parametrize(
    "cls, reason",
    [
        (Gemma4Speculator, "keep no KV cache of their own: they read the target's (KV sharing)"),
        (MultiModuleMTPSpeculator, "its MTP modules each keep a KV cache of their own"),
    ],
)
def test_each_mtp_speculator_of_vllm_says_its_own_reason(cls, reason, model_dir, monkeypatch, log):
    s = start(model_dir, monkeypatch, 512, method="mtp", cls=cls)
    assert s.draft_window is None
    ((level, message),) = log.calls
    assert level == "warning" and f"ignored for method 'mtp' ({cls.__name__}): " in message
    assert reason in message


def test_a_method_without_window_support_is_rejected(model_dir, monkeypatch, log):
    refused = (
        rf"method 'ngram' on {re.escape(RELEASE.name)}; supported there: dflash, dspark, eagle"
    )
    with pytest.raises(ValueError, match=refused):
        start(model_dir, monkeypatch, 512, method="ngram")


def test_dspark_with_a_deepseek_v4_target_warns_and_keeps_the_window(model_dir, monkeypatch, log):
    s = start(model_dir, monkeypatch, 512, model_type="deepseek_v4")
    assert s.draft_window is not None
    levels = [level for level, _ in log.calls]
    assert levels == ["warning", "info"]
    assert "DeepSeek-V4" in log.calls[0][1] and "stays on" in log.calls[0][1]


def test_bad_value_fails_at_start_up(model_dir, monkeypatch, log):
    with pytest.raises(ValueError, match=r"got 0 \(int\)"):
        start(model_dir, monkeypatch, 0)
    with pytest.raises(ValueError, match=r"draft_attention_sinks.*got -1 \(int\)"):
        start(model_dir, monkeypatch, 512, sinks=-1)


def test_prefix_lm_multimodal_targets_are_rejected(model_dir, monkeypatch, log):
    from vllm.config import ModelConfig

    monkeypatch.setattr(ModelConfig, "is_mm_prefix_lm", property(lambda self: True))
    with pytest.raises(ValueError, match=r"prefix-LM multimodal targets"):
        start(model_dir, monkeypatch, 512, method="eagle3")


def test_start_up_line_goes_through_vllms_logger(model_dir, monkeypatch, vllm_log_records):
    """A server configures vLLM's "vllm" logger; the window's lines must reach it."""
    plugin.register()
    try:
        start(model_dir, monkeypatch, 512)
    finally:
        plugin.unregister()
    assert any("Draft KV window on for dspark" in r.getMessage() for r in vllm_log_records)


def test_start_up_line_states_the_threshold(model_dir, monkeypatch, log):
    layouts = (GroupLayout(16), GroupLayout(64, kernel_block_size=32))
    s = start(model_dir, monkeypatch, 256, layouts=layouts, sinks=20, min_context=800)
    assert s.draft_window.spec.min_context == 800
    assert log.calls == [
        (
            "info",
            "Draft KV window on for dspark: draft_window_size=256 with the first 64 tokens as "
            "attention sinks (draft_attention_sinks=20 rounded up to the alignment 64), from a "
            "context of 800 tokens on (draft_window_min_context; shorter contexts read whole), the "
            "draft reads at most 799 tokens per request; block sizes per KV-cache group "
            "{0: 16, 1: 64}, alignment 64.",
        )
    ]


@pytest.mark.parametrize("min_context", [1, 300, 384])
def test_a_threshold_within_the_windows_reach_changes_nothing_and_says_so(
    min_context, model_dir, monkeypatch, log
):
    """S + W + a = 64 + 256 + 64 = 384: no shorter context is cropped, threshold or not."""
    layouts = (GroupLayout(16), GroupLayout(64, kernel_block_size=32))
    s = start(model_dir, monkeypatch, 256, layouts=layouts, sinks=64, min_context=min_context)
    assert s.draft_window.spec.min_context == 0
    said, on = log.calls
    assert said == (
        "info",
        f"draft_window_min_context={min_context} changes nothing: no context "
        "shorter than 384 tokens (draft_window_size=256 with 64 attention sinks and "
        "the alignment 64) is cropped anyway, so every request reads its window "
        "from there.",
    )
    assert on[1].startswith("Draft KV window on for dspark: draft_window_size=256 with the first")
    assert "draft_window_min_context" not in on[1]


def test_a_threshold_above_max_model_len_keeps_the_window_off_and_says_so(
    model_dir, monkeypatch, log
):
    s = start(model_dir, monkeypatch, 256, min_context=MAX_MODEL_LEN + 1)
    assert s.draft_window is None
    said = (
        "draft_window_min_context=1025 is above max_model_len=1024: no request reaches it, "
        "so the draft window stays off."
    )
    assert log.calls == [("info", said)]
    s = start(model_dir, monkeypatch, 256, min_context=MAX_MODEL_LEN)
    assert s.draft_window.spec.min_context == MAX_MODEL_LEN
