"""The row door (dapo_cli/data/rows.py): one check of every DAPO-schema row where a dataset is read.

One case per field of the schema, one per class of number, and the readers' refusals of what
never becomes a row (an integer past Python's 4,300-digit limit, JSON nested too deep), through
the function training reads datasets with (``load_rows``) and the one ``dapo eval`` groups with.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dapo_cli.data.loader import Prompt, build_prompts, load_rows
from dapo_cli.data.rows import MAX_ID_CHARS, ROLES, check_row, exact_integer_text
from dapo_cli.data.schema import make_row, write_dapo_parquet
from dapo_cli.errors import UserError
from dapo_cli.eval.problems import group_problems


def row(**changes: Any) -> dict[str, Any]:
    """A valid row with top-level fields replaced (``prompt=...``) or nested ones (``reward_model__ground_truth=...``)."""
    out = make_row("What is 1+1?", "2", index=17)
    for key, value in changes.items():
        target, _, field = key.partition("__")
        if field:
            out[target] = dict(out[target]) if isinstance(out[target], dict) else out[target]
            out[target][field] = value
        else:
            out[target] = value
    return out


def refused(bad: dict[str, Any]) -> str:
    with pytest.raises(UserError) as info:
        check_row(bad, 17, "data.jsonl")
    return str(info.value)


def test_a_valid_row_comes_back_equal_to_itself() -> None:
    good = make_row("What is 1+1?", "2", index=17, split="train")
    assert check_row(copy.deepcopy(good), 0, "x") == good


# ---------------------------------------------------------------- prompt and its messages


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        (None, "data.jsonl: row 17 has no prompt; give a list of {role, content} messages"),
        (5, "data.jsonl: row 17: prompt is an integer; give a list of {role, content} messages"),
        ({"role": "user"}, "row 17: prompt is an object; give a list"),
        (["What", "is"], "row 17: prompt[0] is a string, not a message; give a list of {role, content} messages"),
        ([], "row 17 has an empty prompt; give the problem as the content of a user message"),
        ([{"role": "user", "content": "  "}], "row 17 has an empty prompt"),
        ([{"content": "q"}], "data.jsonl: row 17: prompt[0] has no 'role'; each message needs role and content strings"),
        ([{"role": "user"}], "row 17: prompt[0] has no 'content'; each message needs role and content strings"),
        ([{"role": "user", "content": 5}], "row 17: prompt[0].content is an integer; each message needs role and content strings"),
        ([{"role": "user", "content": ["a"]}], "prompt[0].content is a list"),
        ([{"role": 1, "content": "q"}], "row 17: prompt[0].role is an integer"),
        ([{"role": "user", "content": "q"}, {"role": "tool", "content": "x"}],
         "row 17: prompt[1].role 'tool' is not a chat role; use one of system, user, assistant"),
    ],
)
def test_prompt_and_messages(prompt: Any, expected: str) -> None:
    assert expected in refused(row(prompt=prompt))


def test_a_string_prompt_is_one_user_message_and_extra_message_keys_are_dropped() -> None:
    assert check_row(row(prompt="What is 1+1?"), 0)["prompt"] == [{"role": "user", "content": "What is 1+1?"}]
    messages = [{"role": r, "content": f"{r} text", "name": "x"} for r in ROLES]
    assert check_row(row(prompt=messages), 0)["prompt"] == [{"role": r, "content": f"{r} text"} for r in ROLES]


# ---------------------------------------------------------------- reward_model and ground_truth


@pytest.mark.parametrize(
    ("reward_model", "expected"),
    [
        ("2", "row 17: reward_model is a string; give an object {ground_truth, style}"),
        ([2], "reward_model is a list"),
        (None, "row 17 has no reward_model.ground_truth; evaluation and training need the answer"),
        ({"style": "x"}, "row 17 has no reward_model.ground_truth"),
        ({"ground_truth": " "}, "row 17 has no reward_model.ground_truth"),
        ({"ground_truth": True}, "row 17: reward_model.ground_truth is a boolean"),
        ({"ground_truth": ["2"]}, "reward_model.ground_truth is a list"),
        ({"ground_truth": {"a": 1}}, "reward_model.ground_truth is an object"),
        ({"ground_truth": 0.5}, "row 17: reward_model.ground_truth 0.5 is not a whole number a float holds exactly; write it as a string, digit for digit"),
        ({"ground_truth": float("inf")}, "reward_model.ground_truth inf is not a whole number"),
        ({"ground_truth": 1e20}, "reward_model.ground_truth 1e+20 is not a whole number a float holds exactly"),
        ({"ground_truth": 10**4000}, "reward_model.ground_truth has more than 1,000 digits"),
        ({"ground_truth": "9" * 1001}, "reward_model.ground_truth has 1,001 characters; no verifier reads more than 1,000"),
        ({"ground_truth": "2", "style": 3}, "row 17: reward_model.style is an integer; give a string"),
    ],
)
def test_reward_model_and_ground_truth(reward_model: Any, expected: str) -> None:
    assert expected in refused(row(reward_model=reward_model))


@pytest.mark.parametrize(("value", "text"), [(27, "27"), (-3, "-3"), (27.0, "27"), (2.0**53, "9007199254740992"),
                                             (10**999, "1" + "0" * 999), ("  540 ", "  540 ")])
def test_a_ground_truth_number_is_converted_exactly(value: Any, text: str) -> None:
    assert check_row(row(reward_model={"ground_truth": value, "style": "s"}), 0)["reward_model"]["ground_truth"] == text


def test_exact_integer_text_never_converts_past_the_digit_limit() -> None:
    assert exact_integer_text(10**5000) is None  # str() of it would raise ValueError (4,300 digits)
    assert exact_integer_text(2.5) is None and exact_integer_text(float("nan")) is None


# ---------------------------------------------------------------- extra_info and its index


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ([1, 2], "row 17: extra_info is a list; give an object {index, raw_problem, ...} or leave it out"),
        ("x", "extra_info is a string"),
        ({"index": True}, "row 17: extra_info.index is a boolean; give an integer, or a printable string id"),
        ({"index": [1]}, "extra_info.index is a list"),
        ({"index": {"a": 1}}, "extra_info.index is an object"),
        ({"index": 2**63}, "extra_info.index is outside int64's range"),
        ({"index": 10**4000}, "extra_info.index is outside int64's range"),
        ({"index": 1.5}, "extra_info.index 1.5 is not a whole number"),
        ({"index": 1e19}, "extra_info.index 1e+19 is not a whole number a float holds exactly"),
        ({"index": float("nan")}, "extra_info.index nan is not a whole number"),
        ({"index": " "}, "extra_info.index ' ' is blank"),
        ({"index": "x" * (MAX_ID_CHARS + 1)}, f"extra_info.index 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'… is {MAX_ID_CHARS + 1} characters"),
        ({"index": "a\x1b[2Jb"}, "extra_info.index 'a\\x1b[2Jb' is not printable"),
        ({"index": 1, "raw_problem": 5}, "row 17: extra_info.raw_problem is an integer; give a string (or leave it out)"),
    ],
)
def test_extra_info_and_index(extra: Any, expected: str) -> None:
    assert expected in refused(row(extra_info=extra))


@pytest.mark.parametrize(("index", "kept"), [(3, 3), (-3, -3), (17.0, 17), ("12", 12), (" 12 ", 12), ("-4", -4),
                                             ("9223372036854775808", "9223372036854775808"),  # past int64: an id
                                             ("a8e94879-4a7c-4f68-9a1c-1f1c4b1a3d5e", "a8e94879-4a7c-4f68-9a1c-1f1c4b1a3d5e"),
                                             ("²", "²"), ("--5", "--5"), (None, None)])
def test_index_is_an_integer_or_a_string_id(index: Any, kept: Any) -> None:
    assert check_row(row(extra_info={"index": index}), 0)["extra_info"]["index"] == kept


def test_missing_extra_info_is_no_index() -> None:
    bare = row()
    del bare["extra_info"]
    assert check_row(bare, 0)["extra_info"] == {"index": None}
    assert check_row(row(extra_info=None), 0)["extra_info"] == {"index": None}


@pytest.mark.parametrize("field", ["data_source", "ability"])
def test_text_fields_are_text(field: str) -> None:
    assert f"row 17: {field} is a list; give a string" in refused(row(**{field: ["x"]}))


def test_a_row_that_is_not_an_object() -> None:
    with pytest.raises(UserError, match=r"^x: row 3 is a list; each row is an object with prompt and reward_model$"):
        check_row([1], 3, "x")


# ---------------------------------------------------------------- where datasets are read: train and eval


def jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_training_checks_every_row_when_the_file_is_read(tmp_path: Path) -> None:
    rows = [make_row(f"What is {i}+1?", str(i + 1), index=i) for i in range(50)]
    rows[49]["prompt"][0].pop("role")  # the last row: found before any of the file is used
    path = jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(UserError, match=r"train.jsonl: row 49: prompt\[0\] has no 'role'; each message needs role and content strings$"):
        load_rows(str(path), split="train", synthetic_size=0)


def test_training_and_eval_read_parquet_rows_through_the_same_door(tmp_path: Path) -> None:
    rows = [make_row("q", "1", index=0), make_row("r", "2", index=1)]
    path = tmp_path / "x.parquet"
    write_dapo_parquet(rows, path)
    table = pq.read_table(path).to_pylist()
    table[1]["prompt"][0]["role"] = None  # a parquet struct field left null
    pq.write_table(pa.Table.from_pylist(table, schema=pq.read_schema(path)), path)
    for read in (lambda: load_rows(str(path), split="train", synthetic_size=0), lambda: group_problems(table, str(path))):
        with pytest.raises(UserError, match=r"x.parquet: row 1: prompt\[0\] has no 'role'"):
            read()


@pytest.mark.parametrize("where", ["ground_truth", "index"])
def test_a_jsonl_integer_past_python_s_digit_limit_is_one_line(tmp_path: Path, where: str) -> None:
    good = json.dumps(make_row("q", "1", index=0))
    bad = good.replace('"ground_truth": "1"', '"ground_truth": ' + "9" * 5000) if where == "ground_truth" else good.replace(
        '"index": 0', '"index": ' + "9" * 5000)
    assert bad != good
    path = tmp_path / "big.jsonl"
    path.write_text(good + "\n" + bad + "\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"big.jsonl: line 2 holds an integer of more than 4,300 digits; write a number that long as a string$"):
        load_rows(str(path), split="train", synthetic_size=0)


def test_a_json_array_with_a_long_integer_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_text("[" + json.dumps(make_row("q", "1", index=0)).replace('"1"', "7" * 5000) + "]", encoding="utf-8")
    with pytest.raises(UserError, match="big.json holds an integer of more than 4,300 digits"):
        load_rows(str(path), split="train", synthetic_size=0)


def test_json_nested_thousands_deep_is_one_line(tmp_path: Path) -> None:
    line = json.dumps({"prompt": "PLACE", "reward_model": {"ground_truth": "1"}}).replace('"PLACE"', "[" * 5000 + "]" * 5000)
    path = tmp_path / "deep.jsonl"
    path.write_text(json.dumps(make_row("q", "1", index=0)) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(UserError, match="deep.jsonl: line 2 nests arrays/objects deeper than 64 levels"):
        load_rows(str(path), split="train", synthetic_size=0)


def test_build_prompts_takes_checked_rows_and_ids_rows_without_index_by_position() -> None:
    rows = [check_row(make_row("a", "1", index=5, template="{problem}"), 0), check_row(row(extra_info={"index": None}), 1)]
    prompts, dropped = build_prompts(rows, lambda messages: messages[0]["content"], len, max_prompt_length=10_000)
    assert dropped == 0
    assert prompts == [Prompt("a", "1", "5"), Prompt(rows[1]["prompt"][0]["content"], "2", "1")]  # not "None"
