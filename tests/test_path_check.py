# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The path check: the draft's attention builders are handed the window on every path,
checked once per path (and at every graph capture); a path that goes around the hooks
stops with an error that names it."""

import dataclasses
import inspect

import pytest
import torch
from vllm.config.compilation import CUDAGraphMode
from vllm.v1.worker.gpu.spec_decode.dflash.cudagraph import _prepare_dflash_inputs_to_capture
from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator
from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator
from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

from testbed.buffers import (
    fill_input_block_tables,
    fill_query_inputs,
    fill_slot_mappings,
)
from testbed.speculators import (
    make_vllm_config,
    wire_speculator,
)
from testbed.vllm_line import RELEASE
from tests.cpu_testbed.dflash import (
    LAYOUTS,
    MAX_MODEL_LEN,
    MAX_NUM_REQS,
    NUM_SPEC,
    Q,
    W,
    assert_reads_exactly_the_window,
    build,
    capture_on_cpu,
    make_batch,
    wire,
)
from vllm_ascend.worker.v2.spec_decode.draft_window import speculator
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import install
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.path_check import UPDATE_PATH, PathCheck
from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import (
    DraftWindow,
    WindowNotInPathError,
)

pytestmark = pytest.mark.usefixtures("window_hooks")
LAYOUT = [*LAYOUTS["target_group_and_two_draft_groups"], *LAYOUTS["one_group"]]
# The build hook's path: the method it wraps, as the installed line names it.
BUILD_PATH = DraftModelSpeculator._build_attn_metadata.__qualname__


def wire_class(cls, model_dir, layouts=LAYOUT, monkeypatch=None):
    """``cls`` wired with the window; with ``monkeypatch``, the installed release also serves
    ``cls`` for DSpark: a served class that goes around a hook (what a later vLLM's own
    class could do), which only the path check can catch."""
    if monkeypatch is not None:
        installed = install.installation()
        served = (("dspark", (*installed.release.speculators_for("dspark"), cls.__name__)),)
        speculators = dict(installed.release.speculators) | dict(served)
        release = dataclasses.replace(installed.release, speculators=tuple(speculators.items()))
        monkeypatch.setattr(installed, "release", release)
    config = make_vllm_config(model_dir, MAX_MODEL_LEN, MAX_NUM_REQS, {"draft_window_size": W})
    return wire_speculator(
        cls, make_batch(layouts, num_reqs_padded=MAX_NUM_REQS), layouts, config, "dspark", NUM_SPEC
    )


def test_a_speculator_class_the_release_does_not_serve_is_refused_by_name(model_dir):
    class NewDSparkFamily(DSparkSpeculator):
        """A draft family the window has not been tested with (its own passes unread)."""

    with pytest.raises(ValueError) as error:
        wire_class(NewDSparkFamily, model_dir)
    assert str(error.value) == (
        "draft_window_size=64 is not supported on Model Runner V2 for speculative method "
        f"'dspark' with speculator NewDSparkFamily on {RELEASE.name}: the window is tested there "
        "with DSparkSpeculator only. Use a draft those speculators serve, or remove "
        "draft_window_size."
    )


def test_the_plugins_set_attn_attaches_the_check_the_core_window_has_none(model_dir, monkeypatch):
    """``create_draft_window`` (what vllm-ascend's call sites call) makes a window with no
    check of its builders, refreshing with the torch path; the plugin's ``set_attn`` hook
    attaches the path check to the speculator's real builders."""
    layouts = LAYOUTS["one_group"]
    wired = wire(
        "dflash", layouts, make_batch(layouts, num_reqs_padded=MAX_NUM_REQS), model_dir, monkeypatch
    )
    s = wired.speculator
    check = s.draft_window.path_check
    assert isinstance(check, PathCheck) and check.speculator is s
    builder = s.attn_groups[0][0].metadata_builders[0]
    assert inspect.unwrap(builder.build) is not builder.build
    core = speculator.create_draft_window(s, install.installation().release)
    assert core is not None and core.path_check is None
    assert core.refresh_kernel is None


def vllms(method):
    """vLLM's own function under the window's wrapper: what a subclass that copies vLLM's
    code instead of calling super() runs."""
    return inspect.unwrap(method)


def test_each_path_is_checked_once_and_every_capture_build_every_time(model_dir, monkeypatch):
    layouts = LAYOUTS["one_group"]
    wired = wire(
        "dflash", layouts, make_batch(layouts, num_reqs_padded=MAX_NUM_REQS), model_dir, monkeypatch
    )
    s, check = wired.speculator, wired.speculator.draft_window.path_check
    captured = capture_on_cpu(s, monkeypatch)
    s.capture()
    # The capture prepares its inputs twice (warmup, then the capture itself), each through
    # build_for_cudagraph_capture, which calls build.
    assert check.num_checks == 4
    for _ in range(3):
        build(wired)
    assert check.num_checks == 5
    for _ in range(3):
        s._update_draft_decode_metadata(captured, MAX_NUM_REQS)
    assert check.num_checks == 6
    s.init_cudagraph_manager(CUDAGraphMode.FULL_DECODE_ONLY)  # a fresh manager to capture
    s.capture()
    assert check.num_checks == 10
    # A capture's builds are never taken as proven: the next one is checked again.
    assert {path for path, _, _ in check.checked} == {(BUILD_PATH,), (UPDATE_PATH,)}
    # And what was proven is the window: a replay step reads exactly it.
    fill_input_block_tables(wired.batch)
    fill_query_inputs(wired.batch)
    fill_slot_mappings(wired.batch)
    s._update_draft_decode_metadata(captured, MAX_NUM_REQS)
    assert_reads_exactly_the_window(wired, layouts, captured)


def test_a_subclass_building_without_super_is_stopped_with_its_path(model_dir, monkeypatch):
    class OwnBuildDSpark(DSparkSpeculator):
        def _build_attn_metadata(self, *args, **kwargs):
            """Builds from the full inputs with vLLM's code, without super()."""
            return vllms(DraftModelSpeculator._build_attn_metadata)(self, *args, **kwargs)

    wired = wire_class(OwnBuildDSpark, model_dir, monkeypatch=monkeypatch)
    with pytest.raises(WindowNotInPathError) as error:
        build(wired)
    message = str(error.value)
    assert message.startswith(
        "draft window not in the path: OwnBuildDSpark's draft attention "
        "builder for KV-cache group 1 got metadata (build) outside the "
        "window's calls, called from "
    )
    assert "OwnBuildDSpark._build_attn_metadata" in message
    assert "DraftModelSpeculator._build_uniform_attn_metadata" in message
    assert "its device seq_lens is not the window's windowed seq_lens" in message
    assert "is not the group's cropped table" in message
    assert "remove draft_window_size, or report the path" in message


def test_a_vllm_that_stops_forwarding_the_uniform_build_is_stopped(model_dir, monkeypatch):
    real_build = vllms(DraftModelSpeculator._build_attn_metadata)
    real_uniform = DraftModelSpeculator._build_uniform_attn_metadata

    def _build_uniform_attn_metadata(self, *args, **kwargs):
        """A vLLM whose uniform build builds by itself instead of forwarding."""
        self_forwarding = self._build_attn_metadata
        self._build_attn_metadata = lambda **kw: real_build(self, **kw)
        try:
            return real_uniform(self, *args, **kwargs)
        finally:
            self._build_attn_metadata = self_forwarding

    monkeypatch.setattr(
        DraftModelSpeculator, "_build_uniform_attn_metadata", _build_uniform_attn_metadata
    )
    wired = wire_class(DSparkSpeculator, model_dir)
    with pytest.raises(
        WindowNotInPathError,
        match=r"outside the window's calls, called from "
        r".*_build_uniform_attn_metadata",
    ):
        build(wired)


def test_a_capture_that_bypasses_the_hook_is_stopped_with_its_path(model_dir, monkeypatch):
    class OwnCaptureDFlash(DFlashSpeculator):
        def capture(self):
            """Prepares its graphs' inputs itself, without super(): the shape of a capture
            that calls the graph manager directly."""
            _prepare_dflash_inputs_to_capture(
                MAX_NUM_REQS,
                MAX_NUM_REQS * Q,
                self.input_buffers,
                self.block_tables,
                self.attn_groups,
                self.kv_cache_config,
                self.max_model_len,
                skip_attn=False,
                causal=True,
            )

    wired = wire_class(OwnCaptureDFlash, model_dir, monkeypatch=monkeypatch)
    with pytest.raises(WindowNotInPathError) as error:
        wired.speculator.capture()
    message = str(error.value)
    assert "(build_for_cudagraph_capture) outside the window's calls" in message
    assert "OwnCaptureDFlash.capture" in message


def test_an_in_place_update_outside_the_hook_is_stopped(model_dir, monkeypatch):
    """vLLM 0.30's fused decode updates recorded metadata through the attention groups
    directly, which would leave the window's buffers as they were."""
    layouts = LAYOUTS["one_group"]
    wired = wire(
        "dflash", layouts, make_batch(layouts, num_reqs_padded=MAX_NUM_REQS), model_dir, monkeypatch
    )
    captured = capture_on_cpu(wired.speculator, monkeypatch)
    wired.speculator.capture()
    (group,) = wired.attn_groups[0]
    with pytest.raises(
        WindowNotInPathError, match="updated in place outside the window's update hook"
    ):
        group.update_draft_decode_metadata(captured)


def test_a_set_attn_override_without_super_is_stopped_at_the_first_build(model_dir):
    class OwnSetAttnDSpark(DSparkSpeculator):
        def set_attn(self, *args, **kwargs):
            """vLLM's own set_attn, without super()."""
            vllms(DraftModelSpeculator.set_attn)(self, *args, **kwargs)

    wired = wire_class(OwnSetAttnDSpark, model_dir)
    with pytest.raises(
        WindowNotInPathError,
        match=r"OwnSetAttnDSpark.set_attn did not run "
        r"through the window's hook",
    ):
        build(wired, CUDAGraphMode.FULL)


def test_host_lengths_past_the_window_are_stopped(model_dir, monkeypatch):
    """A host bound that escaped the window (here the window's own host arithmetic is
    switched off; vllm-ascend's DSpark MLA path hands its builders unwindowed host lengths)."""
    monkeypatch.setattr(
        DraftWindow, "host_upper_bound", lambda self, bound, num_reqs, step, **kwargs: bound
    )
    wired = wire_class(DSparkSpeculator, model_dir)
    with pytest.raises(WindowNotInPathError) as error:
        build(wired)
    message = str(error.value)
    assert f"(build) under the window's calls {BUILD_PATH}, and " in message
    # Alignment lcm(16, 32, 16) = 32: at most 64 + 32 - 1 tokens; the longest context is 2000.
    assert "seq_lens_cpu_upper_bound reaches 2000, past the window's 95" in message


def test_a_captures_worst_case_host_bound_is_a_bound_the_proof_accepts(model_dir, monkeypatch):
    """At a capture the host lengths are vLLM's bounds over every replay (vllm-ascend's
    capture build sets them to max_model_len); each replay reads the device lengths, which
    the path check checks. Outside a capture the same bound stops (the test above)."""
    import vllm.v1.worker.gpu.spec_decode.dflash.cudagraph as dflash_cudagraph

    real = dflash_cudagraph.build_attn_metadata
    bounds = []

    def with_worst_case_bound(*args, num_reqs, max_seq_len, **kwargs):
        bounds.append(torch.full((num_reqs,), max_seq_len, dtype=torch.int32))
        return real(
            *args,
            num_reqs=num_reqs,
            max_seq_len=max_seq_len,
            seq_lens_cpu_upper_bound=bounds[-1],
            **kwargs,
        )

    monkeypatch.setattr(dflash_cudagraph, "build_attn_metadata", with_worst_case_bound)
    layouts = LAYOUTS["one_group"]
    wired = wire(
        "dflash", layouts, make_batch(layouts, num_reqs_padded=MAX_NUM_REQS), model_dir, monkeypatch
    )
    capture_on_cpu(wired.speculator, monkeypatch)
    wired.speculator.capture()
    assert len(bounds) == 2 and int(bounds[0].max()) == MAX_MODEL_LEN  # warmup, capture
    assert wired.speculator.draft_window.path_check.num_checks == 4
