# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""vllm-ascend's pre-commit hooks about Python files, run on a change to a vllm-ascend source
tree as its own ``.pre-commit-config.yaml`` configures them, at the tools' pinned versions
(requirements/vllm-ascend-lint.txt). Each hook reports instead of fixing."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from tools.upstream.patch import PRISTINE, _git

CONFIG = ".pre-commit-config.yaml"
# The environment's scripts: its pinned ruff, codespell and typos (not the first on PATH).
BIN = Path(sys.executable).parent
# pre-commit runs a Python hook in an environment of its own; here, this one's packages without
# its start-up files (.venv-030's .pth loads the torch_npu stand-ins: 1.4 s a process).
PYTHON = [sys.executable, "-S"]
PYTHON_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}),
}

# What a remote repository's hook runs, from its .pre-commit-hooks.yaml at the rev pinned; the
# config in the tree adds args, excludes and types to it.
MANIFESTS = {
    "ruff-check": {"entry": "ruff check --force-exclude", "types_or": ["python", "pyi", "jupyter"]},
    "ruff-format": {
        "entry": "ruff format --force-exclude",
        "types_or": ["python", "pyi", "jupyter"],
    },
    "codespell": {"entry": "codespell", "types": ["text"]},
    "typos": {"entry": "typos", "types": ["text"]},
}
# The tool each remote repository installs, whose version must be the repository's rev.
TOOLS = {
    "https://github.com/astral-sh/ruff-pre-commit": "ruff",
    "https://github.com/codespell-project/codespell": "codespell",
    "https://github.com/crate-ci/typos": "typos",
}
# The local hooks that check Python files, run by their own entry.
LOCAL = (
    "check-filenames",
    "python-init",
    "check-logger",
    "check-forbidden-imports",
    "check-boolean-context-manager",
    "check-long-functions",
)
# The hooks that do not apply to a change of Python files, and why.
SKIPPED = {
    "clang-format": "C++ files only",
    "markdownlint": "Markdown files only, and only in CI (stages: [manual])",
    "actionlint": "GitHub workflow files only",
    "gitleaks-offline-scan": "a secret scan by the gitleaks binary, not a Python check",
    "shellcheck": "shell scripts only",
    "png-lint": "PNG files only",
    "signoff-commit": "edits the commit message (stages: [prepare-commit-msg])",
    "check-symbolic-meta": "reads csrc/torch_binding_meta.cpp only (C++ meta kernels)",
    "suggestion": "prints a hint, checks nothing",
}
# Reporting instead of fixing, in a form the parsers read; everything else is the config's.
REPORT = {
    "ruff-check": lambda args: [arg for arg in args if arg != "--fix"] + ["--no-fix"],
    "ruff-format": lambda args: [*args, "--diff"],
    "typos": lambda args: [*args, "--format", "brief"],
}
# Identify's tags for the suffixes a change to Python files brings; "text" is read from the file.
SUFFIX_TAGS = {".py": "python", ".pyi": "pyi", ".ipynb": "jupyter", ".sh": "shell"}
# "path:line: message", "path:line:column: message", and ruff's github format's tail.
LOCATED = re.compile(r"(?P<file>[^\s:]+):(?P<line>\d+):(?:\d+:)?\s+(?P<message>.+)")
COLOUR = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Finding:
    """One thing a hook reports: ``line`` 0 is the whole file, ``file`` "" the whole tree."""

    hook: str
    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.hook}: {self.file}:{self.line}: {self.message}"


@dataclass(frozen=True)
class Hook:
    """One hook as the config resolves it: what it runs and on which files."""

    id: str
    command: list[str]
    types: list[str]
    types_or: list[str]
    files: str
    exclude: str
    pass_filenames: bool
    always_run: bool


def hooks(tree: Path) -> list[Hook]:
    """The hooks of the tree's config that check Python files, each tool checked to be at its
    hook's rev; a hook this module neither runs nor skips is an error."""
    config = yaml.safe_load((tree / CONFIG).read_text())
    resolved = []
    for repo in config["repos"]:
        for hook in repo["hooks"]:
            if hook["id"] in SKIPPED:
                continue
            if repo["repo"] == "local" and hook["id"] in LOCAL:
                spec = hook
            elif hook["id"] in MANIFESTS and repo["repo"] in TOOLS:
                _check_version(TOOLS[repo["repo"]], repo["rev"], hook["id"])
                spec = {**MANIFESTS[hook["id"]], **hook}
            else:
                raise ValueError(
                    f"{CONFIG} hook {hook['id']!r} ({repo['repo']}) is neither run nor skipped: "
                    "add it to LOCAL, MANIFESTS or SKIPPED in tools/upstream/precommit.py"
                )
            resolved.append(_resolve(spec, tree, config.get("exclude", "^$")))
    return resolved


def _resolve(spec: dict, tree: Path, exclude: str) -> Hook:
    command = shlex.split(spec["entry"])
    if command[0] in TOOLS.values():
        command[:1] = _tool(command[0])
    elif command[0] == "python3":
        command[:1] = PYTHON
    elif spec.get("language") == "script":
        command[0] = str(tree / command[0])
    args = list(spec.get("args", []))
    command += REPORT[spec["id"]](args) if spec["id"] in REPORT else args
    own_exclude = spec.get("exclude", "^$")
    return Hook(
        id=spec["id"],
        command=command,
        types=spec.get("types", ["file"]),
        types_or=spec.get("types_or", []),
        files=spec.get("files", ""),
        exclude=f"(?:{exclude})|(?:{own_exclude})",
        pass_filenames=spec.get("pass_filenames", True),
        always_run=spec.get("always_run", False),
    )


