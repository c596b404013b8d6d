# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The upstream patch's e2e cases (``tools/upstream/vllm-ascend-0.30.0rc2/tests/e2e``), one file
per part of the series that brings a method: on the patched tree, vllm-ascend's pytest collects
each of them, each method a case of its own.

Collection is all that runs here: the cases serve 8B models on an NPU, on vllm-ascend's NPU CI.
"""

import subprocess
from pathlib import Path

from tests.ascend.npu_testbed import vllm_ascend_ut
from tools.upstream import patch as upstream

SPEC_DECODE = Path("tests/e2e/pull_request/one_card/spec_decode")
# Each new e2e file of the patch -> the test ids pytest collects from it.
EXPECTED = {
    "test_draft_window_dflash_dspark.py": {
        "test_dflash_dspark_draft_window_matches_mrv1[dspark]",
        "test_dflash_dspark_draft_window_matches_mrv1[dflash]",
    },
    "test_draft_window_eagle.py": {
        "test_eagle_draft_window_matches_mrv1[eagle]",
        "test_eagle_draft_window_matches_mrv1[eagle3]",
    },
}
# Stand-ins for what vllm-ascend's tests/e2e/conftest.py imports and this environment lacks,
# enough for collection only (nothing here downloads a model).
STAND_INS = {
    "modelscope.py": "def snapshot_download(*args, **kwargs):\n"
    "    raise RuntimeError('modelscope stand-in: e2e collection only')\n",
}


def _collected(tree: Path, out: Path) -> tuple[set[str], str]:
    """(the test ids, the output) of one ``pytest --collect-only`` of the e2e files in ``tree``."""
    stand_ins = out / "stand_ins"
    stand_ins.mkdir()
    for name, text in STAND_INS.items():
        (stand_ins / name).write_text(text)
    paths = [str(SPEC_DECODE / name) for name in sorted(EXPECTED)]
    done = subprocess.run(
        [*vllm_ascend_ut.PYTEST, "--collect-only", *paths],
        cwd=tree,
        env=vllm_ascend_ut.environment(tree, out, first=(stand_ins,)),
        capture_output=True,
        text=True,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    return {line for line in done.stdout.splitlines() if "::" in line}, output


def test_the_patched_tree_collects_each_e2e_case_of_the_patch(tmp_path):
    e2e = {path for path in upstream.new_files() if path.parts[:2] == ("tests", "e2e")}
    assert e2e == {SPEC_DECODE / name for name in EXPECTED}

    tree = upstream.patched_tree(tmp_path / "tree")
    ids, output = _collected(tree, tmp_path)
    expected = {
        f"{SPEC_DECODE / name}::{case}" for name, cases in EXPECTED.items() for case in cases
    }
    assert ids == expected, output[-4000:]
