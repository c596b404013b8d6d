# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The window inspector (`make demo`): its table, its checks and its errors."""

import shlex
import time
from pathlib import Path

import pytest

from tools.inspector import inspector
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import plugin

# The same code on every vLLM line: run once, in .venv (design/testing.md).
pytestmark = pytest.mark.release_independent


def inspect(flags: str) -> int:
    """The inspector's command line, ``flags`` as typed (without the served study)."""
    return inspector.main([*shlex.split(flags), "--no-serve"])


@pytest.fixture(autouse=True)
def uninstall_after():
    yield
    plugin.unregister()


def test_inspector_prints_a_checked_row_per_request(capsys):
    code = inspect(
        "--window 256 --seq-lens 100,256,1000,5000 --block-sizes 16,32 --method "
        "dspark --method eagle3"
    )
    out = capsys.readouterr().out
    assert code == 0
    for method in ("dspark", "eagle3"):
        assert "draft_window_size=256, block sizes [16, 32], alignment 32" in out
        assert f"\n{method} (" in out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 8 and all(row[-1] == "ok" for row in rows)
    # dspark, 5000-token context (+4 query tokens): start 4736 = floor((5004 - 256) / 32) * 32.
    assert rows[3][:5] == ["5000", "5004", "yes", "4736", "268"]


