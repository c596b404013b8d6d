# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""``draft_window_size: "auto"``: the window sized from the training context the draft
checkpoint declares in its own config.json, W = C - a + 1 (the largest window whose reads,
W to W + a - 1 tokens, stay within C), resolved at ``set_attn`` once the alignment is known.

vLLM raises a draft's ``max_position_embeddings`` to the target's ``max_model_len`` at
start-up (every method but draft_model, where the RoPE type only sizes the cache), and caps
``max_model_len`` at a draft model's own: the tests build real configs over each family's
checkpoint layout, show what vLLM did to the loaded config, and that the window still reads
what the checkpoint declares.
"""

import json
import re
from types import SimpleNamespace

import numpy as np
import pytest
from vllm.config.compilation import CUDAGraphMode

from testbed.buffers import make_mrv2_batch
from testbed.configs import speculative_vllm_config
from testbed.speculators import SPECULATOR_CLASSES, GroupLayout, wire_speculator
from testbed.tiny_models import DRAFT_LAYOUTS, write_draft_dir, write_model_dir
from testbed.vllm_line import RELEASE
from tests.cpu_testbed import graphs
from tests.cpu_testbed.startup import (
    assert_launch_reads,
    capture,
    propose,
    replayed,
    started,
    verify_step,
)
from vllm_ascend.worker.v2.spec_decode.draft_window import policy
from vllm_ascend.worker.v2.spec_decode.draft_window.config import DraftWindowConfig
from vllm_ascend.worker.v2.spec_decode.draft_window.declared import FIELDS, declared_context
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import plugin

AUTO = {"draft_window_size": "auto"}
# startup.py's: max_model_len 1024, one KV-cache group of 16-token blocks.
MAX_MODEL_LEN, BLOCK = 1024, 16
# The drafter's declared training context: vLLM raises it to 1024 in the loaded config.
CONTEXT = 64
ONE_GROUP = (GroupLayout(BLOCK),)
WINDOWED_LAYOUTS = [layout for layout in DRAFT_LAYOUTS if layout != "draft_model"]


def became(checkpoint, field: str, context: int, window: int, alignment: int) -> str:
    return (
        f"draft_window_size=auto became W={window}: the draft checkpoint {checkpoint} declares "
        f"{field}={context} (its training context), and the window's reads (W to W + a - 1 = "
        f"{window + alignment - 1} tokens, alignment {alignment}) stay within it."
    )


def stays_off(checkpoint, field: str, context: int, max_model_len: int) -> str:
    return (
        f"draft_window_size=auto: the draft checkpoint {checkpoint} declares {field}={context}, "
        f"not below max_model_len={max_model_len}, so the draft reads no context longer than "
        "it declares; the draft window stays off. Set draft_window_size to the drafter's "
        "training context in tokens to window it anyway."
    )


# ---- each family's checkpoint, through vLLM's own config and a real speculator's set_attn ----


@pytest.mark.usefixtures("window_hooks")
@pytest.mark.parametrize("layout", WINDOWED_LAYOUTS)
def test_the_window_reads_the_declared_context_that_vllm_overwrote(
    layout, model_dir, tmp_path, monkeypatch, window_log
):
    """A draft checkpoint declaring 64 tokens, validated by vLLM as its own method: vLLM
    raised the loaded config's max_position_embeddings to the target's max_model_len
    (1024), the checkpoint's config.json still says 64, and the speculator's own set_attn
    sizes the window from the checkpoint: W = 64 - 16 + 1 = 49."""
    method, field = DRAFT_LAYOUTS[layout]
    draft = write_draft_dir(tmp_path / layout, layout, CONTEXT)
    # Eager: what is read, and when, is the same under graphs (the replays read it: below).
    st = started(model_dir, method, 3, CUDAGraphMode.NONE, AUTO, monkeypatch, draft=draft)
    vllm_config = st.s.vllm_config
    draft_config = vllm_config.speculative_config.draft_model_config
    assert draft_config.model == str(draft)
    # What vLLM did at start-up: the draft's positions raised to the target's.
    assert draft_config.hf_config.max_position_embeddings == MAX_MODEL_LEN
    assert vllm_config.model_config.max_model_len == MAX_MODEL_LEN
    # What the checkpoint declares, read from its own file.
    declared = declared_context(vllm_config)
    assert (declared.tokens, declared.field, declared.path) == (
        CONTEXT,
        field,
        draft / "config.json",
    )
    window = st.s.draft_window
    assert window.spec.window_size == CONTEXT - BLOCK + 1
    assert window.spec.max_read_len == CONTEXT
    ((level, said), (_, on)) = window_log
    assert level == "info" and said == became(draft, field, CONTEXT, 49, BLOCK)
    assert on.startswith(f"Draft KV window on for {method}: draft_window_size=49, the draft ")


@pytest.mark.usefixtures("window_hooks")
def test_every_replayed_eagle3_decode_step_reads_the_window_auto_gave(
    model_dir, tmp_path, monkeypatch
):
    """The window "auto" made is the window every captured decode step replays: each launch
    reads exactly its last 49 tokens from a block boundary, never past the declared 64."""
    draft = write_draft_dir(tmp_path / "eagle3", "eagle3", CONTEXT)
    graphs.cuda_graphs_on_cpu(monkeypatch)
    mode, num_spec = CUDAGraphMode.FULL_DECODE_ONLY, 3
    st = started(model_dir, "eagle3", num_spec, mode, AUTO, monkeypatch, draft=draft)
    capture(st.s, mode)
    # 7 requests replay the graph captured for 8 (vLLM 0.34 captures one per count up to 6).
    target_lens = [40, 64, 79, 80, 81, 300, 900]
    t = verify_step(st, target_lens)
    propose(st.s, t)
    spec = st.s.draft_window.spec
    launches = replayed(st.s.decode_cudagraph_manager, st.model, num_spec - 1)
    for step, launch in enumerate(launches, start=1):
        ends = [target - int(r) + step for target, r in zip(target_lens, t.rejected, strict=True)]
        assert_launch_reads(t, launch, ends, 1, spec)
        assert int(launch.seq_lens.max()) <= CONTEXT


@pytest.mark.usefixtures("window_hooks")
def test_a_draft_model_caps_max_model_len_at_its_context_so_auto_keeps_the_window_off(
    model_dir, tmp_path, monkeypatch, window_log
):
    """draft_model: vLLM leaves its max_position_embeddings as declared and lowers
    max_model_len to the draft's instead, so the draft never reads past what it declares."""
    draft = write_draft_dir(tmp_path / "draft", "draft_model", CONTEXT)
    st = started(model_dir, "draft_model", 3, CUDAGraphMode.NONE, AUTO, monkeypatch, draft=draft)
    config = st.s.vllm_config
    assert config.speculative_config.draft_model_config.hf_config.max_position_embeddings == 64
    assert config.model_config.max_model_len == CONTEXT
    assert st.s.draft_window is None
    assert window_log == [("info", stays_off(draft, "max_position_embeddings", 64, 64))]


