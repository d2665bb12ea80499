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
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dapo_cli.errors import UserError
from dapo_cli.fileio import UnreadableJson, atomic_path, load_json, refuse_special
from dapo_cli.redact import escape_controls, shown

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
    refuse_special(path, "comparison input")
    if path.is_dir():
        if (path / GENERATIONS_FILE).is_file():
            return path / GENERATIONS_FILE
        if (path / CHECKPOINT_FILE).is_file():
            raise UserError(f"{path} holds an unfinished evaluation; rerun `dapo eval ... --output {path}` to finish it")
        raise UserError(f"{path} holds no {GENERATIONS_FILE}; give an eval result dir or a generations parquet")
    if not path.is_file():
        raise UserError(f"comparison input not found: {path}")
    return path


PARTIAL_FIX = "delete it or use another --output DIR"
"""The end of every error about ``generations.partial.jsonl``: the way on (a fresh evaluation)."""

RECORD_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "int64": (int,), "bool": (bool,), "float64": (int, float)}
"""Python types a record's field may hold, by its :data:`GENERATION_COLUMNS` type (a bool is no number here)."""


class GenerationCheckpoint:
    """Finished batches, kept in memory and (with a directory) in ``DIR/generations.partial.jsonl``.

    The file is append-only JSONL: line 1 is ``{"settings": {...}}``, every later line
    ``{"batch": b, "records": [...]}``, flushed and fsynced when batch ``b`` finishes. A torn last
    line (killed mid-write: no newline after it) is dropped and the file rewritten without it; other
    settings are a :class:`UserError`, and so is any other line that is not what this class wrote
    (:meth:`_batch`): nothing is kept or rewritten before the whole file has been checked. Without a
    directory nothing is written (a null checkpoint).

    ``batches`` (the problem ids of each batch, as the evaluation splits them) and ``k`` (samples per
    problem), when given, bound every record: its batch among them, exactly ``k`` samples (``sample_index``
    0..k-1) of each problem of its batch and nothing else.
    """

    def __init__(self, directory: Path | None, settings: Mapping[str, Any], *,
                 batches: Sequence[Sequence[str]] | None = None, k: int | None = None) -> None:
        self.path = None if directory is None else directory / CHECKPOINT_FILE
        self.settings = json.loads(json.dumps(dict(settings)))
        self.batches = None if batches is None else [list(b) for b in batches]
        self.k = k
        self.done: dict[int, list[SampleRecord]] = {}
        if self.path is not None and self.path.exists():
            self._load(self.path)
        elif self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._write_line({"settings": self.settings}, mode="w")

    def _load(self, path: Path) -> None:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            line = path.read_bytes().count(b"\n", 0, exc.start) + 1
            raise UserError(f"{path}: line {line} is not UTF-8 text; {PARTIAL_FIX}") from None
        lines = text.splitlines()
        torn = bool(text) and not text.endswith("\n")  # only a write cut short leaves a line without its newline
        entries = []
        for number, line in enumerate(lines, start=1):
            try:
                entries.append(load_json(line))
            except UnreadableJson as exc:
                if number == len(lines) and torn:
                    break  # torn final write: that batch is simply redone
                raise UserError(f"{path}: line {number} is corrupt ({exc}); {PARTIAL_FIX}") from None
        header = entries[0] if entries else None
        if not (isinstance(header, dict) and list(header) == ["settings"] and isinstance(header["settings"], dict)):
            raise UserError(f"{path}: line 1 is not its settings header ({{\"settings\": {{...}}}}); {PARTIAL_FIX}")
        old = header["settings"]
        if old != self.settings:
            diff = sorted((key for key in set(old) | set(self.settings) if old.get(key) != self.settings.get(key)), key=str)
            detail = "; ".join(f"{escape_controls(str(key))}: {shown(old.get(key))} then, {shown(self.settings.get(key))} now"
                               for key in diff)
            raise UserError(f"{path}: line 1 says it holds generations made with other settings ({detail}); use another "
                            "--output DIR (or delete the file to start afresh)")
        done: dict[int, list[SampleRecord]] = {}
        for number, entry in enumerate(entries[1:], start=2):
            batch, records = self._batch(entry, f"{path}: line {number}")
            if batch in done:
                raise UserError(f"{path}: line {number} repeats batch {batch}; {PARTIAL_FIX}")
            done[batch] = records
        self.done = done
        if torn:  # drop the torn line (or end the last one) so appends start on a clean line
            with atomic_path(path) as tmp:
                tmp.write_text("".join(json.dumps(e) + "\n" for e in entries), encoding="utf-8")

    def _batch(self, entry: Any, where: str) -> tuple[int, list[SampleRecord]]:
        """``(b, records)`` of one ``{"batch": b, "records": [...]}`` line, every field checked (see the class)."""
        if not (isinstance(entry, dict) and set(entry) == {"batch", "records"} and isinstance(entry["records"], list)):
            raise UserError(f"{where} is not a finished batch ({{\"batch\": b, \"records\": [...]}}); {PARTIAL_FIX}")
        batch, count = entry["batch"], None if self.batches is None else len(self.batches)
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0 or (count is not None and batch >= count):
            valid = f"0..{count - 1}" if count is not None else "a whole number >= 0"
            raise UserError(f"{where} is batch {shown(batch)}; this evaluation's batches are {valid}; {PARTIAL_FIX}")
        records = [self._record(r, f"{where}, record {i + 1}") for i, r in enumerate(entry["records"])]
        if self.batches is not None and self.k is not None:
            ids = self.batches[batch]
            expected = {(pid, j) for pid in ids for j in range(self.k)}
            got = [(r.problem_id, r.sample_index) for r in records]
            stray = next((g for g in got if g not in expected), None)
            if stray is not None:
                problems = ", ".join(map(shown, ids[:3])) + (", ..." if len(ids) > 3 else "")
                raise UserError(f"{where} holds sample {stray[1]} of problem {shown(stray[0])}; batch {batch} is samples "
                                f"0..{self.k - 1} of problem(s) {problems}; {PARTIAL_FIX}")
            if len(got) != len(expected) or set(got) != expected:
                raise UserError(f"{where} holds {len(got)} samples; batch {batch} is {len(ids)} problem(s) x {self.k} "
                                f"samples, each once; {PARTIAL_FIX}")
        return batch, records

    def _record(self, record: Any, where: str) -> SampleRecord:
        """One sample: exactly the :class:`SampleRecord` fields, each of its column's type; counts >= 0, a finite score."""
        if not isinstance(record, dict):
            raise UserError(f"{where} is {shown(record)}, not a sample record ({', '.join(GENERATION_COLUMNS)}); {PARTIAL_FIX}")
        missing = [name for name in GENERATION_COLUMNS if name not in record]
        unknown = sorted((escape_controls(str(key)) for key in record if key not in GENERATION_COLUMNS))
        if missing or unknown:
            wrong = "; ".join(f"{label} {', '.join(keys[:5])}" for label, keys in (("lacks", missing), ("has no field", unknown)) if keys)
            raise UserError(f"{where} {wrong}; {PARTIAL_FIX}")
        for name, kind in GENERATION_COLUMNS.items():
            value = record[name]
            if not isinstance(value, RECORD_TYPES[kind]) or (kind != "bool" and isinstance(value, bool)):
                raise UserError(f"{where}: {name} is {shown(value)}, not of type {kind}; {PARTIAL_FIX}")
        for name in ("sample_index", "length"):
            if record[name] < 0:
                raise UserError(f"{where}: {name} is {record[name]}; it counts from 0; {PARTIAL_FIX}")
        if not math.isfinite(record["score"]):
            raise UserError(f"{where}: score is {shown(record['score'])}, not a finite number; {PARTIAL_FIX}")
        return SampleRecord(**record)

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