def test_inspector_checks_sinks_beside_the_window(capsys):
    code = inspect(
        "--window 256 --sinks 20 --seq-lens 100,300,1000,5000 --block-sizes 32 "
        "--method dspark --method eagle3"
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "draft_window_size=256, attention sinks 32 (draft_attention_sinks=20)" in out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 8 and all(row[-1] == "ok" for row in rows)
    # dspark, 300-token context (+4): start 32 = floor((304 - 256) / 32) * 32 meets the
    # sinks, so all 304 are read; 5000 (+4): start 4736, 32 sinks + 268 recent tokens.
    assert rows[1][:5] == ["300", "304", "yes", "0", "304"]
    assert rows[3][:5] == ["5000", "5004", "yes", "4736", "300"]


def test_inspector_shows_which_rows_engaged_the_window(capsys):
    code = inspect(
        "--window 256 --min-context 1000 --seq-lens 100,995,996,2000 --block-sizes 32 "
        "--method dspark --method eagle3"
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "draft_window_size=256, engaged from a context of 1000 (draft_window_min_context)" in out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 8 and all(row[-1] == "ok" for row in rows)
    # dspark's lengths count 4 query tokens: 995 + 4 = 999 reads whole, 996 + 4 its window.
    assert [row[:5] for row in rows[:4]] == [
        ["100", "104", "no", "0", "104"],
        ["995", "999", "no", "0", "999"],
        ["996", "1000", "yes", "736", "264"],
        ["2000", "2004", "yes", "1728", "276"],
    ]
    # eagle3's decode step reads one query token: 996 + 1 is still below the threshold.
    assert [row[2] for row in rows[4:]] == ["no", "no", "no", "yes"]


def test_inspector_says_when_a_threshold_changes_nothing(capsys):
    code = inspect(
        "--window 256 --min-context 288 --seq-lens 100,5000 --block-sizes 32 --method dspark"
    )
    out = capsys.readouterr().out
    assert code == 0 and "(draft_window_min_context=288 changes nothing)" in out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [row[2] for row in rows] == ["yes", "yes"]


@pytest.mark.parametrize("sinks", ["0", "16"])
def test_inspector_writes_its_plot(sinks, tmp_path):
    path = tmp_path / "blocks.png"
    code = inspector.main(
        [
            "--window",
            "64",
            "--sinks",
            sinks,
            "--seq-lens",
            "50,300",
            "--method",
            "dspark",
            "--no-serve",
            "--plot",
            str(path),
        ]
    )
    assert code == 0 and path.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--window", "0"], 'additional_config["draft_window_size"] must be a positive integer'),
        (["--window", "abc"], "got 'abc'"),
        (["--sinks", "-1"], 'additional_config["draft_attention_sinks"] must be an integer'),
        (
            ["--min-context", "8k"],
            'additional_config["draft_window_min_context"] must be an integer',
        ),
        (["--block-sizes", "16,x"], "--block-sizes must be comma-separated positive integers"),
        (["--seq-lens", "0"], "--seq-lens must be comma-separated positive integers"),
        (["--window", "3", "--num-spec-tokens", "3"], "smaller than the draft's query stretch"),
        (["--method", "mtp"], "invalid choice: 'mtp'"),
    ],
)
def test_bad_flags_stop_with_a_clear_error(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        inspector.main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_inspector_fails_when_the_window_is_wrong(capsys, monkeypatch):
    """A window that reads less than W (here: the math told W = 100) is caught."""
    from vllm_ascend.worker.v2.spec_decode.draft_window.window import WindowSpec

    real = WindowSpec.derive
    monkeypatch.setattr(
        WindowSpec, "derive", classmethod(lambda cls, window_size, *args: real(100, *args))
    )
    code = inspect("--window 256 --seq-lens 1000,5000 --method dspark")
    out = capsys.readouterr().out
    assert code == 1 and "FAILED" in out


def test_make_demo_shows_the_window_lines_and_none_of_vllms_cpu_warnings():
    """``python -m tools.inspector`` (what ``make demo`` runs) prints the window's two
    start-up lines, and none of the warnings vLLM logs about a CPU-only host. (What it serves
    after its tables, ``served.py``, runs in ``test_engine_study.py``.)"""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "VLLM_LOGGING_LEVEL"}
    argv = ["--window", "256", "--seq-lens", "1000,5000", "--method", "dspark", "--no-serve"]
    result = subprocess.run(
        [sys.executable, "-m", "tools.inspector", *argv],
        cwd=root,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    err = result.stderr
    assert "INFO Draft KV window on for dspark: draft_window_size=256" in err
    assert "INFO Draft KV window active: the first draft metadata build is windowed." in err
    for warning in ("Failed to import from vllm._C", "Pinned memory", "Reset SSM cache type"):
        assert warning not in err
    # Each of the window's lines whole on a line of its own, as a log keeps it: nothing redraws
    # over a line (a carriage return), and nothing else shares one with them.
    assert "\r" not in err
    lines = [line for line in err.split("\n") if "Draft KV window" in line]
    assert len(lines) == 2 and all(line.startswith("INFO Draft KV window") for line in lines)


def test_a_failure_in_the_tables_stops_the_study_started_beside_them(monkeypatch):
    """``make demo`` starts the served study before its tables (the study's first seconds
    take one core): where the tables fail, the study and every process it started stop."""
    import subprocess
    import sys

    from e2e.cpu_study import CpuStudy
    from tools.inspector import served

    # A study that has started a server of its own: a process group of two sleepers.
    script = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
    script += "'import time; time.sleep(600)']); print(flush=True); time.sleep(600)"
    started = []

    def start_study():
        study = subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        study.stdout.readline()  # its child is started
        started.append(study)
        return CpuStudy(study, Path("no-report"), {})

    def tables(args):
        raise RuntimeError("a table failed")

    monkeypatch.setattr(served, "start_study", start_study)
    monkeypatch.setattr(inspector, "tables", tables)
    with pytest.raises(RuntimeError, match="a table failed"):
        inspector.main(["--window", "256"])
    (study,) = started
    assert study.returncode is not None
    deadline = time.monotonic() + 10
    while live_in_group(study.pid) and time.monotonic() < deadline:
        time.sleep(0.1)  # the signal reaches the server asynchronously
    assert live_in_group(study.pid) == []


def live_in_group(group: int) -> list[int]:
    """The processes of process group ``group`` still running (zombies are not)."""
    live = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            live.append(int(stat.parent.name))
    return live


def test_a_study_that_stops_before_its_report_never_shows_an_earlier_runs(
    tmp_path, capsys, monkeypatch
):
    """A study refused before it clears its folder (a failed check) leaves the last run's
    report there: ``make demo`` says it failed and prints no table from it."""
    import subprocess
    import sys

    from e2e import cpu_study
    from tools.inspector import served

    earlier = tmp_path / f"study_{served.SCENARIO}" / "report.json"
    earlier.parent.mkdir()
    earlier.write_text("{}")  # an earlier run's; a table from it would raise
    real = subprocess.Popen

    def refused(command, **kwargs):
        assert command[1:3] == ["-m", "e2e"] and command[-2:] == ["--out", str(tmp_path)]
        script = "print('[e2e] cannot run'); raise SystemExit(2)"
        return real([sys.executable, "-c", script], **kwargs)

    monkeypatch.setattr(cpu_study.subprocess, "Popen", refused)
    assert not served.finish_study(served.start_study(tmp_path))
    out = capsys.readouterr().out
    assert "cannot run" in out and "Report:" not in out
