"""Tests for ``dapo_cli.data.schema``: DAPO rows, parquet round trip, and one-line errors for bad files."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dapo_cli.data.schema import (
    DAPO_INSTRUCTION,
    DAPO_SCHEMA,
    is_dapo_table,
    make_row,
    read_dapo_rows,
    write_dapo_parquet,
)
from dapo_cli.errors import UserError

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
AIME = DATA / "aime-2024.parquet"


def test_make_row_fills_the_dapo_template() -> None:
    row = make_row("What is 1+1?", 2, index=3, split="test", original_answer="2.0", conversion="integer")
    assert row == {
        "data_source": "math_dapo",
        "prompt": [
            {
                "content": "Solve the following math problem step by step. The last line of your response should be "
                "of the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
                'What is 1+1?\n\nRemember to put your answer on its own line after "Answer:".',
                "role": "user",
            }
        ],
        "ability": "MATH",
        "reward_model": {"ground_truth": "2", "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": 3, "raw_problem": "What is 1+1?", "split": "test", "original_answer": "2.0", "conversion": "integer"},
    }


def test_make_row_custom_template_keeps_braces_in_the_problem() -> None:
    row = make_row("Find {x : x > 0}", "5", index=0, template="Q: {problem}", data_source="synthetic/x")
    assert row["prompt"][0]["content"] == "Q: Find {x : x > 0}"  # str.replace, not str.format
    assert row["data_source"] == "synthetic/x"


def test_write_then_read_round_trips(tmp_path: Path) -> None:
    rows = [make_row(f"problem {i}", str(i * i), index=i, split="train") for i in range(5)]
    path = tmp_path / "sub" / "train.parquet"
    write_dapo_parquet(rows, path)
    assert pq.read_schema(path).remove_metadata() == DAPO_SCHEMA
    assert read_dapo_rows(path) == rows
    assert [p.name for p in path.parent.iterdir()] == ["train.parquet"]  # written atomically, no temp left


def test_missing_extra_info_index_becomes_the_row_number(tmp_path: Path) -> None:
    rows = [make_row("a", "1", index=0), make_row("b", "2", index=0)]
    for row in rows:
        row["extra_info"]["index"] = None
    path = tmp_path / "x.parquet"
    write_dapo_parquet(rows, path)
    assert [r["extra_info"]["index"] for r in read_dapo_rows(path)] == [0, 1]


def test_is_dapo_table() -> None:
    assert is_dapo_table(["data_source", "prompt", "ability", "reward_model", "extra_info"])
    assert is_dapo_table(["prompt", "reward_model"])
    assert not is_dapo_table(["problem", "answer"])
    assert not is_dapo_table(["prompt"])


def write_table(path: Path, columns: dict) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def test_read_errors_are_user_errors_that_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"dataset file not found: .*nope\.parquet \(give a parquet file in the DAPO schema\)"):
        read_dapo_rows(tmp_path / "nope.parquet")
    (tmp_path / "text.parquet").write_text("not parquet", encoding="utf-8")
    with pytest.raises(UserError, match="cannot read .*text.parquet as parquet"):
        read_dapo_rows(tmp_path / "text.parquet")
    raw = write_table(tmp_path / "raw.parquet", {"problem": ["1+1"], "answer": ["2"]})
    with pytest.raises(UserError, match="not in the DAPO schema .* convert it with `dapo prepare-data`"):
        read_dapo_rows(raw)


def test_rows_without_answer_or_prompt_are_rejected(tmp_path: Path) -> None:
    prompt = [[{"content": "q", "role": "user"}], [{"content": "q", "role": "user"}]]
    no_gt = write_table(
        tmp_path / "gt.parquet", {"prompt": prompt, "reward_model": [{"ground_truth": "1"}, {"ground_truth": "  "}]}
    )
    with pytest.raises(UserError, match="row 1 has no reward_model.ground_truth"):
        read_dapo_rows(no_gt)
    no_prompt = write_table(
        tmp_path / "p.parquet", {"prompt": [prompt[0], []], "reward_model": [{"ground_truth": "1"}, {"ground_truth": "2"}]}
    )
    with pytest.raises(UserError, match="row 1 has an empty prompt"):
        read_dapo_rows(no_prompt)
    empty = tmp_path / "empty.parquet"
    write_dapo_parquet([], empty)
    with pytest.raises(UserError, match="holds no rows"):
        read_dapo_rows(empty)


@pytest.mark.skipif(not AIME.is_file(), reason=f"shared data not found at {AIME}")
def test_reads_the_released_aime_2024_file() -> None:
    rows = read_dapo_rows(AIME)
    assert len(rows) == 960
    # the released file uses exactly our template, filled with extra_info.raw_problem
    assert all(
        r["prompt"] == [{"content": DAPO_INSTRUCTION.replace("{problem}", r["extra_info"]["raw_problem"]), "role": "user"}]
        for r in rows
    )
    assert {r["data_source"] for r in rows} == {"math_dapo"}
    assert {r["reward_model"]["style"] for r in rows} == {"rule-lighteval/MATH_v2"}
    first = rows[0]
    assert first["extra_info"]["index"] == 2 and first["reward_model"]["ground_truth"] == "540"
