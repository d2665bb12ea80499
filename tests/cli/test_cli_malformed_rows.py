"""Malformed dataset rows and oversized inputs (issue 54): exit 2, one ``error:`` line, no traceback, nothing left.

Each class of bad row is refused where the data is read, by the one row check both commands use
(dapo_cli/data/rows.py): by ``dapo eval`` before the model loads, by ``dapo train`` before its first
step, never as a ``TypeError`` in the middle of a run. Numbers past Python's limits and JSON nested
thousands deep are refused by the reader with the line. ``eval --compare`` counts what it would hold
before holding it. The bad files are written into each case's working directory by the setups below.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import malformed_harness
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from malformed_harness import ENV, Case, case, places_for, run_case
from typer.testing import CliRunner

from dapo_cli.cli import app
from dapo_cli.data.schema import make_row, write_dapo_parquet
from dapo_cli.eval.compare import MAX_COMPARE_SAMPLES


def _rows() -> list[dict[str, Any]]:
    return [make_row(f"What is {i} + 1?", str(i + 1), index=i) for i in range(3)]


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A change of row 1: ``path`` like ``prompt.0.role`` (``-`` as the value: delete it)."""

    def change(row: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = row
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        key = int(last) if isinstance(target, list) else last
        if value == "-":
            del target[key]
        else:
            target[key] = value

    return change


BAD_ROWS: dict[str, Callable[[dict[str, Any]], None]] = {
    "prompt-int": _set("prompt", 5),
    "prompt-strings": _set("prompt", ["What is", "2 + 1?"]),
    "prompt-empty": _set("prompt", []),
    "reward-model-string": _set("reward_model", "2"),
    "no-role": _set("prompt.0.role", "-"),
    "no-content": _set("prompt.0.content", "-"),
    "content-int": _set("prompt.0.content", 7),
    "role-tool": _set("prompt.0.role", "tool"),
    "ground-truth-fraction": _set("reward_model.ground_truth", 0.5),
    "ground-truth-list": _set("reward_model.ground_truth", ["2"]),
    "ground-truth-too-long": _set("reward_model.ground_truth", "7" * 1001),
    "extra-info-list": _set("extra_info", [1]),
    "index-bool": _set("extra_info.index", True),
    "index-control-text": _set("extra_info.index", "a\x1b[2Jb"),
}


def _jsonl(name: str, change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def setup(cwd: Path) -> None:
        rows = _rows()
        change(rows[1])
        (cwd / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")

    return setup


def _raw_line(name: str, edit: Callable[[str], str]) -> Callable[[Path], None]:
    """A JSONL file whose line 2 is edited as text (what json.dumps cannot write)."""

    def setup(cwd: Path) -> None:
        lines = [json.dumps(r) for r in _rows()]
        lines[1] = edit(lines[1])
        (cwd / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")

    return setup


def _parquet_without_role(cwd: Path) -> None:
    path = cwd / "no-role.parquet"
    write_dapo_parquet(_rows(), path)
    table = pq.read_table(path)
    rows = table.to_pylist()
    rows[1]["prompt"][0]["role"] = None
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)


def _generations(name: str, ids: Callable[[], pa.Array], acc: str = "bool") -> Callable[[Path], None]:
    def setup(cwd: Path) -> None:
        column = ids()
        table = {"problem_id": column}
        if acc == "bool":
            table["acc"] = pa.array(np.zeros(len(column), dtype=bool))
        elif acc == "float":
            table["acc"] = pa.array(np.zeros(len(column)))
        pq.write_table(pa.table(table), cwd / name)

    return setup


def _numbers(n: int, distinct: int | None = None) -> pa.Array:
    values = np.arange(n) if distinct is None else np.arange(n) % distinct
    return pc.cast(pa.array(values), pa.string())


BIG = "9" * 5000
SETUPS: dict[str, Callable[[Path], object]] = {
    **{f"rows/{name}": _jsonl(name, change) for name, change in BAD_ROWS.items()},
    "rows/ground-truth-5000-digits": _raw_line("ground-truth-5000-digits", lambda line: line.replace('"ground_truth": "2"', f'"ground_truth": {BIG}')),
    "rows/index-5000-digits": _raw_line("index-5000-digits", lambda line: line.replace('"index": 1', f'"index": {BIG}')),
    "rows/deep": _raw_line("deep", lambda line: line.replace('"prompt": [', '"prompt": ' + "[" * 5000 + "]" * 4999 + ", [")),
    "rows/no-role.parquet": _parquet_without_role,
    "gen/fine.parquet": _generations("fine.parquet", lambda: _numbers(4)),
    "gen/many-problems.parquet": _generations("many-problems.parquet", lambda: _numbers(1_000_000)),
    "gen/many-samples.parquet": _generations("many-samples.parquet", lambda: _numbers(MAX_COMPARE_SAMPLES + 1, 1000)),
    "gen/no-acc.parquet": _generations("no-acc.parquet", lambda: _numbers(4), acc="none"),
    "gen/float-acc.parquet": _generations("float-acc.parquet", lambda: _numbers(4), acc="float"),
}
malformed_harness.SETUPS.update(SETUPS)

EVAL = ("eval", "{model}", "--avg", "1", "--max-tokens", "2", "--no-track", "--dataset")
TRAIN = ("train", "--set", "model.path={model}", "--set")
MESSAGES = "each message needs role and content strings"
LIST = "give a list of {{role, content}} messages"  # braces doubled: expect is a format string


def eval_case(name: str, expect: str, file: str = "", *extra: str) -> Case:
    """``dapo eval`` of ``file`` (default ``NAME.jsonl``), written by the setup ``rows/NAME`` (``rows/FILE`` for a parquet)."""
    file = file or f"{name}.jsonl"
    parquet = file.endswith(".parquet")
    id = f"eval-row-{name}{'-parquet' if parquet else ''}{'-limit' if extra else ''}"
    return case(id, *EVAL, file, *extra, expect=expect, setup=(f"rows/{file if parquet else name}",))


def train_case(name: str, expect: str, key: str = "data.train_files") -> Case:
    """``dapo train`` with ``key`` (training or validation files) = the file of the setup ``rows/NAME``."""
    return case(f"train-row-{name}-{key.split('.')[1]}", *TRAIN, f"{key}=[{name}.jsonl]", expect=expect, setup=(f"rows/{name}",))


CASES = [
    # ------------------------------------------------------------ eval: every field of the row schema, read before the model loads
    eval_case("prompt-int", f"prompt-int.jsonl: row 1: prompt is an integer; {LIST}"),
    eval_case("prompt-strings", f"prompt-strings.jsonl: row 1: prompt[0] is a string, not a message; {LIST}"),
    eval_case("prompt-empty", "prompt-empty.jsonl: row 1 has an empty prompt; give the problem as the content of a user message"),
    eval_case("no-role", f"no-role.jsonl: row 1: prompt[0] has no 'role'; {MESSAGES}"),
    eval_case("no-content", f"no-content.jsonl: row 1: prompt[0] has no 'content'; {MESSAGES}"),
    eval_case("content-int", f"content-int.jsonl: row 1: prompt[0].content is an integer; {MESSAGES}"),
    eval_case("role-tool", "role-tool.jsonl: row 1: prompt[0].role 'tool' is not a chat role; use one of system, user, assistant"),
    eval_case("reward-model-string", "reward-model-string.jsonl: row 1: reward_model is a string; give an object {{ground_truth, style}}"),
    eval_case("ground-truth-list", "ground-truth-list.jsonl: row 1: reward_model.ground_truth is a list"),
    eval_case("ground-truth-fraction", "row 1: reward_model.ground_truth 0.5 is not a whole number a float holds exactly; write it as a string"),
    eval_case("ground-truth-too-long", "row 1: reward_model.ground_truth has 1,001 characters; no verifier reads more than 1,000"),
    eval_case("extra-info-list", "extra-info-list.jsonl: row 1: extra_info is a list; give an object {{index, raw_problem, ...}}"),
    eval_case("index-bool", "index-bool.jsonl: row 1: extra_info.index is a boolean; give an integer, or a printable string id"),
    eval_case("index-control-text", "row 1: extra_info.index 'a\\x1b[2Jb' is not printable"),  # escaped, never sent to the terminal
    eval_case("no-role", f"no-role.parquet: row 1: prompt[0] has no 'role'; {MESSAGES}", "no-role.parquet"),
    eval_case("no-role", f"no-role.parquet: row 1: prompt[0] has no 'role'; {MESSAGES}", "no-role.parquet", "--limit", "2"),
    eval_case("prompt-int", "prompt-int.jsonl: row 1: prompt is an integer", "", "--limit", "2"),
    # ------------------------------------------------------------ eval: numbers past Python's limits, nesting past the stack
    eval_case("ground-truth-5000-digits", "ground-truth-5000-digits.jsonl: line 2 holds an integer of more than 4,300 digits; write a number that long as a string"),
    eval_case("index-5000-digits", "index-5000-digits.jsonl: line 2 holds an integer of more than 4,300 digits"),
    eval_case("deep", "deep.jsonl: line 2 nests arrays/objects deeper than 64 levels; this is not a dataset row"),
    # ------------------------------------------------------------ train: the same door, before the first step (training and validation files)
    train_case("no-role", f"no-role.jsonl: row 1: prompt[0] has no 'role'; {MESSAGES}"),
    train_case("reward-model-string", "reward-model-string.jsonl: row 1: reward_model is a string"),
    train_case("index-bool", "index-bool.jsonl: row 1: extra_info.index is a boolean"),
    train_case("ground-truth-5000-digits", "ground-truth-5000-digits.jsonl: line 2 holds an integer of more than 4,300 digits"),
    train_case("deep", "deep.jsonl: line 2 nests arrays/objects deeper than 64 levels"),
    train_case("content-int", "content-int.jsonl: row 1: prompt[0].content is an integer", key="data.val_files"),
    # ------------------------------------------------------------ eval --compare: sizes counted before the files are held, and their schema
    case("compare-too-many-problems", "eval", "--compare", "fine.parquet", "many-problems.parquet",
         expect="--compare many-problems.parquet: 1,000,000 problems; at most 100,000", setup=("gen/fine.parquet", "gen/many-problems.parquet")),
    case("compare-too-many-samples", "eval", "--compare", "many-samples.parquet", "fine.parquet",
         expect="--compare many-samples.parquet: 4,000,001 samples; at most 4,000,000", setup=("gen/fine.parquet", "gen/many-samples.parquet")),
    case("compare-no-acc", "eval", "--compare", "fine.parquet", "no-acc.parquet",
         expect="no-acc.parquet is not a generations file (missing acc)", setup=("gen/fine.parquet", "gen/no-acc.parquet")),
    case("compare-float-acc", "eval", "--compare", "float-acc.parquet", "fine.parquet",
         expect="--compare float-acc.parquet: problem_id must be text and acc true/false (got string and double)",
         setup=("gen/fine.parquet", "gen/float-acc.parquet")),
]


def test_every_bad_row_class_has_an_eval_and_a_train_case() -> None:
    assert len({c.id for c in CASES}) == len(CASES)
    used = {name for c in CASES for name in c.setup}
    assert {f"rows/{name}" for name in BAD_ROWS} <= used and set(SETUPS) <= used
    assert {c.args[0] for c in CASES} == {"eval", "train"}


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
@pytest.mark.slow
def test_malformed_rows_are_one_error_line_exit_2_and_leave_nothing(
    c: Case, request: pytest.FixtureRequest, models: dict[str, Path], dataset: Path, case_dir: Path,
) -> None:
    run_case(c, places_for(c, request, models, dataset), case_dir)


@pytest.mark.slow
def test_compare_orders_problem_ids_past_python_s_limits_without_a_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    ids = pa.array(["²", "--5", "9" * 5000, "12", "3"])
    for name in ("a.parquet", "b.parquet"):
        pq.write_table(pa.table({"problem_id": ids, "acc": pa.array([True, False, True, False, True])}), tmp_path / name)
    result = CliRunner().invoke(app, ["eval", "--compare", "a.parquet", "b.parquet"], env=ENV)
    assert result.exit_code == 0, result.output
    assert "A − B on 5 common problems" in result.stdout and "Traceback" not in result.output