@pytest.mark.usefixtures("window_hooks")
@pytest.mark.parametrize(("context", "on"), [(MAX_MODEL_LEN - 1, True), (MAX_MODEL_LEN, False)])
def test_a_declared_context_at_max_model_len_keeps_the_window_off_and_one_below_windows(
    context, on, model_dir, tmp_path, monkeypatch, window_log
):
    draft = write_draft_dir(tmp_path / "eagle3", "eagle3", context)
    st = started(model_dir, "eagle3", 3, CUDAGraphMode.NONE, AUTO, monkeypatch, draft=draft)
    if on:
        assert st.s.draft_window.spec.window_size == context - BLOCK + 1
        assert window_log[0] == (
            "info",
            became(draft, "max_position_embeddings", context, context - BLOCK + 1, BLOCK),
        )
    else:
        assert st.s.draft_window is None
        assert window_log == [
            ("info", stays_off(draft, "max_position_embeddings", context, MAX_MODEL_LEN))
        ]


# ---- the alignment, sinks and the threshold: real speculators wired to real groups ----


def wired(model_dir, tmp_path, additional, context=CONTEXT, layouts=ONE_GROUP, cp=(1, 0, 1)):
    """A DSpark speculator through its real set_attn, its config validated by vLLM over a
    DSpark checkpoint declaring ``context`` tokens (``cp``: decode context parallelism)."""
    num_spec = 3
    draft = write_draft_dir(tmp_path / "dspark", "dspark", context)
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
    config = speculative_vllm_config(
        model_dir, MAX_MODEL_LEN, num_spec, "dspark", additional, draft=draft
    )
    cls = SPECULATOR_CLASSES["dspark"]
    return draft, wire_speculator(cls, batch, list(layouts), config, "dspark", num_spec).speculator


