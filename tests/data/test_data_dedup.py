"""Deduplication in prepare-data: a file shaped like DAPO-Math-17K, conflicts, --keep-duplicates, AIME, memory.

The fixture mirrors the published DAPO-Math-17K parquet (BytedTsinghua-SIA/DAPO-Math-17k,
``data/dapo-math-17k.parquet``): columns ``data_source``, ``prompt`` (one user message:
the DAPO instruction prefix, the problem, the closing reminder), ``ability``,
``reward_model {ground_truth, style}`` and ``extra_info {index}`` holding a UUID string,
with the whole set repeated (there ~100 times, here 4).
"""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dapo_cli.data import dedup as D
from dapo_cli.data import prepare as P
from dapo_cli.data import readers
from dapo_cli.data.prepare import PrepareOptions, run_prepare

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"shared data not found at {DATA}")

# Written out, not taken from dapo_cli.data.schema, so a drift of the template there fails here.
PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'

PROBLEMS = [
    ("Let $x$ satisfy $2x+1=7$. Find $x$.", "3"),
    ("How many positive divisors does $36$ have?", "9"),
    ("Compute $\\lfloor -\\sqrt{5} \\rfloor$.", "-3"),
    ("Find the remainder when $2^{10}$ is divided by $1000$.", "24"),
]
CONFLICT = "What is the sum of the first $5$ odd numbers?"  # published once with 25, once with 26
COPIES = 4


