"""The files of one ``dapo eval`` result directory, and the sample record they hold.

``generations.parquet`` holds one row per sample (a :class:`SampleRecord`): ``problem_id``,
``sample_index``, ``response``, ``pred``, ``acc``, ``score``, ``ground_truth``, ``length``,
``truncated``. ``generations.partial.jsonl`` is the resumable record of an unfinished
evaluation, ``summary.json`` the metrics. :mod:`dapo_cli.eval.run` writes them and
:mod:`dapo_cli.eval.compare` reads them; both import this module, neither the other.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dapo_cli.errors import UserError
from dapo_cli.fileio import atomic_path

CHECKPOINT_FILE = "generations.partial.jsonl"
GENERATIONS_FILE = "generations.parquet"
SUMMARY_FILE = "summary.json"


@dataclass(frozen=True)
class SampleRecord:
    """One scored response: sample ``sample_index`` (0..K-1) of problem ``problem_id``."""

    problem_id: str
    sample_index: int
    response: str
    pred: str
    acc: bool
    score: float
    ground_truth: str
    length: int
    truncated: bool


GENERATION_COLUMNS: dict[str, str] = {
    "problem_id": "string",
    "sample_index": "int64",
    "response": "string",
    "pred": "string",
    "acc": "bool",
    "score": "float64",
    "ground_truth": "string",
    "length": "int64",
    "truncated": "bool",
}
"""Column → arrow type of ``generations.parquet``."""


def write_generations(records: Sequence[SampleRecord], path: str | os.PathLike[str]) -> None:
    """One row per sample as parquet, atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([(name, pa.type_for_alias(kind)) for name, kind in GENERATION_COLUMNS.items()])
    table = pa.Table.from_pylist([asdict(r) for r in records], schema=schema)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def generations_path(spec: str) -> Path:
    """The parquet of a result dir (``--output`` of ``dapo eval``) or a parquet path."""
    path = Path(spec).expanduser()
    if path.is_dir():
        if (path / GENERATIONS_FILE).is_file():
            return path / GENERATIONS_FILE
        if (path / CHECKPOINT_FILE).is_file():
            raise UserError(f"{path} holds an unfinished evaluation; rerun `dapo eval ... --output {path}` to finish it")
        raise UserError(f"{path} holds no {GENERATIONS_FILE}; give an eval result dir or a generations parquet")
    if not path.is_file():
        raise UserError(f"comparison input not found: {path}")
    return path


def read_generations(spec: str) -> list[dict[str, Any]]:
    """Rows of a generations parquet (``problem_id`` and ``acc`` at least)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = generations_path(spec)
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise UserError(f"cannot read {path} as parquet: {exc}") from None
    missing = {"problem_id", "acc"} - set(table.column_names)
    if missing:
        raise UserError(f"{path} is not a generations file (missing {', '.join(sorted(missing))})")
    return table.select(["problem_id", "acc"]).to_pylist()