@pytest.fixture
def log(window_log):
    plugin.register()
    yield window_log
    plugin.unregister()


@pytest.mark.parametrize(
    ("layouts", "cp", "alignment"),
    [
        ((GroupLayout(16), GroupLayout(64, kernel_block_size=32)), (1, 0, 1), 64),
        ((GroupLayout(16),), (4, 1, 1), 64),
        ((GroupLayout(32),), (1, 0, 1), 32),
    ],
    ids=["two groups", "dcp 4", "one group"],
)
def test_auto_is_the_declared_context_less_the_alignment_plus_one(
    layouts, cp, alignment, model_dir, tmp_path, log
):
    """The alignment as the window derives it: the lcm of the windowed groups' column tokens,
    under DCP N times a block."""
    context = 512
    draft, s = wired(model_dir, tmp_path, AUTO, context, layouts, cp=cp)
    spec = s.draft_window.spec
    assert (spec.alignment, spec.window_size) == (alignment, context - alignment + 1)
    # Every read, W to W + a - 1 tokens, within the declared context.
    assert spec.max_read_len == context
    assert log[0] == (
        "info",
        became(draft, "max_position_embeddings", context, context - alignment + 1, alignment),
    )
    assert log[1][1].startswith(
        f"Draft KV window on for dspark: draft_window_size={context - alignment + 1}"
    )


def test_the_measured_case_a_64_token_drafter_at_alignment_32_gets_33(model_dir, tmp_path, log):
    """The rule's measurement (C = 64, a = 32): W = 33, reads 33 to 64 tokens."""
    draft, s = wired(model_dir, tmp_path, AUTO, 64, (GroupLayout(32),))
    assert s.draft_window.spec.window_size == 33
    assert log[0] == ("info", became(draft, "max_position_embeddings", 64, 33, 32))


def test_sinks_come_on_top_of_the_window_auto_sizes(model_dir, tmp_path, log):
    layouts = (GroupLayout(16), GroupLayout(64, kernel_block_size=32))
    additional = {**AUTO, "draft_attention_sinks": 20}
    _, s = wired(model_dir, tmp_path, additional, 512, layouts)
    spec = s.draft_window.spec
    assert (spec.window_size, spec.sink_size, spec.alignment) == (449, 64, 64)
    assert log[1] == (
        "info",
        "Draft KV window on for dspark: draft_window_size=449 with the first 64 tokens as "
        "attention sinks (draft_attention_sinks=20 rounded up to the alignment 64), the draft "
        "reads at most 576 tokens per request; block sizes per KV-cache group {0: 16, 1: 64}, "
        "alignment 64.",
    )


@pytest.mark.parametrize(("min_context", "applied"), [(800, 800), (300, 0)])
def test_the_threshold_composes_with_auto_as_with_a_number(
    min_context, applied, model_dir, tmp_path, log
):
    """W = 512 - 16 + 1 = 497: a threshold above S + W + a = 513 engages from there; one
    below changes nothing and says so, as for an integer window."""
    additional = {**AUTO, "draft_window_min_context": min_context}
    _, s = wired(model_dir, tmp_path, additional, 512)
    assert (s.draft_window.spec.window_size, s.draft_window.spec.min_context) == (497, applied)
    if applied:
        assert "from a context of 800 tokens on (draft_window_min_context;" in log[1][1]
    else:
        assert log[1] == (
            "info",
            "draft_window_min_context=300 changes nothing: no context shorter than 513 tokens "
            "(draft_window_size=497 and the alignment 16) is cropped anyway, so every request "
            "reads its window from there.",
        )


