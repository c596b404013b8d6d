# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The upstream patch (``make upstream-patch``, ``tools/upstream``): the second form of the
window, generated from the package, applied to vllm-ascend 0.30.0rc2's pristine source
distribution.

- it applies there (``git apply --check``) and touches only the call-site files and new ones;
- its new modules are the package's serving modules, byte for byte (one source);
- vllm-ascend's own unit tests give the same outcome for every test on the patched tree as
  on the pristine one (the window off: none of them sets it), and the patch's own unit tests
  pass there, on vllm-ascend's conftest stand-ins;
- the same change as a series of pull requests: each part applies with ``git apply`` on the
  previous one, the last ends in the patch's tree, and each earlier part's tree passes its
  own tests and the tests of the parts before it.

The window's own tests run against the patched tree in ``make test-upstream``
(``DRAFT_WINDOW_IN_TREE=1``).
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ascend.npu_testbed import vllm_ascend_ut
from tools.upstream import patch as upstream

pytestmark = pytest.mark.overlay


@pytest.fixture(scope="module")
def made() -> tuple[str, str]:
    return upstream.make_patch()


def _touched(patch: str) -> tuple[set[str], set[str]]:
    """(changed files, new files) of a git patch."""
    changed, new = set(), set()
    for block in re.split(r"^diff --git ", patch, flags=re.M)[1:]:
        path = block.split("\n", 1)[0].split(" b/", 1)[1]
        (new if "\nnew file mode" in block.split("@@", 1)[0] else changed).add(path)
    return changed, new


