# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Every ``vllm bench`` command the dry run prints, and every ``vllm serve`` and ``vllm
bench serve`` its sweeps run, parsed by the vLLM of a vllm-ascend release (0.30 in
.venv-030, 0.29 in .venv-029): the lines make e2e-ascend serves on an Ascend host. Only
parsed: nothing starts."""

import pytest

from tests.cpu_testbed import vllm_cli


@pytest.mark.parametrize("name", list(vllm_cli.DRY_RUNS))
def test_every_printed_command_parses_with_this_vllm(name, tmp_path, monkeypatch, capsys):
    lines = vllm_cli.dry_run_lines(name, tmp_path, monkeypatch, capsys)
    count, refused = vllm_cli.unparsed(lines)
    assert refused == [] and count >= 6
