"""Grouping rows into problems (dapo_cli/eval/problems.py), on the real AIME file and on made-up rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo_cli.data.schema import make_row, read_dapo_rows
from dapo_cli.errors import UserError
from dapo_cli.eval.problems import describe_layout, group_problems

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
AIME = DATA / "aime-2024.parquet"


@pytest.mark.skipif(not AIME.is_file(), reason=f"shared data not found at {AIME}")
def test_aime_file_groups_into_30_problems_of_32_rows() -> None:
    rows = read_dapo_rows(AIME)
    problems = group_problems(rows)
    assert len(rows) == 960
    assert len(problems) == 30
    assert all(p.copies == 32 for p in problems)
    assert [p.problem_id for p in problems] == [str(i) for i in range(30)]
    # every problem's ground truth is the one all its rows carry (the file is shuffled)
    truths: dict[str, set[str]] = {}
    for row in rows:
        truths.setdefault(str(row["extra_info"]["index"]), set()).add(row["reward_model"]["ground_truth"])
    assert {p.problem_id: {p.ground_truth} for p in problems} == truths
    # problem 2 is the |z| = 4 problem with answer 540 (first row of the file)
    by_id = {p.problem_id: p for p in problems}
    assert by_id["2"].ground_truth == "540"
    assert "|z|=4" in by_id["2"].raw_problem
    assert by_id["2"].messages[0]["role"] == "user"
    assert by_id["2"].messages[0]["content"].startswith("Solve the following math problem")
    assert describe_layout(problems) == "960 rows → 30 problems (32 copies each)"


def test_rows_without_index_group_by_prompt_text() -> None:
    a = make_row("What is 1+1?", "2", index=0)
    b = make_row("What is 2+2?", "4", index=1)
    rows = [a, b, a]
    for row in rows:
        row["extra_info"] = {}
    problems = group_problems(rows)
    assert [p.copies for p in problems] == [2, 1]  # first appearance order, a twice
    assert problems[0].problem_id.startswith("p-") and problems[0].ground_truth == "2"


def test_missing_ground_truth_is_a_user_error() -> None:
    row = make_row("What is 1+1?", "2", index=0)
    row["reward_model"]["ground_truth"] = ""
    with pytest.raises(UserError, match="no reward_model.ground_truth"):
        group_problems([row])


def test_conflicting_rows_of_one_problem_are_a_user_error() -> None:
    with pytest.raises(UserError, match="disagree on the ground truth"):
        group_problems([make_row("What is 1+1?", "2", index=0), make_row("What is 1+1?", "3", index=0)])


def test_empty_rows_are_a_user_error() -> None:
    with pytest.raises(UserError, match="no rows"):
        group_problems([])