def test_the_patch_applies_to_the_pristine_sdist(made, tmp_path):
    patch, _ = made
    for name in upstream.CHANGED:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(upstream.PRISTINE / name, tmp_path / name)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    check = subprocess.run(
        ["git", "apply", "--check", "--whitespace=error-all", "-"],
        input=patch,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr
    # and not twice: the call sites are not there yet in the pristine tree
    assert "draft_window" not in (tmp_path / upstream.CHANGED[1]).read_text()


def test_the_patch_touches_the_call_site_files_and_adds_only_new_ones(made):
    changed, new = _touched(made[0])
    assert changed == set(upstream.CHANGED)
    package = str(upstream.PACKAGE)
    # Unit tests where vllm-ascend's mirror the source path, and e2e cases beside its own.
    ut = "tests/ut/worker/v2/spec_decode/draft_window/test_draft_window"
    e2e = "tests/e2e/pull_request/one_card/spec_decode/test_draft_window_"
    assert {p for p in new if not p.startswith((f"{package}/", e2e))} == {
        f"{ut}.py",
        f"{ut}_mrv1_parity.py",
        f"{ut}_eagle.py",
        f"{ut}_auto.py",
        f"{ut}_sinks.py",
        f"{ut}_dcp.py",
        f"{ut}_free_kv.py",
    }
    # The core by construction: every module of the package outside overlay/, nothing else.
    shipped = {p.removeprefix(f"{package}/") for p in new if p.startswith(package)}
    folder = upstream.ROOT / upstream.PACKAGE
    core = {
        str(p.relative_to(folder))
        for p in folder.rglob("*.py")
        if p.relative_to(folder).parts[0] != upstream.OVERLAY
    }
    assert shipped == core
    assert {"speculator.py", "autoregressive.py", "ascend.py", "window.py"} <= shipped


def test_the_new_modules_are_the_packages_own(made, tmp_path):
    """One source: every new file of the patch is the package's file as it is."""
    tree = upstream.patched_tree(tmp_path / "tree")
    for target, source in upstream.new_files().items():
        assert (tree / target).read_bytes() == source.read_bytes(), target
    assert not (tree / upstream.PACKAGE / upstream.OVERLAY).exists()


@pytest.fixture(scope="module")
def pristine_outcomes(tmp_path_factory) -> dict[str, str]:
    """vllm-ascend's own unit tests (``vllm_ascend_ut.SUBSET``) on the pristine tree, run once:
    none fails there."""
    root = tmp_path_factory.mktemp("pristine-ut")
    tree = upstream.patched_tree(root / "tree", apply=False)
    _passes_their_ci_test_layout_gate(tree)
    before = vllm_ascend_ut.run(tree, root)
    assert len(before) > 900
    assert not [name for name, outcome in before.items() if outcome in ("failed", "error")]
    return before


def _passes_their_ci_test_layout_gate(tree: Path) -> None:
    """vllm-ascend's CI gate over its test layout (``.github/workflows/scripts/coverage.py``):
    every e2e file has an estimated time, every path its test config names exists."""
    gate = subprocess.run(
        [sys.executable, ".github/workflows/scripts/coverage.py"],
        cwd=tree,
        capture_output=True,
        text=True,
    )
    assert gate.returncode == 0 and "REVIEW RESULT" in gate.stdout, gate.stdout + gate.stderr


def _keeps_their_outcomes_and_ours_pass(outcomes: dict[str, str], before: dict[str, str]) -> None:
    assert {name: outcomes.get(name) for name in before} == before
    added = {name: outcome for name, outcome in outcomes.items() if name not in before}
    assert added and all(
        name.startswith("tests.ut.worker.v2.spec_decode.draft_window.test_draft_window")
        for name in added
    )
    assert set(added.values()) == {"passed"}, added


def test_vllm_ascends_own_unit_tests_keep_every_outcome_and_the_patchs_own_pass(
    pristine_outcomes, tmp_path
):
    patched = upstream.patched_tree(tmp_path / "patched")
    after = vllm_ascend_ut.run(patched, tmp_path, (*vllm_ascend_ut.SUBSET, str(upstream.UT)))
    _keeps_their_outcomes_and_ours_pass(after, pristine_outcomes)
    _passes_their_ci_test_layout_gate(patched)


@pytest.fixture(scope="module")
def series() -> list[tuple[upstream.Part, str]]:
    return upstream.make_series()


def test_each_part_applies_on_the_previous_and_the_last_ends_in_the_patch(series, made, tmp_path):
    parts, whole = tmp_path / "parts", tmp_path / "whole"
    for tree in (parts, whole):
        for name in upstream.CHANGED:
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(upstream.PRISTINE / name, tree / name)
        subprocess.run(["git", "init", "-q"], cwd=tree, check=True)
    for part, patch in series:
        applied = subprocess.run(
            ["git", "apply", "--whitespace=error-all", "-"],
            input=patch,
            cwd=parts,
            capture_output=True,
            text=True,
        )
        assert applied.returncode == 0, f"part {part.number}: {applied.stderr}"
    subprocess.run(["git", "apply", "-"], input=made[0], cwd=whole, check=True, text=True)
    files = {
        p.relative_to(whole) for p in whole.rglob("*") if p.is_file() and ".git" not in p.parts
    }
    assert files == {
        p.relative_to(parts) for p in parts.rglob("*") if p.is_file() and ".git" not in p.parts
    }
    for name in files:
        assert (parts / name).read_bytes() == (whole / name).read_bytes(), name


def test_each_part_is_one_pull_request_in_vllm_ascends_template(series):
    headings = (
        "### What this PR does / why we need it?",
        "### Does this PR introduce _any_ user-facing change?",
        "### How was this patch tested?",
    )
    for part, patch in series:
        description = part.description.read_text()
        title = description.splitlines()[0]
        assert title.startswith("[Feature] "), title
        assert f"[PATCH {part.number}/{len(series)}]" in patch
        # Every section of the template, in its order, with a body of its own.
        starts = [description.find(heading) for heading in headings]
        assert -1 not in starts and starts == sorted(starts), part
        bodies = [
            description[start + len(heading) : end]
            for start, heading, end in zip(starts, headings, [*starts[1:], None], strict=True)
        ]
        assert all(body.strip() for body in bodies), part
        # Its own tests: the test files it adds are the ones the table gives it, and the
        # section on testing names each of them.
        _, new = _touched(patch)
        tests = {p for p in new if p.startswith("tests/")}
        own = {str(p) for p, number in upstream.PART_FILES.items() if number == part.number}
        assert {p for p in own if p.startswith("tests/")} <= tests and tests, part
        assert all(f"`{test}`" in bodies[-1] for test in tests), part


@pytest.mark.parametrize("parts", range(1, len(upstream.PARTS)))
def test_each_earlier_parts_tree_passes_its_tests_and_keeps_vllm_ascends_outcomes(
    parts, pristine_outcomes, tmp_path
):
    """Each part as it would be reviewed: its tree passes its own tests and the earlier parts',
    and vllm-ascend's own unit tests keep the pristine tree's outcomes on it."""
    tree = upstream.patched_tree(tmp_path / "tree", parts=parts)
    tests = sorted(
        str(p.relative_to(tree)) for p in (tree / upstream.UT).glob("test_draft_window*")
    )
    later = {str(p) for p, number in upstream.PART_FILES.items() if number > parts}
    assert tests and not later & set(tests)
    assert not [p for p in later if (tree / p).exists()]
    outcomes = vllm_ascend_ut.run(tree, tmp_path, (*vllm_ascend_ut.SUBSET, *tests))
    _keeps_their_outcomes_and_ours_pass(outcomes, pristine_outcomes)
    _passes_their_ci_test_layout_gate(tree)
    # Every test file of the tree ran (a file pytest cannot import reports no test).
    modules = {test.removesuffix(".py").replace("/", ".") for test in tests}
    assert {name.split("::")[0] for name in outcomes} >= modules


def _numstat(patch: str) -> dict[str, int]:
    """Files, added and removed lines of code (outside ``tests/``) and of tests, as
    ``git apply --numstat`` counts them."""
    stat = subprocess.run(
        ["git", "apply", "--numstat", "-"], input=patch, capture_output=True, text=True, check=True
    ).stdout
    counts = dict.fromkeys(("files", "code", "removed", "tests", "test_files"), 0)
    for line in stat.splitlines():
        added, removed, path = line.split("\t")
        test = path.startswith("tests/")
        counts["test_files" if test else "files"] += 1
        counts["tests" if test else "code"] += int(added)
        counts["removed"] += 0 if test else int(removed)
    return counts


def _figure(n: int) -> str:
    return f"{n:,}"


def test_design_upstream_states_the_series_and_the_patch_as_generated(series, made):
    """design/upstream.md's line counts are those of the patch and series made now."""
    text = (upstream.ROOT / "design" / "upstream.md").read_text()
    for part, patch in series:
        n = _numstat(patch)
        row = (
            f"| `series/{part.description.name}` | {n['files']} files, +{_figure(n['code'])} / "
            f"-{_figure(n['removed'])} | +{_figure(n['tests'])} |"
        )
        assert row in text, f"part {part.number}: {row}"
    n = _numstat(made[0])
    folder = upstream.ROOT / upstream.PACKAGE
    core = [p for p in folder.rglob("*.py") if p.relative_to(folder).parts[0] != upstream.OVERLAY]
    lines = sum(len(p.read_text().splitlines()) for p in core)
    flat = " ".join(text.split())
    assert f"`{upstream.PACKAGE}/`, {len(core)} files, {_figure(lines)} lines:" in flat, (
        "New module"
    )
    assert (
        f"In all, {n['files'] + n['test_files']} files, +{_figure(n['code'] + n['tests'])} / "
        f"-{_figure(n['removed'])} (`git apply --numstat`): +{_figure(n['code'])} of code, "
        f"+{_figure(n['tests'])} of tests." in flat
    ), "In all"


def _docstring_share(files) -> float:
    """Docstring lines (module, class and function docstrings) per line of ``files``."""
    import ast

    lines = docstrings = 0
    for path in files:
        source = path.read_text(encoding="utf-8")
        lines += len(source.splitlines())
        for node in ast.walk(ast.parse(source)):
            documented = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
            if isinstance(node, documented) and ast.get_docstring(node, clean=False) is not None:
                first = node.body[0]
                docstrings += first.end_lineno - first.lineno + 1
    return docstrings / lines


def test_the_cores_docstrings_are_as_dense_as_vllm_ascends_and_cite_nothing_it_lacks():
    """The pull request's new modules document themselves about as densely as vllm-ascend
    0.30.0rc2's own ``worker/v2/spec_decode`` (within half a point of its share of lines,
    either way),
    and name nothing a vllm-ascend reader does not have: this repository's design pages,
    its make targets, the plugin form's overlay."""
    core = sorted((upstream.ROOT / upstream.PACKAGE).glob("*.py"))
    theirs = sorted((upstream.PRISTINE / "vllm_ascend/worker/v2/spec_decode").rglob("*.py"))
    assert len(core) > 10 and len(theirs) > 10
    assert abs(_docstring_share(core) - _docstring_share(theirs)) <= 0.005
    foreign = re.compile(r"design/|\.md\b|\bmake (demo|test|bench|upstream)|overlay|hooks/")
    cited = [f"{p.name}: {m.group(0)}" for p in core for m in foreign.finditer(p.read_text())]
    assert cited == []


def _annotations(path) -> list:
    """(annotation, where) of every annotation of ``path``: ``where`` is ``"*args"`` for a
    variadic parameter, ``"__getattr__"`` for that method's return, else ``""``."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.AnnAssign):
            found.append((node.annotation, ""))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args
            named = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
            found += [(a.annotation, "") for a in named if a.annotation is not None]
            variadic = [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
            found += [(a.annotation, "*args") for a in variadic if a.annotation is not None]
            if node.returns is not None:
                found.append((node.returns, "__getattr__" if node.name == "__getattr__" else ""))
    return found


def _uses_of_any(annotation) -> list[str]:
    """Each ``Any`` of ``annotation`` as the type it is written in: ``dict[str, Any]``,
    ``Callable[..., Any]``, or ``Any`` alone."""
    import ast

    uses = []
    for node in ast.walk(annotation):
        if isinstance(node, ast.Subscript):
            inner = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if any(isinstance(e, ast.Name) and e.id == "Any" for e in inner):
                uses.append(ast.unparse(node))
    if isinstance(annotation, ast.Name) and annotation.id == "Any":
        uses.append("Any")
    return uses


def _type_checking_imports(path) -> list[tuple[str, str]]:
    """(module, name) of every ``from module import name`` under ``if TYPE_CHECKING:``."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for statement in node.body:
                if isinstance(statement, ast.ImportFrom):
                    found += [(statement.module, alias.name) for alias in statement.names]
    return found


def _defines(source: str, name: str) -> bool:
    import ast

    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef) and node.name == name:
            return True
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
        if isinstance(node, ast.ImportFrom) and name in {a.asname or a.name for a in node.names}:
            return True
    return False