def test_the_lines_said_before_auto_is_resolved_name_it_as_set(model_dir, tmp_path, log):
    """A draft whose groups the window does not apply to: refused before any alignment exists,
    with the value as set (and MTP's warning likewise)."""
    import torch
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    from testbed.speculators import HEAD_SIZE, NUM_KV_HEADS, make_vllm_config

    sliding = SlidingWindowSpec(
        block_size=32,
        sliding_window=128,
        num_kv_heads=NUM_KV_HEADS,
        head_size=HEAD_SIZE,
        dtype=torch.float32,
    )
    layouts = (GroupLayout(16, draft=False), GroupLayout(32, spec=sliding))
    with pytest.raises(ValueError, match=r"^draft_window_size=auto cannot window the draft: "):
        wired(model_dir, tmp_path, AUTO, 512, layouts)
    assert log == []
    # A declared context that keeps "auto" off says so, and nothing is refused.
    draft, s = wired(model_dir, tmp_path, AUTO, MAX_MODEL_LEN, layouts)
    assert s.draft_window is None
    ((level, said),) = log
    assert level == "info" and said.startswith(
        f"draft_window_size=auto: the draft checkpoint {draft} declares "
        f"max_position_embeddings={MAX_MODEL_LEN}, not below max_model_len={MAX_MODEL_LEN}"
    )
    log.clear()
    batch = make_mrv2_batch([BLOCK], [100], 4, 1, 4, MAX_MODEL_LEN, np.random.default_rng(0))
    config = make_vllm_config(model_dir, MAX_MODEL_LEN, 4, AUTO)
    mtp = SPECULATOR_CLASSES["mtp"]
    s = wire_speculator(mtp, batch, [GroupLayout(BLOCK)], config, "mtp", 3).speculator
    assert s.draft_window is None
    ((level, said),) = log
    assert level == "warning"
    assert said.startswith("draft_window_size=auto is ignored for method 'mtp' (MTPSpeculator)")


def test_a_declared_context_too_short_for_the_drafts_queries_is_refused_by_name(
    model_dir, tmp_path, log
):
    """C = 64, a = 64 (two groups): W = 1 cannot hold the 4 query tokens DSpark drafts."""
    layouts = (GroupLayout(16), GroupLayout(64, kernel_block_size=32))
    with pytest.raises(ValueError) as error:
        wired(model_dir, tmp_path, AUTO, 64, layouts)
    draft = tmp_path / "dspark"
    assert str(error.value) == (
        f"draft_window_size=auto cannot size the draft window: the draft checkpoint {draft} "
        "declares max_position_embeddings=64 and the window's alignment is 64, so W = 64 - 64 "
        "+ 1 = 1 is smaller than the 4 query tokens method 'dspark' drafts per request "
        "(num_speculative_tokens + 1). Set draft_window_size explicitly to a number of tokens "
        ">= 4."
    )


def test_a_checkpoint_declaring_no_context_keeps_the_window_off_and_says_what_to_set(
    model_dir, tmp_path, log
):
    draft = write_draft_dir(tmp_path / "dspark", "dspark", None)
    config = speculative_vllm_config(model_dir, MAX_MODEL_LEN, 3, "dspark", AUTO, draft=draft)
    batch = make_mrv2_batch([BLOCK], [100], 4, 1, 4, MAX_MODEL_LEN, np.random.default_rng(0))
    cls = SPECULATOR_CLASSES["dspark"]
    s = wire_speculator(cls, batch, [GroupLayout(BLOCK)], config, "dspark", 3).speculator
    assert s.draft_window is None
    assert log == [
        (
            "warning",
            f"draft_window_size=auto: the draft checkpoint {draft} declares no training context "
            "(none of max_position_embeddings, transformer_layer_config.max_position_embeddings, "
            "text_config.max_position_embeddings in its config.json), so the draft window stays "
            "off. Set draft_window_size to the drafter's training context in tokens to window it.",
        )
    ]


def test_a_config_json_gone_at_start_up_is_the_named_error(model_dir, tmp_path, log):
    draft = write_draft_dir(tmp_path / "dspark", "dspark", 512)
    config = speculative_vllm_config(model_dir, MAX_MODEL_LEN, 3, "dspark", AUTO, draft=draft)
    (draft / "config.json").unlink()
    batch = make_mrv2_batch([BLOCK], [100], 4, 1, 4, MAX_MODEL_LEN, np.random.default_rng(0))
    cls = SPECULATOR_CLASSES["dspark"]
    with pytest.raises(ValueError, match=re.escape(missing(draft))):
        wire_speculator(cls, batch, [GroupLayout(BLOCK)], config, "dspark", 3)
    # The config check both forms run before workers start stops on it too (Model Runner V2).
    with pytest.raises(ValueError, match=re.escape(missing(draft))):
        policy.check_start_up(config, DraftWindowConfig.from_additional_config(AUTO), RELEASE, True)


