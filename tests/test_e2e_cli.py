# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Every ``vllm bench`` command the dry run prints, and every ``vllm serve`` and ``vllm
bench serve`` its sweeps run, parsed by this environment's vLLM (0.33 in .venv, 0.34 in
.venv-034; 0.30 and 0.29 in tests/ascend/test_e2e_cli.py). Only parsed: nothing starts."""

import pytest

from tests.cpu_testbed import vllm_cli


@pytest.mark.parametrize("name", list(vllm_cli.DRY_RUNS))
def test_every_printed_command_parses_with_this_vllm(name, tmp_path, monkeypatch, capsys):
    lines = vllm_cli.dry_run_lines(name, tmp_path, monkeypatch, capsys)
    count, refused = vllm_cli.unparsed(lines)
    assert refused == [] and count >= 6


def test_the_parser_refuses_what_vllm_does_not_take():
    """The check can fail: a flag no vLLM has is refused."""
    parser = vllm_cli.vllm_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "serve", "--no-such-flag", "1"])
    parsed = parser.parse_args(["serve", "m", "--additional-config", '{"draft_window_size": 512}'])
    assert vllm_cli.served_json(parsed)["additional_config"] == {"draft_window_size": 512}