def test_the_cores_types_are_vllms_and_vllm_ascends_own_and_any_only_as_they_declare_it():
    """The core annotates vLLM's and vllm-ascend's objects with their own classes: every name
    it imports for annotations only is defined where it says, in the installed vLLM 0.30 or
    the pristine vllm-ascend 0.30.0rc2; and every annotation with ``Any`` in it is one vLLM's
    Model Runner V2 or vllm-ascend's ``worker/v2`` writes themselves (their attention
    metadata and FIA parameters are ``dict[str, Any]``, ``additional_config`` is a ``dict``)."""
    import importlib
    import importlib.util
    from pathlib import Path

    core = sorted((upstream.ROOT / upstream.PACKAGE).glob("*.py"))
    vllm = Path(importlib.util.find_spec("vllm").submodule_search_locations[0])
    imported = {item for path in core for item in _type_checking_imports(path)}
    assert len(imported) >= 8
    for module, name in sorted(imported):
        parts = module.split(".")
        if parts[0] not in ("vllm", "vllm_ascend"):
            assert hasattr(importlib.import_module(module), name), f"{module}.{name}"
            continue
        # The core's own modules (for annotations only) are the patch's, not the pristine tree's.
        core_module = module.startswith(str(upstream.PACKAGE).replace("/", "."))
        root = (
            upstream.ROOT
            if core_module
            else upstream.PRISTINE
            if parts[0] == "vllm_ascend"
            else vllm.parent
        )
        source = root.joinpath(*parts)
        file = source / "__init__.py" if source.is_dir() else source.with_suffix(".py")
        assert _defines(file.read_text(encoding="utf-8"), name), f"{module}.{name}"
    theirs = {
        use
        for folder in (vllm / "v1/worker/gpu", upstream.PRISTINE / "vllm_ascend/worker/v2")
        for path in folder.rglob("*.py")
        for annotation, _ in _annotations(path)
        for use in _uses_of_any(annotation)
        if use != "Any"
    }
    ours = [
        (path.name, use, where)
        for path in core
        for annotation, where in _annotations(path)
        for use in _uses_of_any(annotation)
    ]
    assert ours, "the core annotates vLLM's attention metadata"
    # Alone, only a wrapper's variadic parameters and a view's __getattr__ are Any.
    alone = [(name, where) for name, use, where in ours if use == "Any" and not where]
    assert alone == []
    assert {(name, use) for name, use, _ in ours if use != "Any" and use not in theirs} == set()


