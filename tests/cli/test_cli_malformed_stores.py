"""Stores and files that are not what they claim (issue 54): one ``error:`` line, exit 2, every file as it was.

A tracking store that is a text file, a damaged database, another program's SQLite database, a FIFO or a
link to ``/dev/zero``; an input that is a FIFO, a device or a symbolic-link loop; an output that cannot be
written while tracking is on; a Slurm that does not take jobs. The harness (``malformed_harness.py``)
compares every file's size and SHA-256 before and after, so "another program's database is left byte for
byte as it was" is checked, not assumed.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from malformed_harness import SETUPS, Case, case, places_for, run_case


def _other_program_db(cwd: Path) -> None:
    with sqlite3.connect(cwd / "other.db") as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO users (name) VALUES ('ada')")
    conn.close()


def _damaged_db(cwd: Path) -> None:
    """SQLite's header, then pages of noise: it passes the magic-number test and fails as a database."""
    (cwd / "damaged.db").write_bytes(b"SQLite format 3\x00" + bytes([0x10, 0x00]) + b"\xff" * 4000)


SETUPS.update({
    "text.db": lambda cwd: (cwd / "text.db").write_text("not a database\n", encoding="utf-8"),
    "x.jsonl": lambda cwd: (cwd / "x.jsonl").write_text('{"problem": "What is 1 + 1?", "answer": "2"}\n', encoding="utf-8"),
    "other.db": _other_program_db,
    "damaged.db": _damaged_db,
    "fifo": lambda cwd: os.mkfifo(cwd / "fifo"),
    "loop": lambda cwd: (cwd / "loop").symlink_to("loop"),
    "zero": lambda cwd: (cwd / "zero.jsonl").symlink_to("/dev/zero"),
})

M = ("--set", "model.path={model}")
EVAL = ("eval", "{model}", "--dataset", "{data}", "--avg", "1", "--max-tokens", "2")
PREP = ("prepare-data", "--synthetic", "add-3digit", "--n", "4", "-o", "x.parquet")
NOT_SQLITE = "is not a SQLite database (it does not start with SQLite's header)"
NOT_MLFLOW = "other.db is a SQLite database but not an MLflow store (its tables: users)"

