"""``dapo eval --limit N`` reads only what the first N problems need (dapo_cli/eval/problems.py), and picks
exactly the problems the whole file's order gives: by integer index when every row has one, else by first
appearance. Checked against grouping every row, on the AIME file and on made-up files of every layout, and
a million-row parquet file read within a time and a memory bound."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from dapo_cli.data.schema import DAPO_SCHEMA, make_row, write_dapo_parquet
from dapo_cli.errors import UserError
from dapo_cli.eval.problems import ProblemSelection, group_problems, read_problems
from fixtures.peak_memory import PeakMemory, can_measure

AIME = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "aime-2024.parquet"


def rows_of(indexes: list[Any]) -> list[dict[str, Any]]:
    """One row per entry: problem ``i`` is "What is i+1?" with answer ``len(str(i))`` (a None index: no index,
    the prompt identifies the problem; a text index: a string id)."""
    out = []
    for i in indexes:
        r = make_row(f"What is {i}+1?", str(len(str(i))), index=0)
        r["extra_info"]["index"] = i
        out.append(r)
    return out


def write(tmp_path: Path, rows: list[dict[str, Any]], kind: str) -> Path:
    if kind == "parquet":
        path = tmp_path / "d.parquet"
        write_dapo_parquet(rows, path)
    else:
        path = tmp_path / "d.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


LAYOUTS: dict[str, list[Any]] = {
    "sorted": list(range(20)),
    "shuffled-copies": random.Random(0).sample([i for i in range(12) for _ in range(3)], 36),
    "descending": list(range(19, -1, -1)),
    "no-index": [None, None, None],  # replaced by distinct unindexed prompts below
    "mixed": [5, 3, None, 1, 5, 7, None, 0],
    "text-ids": [4, "a8e94879-4a7c", 2, "b1", "a8e94879-4a7c", "12", 0],  # UUID-like ids (DAPO-Math-17K); "12" is 12
}


FILES = [(layout, kind) for layout in sorted(LAYOUTS) for kind in ("parquet", "jsonl") if (layout, kind) != ("text-ids", "parquet")]
"""Every layout in both formats, but text ids in parquet (the DAPO parquet schema stores the index as int64)."""


@pytest.mark.parametrize(("layout", "kind"), FILES)
@pytest.mark.parametrize("limit", [1, 3, 100])
def test_limit_selects_what_grouping_every_row_selects(tmp_path: Path, kind: str, layout: str, limit: int) -> None:
    rows = rows_of(LAYOUTS[layout])
    if layout == "no-index":
        rows = [make_row(f"problem {i % 4}", str(i % 4), index=0) for i in range(10)]
        for r in rows:
            r["extra_info"]["index"] = None
    path = write(tmp_path, rows, kind)
    expected = group_problems(rows)[:limit]
    found = read_problems(str(path), limit).problems
    assert [(p.problem_id, p.ground_truth, p.messages) for p in found] == [(p.problem_id, p.ground_truth, p.messages) for p in expected]
    if layout in ("sorted", "shuffled-copies", "descending"):  # every row read: the copies are exact too
        assert [p.copies for p in found] == [p.copies for p in expected]


@pytest.mark.skipif(not AIME.is_file(), reason=f"shared data not found at {AIME}")
def test_limit_on_the_shuffled_aime_file_is_problems_0_to_7_with_all_their_copies() -> None:
    found = read_problems(str(AIME), 8)
    assert [p.problem_id for p in found.problems] == [str(i) for i in range(8)]
    assert all(p.copies == 32 for p in found.problems)
    assert found.layout == "aime-2024.parquet: 960 rows → 30 problems (32 copies each); --limit 8: the first 8"
    assert read_problems(str(AIME)).layout == "aime-2024.parquet: 960 rows → 30 problems (32 copies each)"


def test_selection_stops_at_the_nth_problem_once_the_order_is_first_appearance() -> None:
    selection = ProblemSelection(2)
    rows = rows_of([3, None, 1, 4])
    rows[1]["extra_info"]["index"] = None
    assert selection.add(rows[0], 0)  # indexed so far: a later row may hold a smaller index
    assert not selection.add(rows[1], 1)  # unindexed: the order is first appearance, and 2 problems are in
    assert [p.problem_id for p in selection.problems()][0] == "3"


def test_selection_reads_on_while_every_row_is_indexed() -> None:
    selection = ProblemSelection(1)
    assert all(selection.add(r, i) for i, r in enumerate(rows_of([5, 4, 3, 2, 1])))
    assert [p.problem_id for p in selection.problems()] == ["1"]


def test_rows_of_a_selected_problem_must_agree_and_bad_rows_read_are_refused(tmp_path: Path) -> None:
    rows = rows_of([1, 0, 1])
    rows[2]["reward_model"]["ground_truth"] = "99"
    path = write(tmp_path, rows, "parquet")
    with pytest.raises(UserError, match=r"d.parquet: row 2: rows of problem id 1 disagree on the ground truth; fix the dataset"):
        read_problems(str(path), 2)
    rows = rows_of([1, 0, 2])
    rows[1]["prompt"] = 7
    with pytest.raises(UserError, match=r"d.jsonl: row 1: prompt is an integer"):
        read_problems(str(write(tmp_path, rows, "jsonl")), 1)


def big_dapo_table(n: int) -> pa.Table:
    """``n`` tiny DAPO rows ("What is i?", answer i, index i), built column by column in Arrow (about a second)."""
    index = np.arange(n, dtype=np.int64)
    text = pc.cast(pa.array(index), pa.string())

    def constant(value: str) -> pa.Array:
        return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)), pa.array([value])).cast(pa.string())

    message = pa.StructArray.from_arrays([pc.binary_join_element_wise("What is ", text, "?", ""), constant("user")], names=["content", "role"])
    prompt = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), message)
    reward = pa.StructArray.from_arrays([text, constant("s")], names=["ground_truth", "style"])
    nulls = pa.nulls(n, pa.string())
    extra = pa.StructArray.from_arrays([pa.array(index), text, nulls, nulls, nulls], names=[f.name for f in DAPO_SCHEMA.field("extra_info").type])
    return pa.Table.from_arrays([constant("math_dapo"), prompt, constant("MATH"), reward, extra], schema=DAPO_SCHEMA)


@pytest.mark.slow
@pytest.mark.skipif(not can_measure(), reason="resident memory is read from /proc")
def test_limit_1_of_a_million_rows_stays_within_time_and_memory(tmp_path: Path) -> None:
    # before: every row became Python objects (a million real rows: 2.1 GB, 31 s; these tiny ones take
    # ~1.5 GB as dicts). Now: the index column and its counts, then the rows of problem 0 only. Index 0
    # first: one batch is read; last (descending file): every batch is filtered in Arrow, one row converted.
    table = big_dapo_table(1_000_000)
    ascending, descending = tmp_path / "ascending.parquet", tmp_path / "descending.parquet"
    pq.write_table(table, ascending)
    pq.write_table(table.take(pa.array(np.arange(len(table) - 1, -1, -1))), descending)
    del table
    read_problems(str(AIME if AIME.is_file() else ascending), 1)  # first-call imports out of the measure
    for path in (ascending, descending):
        with PeakMemory() as memory:
            start = time.perf_counter()
            found = read_problems(str(path), 1)
            seconds = time.perf_counter() - start
        assert [p.problem_id for p in found.problems] == ["0"]
        assert found.layout == f"{path.name}: 1000000 rows → 1000000 problems (one row each); --limit 1: the first 1"
        assert seconds < 5.0, (path.name, seconds)  # measured 0.3 s (ascending), 0.4-1.4 s (descending), 2 busy cores
        assert memory.grown < 300 * 2**20, (path.name, memory.grown)  # measured 40-110 MB: the index column, its counts
