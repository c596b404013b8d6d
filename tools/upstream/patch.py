# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Making the patch from the package, and applying it to a pristine vllm-ascend tree."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RELEASE = "0.30.0rc2"
HERE = Path(__file__).resolve().parent / f"vllm-ascend-{RELEASE}"
# The pristine source distribution `make setup` fetches (sha256-pinned) and unpacks.
PRISTINE = ROOT / ".cache" / f"vllm-ascend-{RELEASE}" / f"vllm_ascend-{RELEASE}"
PACKAGE = Path("vllm_ascend/worker/v2/spec_decode/draft_window")
# The plugin form's own folder: the core is everything else in the package, byte for byte.
OVERLAY = "overlay"
# vllm-ascend's files the call sites change (call_sites.diff).
CHANGED = (
    "vllm_ascend/ascend_config.py",
    "vllm_ascend/worker/v2/spec_decode/autoregressive/speculator.py",
    "vllm_ascend/worker/v2/spec_decode/dflash/speculator.py",
    "vllm_ascend/worker/v2/spec_decode/dspark/speculator.py",
    # Each e2e file's entry, which vllm-ascend's CI (its coverage.py) requires.
    ".github/workflows/scripts/estimated_times.yaml",
)
OUT = ROOT / "dist" / f"vllm-ascend-{RELEASE}-draft-window.patch"
# The same change as a series of pull requests, each applying on the previous one.
SERIES = HERE / "series"
SERIES_OUT = ROOT / "dist" / f"vllm-ascend-{RELEASE}-draft-window"


@dataclass(frozen=True)
class Part:
    """One pull request of the series: ``series/<number>-<name>.md`` is its description (the
    first line its title) and ``series/without-part-<number>.diff`` takes it out of the files
    it shares with the earlier parts (none for the first)."""

    number: int
    name: str

    @property
    def description(self) -> Path:
        return SERIES / f"{self.number}-{self.name}.md"

    @property
    def without(self) -> Path:
        return SERIES / f"without-part-{self.number}.diff"


PARTS = (
    Part(1, "window"),
    Part(2, "eagle"),
    Part(3, "auto"),
    Part(4, "sinks-and-threshold"),
    Part(5, "dcp"),
    Part(6, "free-kv"),
)
# The patch's own tests: unit tests mirroring the package's path, e2e cases beside vllm-ascend's.
UT = Path("tests/ut/worker/v2/spec_decode/draft_window")
E2E = Path("tests/e2e/pull_request/one_card/spec_decode")
# New files a later part adds whole; every other new file is the first part's.
PART_FILES = {
    PACKAGE / "autoregressive.py": 2,
    PACKAGE / "ascend.py": 2,
    UT / "test_draft_window_eagle.py": 2,
    E2E / "test_draft_window_eagle.py": 2,
    PACKAGE / "declared.py": 3,
    UT / "test_draft_window_auto.py": 3,
    UT / "test_draft_window_sinks.py": 4,
    PACKAGE / "dcp.py": 5,
    UT / "test_draft_window_dcp.py": 5,
    UT / "test_draft_window_free_kv.py": 6,
}


def new_files() -> dict[Path, Path]:
    """The patch's new files (path in vllm-ascend's tree -> source here): the package's core
    (all of it but ``overlay/``) and the patch's own unit tests."""
    files = {}
    for source in sorted((ROOT / PACKAGE).rglob("*.py")):
        relative = source.relative_to(ROOT / PACKAGE)
        if relative.parts[0] == OVERLAY:
            continue
        files[PACKAGE / relative] = source
    tests = HERE / "tests"
    for source in sorted(tests.rglob("*.py")):
        files[Path("tests") / source.relative_to(tests)] = source
    return files


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=draft-window", "-c", "user.email=draft-window@localhost", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def _pristine() -> Path:
    if not (PRISTINE / "vllm_ascend").is_dir():
        raise SystemExit(
            f"no pristine vllm-ascend {RELEASE} source tree at {PRISTINE}: run `make setup`"
        )
    return PRISTINE