def _their_mypy_flags() -> list[str]:
    """The flags vllm-ascend's ``tools/mypy.sh`` gives mypy, at the lowest Python version its
    CI checks (3.10, as ``.github/workflows/pr_test.yaml`` runs it)."""
    script = (upstream.PRISTINE / "tools" / "mypy.sh").read_text()
    (line,) = [line for line in script.splitlines() if line.strip().startswith("mypy --")]
    assert (
        '"$@"' in line
        and "3.10" in (upstream.PRISTINE / ".github/workflows/pr_test.yaml").read_text()
    )
    flags = line.split()[1:-1]
    return [flag.replace('"${PYTHON_VERSION}"', "3.10") for flag in flags]


def _type_check(tree: Path, cache: Path) -> list[str]:
    """vllm-ascend's type check of its package on ``tree`` (its flags and ``mypy.ini``; vLLM
    and torch from this environment), incremental over ``cache``: each error, without its
    line number."""
    command = [sys.executable, "-m", "mypy", "--python-executable", sys.executable]
    command += [*_their_mypy_flags(), "--cache-dir", str(cache), "vllm_ascend"]
    run = subprocess.run(
        command,
        cwd=tree,
        capture_output=True,
        text=True,
    )
    assert run.returncode in (0, 1) and "errors prevented further checking" not in run.stdout, (
        run.stdout[-2000:] + run.stderr[-2000:]
    )
    assert (tree / "mypy.ini").is_file()
    return sorted(
        re.sub(r":\d+: ", ": ", line) for line in run.stdout.splitlines() if ": error:" in line
    )


@pytest.fixture(scope="module")
def type_checked(tmp_path_factory) -> tuple[Path, Path, list[str]]:
    """Where every tree is type-checked (one path, one mypy cache: each later tree re-checks
    what its patch changed and what depends on it, as mypy's incremental mode does on a
    developer's checkout), and the pristine tree's errors, checked there first."""
    root = tmp_path_factory.mktemp("type-check")
    tree, cache = root / "tree", root / ".mypy_cache"
    return tree, cache, _type_check(upstream.patched_tree(tree, apply=False), cache)


@pytest.mark.parametrize(
    "parts",
    [*range(1, len(upstream.PARTS)), None],
    ids=lambda n: f"parts 1-{n}" if n else "the patch",
)
def test_vllm_ascends_type_check_reports_nothing_new_on_each_parts_tree(parts, type_checked):
    """vllm-ascend's CI runs mypy over its package (``tools/mypy.sh``): the tree of each part of
    the series, and of the whole patch, gets exactly the errors the pristine tree gets."""
    directory, cache, pristine = type_checked
    tree = upstream.patched_tree(directory, parts=parts)
    assert (tree / upstream.PACKAGE / "window.py").is_file()
    assert _type_check(tree, cache) == pristine
