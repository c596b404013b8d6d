# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""``make compare-trained-models`` (``tools/compare_trained.py``) holds the retrained models'
curve to the committed one's within its tolerance, point by point, and fails where one point
is farther. The studies themselves (real ``vllm serve``) run only in that make target; here
their curves are given."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import compare_trained

pytestmark = pytest.mark.release_independent

COMMITTED = {
    "v2_no_window": {32: 3.58, 512: 2.07, 1024: 1.92},
    "v2_window": {32: 3.58, 512: 3.02, 1024: 3.03},
}


def served(retrained_window_at_1024: float):
    """A stand-in for the two studies: the committed curve, and the retrained one equal to it
    but for the window's point at 1024 tokens."""

    def curve(scenario: str, models: Path | None, out: Path) -> dict[str, dict[int, float]]:
        found = {run: dict(points) for run, points in COMMITTED.items()}
        if models is not None:
            found["v2_window"][1024] = retrained_window_at_1024
        return found

    return curve


def test_a_retrained_curve_within_the_tolerance_passes(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(compare_trained, "curve", served(3.03 - 0.25))
    assert compare_trained.compare(tmp_path, tmp_path, tolerance=0.25) == []
    assert "1024: 3.03 / 2.78" in capsys.readouterr().out


def test_one_point_past_the_tolerance_fails_and_is_named(monkeypatch, tmp_path):
    monkeypatch.setattr(compare_trained, "curve", served(2.70))
    far = compare_trained.compare(tmp_path, tmp_path, tolerance=0.25)
    # Once per drafter: both are served over the same stand-in.
    assert far == [
        "draft model, W = 33, 1024 tokens: 3.03 against 2.70",
        "EAGLE3, W = 33, 1024 tokens: 3.03 against 2.70",
    ]
    monkeypatch.setattr(compare_trained, "ROOT", tmp_path)
    assert compare_trained.main([str(tmp_path)]) == 1


def test_a_study_that_did_not_run_stops_with_status_2(monkeypatch, tmp_path):
    def no_study(scenario, models, out):
        raise RuntimeError(f"the {scenario} study did not run")

    monkeypatch.setattr(compare_trained, "curve", no_study)
    monkeypatch.setattr(compare_trained, "ROOT", tmp_path)
    assert compare_trained.main([str(tmp_path)]) == 2
