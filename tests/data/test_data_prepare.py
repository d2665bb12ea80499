"""The prepare-data library: shared files end to end, dedup, K-copies layout, split, repeat, limit, atomicity.

Deduplication of a DAPO-Math-17K-shaped file has its own module: test_data_dedup.py.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dapo_cli.data import manifest as M
from dapo_cli.data import prepare as P
from dapo_cli.data.prepare import PrepareOptions, run_prepare
from dapo_cli.data.schema import DAPO_INSTRUCTION, DAPO_SCHEMA, make_row, write_dapo_parquet
from dapo_cli.errors import UserError
from dapo_cli.fileio import sha256_file

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"shared data not found at {DATA}")


def prepare(tmp_path: Path, *inputs: Path, **options: object) -> P.PrepareResult:
    return run_prepare(PrepareOptions(output=tmp_path / "out.parquet", inputs=inputs, **options))


def rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@needs_data
def test_aime_k_copies_layout_is_kept_with_keep_duplicates(tmp_path: Path) -> None:
    result = prepare(tmp_path, DATA / "aime-2024.parquet", keep_duplicates=True)
    source, out = rows(DATA / "aime-2024.parquet"), rows(tmp_path / "out.parquet")
    assert len(out) == 960 and result.train_rows == 960
    copies = Counter(r["extra_info"]["index"] for r in out)
    assert len(copies) == 30 and set(copies.values()) == {32}
    for before, after in zip(source, out, strict=True):  # same rows, same order
        assert after["prompt"] == before["prompt"]
        assert after["reward_model"] == before["reward_model"]
        assert after["data_source"] == before["data_source"] == "math_dapo"
        assert after["extra_info"]["index"] == before["extra_info"]["index"]
        assert after["extra_info"]["raw_problem"] == before["extra_info"]["raw_problem"]
        assert after["extra_info"]["conversion"] == "integer"
        assert after["extra_info"]["original_answer"] == before["reward_model"]["ground_truth"]
    assert pq.read_schema(tmp_path / "out.parquet").names == DAPO_SCHEMA.names  # no __index_level_0__
    [report] = result.manifest["inputs"]
    assert (report["layout"], report["kind"], report["kept"], report["dropped"]) == ("32 per problem", "dapo", {"integer": 960}, {})
    counts = result.manifest["counts"]
    assert (counts["deduplicated"], counts["duplicates_removed"], counts["duplicates_kept"]) == (False, 0, 930)


@needs_data
def test_amc23_float_answers_become_integer_rows(tmp_path: Path) -> None:
    prepare(tmp_path, DATA / "raw-amc23.jsonl")
    out = rows(tmp_path / "out.parquet")
    source = [json.loads(line) for line in (DATA / "raw-amc23.jsonl").read_text().splitlines()]
    assert [r["extra_info"]["index"] for r in out] == list(range(40))
    assert [r["reward_model"]["ground_truth"] for r in out] == [str(int(s["answer"])) for s in source]
    first = out[0]  # line 1: "answer":27.0
    assert first["reward_model"] == {"ground_truth": "27", "style": "rule-lighteval/MATH_v2"}
    assert first["prompt"] == [{"content": DAPO_INSTRUCTION.replace("{problem}", source[0]["problem"]), "role": "user"}]
    assert first["extra_info"] == {
        "index": 0, "raw_problem": source[0]["problem"], "split": None, "original_answer": "27.0", "conversion": "integer"
    }  # fmt: skip
    assert (first["data_source"], first["ability"]) == ("math_dapo", "MATH")


@needs_data
@pytest.mark.parametrize(
    ("name", "kept", "dropped"),
    [
        (
            "raw-gaokao2023en.jsonl",
            # line 368, "$12\\times18\\times11$": an expression, 12 * 18 * 11 = 2376
            {"integer": 196, "expression": 1, "fraction": 37, "surd": 27, "pi": 3},
            {
                "choice": 46, "non_integer_decimal": 22, "equation_or_inequality": 12, "interval_or_set": 10,
                "tuple": 6, "has_variables": 6, "complex": 4, "multiple_answers": 4, "text": 3, "unparseable": 3,
                "irrational": 3, "no_answer": 2,
            },
        ),
        (
            "raw-minerva_math.jsonl",
            {"integer": 64, "pi": 1},
            {
                "non_integer_decimal": 68, "scientific_notation": 58, "has_variables": 36, "unparseable": 29,
                "equation_or_inequality": 12, "complex": 3, "text": 1,
            },
        ),
    ],
)  # fmt: skip
def test_shared_raw_files_counts(tmp_path: Path, name: str, kept: dict, dropped: dict) -> None:
    result = prepare(tmp_path, DATA / name)
    assert dict(result.kept) == kept and dict(result.dropped) == dropped
    assert result.train_rows == sum(kept.values()) == len(rows(tmp_path / "out.parquet"))
    assert result.rows_read == sum(kept.values()) + sum(dropped.values())
    counts = result.manifest["counts"]
    assert counts["kept_by_conversion"] == kept and counts["dropped_by_reason"] == dict(sorted(dropped.items()))
    assert all(r["reward_model"]["ground_truth"].lstrip("-").isdigit() for r in rows(tmp_path / "out.parquet"))


def test_duplicates_are_dropped_by_folded_problem_text(tmp_path: Path) -> None:
    raw = write_jsonl(
        tmp_path / "raw.jsonl",
        [
            {"problem": "What is 1+1?", "answer": "2"},
            {"problem": "  what IS\n1+1? ", "answer": "2.0"},  # same text up to case and whitespace, same integer
            {"problem": "What is 2+2?", "answer": 4.0},
        ],
    )
    result = prepare(tmp_path, raw)
    assert dict(result.dropped) == {"duplicate": 1} and result.duplicates_removed == 1
    assert [r["extra_info"]["raw_problem"] for r in rows(tmp_path / "out.parquet")] == ["What is 1+1?", "What is 2+2?"]


def _amc_like(tmp_path: Path, n: int = 40) -> Path:
    return write_jsonl(tmp_path / "raw.jsonl", [{"question": f"Problem {i}?", "answer": str(i)} for i in range(n)])


def test_split_is_seeded_deterministic_and_by_problem(tmp_path: Path) -> None:
    raw = _amc_like(tmp_path)
    first = prepare(tmp_path, raw, val_fraction=0.25, seed=7)
    train, val = rows(tmp_path / "out.parquet"), rows(tmp_path / "out.val.parquet")
    assert (len(train), len(val)) == (30, 10)  # round(40 · 0.25) = 10 problems
    assert {r["extra_info"]["split"] for r in train} == {"train"} and {r["extra_info"]["split"] for r in val} == {"val"}
    assert not {r["extra_info"]["index"] for r in train} & {r["extra_info"]["index"] for r in val}
    again = prepare(tmp_path, raw, val_fraction=0.25, seed=7)
    assert again.manifest["outputs"] == first.manifest["outputs"]  # byte-identical files (sha256)
    other = prepare(tmp_path, raw, val_fraction=0.25, seed=8)
    assert other.manifest["outputs"][1]["sha256"] != first.manifest["outputs"][1]["sha256"]


@needs_data
def test_k_copies_split_keeps_copies_together(tmp_path: Path) -> None:
    prepare(tmp_path, DATA / "aime-2024.parquet", val_fraction=0.2, seed=1, keep_duplicates=True)
    train, val = rows(tmp_path / "out.parquet"), rows(tmp_path / "out.val.parquet")
    # 30 problems → round(6.0) = 6 val problems × 32 copies
    assert (len(train), len(val)) == (24 * 32, 6 * 32)
    assert set(Counter(r["extra_info"]["index"] for r in val).values()) == {32}


def test_repeat_writes_the_avg_at_k_layout(tmp_path: Path) -> None:
    result = prepare(tmp_path, _amc_like(tmp_path, 5), repeat=3)
    assert [r["extra_info"]["index"] for r in rows(tmp_path / "out.parquet")] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]
    assert result.train_rows == 15


def test_rows_past_the_bound_are_refused_before_any_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # problems x --repeat counted once the problems are read; the bound lowered to 14 so 5 x 3 = 15 exceeds it
    monkeypatch.setattr("dapo_cli.data.prepare.MAX_ROWS", 14)
    with pytest.raises(UserError, match=r"^5 problems x --repeat 3 = 15 rows; at most 14 per run"):
        prepare(tmp_path, _amc_like(tmp_path, 5), repeat=3)
    assert not (tmp_path / "out.parquet").exists()
    assert prepare(tmp_path, _amc_like(tmp_path, 5), repeat=2).train_rows == 10  # 10 <= 14


def test_k_copies_input_refuses_repeat_only_when_kept(tmp_path: Path) -> None:
    copies = [make_row(f"P{i}?", str(i), index=i) for i in range(3) for _ in range(4)]
    write_dapo_parquet(copies, tmp_path / "k.parquet")
    with pytest.raises(UserError, match=r"already in the 4-copies layout; drop --repeat \(or --keep-duplicates\)"):
        prepare(tmp_path, tmp_path / "k.parquet", repeat=2, keep_duplicates=True)
    result = prepare(tmp_path, tmp_path / "k.parquet", repeat=2)  # deduplicated first: 3 problems, then 2 each
    assert [r["extra_info"]["index"] for r in rows(tmp_path / "out.parquet")] == [0, 0, 1, 1, 2, 2]
    assert result.duplicates_removed == 9 and result.files[0].layout == "4 per problem"


def test_limit_keeps_the_first_problems(tmp_path: Path) -> None:
    result = prepare(tmp_path, _amc_like(tmp_path), limit=10)
    assert [r["reward_model"]["ground_truth"] for r in rows(tmp_path / "out.parquet")] == [str(i) for i in range(10)]
    assert dict(result.dropped) == {"limit": 30} and dict(result.kept) == {"integer": 10}


def test_prepared_rows_are_revalidated_and_deduplicated(tmp_path: Path) -> None:
    empty = make_row("C?", "7", index=3)
    empty["prompt"] = [{"content": "  ", "role": "user"}]
    prepared = [
        make_row("A?", "5", index=0),
        make_row("A?", "5", index=0),  # uneven copies (2, 1, 1, 1): not the K-copies layout → deduplicated
        make_row("B?", "1.5", index=1),
        make_row("D?", "-4", index=2),
        empty,
    ]
    write_dapo_parquet(prepared, tmp_path / "p.parquet")
    result = prepare(tmp_path, tmp_path / "p.parquet")
    assert dict(result.dropped) == {"duplicate": 1, "non_integer_ground_truth": 1, "empty_prompt": 1}
    out = rows(tmp_path / "out.parquet")
    assert [(r["extra_info"]["index"], r["reward_model"]["ground_truth"]) for r in out] == [(0, "5"), (2, "-4")]


def test_indices_of_later_inputs_never_collide(tmp_path: Path) -> None:
    write_dapo_parquet([make_row("A?", "1", index=0), make_row("B?", "2", index=1)], tmp_path / "one.parquet")
    write_dapo_parquet([make_row("C?", "3", index=0), make_row("D?", "4", index=1)], tmp_path / "two.parquet")
    raw = write_jsonl(tmp_path / "raw.jsonl", [{"problem": "E?", "answer": "5"}])
    prepare(tmp_path, tmp_path / "one.parquet", tmp_path / "two.parquet", raw)
    out = rows(tmp_path / "out.parquet")
    # second file shifted by max(0, 1) + 1 - 0 = 2; the raw problem numbered after the highest index
    assert [(r["extra_info"]["raw_problem"], r["extra_info"]["index"]) for r in out] == [
        ("A?", 0), ("B?", 1), ("C?", 2), ("D?", 3), ("E?", 4)
    ]  # fmt: skip


def test_template_and_data_source(tmp_path: Path) -> None:
    prepare(tmp_path, _amc_like(tmp_path, 2), template="Q: {problem}\nA:", data_source="my_source")
    first = rows(tmp_path / "out.parquet")[0]
    assert first["prompt"] == [{"content": "Q: Problem 0?\nA:", "role": "user"}] and first["data_source"] == "my_source"


def test_every_row_dropped_writes_nothing(tmp_path: Path) -> None:
    raw = write_jsonl(tmp_path / "raw.jsonl", [{"problem": "Pick one.", "answer": "A"}, {"problem": "x?", "answer": "[1,2)"}])
    with pytest.raises(UserError, match=r"every row was dropped \((choice 1, interval_or_set 1|interval_or_set 1, choice 1)\)"):
        prepare(tmp_path, raw)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw.jsonl"]


def test_failed_write_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = _amc_like(tmp_path, 10)
    calls = []

    def failing_write(rows: list, path: Path) -> None:
        calls.append(path)
        if len(calls) == 2:  # the validation file, after the training file is complete
            raise OSError("disk full")
        real_write(rows, path)

    real_write = M.write_dapo_table
    monkeypatch.setattr(M, "write_dapo_table", failing_write)
    with pytest.raises(UserError, match=r"cannot write .*out.val.parquet: disk full; nothing was written"):
        prepare(tmp_path, raw, val_fraction=0.5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw.jsonl"]  # no output, manifest or temporary file


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"val_fraction": 1.0}, r"--val-fraction must be in \[0, 1\)"),
        ({"repeat": 0}, r"--repeat must be in \[1, 4096\], got 0"),
        ({"limit": 0}, "--limit must be >= 1"),
        ({"template": "no placeholder"}, "--template must contain {problem}"),
    ],
)
def test_bad_options(tmp_path: Path, options: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        prepare(tmp_path, _amc_like(tmp_path, 3), **options)


def test_output_must_not_be_an_input(tmp_path: Path) -> None:
    raw = _amc_like(tmp_path, 3)
    with pytest.raises(UserError, match="is also an input"):
        run_prepare(PrepareOptions(output=raw, inputs=(raw,)))
    with pytest.raises(UserError, match="exactly one of them"):
        run_prepare(PrepareOptions(output=tmp_path / "o.parquet"))


def test_synthetic_task_splits_from_disjoint_partitions(tmp_path: Path) -> None:
    pytest.importorskip("dapo_cli.data.synthetic")
    result = run_prepare(
        PrepareOptions(output=tmp_path / "syn.parquet", synthetic="add-3digit", n=20, val_fraction=0.25, seed=3)
    )
    train, val = rows(tmp_path / "syn.parquet"), rows(tmp_path / "syn.val.parquet")
    assert (len(train), len(val), result.train_rows, result.val_rows) == (15, 5, 15, 5)
    assert {r["extra_info"]["split"] for r in train} == {"train"} and {r["extra_info"]["split"] for r in val} == {"val"}
    assert not {r["extra_info"]["raw_problem"] for r in train} & {r["extra_info"]["raw_problem"] for r in val}
    assert all(r["data_source"] == "synthetic/add-3digit" for r in train + val)
    again = run_prepare(
        PrepareOptions(output=tmp_path / "syn2.parquet", synthetic="add-3digit", n=20, val_fraction=0.25, seed=3)
    )
    assert sha256_file(tmp_path / "syn.parquet") == sha256_file(tmp_path / "syn2.parquet")
    assert again.manifest["counts"] == result.manifest["counts"]


# ---------------------------------------------------------------------------
# bounds on prepared rows


def test_prepared_rows_over_the_caps_or_malformed_are_dropped(tmp_path: Path) -> None:
    from dapo_cli.data.convert import MAX_PROBLEM_CHARS
    from dapo_cli.rewards.bounds import MAX_GROUND_TRUTH_CHARS

    def row(problem: str, truth: str, **changes: object) -> dict:
        return {**make_row(problem, truth, index=0), **changes}

    records = [
        row("kept?", "1" * MAX_GROUND_TRUTH_CHARS),  # at the cap: kept
        row("huge answer?", "1" * 200_000),  # the row that hung `dapo eval`
        row("x" * MAX_PROBLEM_CHARS, "2"),  # at the cap: kept
        row("x" * (MAX_PROBLEM_CHARS + 1), "3"),
        row("fullwidth?", "\uff11\uff12"),  # not an ASCII integer: no verifier would match "12"
        row("prompt is text?", "4", prompt="What is 2+2?"),
        row("bad message?", "4", prompt=[{"content": "x", "role": "user"}, "junk"]),
        row("bad truth cell?", "4", reward_model=["4"]),
        row("bad raw problem?", "4", extra_info={"raw_problem": ["x"]}),
        row("bad source?", "4", data_source={"a": 1}),
    ]
    path = write_jsonl(tmp_path / "prepared.jsonl", records)
    result = prepare(tmp_path, path)
    assert dict(result.dropped) == {
        "answer_too_long": 1, "problem_too_long": 1, "non_integer_ground_truth": 1, "malformed_row": 5,
    }  # fmt: skip
    assert [len(r["reward_model"]["ground_truth"]) for r in rows(tmp_path / "out.parquet")] == [MAX_GROUND_TRUTH_CHARS, 1]


# ---------------------------------------------------------------------------
# all outputs or none


def test_output_that_is_a_directory_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    raw = _amc_like(tmp_path, 3)
    (tmp_path / "existing").mkdir()
    with pytest.raises(UserError, match=r"output .*existing is a directory; give a file path") as info:
        run_prepare(PrepareOptions(output=tmp_path / "existing", inputs=(raw,)))
    assert "\n" not in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing", "raw.jsonl"]  # no existing.manifest.json
    assert list((tmp_path / "existing").iterdir()) == []
    (tmp_path / "out.parquet.manifest.json").mkdir()  # the manifest's place taken by a directory
    with pytest.raises(UserError, match=r"output .*out.parquet.manifest.json is a directory"):
        prepare(tmp_path, raw)
    assert not (tmp_path / "out.parquet").exists()


def test_a_file_where_a_directory_is_expected_is_refused(tmp_path: Path) -> None:
    raw = _amc_like(tmp_path, 3)
    with pytest.raises(UserError, match=r"cannot write .*raw.jsonl/sub/out.parquet: .*raw.jsonl is a file, not a directory"):
        run_prepare(PrepareOptions(output=raw / "sub" / "out.parquet", inputs=(raw,)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw.jsonl"]


def test_a_failed_rename_puts_the_previous_outputs_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dapo_cli.data import staging

    raw = _amc_like(tmp_path, 10)
    prepare(tmp_path, raw, val_fraction=0.5, seed=1)
    names = ["out.parquet", "out.val.parquet", "out.parquet.manifest.json"]
    before = {name: (tmp_path / name).read_bytes() for name in names}
    real_replace, calls = staging.os.replace, []

    def flaky_replace(src: object, dst: object) -> None:
        calls.append(dst)
        if len(calls) == 3:  # the manifest, after both parquet files were renamed into place
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(staging.os, "replace", flaky_replace)
    with pytest.raises(UserError, match=r"cannot write .*out.parquet.manifest.json: No space left on device; nothing was written"):
        prepare(tmp_path, raw, val_fraction=0.5, seed=2)  # another split: different files
    assert {name: (tmp_path / name).read_bytes() for name in names} == before  # the old outputs, all of them
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*names, "raw.jsonl"])  # no temporary, no backup


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Callable[[str, bool], Path]]:
    """Mount a small tmpfs (``size``, optionally read-only) under tmp_path; skip where mount is not permitted."""
    mounted: list[Path] = []

    def mount(size: str, read_only: bool = False) -> Path:
        target = tmp_path / f"mnt{len(mounted)}"
        target.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(target)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode(errors='replace').strip()})")
        mounted.append(target)
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(target)], check=True)
        return target

    yield mount
    for target in mounted:
        subprocess.run(["umount", str(target)], check=False)


def test_read_only_destination_leaves_nothing(tmp_path: Path, small_tmpfs: Callable[[str, bool], Path]) -> None:
    destination = small_tmpfs("64k", True)
    raw = _amc_like(tmp_path, 3)
    with pytest.raises(UserError, match=r"cannot write .*out.parquet: Read-only file system; nothing was written") as info:
        run_prepare(PrepareOptions(output=destination / "out.parquet", inputs=(raw,)))
    assert "\n" not in str(info.value) and list(destination.iterdir()) == []


def test_full_disk_leaves_nothing_not_even_the_directory_it_made(tmp_path: Path, small_tmpfs: Callable[[str, bool], Path]) -> None:
    destination = small_tmpfs("16k", False)
    records = [{"problem": f"Problem {i}: " + "text " * 60, "answer": str(i)} for i in range(400)]  # ~50 kB of parquet
    raw = write_jsonl(tmp_path / "raw.jsonl", records)
    with pytest.raises(UserError, match=r"cannot write .*sub/out.parquet: .*No space left on device.*; nothing was written"):
        run_prepare(PrepareOptions(output=destination / "sub" / "out.parquet", inputs=(raw,)))
    assert list(destination.iterdir()) == []  # no parquet, manifest, temporary file or sub/


class FakeRecord:
    """A RunRecord that keeps what it is given (the data layer knows no tracking backend)."""

    run_id = "run-1"

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def log_params(self, params: object) -> None:
        self.calls.append(("params", params))

    def log_metrics(self, metrics: object, step: int | None = None) -> None:
        self.calls.append(("metrics", step))

    def log_artifact(self, path: object, artifact_path: str | None = None) -> None:
        self.calls.append(("artifact", path))


def test_the_caller_opens_the_record_after_reading_and_before_writing(tmp_path: Path) -> None:
    raw = write_jsonl(tmp_path / "raw.jsonl", [{"problem": "1+1?", "answer": "2"}, {"problem": "2+3?", "answer": "5"}])
    record, opened = FakeRecord(), []

    def open_run(options: PrepareOptions):
        assert not options.output.exists()  # opened before anything is written
        opened.append(options.output)
        return contextlib.nullcontext(record)

    options = PrepareOptions(output=tmp_path / "out.parquet", inputs=(raw,))
    result = run_prepare(options, open_run=open_run)
    assert opened == [options.output]
    assert [kind for kind, _ in record.calls] == ["params", "metrics", "artifact"]
    assert record.calls[0][1]["inputs"] == str(raw) and record.calls[1][1] == 0
    assert record.calls[2][1] == options.manifest_path
    assert result.run_id == "run-1"


def test_bad_input_opens_no_record(tmp_path: Path) -> None:
    raw = write_jsonl(tmp_path / "raw.jsonl", [{"problem": "what?", "answer": "x"}])

    def open_run(options: PrepareOptions):
        raise AssertionError("no record for a preparation that writes nothing")

    with pytest.raises(UserError, match="every row was dropped"):
        run_prepare(PrepareOptions(output=tmp_path / "out.parquet", inputs=(raw,)), open_run=open_run)


def test_by_default_nothing_is_recorded(tmp_path: Path) -> None:
    raw = write_jsonl(tmp_path / "raw.jsonl", [{"problem": "1+1?", "answer": "2"}])
    assert run_prepare(PrepareOptions(output=tmp_path / "out.parquet", inputs=(raw,))).run_id == ""
