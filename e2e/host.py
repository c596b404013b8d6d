# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The run's host and folder: the install and the pairing check, free ports, what this host
lacks; the run's own folder and its record of what produced it (``run.json``)."""

from __future__ import annotations

import base64
import dataclasses
import datetime
import hashlib
import json
import platform
import shlex
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from e2e import cli, lossless, study, sweep_plan
from e2e.scenarios import (
    ROOT,
    Run,
    Scenario,
    trained_models,
)


@dataclass
class Job:
    """One run of the harness, or ``--check`` of one: its scenario on its device, its
    folder, the settings given (the Makefile's names: ``cli.SETTINGS``), what produced it
    (``run.json``) and, for the study, the study's settings."""

    scenario: Scenario
    device: str
    out: Path
    given: dict[str, str]
    produced: dict | None = None
    settings: study.Settings | None = None

    @property
    def policy(self) -> lossless.Policy:
        return lossless.Policy.for_run(self.device, self.given)


PLUGIN_MODULE = "vllm_ascend.worker.v2.spec_decode.draft_window.overlay.plugin"


def record_hashes(dist: str) -> dict[str, str]:
    """Current sha256 of every file a distribution's RECORD lists."""
    out = {}
    for f in metadata.distribution(dist).files or []:
        path = Path(f.locate())
        if path.is_file() and f.hash is not None:
            digest = hashlib.sha256(path.read_bytes()).digest()
            out[str(f)] = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    return out


def install(device: str) -> None:
    if device == "cpu":
        # make installed this project into .venv (a regular install); the servers import it
        # from there, never from this checkout (they start in the study's folder).
        probe = [sys.executable, "-c", f"import {PLUGIN_MODULE}"]
        if subprocess.run(probe, capture_output=True, cwd="/").returncode != 0:
            raise SystemExit(f"{PLUGIN_MODULE} is not installed here: run make study-cpu")
        return
    before = record_hashes("vllm-ascend") if device == "ascend" else {}
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", str(ROOT)]
    try:
        # Offline hosts: build with the environment's own setuptools when it is recent enough.
        if int(metadata.version("setuptools").split(".")[0]) >= 77:
            cmd.insert(-1, "--no-build-isolation")
    except metadata.PackageNotFoundError:
        pass
    print(f"[e2e] {shlex.join(cmd)}", flush=True)
    subprocess.run(cmd, check=True)
    if device == "ascend":
        after = record_hashes("vllm-ascend")
        changed = sorted(p for p, h in before.items() if after.get(p) != h)
        if changed:
            raise SystemExit(f"installing this project changed vllm-ascend files: {changed[:5]}")
    # An editable vllm-ascend hides the namespace folders this overlay installs into.
    probe = [sys.executable, "-c", f"import {PLUGIN_MODULE}"]
    if subprocess.run(probe, capture_output=True).returncode != 0:
        raise SystemExit(
            f"{PLUGIN_MODULE} does not import after the install (is vllm-ascend "
            "installed editable? install it regularly)"
        )


def check_pairing(method: str) -> None:
    """Before any server: the host's vLLM (and vllm-ascend) must be a release the window
    supports, and serve the scenario's method there (the installed package's own table)."""
    probe = [sys.executable, "-c", PAIRING_PROBE, method]
    result = subprocess.run(probe, capture_output=True, text=True)
    print(f"[e2e] {result.stdout.strip()}", flush=True)
    if result.returncode != 0:
        raise SystemExit(result.stdout.strip().splitlines()[-1] if result.stdout else result.stderr)


# Run in the host's Python after the install: the versions and the supported supported.
PAIRING_PROBE = """
import sys
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import supported, versions
installed = versions.installed_versions()
line = supported.release_for(installed["vllm"])
print(f"host: {versions.describe_versions()}; supported: {supported.SUPPORTED}")
problem = None
if line is None:
    problem = f"vLLM {installed['vllm']} is not a release the draft window supports"
else:
    problem = versions.requirement_problem(line)
    if problem is None and sys.argv[1] not in line.methods:
        problem = (f"the draft window does not serve method {sys.argv[1]!r} on {line.name} "
                   f"(supported there: {', '.join(line.methods)}): pick another E2E_SCENARIO")
if problem:
    print(f"cannot run: {problem}")
    sys.exit(2)
"""


