"""Reading raw files: format detection, field detection on every shared file, answer extraction rules."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dapo_cli.data.layouts import Layout, answer_from_value
from dapo_cli.data.readers import detect_format, read_input
from dapo_cli.errors import UserError

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"shared data not found at {DATA}")


@needs_data
def test_amc23_float_answers() -> None:
    source = read_input(DATA / "raw-amc23.jsonl")
    assert (source.format, source.kind, source.rows_read, source.problem_field) == ("jsonl", "raw", 40, "problem")
    assert source.answer_sources == {"answer": 40}
    # line 1: {"id":0,"problem":"Cities $A$ and $B$ are $45$ miles apart. ...","answer":27.0,...}: an integral float
    first = source.problems[0]
    assert first.answer == "27.0" and first.problem.startswith("Cities $A$ and $B$ are $45$ miles apart.")
    # line 16: "answer":-1.0 (the conversion makes both integers: tests/data/test_data_convert.py)
    assert source.problems[15].answer == "-1.0"
    # the file has "problem" and "question" (the same text): "problem" first, "question" when a record lacks it
    assert source.layout.problem == ("problem", "question") and source.layout.answer == ("answer",)


@needs_data
def test_gaokao_question_field_and_empty_answers() -> None:
    source = read_input(DATA / "raw-gaokao2023en.jsonl")
    assert (source.kind, source.rows_read, source.problem_field) == ("raw", 385, "question")
    # two records have "answer": "" → no answer
    assert source.answer_sources == {"answer": 383, "none": 2}
    # line 1: "question": "Given sets $M=\\{x|x+2\\geq 0\\},N=\\{x|x-1<0\\}$, find $M \\cap N$.", "answer": "$\\{x|-2\\leq x < 1\\}$"
    assert source.problems[0].answer == "$\\{x|-2\\leq x < 1\\}$"
    assert source.problems[0].problem.startswith("Given sets $M=")


@needs_data
def test_minerva_answers_come_from_the_last_box_of_the_solution() -> None:
    source = read_input(DATA / "raw-minerva_math.jsonl")
    assert (source.kind, source.rows_read, source.problem_field) == ("raw", 272, "problem")
    assert source.answer_sources == {"solution:boxed": 272}
    # line 1: "...s=\\frac{45}{3600} \\frac{\\pi}{180} 7200=\\boxed{1.6} \\mathrm{~cm}\n\\]"
    assert source.problems[0].answer == "1.6"
    # line 2: "L & \\simeq \\boxed{4.5e33} \\mathrm{ergs} \\mathrm{s}^{-1}"
    assert source.problems[1].answer == "4.5e33"


@needs_data
def test_prepared_dapo_parquet_is_read_as_rows() -> None:
    source = read_input(DATA / "aime-2024.parquet")
    assert (source.format, source.kind, source.rows_read) == ("parquet", "dapo", 960)
    assert len(source.dapo_rows) == 960 and source.problems == ()
    assert source.dapo_rows[0]["reward_model"]["ground_truth"] == "540"


@needs_data
def test_format_is_sniffed_without_extension(tmp_path: Path) -> None:
    shutil.copy(DATA / "aime-2024.parquet", tmp_path / "aime")
    shutil.copy(DATA / "raw-amc23.jsonl", tmp_path / "amc")
    assert detect_format(tmp_path / "aime") == "parquet"
    assert detect_format(tmp_path / "amc") == "jsonl"
    assert read_input(tmp_path / "amc").rows_read == 40


def test_raw_parquet_and_json_array(tmp_path: Path) -> None:
    records = [{"question": "What is 1+1?", "answer": "2"}, {"question": "Half of 1?", "answer": "\\frac12"}]
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "raw.parquet")
    (tmp_path / "raw.json").write_text(json.dumps(records))
    for name in ("raw.parquet", "raw.json"):
        source = read_input(tmp_path / name)
        assert source.kind == "raw" and source.problem_field == "question"
        assert [p.answer for p in source.problems] == ["2", "\\frac12"]


@pytest.mark.parametrize(
    ("record", "answer", "source"),
    [
        ({"answer": "The cost is 3+4 dollars.\nThe answer is: 7"}, "7", "answer:the_answer_is"),  # MetaMathQA style
        ({"answer": "So the total is $\\boxed{18}$."}, "18", "answer:boxed"),
        ({"answer": 27.0}, "27.0", "answer"),  # as written; the conversion reads it as the integer 27
        ({"answer": 2.5}, "2.5", "answer"),
        ({"answer": 5}, "5", "answer"),
        ({"answer": "  $\\frac{1}{2}$ "}, "$\\frac{1}{2}$", "answer"),
        ({"answer": "", "solution": "so \\fbox{12}"}, "12", "solution:boxed"),
        ({"answer": float("nan"), "solution": "\\boxed{3} then \\boxed{4}"}, "4", "solution:boxed"),
        ({"solution": "no box here"}, None, "none"),
        ({"answer": True}, None, "none"),
        ({}, None, "none"),
    ],
)
def test_answer_rules_answer_then_solution(record: dict, answer: str | None, source: str) -> None:
    found = Layout(("problem",), ("answer",), ("solution",)).answer_of(record)
    assert (found.text, found.source, found.drop) == (answer, source, None)


def test_answer_from_value() -> None:
    assert answer_from_value(27.0, "a").text == "27.0" and answer_from_value(-1, "a").text == "-1"
    assert answer_from_value(" x ", "a").text == "x" and answer_from_value([1], "a").text == "1"
    assert answer_from_value(1e300, "a").text == "1e+300"  # dropped later as scientific notation
    assert answer_from_value(float("inf"), "a").text is None and answer_from_value(None, "a").text is None
    assert answer_from_value({"x": 1}, "a").source == "none"


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.jsonl", None, "input file not found"),
        ("notes.txt", "hello\n", "cannot tell the format of .*notes.txt"),
        ("empty.jsonl", "", "holds no rows"),
        ("bad.jsonl", '{"problem": "a", "answer": 1}\n{oops\n', "bad.jsonl: line 2 is not valid JSON"),
        ("list.jsonl", "[1, 2]\n", "line 1 is not a JSON object"),
        ("nofield.jsonl", '{"prompt_text": "a", "answer": 1}\n',
         'no problem field: expected one of problem, question, prompt, input, query or --problem-field NAME .found: "prompt_text", "answer".'),
        ("broken.parquet", "PAR1 not really", "cannot read .*broken.parquet as parquet"),
    ],
)
def test_bad_files_are_one_line_user_errors(tmp_path: Path, name: str, content: str | None, message: str) -> None:
    if content is not None:
        (tmp_path / name).write_text(content)
    with pytest.raises(UserError, match=message) as info:
        read_input(tmp_path / name)
    assert "\n" not in str(info.value)


def test_open_input_streams_parquet_in_batches_and_jsonl_by_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dapo_cli.data import readers

    records = [{"problem": f"P{i}?", "answer": str(i)} for i in range(10)]
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "raw.parquet")
    (tmp_path / "raw.jsonl").write_text("".join(json.dumps(r) + "\n\n" for r in records))  # blank lines are skipped
    monkeypatch.setattr(readers, "PARQUET_BATCH_ROWS", 3)
    for name in ("raw.parquet", "raw.jsonl"):
        source = readers.open_input(tmp_path / name)
        assert (source.kind, source.rows_read, source.problem_field) == ("raw", 10, "problem")
        stream = source.records()
        assert next(stream) == records[0]  # an iterator, not a list read whole
        assert list(stream) == records[1:] and list(source.records()) == records  # every call is a fresh pass
        assert [p.answer for p in source.raw_problems()] == [str(i) for i in range(10)]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        # 100,000 levels: json.loads raised RecursionError; now refused before parsing, naming the line
        ("deep.jsonl", '{"problem": "a", "answer": 1}\n{"problem": "b", "answer": ' + "[" * 100_000 + "]" * 100_000 + "}\n",
         r"deep.jsonl: line 2 nests arrays/objects deeper than 64 levels"),
        ("deep.json", '[\n{"problem": "a",\n "answer": ' + '{"x": ' * 100_000 + "1" + "}" * 100_000 + "}\n]",
         r"deep.json: line 3 nests arrays/objects deeper than 64 levels"),
        ("open.jsonl", "[" * 65 + "\n", r"open.jsonl: line 1 nests arrays/objects deeper than 64"),  # unclosed, too
    ],
)
def test_json_nested_too_deeply_is_one_line_naming_the_line(tmp_path: Path, name: str, content: str, message: str) -> None:
    (tmp_path / name).write_text(content)
    with pytest.raises(UserError, match=message) as info:
        read_input(tmp_path / name)
    assert "\n" not in str(info.value)


def test_nesting_limit_is_exact_and_brackets_inside_strings_do_not_count(tmp_path: Path) -> None:
    from dapo_cli.data.readers import MAX_JSON_DEPTH, json_nesting_excess

    # the row object is level 1, so 63 arrays inside it reach exactly 64
    ok = '{"problem": "' + "{[" * 10_000 + '\\"]", "answer": ' + "[" * 63 + "1" + "]" * 63 + "}"
    assert json_nesting_excess(ok) is None
    deeper = ok.replace("[" * 63, "[" * 64, 1).replace("]" * 63, "]" * 64, 1)
    assert json_nesting_excess(deeper) == deeper.index("[" * 64) + 63
    assert MAX_JSON_DEPTH == 64
    (tmp_path / "ok.jsonl").write_text(ok + "\n")
    assert read_input(tmp_path / "ok.jsonl").problems[0].problem.startswith("{[{[")


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bytes.jsonl", b'{"problem": "a", "answer": 1}\n{"problem": "\xff\xfe"}\n', r"bytes.jsonl: line 2 is not UTF-8 text"),
        ("bytes.json", b'[\n{"problem": "a"},\n\x89PNG\r\n\x1a\n]', r"bytes.json: line 3 is not UTF-8 text"),
        ("image.jsonl", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", r"image.jsonl: line 1 is not UTF-8 text"),
        ("nul.jsonl", b'{"problem": "a\x00", "answer": 1}\n', r"nul.jsonl: line 1 is not valid JSON"),
        ("blob", bytes(range(256)) * 4, r"cannot tell the format of .*blob"),
        ("noise.parquet", bytes(range(256)) * 4, r"cannot read .*noise.parquet as parquet"),
    ],
)
def test_binary_and_non_utf8_input_is_one_line(tmp_path: Path, name: str, content: bytes, message: str) -> None:
    (tmp_path / name).write_bytes(content)
    with pytest.raises(UserError, match=message) as info:
        read_input(tmp_path / name)
    assert "\n" not in str(info.value)
