"""The `vllm.general_plugins` entry point, as vLLM itself discovers and calls it."""

import importlib.metadata

from vllm.plugins import load_plugins_by_group

from vllm_ascend.worker.v2.spec_decode.draft_window import plugin

ENTRY_POINT = "vllm_ascend.worker.v2.spec_decode.draft_window.plugin:register"


def test_installed_distribution_declares_the_entry_point():
    points = importlib.metadata.entry_points(group="vllm.general_plugins")
    assert {p.name: p.value for p in points}.get("draft_window") == ENTRY_POINT


def test_vllm_discovers_the_plugin_and_calling_it_twice_is_safe(monkeypatch):
    monkeypatch.setenv("VLLM_PLUGINS", "draft_window")
    plugins = load_plugins_by_group("vllm.general_plugins")
    assert set(plugins) == {"draft_window"}
    assert plugins["draft_window"] is plugin.register
    plugins["draft_window"]()
    plugins["draft_window"]()
    assert plugin.is_registered()
