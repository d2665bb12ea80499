"""Paired comparison of two generation files (dapo_cli/eval/compare.py) on constructed results."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo_cli.errors import UserError
from dapo_cli.eval.compare import compare_accuracies, compare_results, per_problem_accuracy
from dapo_cli.eval.generations import CHECKPOINT_FILE, SampleRecord, generations_path, write_generations


def write_run(path: Path, correct: dict[str, int], k: int = 4) -> Path:
    """A generations parquet where problem p has ``correct[p]`` of ``k`` samples right."""
    records = [
        SampleRecord(pid, j, "r", "1", j < c, 1.0 if j < c else -1.0, "1", 3, False)
        for pid, c in correct.items()
        for j in range(k)
    ]
    write_generations(records, path)
    return path


def test_per_problem_accuracy() -> None:
    rows = [{"problem_id": "a", "acc": True}, {"problem_id": "a", "acc": False}, {"problem_id": "b", "acc": True}]
    assert per_problem_accuracy(rows) == {"a": 0.5, "b": 1.0}


def test_compare_known_answer(tmp_path: Path) -> None:
    # A is better by exactly 1/4 on every one of 4 problems: every resample of the paired
    # differences has mean 0.25 → CI [0.25, 0.25], share > 0 = 1.
    a = write_run(tmp_path / "a.parquet", {"0": 2, "1": 3, "2": 4, "3": 1})
    (tmp_path / "b").mkdir()
    write_run(tmp_path / "b" / "generations.parquet", {"0": 1, "1": 2, "2": 3, "3": 0})
    report = compare_results(str(a), str(tmp_path / "b"))
    c = report.comparison
    assert c.num_problems == 4
    assert (c.mean_a, c.mean_b) == pytest.approx((10 / 16, 6 / 16), abs=1e-12)
    assert c.diff == pytest.approx(0.25, abs=1e-12)
    assert (c.ci_low, c.ci_high) == pytest.approx((0.25, 0.25), abs=1e-12)
    assert c.share_positive == 1.0
    assert report.only_a == [] and report.only_b == []


def test_compare_intersection_reports_dropped_problems() -> None:
    # common problems 1 and 2 with differences 0 and -0.5 → diff -0.25; resample means are
    # 0 (p 1/4), -0.25 (p 1/2), -0.5 (p 1/4): never > 0.
    report = compare_accuracies({"0": 1.0, "1": 0.5, "2": 0.0}, {"1": 0.5, "2": 0.5, "10": 1.0})
    assert report.common == ["1", "2"]
    assert report.only_a == ["0"] and report.only_b == ["10"]
    assert report.comparison.diff == pytest.approx(-0.25, abs=1e-12)
    assert (report.comparison.ci_low, report.comparison.ci_high) == (-0.5, 0.0)
    assert report.comparison.share_positive == 0.0


def test_compare_empty_intersection_is_a_user_error() -> None:
    with pytest.raises(UserError, match="share no problem"):
        compare_accuracies({"0": 1.0}, {"1": 1.0})


def test_unfinished_or_missing_results_are_user_errors(tmp_path: Path) -> None:
    (tmp_path / CHECKPOINT_FILE).write_text("{}\n")
    with pytest.raises(UserError, match="unfinished evaluation"):
        generations_path(str(tmp_path))
    with pytest.raises(UserError, match="not found"):
        generations_path(str(tmp_path / "missing.parquet"))
