# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The long-context study on CPU (``make study-cpu``: ``python -m e2e --device cpu --study
long``) in a process of its own, and its report read back: what ``make bench``, ``make
demo`` and ``make compare-trained-models`` run. The settings come by the Makefile's names
(``cli.SETTINGS``), the study's own among them (``cli.STUDY_OWN``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from e2e import cli
from e2e.scenarios import ROOT


@dataclass(frozen=True)
class CpuStudy:
    """A started study: its process (output piped, in a session of its own), where its
    report will be, and the settings it was given (the Makefile's names)."""

    process: subprocess.Popen
    report_path: Path
    settings: dict[str, str]

    @classmethod
    def start(
        cls, scenario: str, out: Path, settings: dict[str, str], env: dict[str, str] | None = None
    ) -> CpuStudy:
        """The study of ``scenario`` with ``settings`` (an empty value is not given) into
        ``out``; ``env``: variables over this process's (the engine's own, such as an AVX2
        path)."""
        given = {"DEVICE": "cpu", "STUDY": "long", "E2E_SCENARIO": scenario, **settings}
        command = [sys.executable, "-m", "e2e", *cli.flags(given), "--out", str(out)]
        report = cli.run_folder(Path(out), scenario, study=True) / "report.json"
        # An earlier run's report is not this run's (a study refused before it clears its
        # folder would leave it there).
        report.unlink(missing_ok=True)
        # A session of its own: ``stop`` stops its servers with it.
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        return cls(process, report, given)

    def finish(self) -> tuple[dict | None, str]:
        """Waits for the study: its report (None where it wrote none) and what it printed."""
        printed, _ = self.process.communicate()
        if not self.report_path.exists():
            return None, printed
        return json.loads(self.report_path.read_text()), printed

    def stop(self) -> None:
        """Stops the study and every process it started (its servers)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait()


def run(
    scenario: str, out: Path, settings: dict[str, str], env: dict[str, str] | None = None
) -> tuple[dict, str]:
    """The study run to its end (``CpuStudy.start``'s arguments): its report, failed checks
    included (its verdicts say them), and what it printed; a RuntimeError with the end of
    what it printed where it wrote no report (a sweep that failed, a setting refused)."""
    study = CpuStudy.start(scenario, out, settings, env)
    report, printed = study.finish()
    if report is None:
        raise RuntimeError(
            f"the {scenario} study wrote no report (exit {study.process.returncode}):\n"
            f"{printed[-4000:]}"
        )
    return report, printed