CASES = [
    # ------------------------------------------------------------ tracking stores
    case("prepare-store-text-file", *PREP, "--tracking-uri", "sqlite:///text.db", expect=NOT_SQLITE, setup=("text.db",)),
    case("prepare-store-is-the-input", "prepare-data", "x.jsonl", "-o", "x.parquet", "--tracking-uri", "sqlite:///x.jsonl",
         expect=f"x.jsonl {NOT_SQLITE}", setup=("x.jsonl",)),
    case("prepare-store-other-program", *PREP, "--tracking-uri", "sqlite:///other.db", expect=NOT_MLFLOW, setup=("other.db",)),
    case("train-store-other-program", "train", *M, "--set", "tracking.tracking_uri=sqlite:///other.db", expect=NOT_MLFLOW,
         setup=("other.db",)),
    case("train-store-damaged", "train", *M, "--set", "tracking.tracking_uri=sqlite:///damaged.db",
         expect="damaged.db is a damaged SQLite database", setup=("damaged.db",)),
    case("eval-store-text-file", *EVAL, "--tracking-uri", "sqlite:///text.db", expect=NOT_SQLITE, setup=("text.db",)),
    case("eval-store-fifo", *EVAL, "--tracking-uri", "sqlite:///fifo", expect="fifo is a named pipe (FIFO), not a file",
         setup=("fifo",)),
    case("report-store-other-program", "report", "x", "--tracking-uri", "sqlite:///other.db", expect=NOT_MLFLOW,
         setup=("other.db",)),
    case("report-store-device", "report", "x", "--tracking-uri", "sqlite:///zero.jsonl",
         expect="zero.jsonl is a character device, not a file (it leads to /dev/zero)", setup=("zero",)),
    case("ablate-store-loop", "ablate", "--ladder", "--launcher", "print", "--set", "tracking.tracking_uri=sqlite:///loop",
         expect="loop is a symbolic link loop", setup=("loop",)),
    # ------------------------------------------------------------ inputs that are not files
    case("config-fifo", "config", "fifo", expect="config fifo is a named pipe (FIFO), not a file; give a regular file",
         setup=("fifo",)),
    case("lint-loop", "lint", "loop", expect="config loop is a symbolic link loop", setup=("loop",)),
    case("train-config-device", "train", "zero.jsonl", expect="config zero.jsonl is a character device", setup=("zero",)),
    case("train-dataset-fifo", "train", *M, "--set", "data.train_files=[fifo]",
         expect="data.train_files: fifo is a named pipe (FIFO), not a file", setup=("fifo",)),
    case("train-dataset-loop", "train", *M, "--set", "data.val_files=[loop]", expect="data.val_files: loop is a symbolic link loop",
         setup=("loop",)),
    case("prepare-input-loop", "prepare-data", "loop", "-o", "x.parquet", expect="input loop is a symbolic link loop",
         setup=("loop",)),
    case("prepare-input-fifo", "prepare-data", "fifo", "-o", "x.parquet", expect="input fifo is a named pipe (FIFO)", setup=("fifo",)),
    case("prepare-input-device", "prepare-data", "zero.jsonl", "-o", "x.parquet",
         expect="input zero.jsonl is a character device, not a file (it leads to /dev/zero)", setup=("zero",)),
    case("eval-dataset-device", "eval", "{model}", "--dataset", "zero.jsonl", expect="zero.jsonl is a character device",
         setup=("zero",)),
    case("eval-compare-fifo", "eval", "--compare", "fifo", "{data}", expect="fifo is a named pipe (FIFO)", setup=("fifo",)),
    # ------------------------------------------------------------ outputs, checked before a tracked run opens
    case("prepare-tracked-output-read-only", *PREP[:-1], "{ro}/x.parquet", expect="is on a read-only file system; give a writable -o/--output",
         read_only=True),
    case("prepare-tracked-val-output-read-only", *PREP, "--val-fraction", "0.5", "--val-output", "{ro}/v.parquet",
         expect="is on a read-only file system; give a writable --val-output", read_only=True),
    case("prepare-tracked-output-inside-a-file", *PREP[:-1], "afile/x.parquet", expect="is inside afile, which is a file",
         setup=("afile",)),
]


def test_the_stores_table_covers_each_kind() -> None:
    assert len({c.id for c in CASES}) == len(CASES)
    assert {s for c in CASES for s in c.setup} >= {"text.db", "other.db", "damaged.db", "fifo", "loop", "zero"}


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
@pytest.mark.slow
def test_a_store_or_file_that_is_not_what_it_claims_is_one_line_and_changes_nothing(
    c: Case, request: pytest.FixtureRequest, models: dict[str, Path], dataset: Path, case_dir: Path,
) -> None:
    run_case(c, places_for(c, request, models, dataset), case_dir)


@pytest.mark.slow
def test_ablate_on_a_slurm_that_takes_no_jobs_is_one_line_before_anything_opens(
    request: pytest.FixtureRequest, models: dict[str, Path], dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    case_dir: Path,
) -> None:
    """``sbatch`` is there but its controller is not (a login node of a cluster that is down or not set up)."""
    pytest.importorskip("submitit")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("sbatch", 'echo "sbatch: error: Unable to contact slurm controller (connect failure)" >&2; exit 1'),
                       ("srun", "exit 0")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    c = case("ablate-slurm-unreachable", "ablate", "--ladder", "--launcher", "slurm", "--only", "grpo", "--no-calibrate",
             expect="Slurm refused a child's job shape (`sbatch --test-only")
    run_case(c, places_for(c, request, models, dataset), case_dir)