def _scratch_tree(tree: Path) -> None:
    """A git tree at ``tree`` holding the changed files as the pristine sdist has them
    (committed), with the whole change in its work tree."""
    pristine = _pristine()
    for name in CHANGED:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(pristine / name, tree / name)
    _git(tree, "init", "-q")
    _git(tree, "add", "-A")
    _git(tree, "commit", "-q", "-m", f"vllm-ascend {RELEASE}")
    _git(tree, "apply", str(HERE / "call_sites.diff"))
    for target, source in new_files().items():
        (tree / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, tree / target)


def make_patch() -> tuple[str, str]:
    """(the patch, its ``git diff --stat``), made in a scratch git tree holding the changed
    files as the pristine sdist has them."""
    with tempfile.TemporaryDirectory() as scratch:
        tree = Path(scratch)
        _scratch_tree(tree)
        _git(tree, "add", "-A")
        return _git(tree, "diff", "--cached"), _git(tree, "diff", "--cached", "--stat=100")


def make_series() -> list[tuple[Part, str]]:
    """Each part with its patch (``git format-patch``: the description, then the diff on the
    previous part). The whole change is taken apart from the last part down: its own files
    removed, then its ``without`` diff applied; the parts are then committed in order."""
    with tempfile.TemporaryDirectory() as scratch:
        tree = Path(scratch)
        _scratch_tree(tree)
        touched = {str(p) for p in (*CHANGED, *new_files())}
        states = {}
        for part in reversed(PARTS):
            states[part.number] = {
                name: (tree / name).read_bytes() for name in touched if (tree / name).exists()
            }
            for name, number in PART_FILES.items():
                if number == part.number:
                    (tree / name).unlink()
            if part.number > 1:
                _git(tree, "apply", str(part.without))
        base = _git(tree, "rev-parse", "HEAD").strip()
        for part in PARTS:
            for name in touched:
                path = tree / name
                if name in states[part.number]:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(states[part.number][name])
                elif path.exists():
                    path.unlink()
            _git(tree, "add", "-A")
            _git(tree, "commit", "-q", "-F", str(part.description))
        out = tree / ".series"
        _git(tree, "format-patch", "-q", "--no-signature", "-o", str(out), f"{base}..HEAD")
        patches = sorted(out.iterdir())
        return [(part, path.read_text()) for part, path in zip(PARTS, patches, strict=True)]


def write_patch(out: Path = OUT) -> tuple[Path, str]:
    patch, stat = make_patch()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(patch)
    return out, stat


def write_series(out: Path = SERIES_OUT) -> list[Path]:
    """The series as ``<number>-<name>.patch`` files in ``out`` (cleared first)."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    paths = []
    for part, patch in make_series():
        path = out / f"{part.number:04d}-{part.name}.patch"
        path.write_text(patch)
        paths.append(path)
    return paths


def patched_tree(directory: Path, apply: bool = True, parts: int | None = None) -> Path:
    """A vllm-ascend source tree at ``directory``: the pristine sdist's ``vllm_ascend``,
    ``tests`` and ``.github`` (and the files at its root), with the patch applied by
    ``git apply`` unless ``apply`` is False (with ``parts``: the series' first ``parts`` pull
    requests, one ``git apply`` each); plus the ``_build_info.py`` vllm-ascend's build writes
    (an A2 SOC, as the Ascend environments have it)."""
    pristine = _pristine()
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    for entry in pristine.iterdir():
        if entry.is_dir() and entry.name not in ("vllm_ascend", "tests", ".github"):
            continue
        copy = shutil.copytree if entry.is_dir() else shutil.copy2
        copy(entry, directory / entry.name)
    if apply:
        if parts is None:
            patches = [make_patch()[0]]
        else:
            patches = [patch for _, patch in make_series()[:parts]]
        # Its own repository: git apply inside another one's work tree (this project's
        # .cache) would skip every path.
        _git(directory, "init", "-q")
        for patch in patches:
            subprocess.run(
                ["git", "apply", "--whitespace=error-all", "-"],
                input=patch,
                cwd=directory,
                check=True,
                text=True,
            )
    (directory / "vllm_ascend" / "_build_info.py").write_text(
        "# Auto-generated file\n__device_type__ = 'A2'\n"
    )
    return directory