def dapo_row(problem: str, truth: str, index: str) -> dict:
    return {
        "data_source": "math_dapo",
        "prompt": [{"content": PREFIX + problem + SUFFIX, "role": "user"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": truth, "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": index},
    }


def dapo_math_like(*, index_per_copy: bool = False) -> list[dict]:
    """4 problems × 4 copies (the set concatenated 4 times), plus one problem text with two answers.

    Row order (19 rows): CONFLICT/25, then the four passes over PROBLEMS with CONFLICT/25
    again after pass 1 and CONFLICT/26 after pass 2. Copies after the first differ in
    case and spacing only (the problem text is compared case- and whitespace-folded).
    """
    ids = [str(uuid.UUID(int=i + 1)) for i in range(len(PROBLEMS) + 1)]
    rows = [dapo_row(CONFLICT, "25", ids[-1])]
    for copy in range(COPIES):
        for i, (problem, truth) in enumerate(PROBLEMS):
            text = problem if copy == 0 else "  " + problem.upper().replace(" ", "\n ")
            index = str(uuid.UUID(int=1000 * copy + i + 1)) if index_per_copy else ids[i]
            rows.append(dapo_row(text, truth, index))
        if copy == 0:
            rows.append(dapo_row(CONFLICT, "25", ids[-1]))
        if copy == 1:
            rows.append(dapo_row(CONFLICT, "26", ids[-1]))
    return rows


def write(rows: list[dict], path: Path) -> Path:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def prepare(tmp_path: Path, *inputs: Path, **options: object) -> P.PrepareResult:
    return run_prepare(PrepareOptions(output=tmp_path / "out.parquet", inputs=inputs, **options))


def out_rows(tmp_path: Path, name: str = "out.parquet") -> list[dict]:
    return pq.read_table(tmp_path / name).to_pylist()


# 19 rows: 4 problems × 4 copies (12 duplicates), CONFLICT/25 twice (1 duplicate), CONFLICT/26 once.
EXPECTED_COUNTS = {
    "rows_read": 19,
    "kept": 4,
    "distinct_problems": 4,
    "duplicates_removed": 12 + 1,
    "conflicting_duplicates_removed": 2,  # the first row of each answer of CONFLICT
    "conflicting_problems": 1,
    "dropped": 15,
}


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
@pytest.mark.parametrize("index_per_copy", [False, True], ids=["shared-uuid", "uuid-per-copy"])
def test_dapo_math_17k_layout_keeps_one_row_per_problem(tmp_path: Path, suffix: str, index_per_copy: bool) -> None:
    source = write(dapo_math_like(index_per_copy=index_per_copy), tmp_path / f"dapo-math-17k{suffix}")
    result = prepare(tmp_path, source)
    counts = result.manifest["counts"]
    assert {k: counts[k] for k in EXPECTED_COUNTS} == EXPECTED_COUNTS
    assert counts["dropped_by_reason"] == {"conflicting_duplicate": 2, "duplicate": 13}
    assert (result.train_rows, result.duplicates_removed, result.dedup.conflicting_problems) == (4, 13, 1)
    [report] = result.manifest["inputs"]
    assert report["layout"] == "1–4 per problem" and report["dropped"] == {"conflicting_duplicate": 2, "duplicate": 13}

    out = out_rows(tmp_path)
    # first occurrence: the exact text of pass 0 (later copies are upper-cased), in input order
    assert [r["extra_info"]["raw_problem"] for r in out] == [p for p, _ in PROBLEMS]
    assert [r["prompt"][0]["content"] for r in out] == [PREFIX + p + SUFFIX for p, _ in PROBLEMS]
    assert [r["reward_model"]["ground_truth"] for r in out] == [t for _, t in PROBLEMS]
    assert [r["extra_info"]["index"] for r in out] == [0, 1, 2, 3]  # UUIDs are not integers: numbered in order
    assert not any(CONFLICT in r["prompt"][0]["content"] for r in out)


def test_counts_do_not_depend_on_row_order(tmp_path: Path) -> None:
    rows = dapo_math_like()
    first = prepare(tmp_path, write(rows, tmp_path / "a.parquet")).manifest["counts"]
    random.Random(5).shuffle(rows)
    second = prepare(tmp_path, write(rows, tmp_path / "b.parquet")).manifest["counts"]
    assert first == second


def test_a_conflict_seen_late_still_drops_the_kept_first_row(tmp_path: Path) -> None:
    rows = [dapo_row("A?", "1", "a"), dapo_row("B?", "2", "b"), dapo_row("  a? ", "7", "c")]
    result = prepare(tmp_path, write(rows, tmp_path / "c.parquet"))
    assert [r["extra_info"]["raw_problem"] for r in out_rows(tmp_path)] == ["B?"]
    assert dict(result.dropped) == {"conflicting_duplicate": 2} and dict(result.kept) == {"integer": 1}


def test_same_integer_written_differently_is_a_duplicate_not_a_conflict(tmp_path: Path) -> None:
    rows = [dapo_row("A?", "7", "a"), dapo_row("A?", " 07", "a"), dapo_row("A?", "-0", "b"), dapo_row("B?", "0", "c")]
    result = prepare(tmp_path, write(rows, tmp_path / "d.parquet"))
    # 7 == 07, so row 2 is a copy; -0 is another answer to A: A is conflicting
    assert dict(result.dropped) == {"duplicate": 1, "conflicting_duplicate": 2}
    assert [r["reward_model"]["ground_truth"] for r in out_rows(tmp_path)] == ["0"]


def test_keep_duplicates_writes_every_row_with_copies_under_one_index(tmp_path: Path) -> None:
    source = write(dapo_math_like(index_per_copy=True), tmp_path / "dapo-math-17k.parquet")
    result = prepare(tmp_path, source, keep_duplicates=True)
    counts = result.manifest["counts"]
    assert (result.train_rows, counts["dropped"], counts["duplicates_removed"]) == (19, 0, 0)
    assert (counts["duplicates_kept"], counts["conflicting_problems"], counts["deduplicated"]) == (13, 1, False)
    out = out_rows(tmp_path)
    by_index = Counter(r["extra_info"]["index"] for r in out)
    # 5 problems (CONFLICT/25 = 0, PROBLEMS = 1..4, CONFLICT/26 = 5): copies share an index
    assert by_index == {0: 2, 1: 4, 2: 4, 3: 4, 4: 4, 5: 1}
    assert [r["reward_model"]["ground_truth"] for r in out if r["extra_info"]["index"] in (0, 5)] == ["25", "25", "26"]


def test_keep_duplicates_split_keeps_copies_on_one_side(tmp_path: Path) -> None:
    source = write(dapo_math_like(), tmp_path / "dapo-math-17k.parquet")
    prepare(tmp_path, source, keep_duplicates=True, val_fraction=0.4, seed=3)
    train, val = out_rows(tmp_path), out_rows(tmp_path, "out.val.parquet")
    assert len(train) + len(val) == 19 and len(val) > 0
    assert not {r["extra_info"]["index"] for r in train} & {r["extra_info"]["index"] for r in val}


def test_duplicates_across_inputs_raw_and_prepared(tmp_path: Path) -> None:
    raw = tmp_path / "raw.jsonl"
    raw.write_text(json.dumps({"problem": "How many positive divisors does $36$ have?", "answer": "9"}) + "\n")
    prepared = write(dapo_math_like(), tmp_path / "dapo.parquet")
    result = prepare(tmp_path, raw, prepared)
    assert result.train_rows == 4  # the raw problem is PROBLEMS[1]: its 4 prepared copies are duplicates
    assert [f.dropped["duplicate"] for f in result.files] == [0, 14]
    assert out_rows(tmp_path)[0]["extra_info"]["original_answer"] == "9"


def test_only_kept_rows_are_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built = []
    real = P._schema_row

    def counting(row: dict, **kwargs: object) -> dict:
        built.append(row["prompt"][0]["content"])
        return real(row, **kwargs)

    monkeypatch.setattr(P, "_schema_row", counting)
    monkeypatch.setattr(readers, "PARQUET_BATCH_ROWS", 3)  # stream in 7 batches
    prepare(tmp_path, write(dapo_math_like(), tmp_path / "s.parquet"))
    # the 4 problems and CONFLICT/25 (dropped once CONFLICT/26 appears); no copy is ever shaped or held
    assert len(built) == 5


def test_digest_is_of_the_normalised_text() -> None:
    assert D.text_digest("  What IS\n1+1? ") == D.text_digest("what is 1+1?") and len(D.text_digest("x")) == 16
    assert D.text_digest("What is 1+1?") != D.text_digest("What is 1+2?")
    row = dapo_row("Find $x$.", "1", "u")
    assert D.template_problem(row) == D.problem_text(row) == "Find $x$."
    other = {"prompt": [{"content": "Q: Find $x$.", "role": "user"}]}
    assert D.template_problem(other) is None and D.problem_text(other) == "Q: Find $x$."


@needs_data
def test_aime_k_copies_collapse_by_default_and_repeat_restores_them(tmp_path: Path) -> None:
    source = pq.read_table(DATA / "aime-2024.parquet").to_pylist()
    # the dedup key of the real file: the problem inside the DAPO template is extra_info.raw_problem
    assert all(D.template_problem(r) == r["extra_info"]["raw_problem"] for r in source)

    result = prepare(tmp_path, DATA / "aime-2024.parquet")
    counts = result.manifest["counts"]
    assert (counts["kept"], counts["duplicates_removed"], counts["conflicting_problems"]) == (30, 930, 0)
    assert result.manifest["inputs"][0]["layout"] == "32 per problem"
    out = out_rows(tmp_path)
    first = {}
    for row in source:
        first.setdefault(row["extra_info"]["index"], row)
    assert [r["extra_info"]["index"] for r in out] == list(first)  # order of first appearance: 2, 25, 14, ...
    assert all(r["prompt"] == first[r["extra_info"]["index"]]["prompt"] for r in out)

    again = prepare(tmp_path, DATA / "aime-2024.parquet", repeat=32)
    copies = Counter(r["extra_info"]["index"] for r in out_rows(tmp_path))
    assert again.train_rows == 960 and len(copies) == 30 and set(copies.values()) == {32}