def host_problem(device: str, name: str, given: dict[str, str]) -> str | None:
    """What this host lacks for the run: the committed tiny models (CPU, the tiny scenario),
    the device's cards, vllm-ascend on Ascend; None where it lacks nothing."""
    if (device == "cpu" or name == "tiny") and "TARGET_MODEL" not in given:
        trained = trained_models()
        try:
            trained.committed()
        except trained.FixtureError as error:
            return f"needs the committed tiny models and their held-out text: {error}"
    probe = {"ascend": "npu-smi", "cuda": "nvidia-smi"}.get(device)
    if probe is not None and shutil.which(probe) is None:
        return f"needs {'Ascend NPUs' if device == 'ascend' else 'CUDA GPUs'}: {probe} not found"
    if device == "ascend" and version_of("vllm-ascend") is None:
        return "needs vllm-ascend installed in this environment"
    return None


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int, start: int = 8123) -> int:
    """The first port from ``start`` on with ``count`` free ports from it: a server already
    on a run's port (another run's) would answer its requests, and its own would not start."""
    for base in range(start, start + 1000):
        if all(_port_free(base + i) for i in range(count)):
            return base
    raise SystemExit(f"no {count} free ports from {start}: set PORT (--port)")


def own_folder(out_dir: Path, dry_run: bool = False) -> None:
    """Gives the run an empty ``out_dir``: a run's folder is cleared (vLLM's sweep refuses to
    write into an experiment folder that exists, and nothing of an earlier run may reach
    this run's report); a folder the run may not have (``cli.folder_problem``: a file, a
    folder no run of this harness wrote, results under a dry run) is refused. A dry run's
    folder holds no results (refused), so clearing it deletes none."""
    problem = cli.folder_problem(out_dir, dry_run)
    if problem:
        raise SystemExit(problem)
    if out_dir.is_dir():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)


def version_of(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def provenance(job: Job) -> dict:
    """What produces a run: the command (the settings given as its flags, the device's
    variables before it), the settings, the versions of the host's vLLM and vllm-ascend
    (the servers' environment), the models, the checkout, the time."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    scenario, given = job.scenario, job.given
    settings = {k: v for k, v in given.items() if k not in cli.DEVICE_ENV}
    command = [Path(sys.executable).name, "-m", "e2e", *cli.flags(settings)]
    return {
        "command": " ".join(
            [
                *(f"{k}={shlex.quote(given[k])}" for k in cli.DEVICE_ENV if k in given),
                shlex.join(command),
            ]
        ),
        "device": job.device,
        "settings": given,
        "versions": {
            "vllm": version_of("vllm"),
            "vllm-ascend": version_of("vllm-ascend"),
            "python": platform.python_version(),
        },
        "models": {"target": scenario.target, "draft": scenario.draft, "method": scenario.method},
        "commit": commit.stdout.strip() if commit.returncode == 0 else None,
        "started": now(),
    }


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def start_run(job: Job, dry_run: bool = False) -> dict:
    """Clears the run's folder and records in it what produces the run: after every check
    (the settings', the install's, the pairing's) has passed."""
    own_folder(job.out, dry_run)
    produced = provenance(job)
    (job.out / cli.RUN_RECORD).write_text(json.dumps(produced, indent=2) + "\n")
    return produced


def record_plan(
    out_dir: Path,
    scenario: Scenario,
    planned: list[Run],
    sweeps: list[sweep_plan.Sweep],
    settings: study.Settings | None = None,
) -> None:
    """Adds the run's plan to its record (run.json): the scenario, its runs, its sweeps and
    the study's settings, which ``--check`` reads back to check what the printed commands
    wrote into the folder."""
    record = json.loads((out_dir / cli.RUN_RECORD).read_text())
    record["plan"] = {
        "scenario": dataclasses.asdict(scenario)
        | {"golden": scenario.golden and str(scenario.golden)},
        "runs": [dataclasses.asdict(run) for run in planned],
        "sweeps": [one.name for one in sweeps],
        # What the servers were given: each sweep's vllm serve and its environment.
        "servers": {one.name: {"serve": shlex.join(one.serve), "env": one.env} for one in sweeps},
        "study": None if settings is None else dataclasses.asdict(settings),
    }
    (out_dir / cli.RUN_RECORD).write_text(json.dumps(record, indent=2) + "\n")
