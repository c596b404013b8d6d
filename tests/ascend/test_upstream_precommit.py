# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""vllm-ascend's pre-commit hooks about Python files (``tools/upstream/precommit.py``) pass on
the change of each part of the series, as its ``.pre-commit-config.yaml`` runs them and at the
versions it pins: a pull request its CI would not send back for formatting or spelling."""

import re
import shutil
from collections import Counter
from importlib.metadata import version
from pathlib import Path

import pytest

from tools.upstream import patch as upstream
from tools.upstream import precommit

pytestmark = pytest.mark.overlay
if version("vllm-ascend") != upstream.RELEASE:
    # .venv-030 has the tools at the versions that release's config pins.
    pytest.skip(f"the patch is made for vllm-ascend {upstream.RELEASE}", allow_module_level=True)


@pytest.fixture(scope="module")
def touched() -> list[set[str]]:
    """The files each part's patch adds or changes."""
    return [
        set(re.findall(r"^diff --git a/\S+ b/(\S+)$", patch, flags=re.M))
        for _, patch in upstream.make_series()
    ]


def _with_hook_scripts(tree: Path) -> Path:
    """The local hooks' scripts beside the tree's package (``tools/``, which the series leaves
    alone and ``patched_tree`` does not copy)."""
    shutil.copytree(upstream.PRISTINE / "tools", tree / "tools")
    return tree


def _report(found: list[precommit.Finding]) -> str:
    counts = ", ".join(f"{hook} {n}" for hook, n in sorted(Counter(f.hook for f in found).items()))
    return f"{len(found)} findings ({counts}):\n" + "\n".join(str(f) for f in found[:60])


@pytest.mark.parametrize(
    "parts", range(1, len(upstream.PARTS) + 1), ids=lambda n: "part 1" if n == 1 else f"parts 1-{n}"
)
def test_vllm_ascends_hooks_pass_on_each_parts_change(parts, touched, tmp_path):
    tree = _with_hook_scripts(upstream.patched_tree(tmp_path / "tree", parts=parts))
    files = sorted(set().union(*touched[:parts]))
    found = precommit.findings(tree, files)
    assert found == [], _report(found)


# A new module with one defect for each hook: a misspelling, unsorted imports, a line of 130
# characters, a forbidden import, a boolean of context managers, vllm-ascend's forbidden logger
# and a function of 103 lines without a comment; in a package without __init__.py, beside a
# file whose name has a space.
DEFECTS = "\n".join(
    [
        "import sys",
        "import os",
        "import re",
        "",
        "from vllm.logger import init_logger",
        "",
        "logger = init_logger(__name__)",
        "# teh window of the draft",
        f"WIDTH = {'1' * 122}",
        "",
        "",
        "def long(path):",
        "    with open(path) and open(os.devnull):",
        "        pass",
        *[f"    x{i} = {i}" for i in range(99)],
        "    return re.sub('x', '', sys.argv[0])",
        "",
    ]
)


def test_every_hook_reports_its_defect_in_a_new_module(tmp_path):
    tree = _with_hook_scripts(upstream.patched_tree(tmp_path / "tree", apply=False))
    package = tree / "vllm_ascend" / "defects"
    package.mkdir()
    (package / "module.py").write_text(DEFECTS)
    (package / "two words.py").write_text('"""Nothing but its name."""\n')
    assert len(DEFECTS.splitlines()[8]) == 130
    files = ["vllm_ascend/defects/module.py", "vllm_ascend/defects/two words.py"]
    found = precommit.findings(tree, files)
    by_hook = {hook.id: [f for f in found if f.hook == hook.id] for hook in precommit.hooks(tree)}
    assert {hook for hook, found_by in by_hook.items() if not found_by} == set(), _report(found)
    said = {hook: " ".join(f.message for f in found_by) for hook, found_by in by_hook.items()}
    assert "I001" in said["ruff-check"] and "E501" in said["ruff-check"]
    assert "teh" in said["codespell"] and "teh" in said["typos"]
    # The pristine tree itself is clean for the hooks over the whole tree: nothing of it counts.
    assert all("defects" in f.file or "defects" in f.message for f in found), _report(found)


def test_a_tool_at_another_version_than_the_hooks_rev_is_refused(tmp_path):
    config = (upstream.PRISTINE / precommit.CONFIG).read_text()
    assert "rev: v0.14.0" in config
    (tmp_path / precommit.CONFIG).write_text(config.replace("rev: v0.14.0", "rev: v0.13.3"))
    with pytest.raises(RuntimeError, match=r"pins ruff v0\.13\.3 for 'ruff-check', .* is 0\.14\.0"):
        precommit.hooks(tmp_path)