def missing(checkpoint, revision: str | None = None) -> str:
    at = f" at revision {revision}" if revision else ""
    return (
        f"draft_window_size=auto: no config.json found for the draft checkpoint {checkpoint}"
        f"{at}, neither in a local folder nor in the local Hugging Face cache (the window never "
        "downloads at start-up), so the training context it declares cannot be read. Pass the "
        "draft as a local folder holding its config.json, or set draft_window_size to a number "
        "of tokens (the drafter's training context)."
    )


# ---- the reader: where each layout declares its context, and where it finds config.json ----


def with_draft(model: str, hf_config_path: str | None = None, revision: str | None = None):
    """The parts of a VllmConfig the reader reads."""
    draft = SimpleNamespace(model=model, hf_config_path=hf_config_path, revision=revision)
    return SimpleNamespace(speculative_config=SimpleNamespace(draft_model_config=draft))


@pytest.mark.parametrize("layout", list(DRAFT_LAYOUTS))
def test_each_layout_is_read_where_it_declares_its_context(layout, tmp_path):
    folder = write_draft_dir(tmp_path / "draft", layout, 2048)
    declared = declared_context(with_draft(str(folder)))
    assert (declared.tokens, declared.field) == (2048, DRAFT_LAYOUTS[layout][1])
    assert (declared.checkpoint, declared.path) == (str(folder), folder / "config.json")


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"text_config": {"max_position_embeddings": 4096}}, (4096, "text_config.")),
        # the fields in order: the top level first
        (
            {
                "max_position_embeddings": 2048,
                "transformer_layer_config": {"max_position_embeddings": 8},
            },
            (2048, ""),
        ),
        (
            {
                "transformer_layer_config": {"max_position_embeddings": 8192},
                "text_config": {"max_position_embeddings": 8},
            },
            (8192, "transformer_layer_config."),
        ),
        # not a number of tokens: the next field, or none
        (
            {"max_position_embeddings": None, "text_config": {"max_position_embeddings": 512}},
            (512, "text_config."),
        ),
        ({"max_position_embeddings": True}, (None, None)),
        ({"max_position_embeddings": "2048"}, (None, None)),
        ({"max_position_embeddings": 0}, (None, None)),
        ({"text_config": None, "vocab_size": 256}, (None, None)),
    ],
)
def test_the_fields_in_order(config, expected, tmp_path):
    folder = write_model_dir(tmp_path / "draft", config)
    declared = declared_context(with_draft(str(folder)))
    tokens, prefix = expected
    field = None if prefix is None else f"{prefix}max_position_embeddings"
    assert (declared.tokens, declared.field) == (tokens, field)
    assert field is None or field in FIELDS


def test_hf_config_path_is_where_the_config_is_read(tmp_path):
    """vLLM reads a draft's config from hf_config_path where one is given; so does the
    window."""
    weights = tmp_path / "weights"
    weights.mkdir()
    config = write_model_dir(tmp_path / "config", {"max_position_embeddings": 1024})
    declared = declared_context(with_draft(str(weights), hf_config_path=str(config)))
    assert (declared.tokens, declared.path) == (1024, config / "config.json")


def hub_cache(root, repo_id: str, config: dict, revision: str = "main") -> str:
    """A Hugging Face cache holding ``repo_id``'s config.json at ``revision``, laid out as
    huggingface_hub's downloads leave it; returns the snapshot's commit."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = root / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / revision).write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(config))
    return commit


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """huggingface_hub's cache folder, empty, for one test (no network is ever asked)."""
    from huggingface_hub import constants

    root = tmp_path / "hf-cache"
    root.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    return root


@pytest.mark.parametrize("revision", [None, "v1"])
def test_a_hub_id_is_read_from_the_local_hugging_face_cache(revision, hf_cache):
    repo_id = "org/tiny-eagle3"
    commit = hub_cache(hf_cache, repo_id, {"max_position_embeddings": 2048}, revision or "main")
    declared = declared_context(with_draft(repo_id, revision=revision))
    assert (declared.tokens, declared.checkpoint) == (2048, repo_id)
    assert declared.path.parent.name == commit


