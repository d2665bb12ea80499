"""``dapo eval --compare`` within stated bounds (dapo_cli/eval/compare.py): sizes checked before the files
are held, problem ids of any text ordered without a traceback, and a bootstrap whose memory does not grow
with the number of problems."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from dapo_cli.errors import UserError
from dapo_cli.eval import compare as C
from dapo_cli.eval.generations import SampleRecord, write_generations
from dapo_cli.eval.metrics import BOOTSTRAP_CHUNK_DRAWS, bootstrap_means, paired_bootstrap
from fixtures.peak_memory import PeakMemory, can_measure


def run(path: Path, correct: dict[str, int], k: int = 2) -> Path:
    write_generations(
        [SampleRecord(pid, j, "r", "1", j < c, 1.0, "1", 3, False) for pid, c in correct.items() for j in range(k)], path
    )
    return path


def generations(path: Path, ids: pa.Array, acc: pa.Array | None = None) -> Path:
    """A generations-shaped parquet of the two columns --compare reads (the others are never read)."""
    acc = pa.array(np.zeros(len(ids), dtype=bool)) if acc is None else acc
    pq.write_table(pa.table({"problem_id": ids, "acc": acc}), path)
    return path


def test_problem_ids_of_any_text_are_ordered_numbers_first(tmp_path: Path) -> None:
    long = "9" * 5000  # int() of it would raise: past Python's 4,300-digit limit
    ids = {"10": 1, "2": 2, "-3": 0, "²": 1, "--5": 2, long: 1, "1" * 4000: 0, "b": 2, "a": 1}
    report = C.compare_results(str(run(tmp_path / "a.parquet", ids)), str(run(tmp_path / "b.parquet", ids)))
    assert report.common == ["-3", "2", "10", "1" * 4000, "--5", long, "a", "b", "²"]
    assert report.comparison.diff == 0.0


def test_integer_problem_ids_are_read_as_their_text(tmp_path: Path) -> None:
    a = generations(tmp_path / "a.parquet", pa.array([3, 3, 10], pa.int64()), pa.array([True, False, True]))
    assert C.read_accuracies(str(a)) == {"3": 0.5, "10": 1.0}


def test_too_many_samples_are_refused_from_the_footer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(C, "MAX_COMPARE_SAMPLES", 5)
    a = generations(tmp_path / "a.parquet", pa.array(["1"] * 6))
    with pytest.raises(UserError, match=r"^--compare .*a.parquet: 6 samples; at most 5 \(compare smaller evaluations\)$"):
        C.read_accuracies(str(a))


def test_too_many_problems_are_refused_from_the_id_column(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(C, "MAX_COMPARE_PROBLEMS", 3)
    a = generations(tmp_path / "a.parquet", pa.array(["1", "2", "3", "4", "4"]))
    with pytest.raises(UserError, match=r"a.parquet: 4 problems; at most 3 \(compare on a subset: dapo eval --limit\)$"):
        C.read_accuracies(str(a))


@pytest.mark.parametrize(
    ("columns", "expected"),
    [
        ({"problem_id": pa.array(["1"])}, "is not a generations file (missing acc)"),
        ({"problem_id": pa.array(["1"]), "acc": pa.array([1.0])}, "problem_id must be text and acc true/false (got string and double)"),
        ({"problem_id": pa.array([1.5]), "acc": pa.array([True])}, "problem_id must be text and acc true/false (got double and bool)"),
        ({"problem_id": pa.array(["1", None]), "acc": pa.array([True, False])}, "a row has no problem_id or acc"),
    ],
)
def test_files_that_are_not_generations_are_one_line(tmp_path: Path, columns: dict[str, pa.Array], expected: str) -> None:
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table(columns), path)
    with pytest.raises(UserError) as info:
        C.read_accuracies(str(path))
    assert expected in str(info.value)


def test_per_problem_accuracy_of_rows_is_the_file_computation() -> None:
    rows = [{"problem_id": 7, "acc": True}, {"problem_id": "7", "acc": False}, {"problem_id": "x", "acc": 1}]
    assert C.per_problem_accuracy(rows) == {"7": 0.5, "x": 1.0}


def test_small_bootstraps_are_the_single_draw_they_always_were() -> None:
    values = np.linspace(-1, 1, 97)
    rng = np.random.default_rng(0)
    assert np.array_equal(bootstrap_means(values), values[rng.integers(0, 97, size=(2000, 97))].mean(axis=1))


def test_large_bootstraps_are_drawn_in_chunks_reproducibly(monkeypatch: pytest.MonkeyPatch) -> None:
    import dapo_cli.eval.metrics as M

    monkeypatch.setattr(M, "BOOTSTRAP_CHUNK_DRAWS", 1000)  # 2,000 resamples x 50 values: chunks of 20 resamples
    values = np.random.default_rng(1).random(50)
    first, again = M.bootstrap_means(values), M.bootstrap_means(values)
    assert np.array_equal(first, again) and first.shape == (2000,)
    assert abs(first.mean() - values.mean()) < 0.01 and 0.02 < first.std() < 0.06  # sd of a mean of 50 U(0,1): 0.041
    assert BOOTSTRAP_CHUNK_DRAWS == 1 << 23


@pytest.mark.slow
@pytest.mark.skipif(not can_measure(), reason="resident memory is read from /proc")
def test_oversized_comparisons_end_in_one_line_within_30_s_and_1_gb(tmp_path: Path) -> None:
    # before: two files of 10^6 problems reached 5 GB (every row a dict, then a 2,000 x 10^6 index array)
    many_problems = generations(tmp_path / "problems.parquet", pc.cast(pa.array(np.arange(1_000_000)), pa.string()))
    many_samples = generations(tmp_path / "samples.parquet", pc.cast(pa.array(np.arange(C.MAX_COMPARE_SAMPLES + 1) % 1000), pa.string()))
    fine = run(tmp_path / "fine.parquet", {"1": 1})
    for path, expected in ((many_problems, "1,000,000 problems; at most 100,000"), (many_samples, "4,000,001 samples; at most 4,000,000")):
        with PeakMemory() as memory:
            start = time.perf_counter()
            with pytest.raises(UserError, match=expected):
                C.compare_results(str(fine), str(path))
            seconds = time.perf_counter() - start
        assert seconds < 30 and memory.grown < 2**30, (path.name, seconds, memory.grown)


@pytest.mark.slow
def test_the_largest_comparison_allowed_bootstraps_in_bounded_memory() -> None:
    p = C.MAX_COMPARE_PROBLEMS
    a, b = np.random.default_rng(0).random(p), np.random.default_rng(1).random(p)
    with PeakMemory() as memory:
        result = paired_bootstrap(a, b)
    assert result.num_problems == p and result.ci_low < result.diff < result.ci_high
    assert memory.grown < 400 * 2**20, memory.grown  # drawn at once: 2,000 x 100,000 indices = 1.6 GB, then 1.6 GB of values
