"""The files of one ``dapo eval`` result directory, and the sample record they hold.

``generations.parquet`` holds one row per sample (a :class:`SampleRecord`): ``problem_id``,
``sample_index``, ``response``, ``pred``, ``acc``, ``score``, ``ground_truth``, ``length``,
``truncated``. ``generations.partial.jsonl`` is the resumable record of an unfinished
evaluation (written and read back by :class:`GenerationCheckpoint`), ``summary.json`` the
metrics. :mod:`dapo_cli.eval.run` writes them and :mod:`dapo_cli.eval.compare` reads them; both
import this module, neither the other.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
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


class GenerationCheckpoint:
    """Finished batches, kept in memory and (with a directory) in ``DIR/generations.partial.jsonl``.

    The file is append-only JSONL: line 1 is ``{"settings": {...}}``, every later line
    ``{"batch": b, "records": [...]}``, flushed and fsynced when batch ``b`` finishes. A
    torn last line (killed mid-write) is dropped; other settings are a :class:`UserError`.
    Without a directory nothing is written (a null checkpoint).
    """

    def __init__(self, directory: Path | None, settings: Mapping[str, Any]) -> None:
        self.path = None if directory is None else directory / CHECKPOINT_FILE
        self.settings = json.loads(json.dumps(dict(settings)))
        self.done: dict[int, list[SampleRecord]] = {}
        if self.path is not None and self.path.exists():
            self._load(self.path)
        elif self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._write_line({"settings": self.settings}, mode="w")

    def _load(self, path: Path) -> None:
        lines = path.read_text(encoding="utf-8").splitlines()
        entries = []
        for number, line in enumerate(lines):
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                if number == len(lines) - 1:
                    break  # torn final write: that batch is simply redone
                raise UserError(f"{path} is corrupt at line {number + 1}; delete it or use another --output DIR") from None
        if not entries or "settings" not in entries[0]:
            raise UserError(f"{path} has no settings header; delete it or use another --output DIR")
        old = entries[0]["settings"]
        if old != self.settings:
            diff = sorted(key for key in set(old) | set(self.settings) if old.get(key) != self.settings.get(key))
            detail = "; ".join(f"{key}: {old.get(key)!r} then, {self.settings.get(key)!r} now" for key in diff)
            raise UserError(
                f"{path.parent} holds generations made with other settings ({detail}); use another --output DIR"
            )
        for entry in entries[1:]:
            self.done[int(entry["batch"])] = [SampleRecord(**r) for r in entry["records"]]
        if len(lines) > len(entries):  # drop the torn line so appends start on a clean line
            with atomic_path(path) as tmp:
                tmp.write_text("".join(json.dumps(e) + "\n" for e in entries), encoding="utf-8")

    def _write_line(self, obj: Mapping[str, Any], mode: str = "a") -> None:
        if self.path is None:
            return
        with self.path.open(mode, encoding="utf-8") as handle:
            handle.write(json.dumps(obj) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def append(self, batch: int, records: Sequence[SampleRecord]) -> None:
        """Record a finished batch."""
        self._write_line({"batch": batch, "records": [asdict(r) for r in records]})
        self.done[batch] = list(records)

    def records(self) -> list[SampleRecord]:
        """Every record of the finished batches."""
        return [r for b in sorted(self.done) for r in self.done[b]]