@pytest.mark.parametrize("revision", [None, "v2"])
def test_a_hub_id_not_in_the_local_cache_is_the_named_error_never_a_download(
    revision, hf_cache, monkeypatch
):
    import huggingface_hub

    def no_network(*args, **kwargs):
        raise AssertionError("the window must not download")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_network)
    # cached at another revision only
    hub_cache(hf_cache, "org/tiny-eagle3", {"max_position_embeddings": 2048}, "v1")
    for repo_id in ("org/tiny-eagle3", "org/never-fetched"):
        with pytest.raises(ValueError) as error:
            declared_context(with_draft(repo_id, revision=revision or "v9"))
        assert str(error.value) == missing(repo_id, revision or "v9")


def test_a_local_folder_without_config_json_is_the_named_error(tmp_path):
    folder = tmp_path / "draft"
    folder.mkdir()
    with pytest.raises(ValueError) as error:
        declared_context(with_draft(str(folder)))
    assert str(error.value) == missing(folder)


def test_an_unreadable_config_json_is_the_named_error(tmp_path):
    folder = tmp_path / "draft"
    folder.mkdir()
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ValueError) as error:
        declared_context(with_draft(str(folder)))
    message = str(error.value)
    assert message.startswith(
        f"draft_window_size=auto: the draft checkpoint {folder}'s config.json "
        f"({folder / 'config.json'}) cannot be read (JSONDecodeError: "
    )
    assert message.endswith("Fix the checkpoint, or set draft_window_size to a number of tokens.")


def test_a_draft_without_a_checkpoint_of_its_own_is_the_named_error():
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(method="ngram", draft_model_config=None)
    )
    with pytest.raises(ValueError) as error:
        declared_context(config)
    assert str(error.value) == (
        "draft_window_size=auto sizes the window from the training context the draft "
        "checkpoint declares, and speculative method 'ngram' has no draft checkpoint of its "
        "own here. Set draft_window_size to a number of tokens."
    )


# ---- the runner: only Model Runner V2 resolves "auto" ----

AUTO_ON_V1 = (
    "draft_window_size=auto needs Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER=1): vllm-ascend's "
    "Model Runner V1 draft window takes a number of tokens. Set VLLM_USE_V2_MODEL_RUNNER=1 or "
    "set draft_window_size to the drafter's training context in tokens."
)


@pytest.fixture
def registered():
    from vllm.config import VllmConfig

    saved = {
        name: VllmConfig.__dict__[name]
        for name in ("use_v2_model_runner", "__post_init__")
        if name in VllmConfig.__dict__
    }
    plugin.register()
    yield
    plugin.unregister()
    for name, value in saved.items():
        setattr(VllmConfig, name, value)


@pytest.mark.model_runner_v1
@pytest.mark.parametrize("extra", [{}, {"draft_attention_sinks": 64}])
def test_auto_on_model_runner_v1_stops_start_up_with_the_fix(
    extra, model_dir, tmp_path, registered, monkeypatch
):
    draft = write_draft_dir(tmp_path / "eagle3", "eagle3", 2048)
    additional = {**AUTO, **extra}
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    with pytest.raises(ValueError, match=re.escape(AUTO_ON_V1)):
        speculative_vllm_config(model_dir, 512, 2, "eagle3", additional, draft=draft)
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    config = speculative_vllm_config(model_dir, 512, 2, "eagle3", additional, draft=draft)
    assert config.use_v2_model_runner


def test_auto_builds_on_model_runner_v2_and_a_bad_word_stops_it_named(
    model_dir, tmp_path, registered, monkeypatch
):
    if RELEASE.model_runner_v1:
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    draft = write_draft_dir(tmp_path / "eagle3", "eagle3", 2048)
    assert speculative_vllm_config(model_dir, 512, 2, "eagle3", AUTO, draft=draft)
    with pytest.raises(ValueError, match=re.escape("got 'Auto' (str)")):
        speculative_vllm_config(
            model_dir, 512, 2, "eagle3", {"draft_window_size": "Auto"}, draft=draft
        )