def _tool(name: str) -> list[str]:
    """The command that runs this environment's ``name``: codespell is a Python script, ruff
    and typos are programs."""
    path = BIN / name
    return [*PYTHON, str(path)] if path.read_bytes()[:2] == b"#!" else [str(path)]


def _check_version(tool: str, rev: str, hook: str) -> None:
    installed = None
    if (BIN / tool).is_file():
        command = [*_tool(tool), "--version"]
        words = subprocess.run(command, env=PYTHON_ENV, capture_output=True, text=True).stdout
        # "ruff 0.14.0", "2.4.1", "typos-cli 1.32.0"
        installed = words.split()[-1] if words.split() else None
    if installed != rev.removeprefix("v"):
        raise RuntimeError(
            f"{CONFIG} pins {tool} {rev} for {hook!r}, {BIN / tool} is {installed or 'missing'}: "
            "install requirements/vllm-ascend-lint.txt (make .venv-030/.ut-extra)"
        )


def findings(tree: Path, files: Sequence[str], pristine: Path = PRISTINE) -> list[Finding]:
    """What the hooks report on the change that brings ``files`` (relative to ``tree``) from
    ``pristine`` to what ``tree`` holds, as on a commit of it: the pristine state committed in
    the tree's git, the change staged. Hooks that run over the whole tree count only what they
    do not report on the pristine state. Empty: the change passes."""
    configured = hooks(tree)
    selected = {hook.id: _selected(hook, tree, files) for hook in configured}
    changed = {name: (tree / name).read_bytes() for name in files if (tree / name).is_file()}
    state = _commit_pristine(tree, files, pristine)
    before = set()
    for hook in configured:
        if not hook.pass_filenames:
            if (hook.id, state) not in _BEFORE:
                _BEFORE[hook.id, state] = {_key(f) for f in _run(hook, tree, [])}
            before |= _BEFORE[hook.id, state]
    for name, data in changed.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(data)
    _git(tree, "add", "-A")
    return [
        finding
        for hook in configured
        if selected[hook.id] or hook.always_run
        for finding in _run(hook, tree, selected[hook.id])
        if _key(finding) not in before
    ]


# The whole-tree hooks' findings on a pristine state, by hook and git tree id: the parts of a
# series all start from the same one.
_BEFORE: dict[tuple[str, str], set[tuple[str, str, str]]] = {}


def _key(finding: Finding) -> tuple[str, str, str]:
    """A finding without its line, which the change may move."""
    return finding.hook, finding.file, finding.message


def _selected(hook: Hook, tree: Path, files: Sequence[str]) -> list[str]:
    """The files pre-commit gives the hook: present, of its types, matching ``files``, not
    excluded."""
    chosen = []
    for name in files:
        path = tree / name
        if not path.is_file() or re.search(hook.exclude, name) or not re.search(hook.files, name):
            continue
        tags = {"file", *([SUFFIX_TAGS[path.suffix]] if path.suffix in SUFFIX_TAGS else [])}
        if b"\0" not in path.read_bytes():
            tags.add("text")
        if set(hook.types) <= tags and (not hook.types_or or tags & set(hook.types_or)):
            chosen.append(name)
    return chosen


def _commit_pristine(tree: Path, files: Sequence[str], pristine: Path) -> str:
    """The tree's git: HEAD the tree with ``files`` as ``pristine`` has them (absent where it
    has none), so that hooks reading the staged diff see the change; its git tree id."""
    for name in files:
        source, target = pristine / name, tree / name
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        elif target.exists():
            target.unlink()
    _git(tree, "init", "-q")
    _git(tree, "add", "-A")
    _git(tree, "commit", "-q", "--allow-empty", "-m", "pristine")
    return _git(tree, "rev-parse", "HEAD^{tree}").strip()


def _run(hook: Hook, tree: Path, files: list[str]) -> list[Finding]:
    """The hook's findings: none where it exits 0, as pre-commit passes it."""
    command = [*hook.command, *files] if hook.pass_filenames else hook.command
    run = subprocess.run(command, cwd=tree, env=PYTHON_ENV, capture_output=True, text=True)
    if run.returncode == 0:
        return []
    output = COLOUR.sub("", run.stdout + run.stderr)
    parse = _diff_hunks if hook.id == "ruff-format" else _located
    found = list(parse(hook.id, output, tree))
    return found or [Finding(hook.id, "", 0, output.strip())]


def _located(hook: str, output: str, tree: Path) -> Iterator[Finding]:
    for line in output.splitlines():
        # ruff's github format: "::error title=...,file=...::path:line:col: CODE message"
        match = LOCATED.search(line.rsplit("::", 1)[-1])
        if match:
            name = _relative(match["file"], tree)
            yield Finding(hook, name, int(match["line"]), match["message"].strip())


def _diff_hunks(hook: str, output: str, tree: Path) -> Iterator[Finding]:
    """One finding per hunk of ``ruff format --diff``: where the formatter would change code."""
    name = ""
    for line in output.splitlines():
        if line.startswith("--- "):
            name = _relative(line[4:].strip(), tree)
        elif line.startswith("@@ -"):
            start = int(line[4:].split(",")[0].split()[0])
            yield Finding(hook, name, start, "the formatter would change this hunk")


def _relative(name: str, tree: Path) -> str:
    """A path a hook printed, relative to the tree (some print absolute paths, some ``./``)."""
    path = Path(name)
    for root in (tree.absolute(), tree.resolve()):
        if path.is_absolute() and path.is_relative_to(root):
            path = path.relative_to(root)
    return path.as_posix()
