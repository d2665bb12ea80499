"""Read raw math problems (parquet, JSONL/JSON, Arrow, Hugging Face ``datasets`` folders) and their layout.

Where each record keeps its problem and answer is detected per file from its field
names, or named with field options (:mod:`dapo_cli.data.layouts`: the fields looked
for, their precedence, the answer rules). A file whose columns are already the DAPO
schema (``prompt`` and ``reward_model``, e.g. DAPO-Math-17K or ``aime-2024.parquet``)
is read as prepared rows instead.

The format comes from the path: a folder written by ``datasets``' ``save_to_disk``
(:mod:`dapo_cli.data.arrow_inputs`), else the extension (``.parquet``,
``.jsonl``/``.ndjson``, ``.json``, ``.arrow``), else the first bytes (``PAR1``, Arrow
IPC, ``{``/``[``). Every problem here raises :class:`~dapo_cli.errors.UserError` with
one line: a file that is not UTF-8 (naming the first bad line), JSON nested deeper than
:data:`MAX_JSON_DEPTH` (naming the line, checked before parsing), a broken parquet or
Arrow file, a field option naming a field the file lacks, an integer of more digits than
Python converts (``sys.get_int_max_str_digits()``, 4,300: naming the line).

:func:`open_input` streams: parquet and Arrow in record batches, JSONL line by line (one
extra pass first for the column names), so ``dapo prepare-data`` holds only the
rows it keeps (DAPO-Math-17K's 1.79 M rows are read, never all held);
:func:`read_input` is the same, materialised. Of a parquet file, :meth:`InputSource.integer_index`
reads the ``extra_info.index`` column alone and :meth:`InputSource.records_with_index` only the rows
of some indexes (``dapo eval --limit``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dapo_cli.data import arrow_inputs
from dapo_cli.data.layouts import PROBLEM_FIELDS, FieldOptions, Layout, detect_layout
from dapo_cli.data.schema import is_dapo_table
from dapo_cli.errors import UserError
from dapo_cli.fileio import refuse_special, sha256_file

__all__ = ["PROBLEM_FIELDS", "InputFile", "InputSource", "RawProblem", "detect_format", "open_input", "read_input"]

FORMATS: dict[str, str] = {
    ".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".arrow": "arrow",
}  # fmt: skip
"""File extension → format; anything else is sniffed."""

SAMPLE_ROWS = 100
"""First records looked at to describe a layout (whether a prompt holds text or chat messages)."""

MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects read from JSON (a DAPO row nests 3 levels).

Python's ``json`` recurses once per level (100,000 nested ``[`` raised RecursionError),
and later steps that print or copy a cell recurse again; a row nested deeper than
this is refused with one line naming the file and line before it is parsed.
"""

# One JSON string (always matches from a '"': to its closing quote, or to the end of an
# unterminated one; the unrolled loop never backtracks) or one bracket outside strings.
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)|[\[\]{}]', re.DOTALL)


def json_nesting_excess(text: str) -> int | None:
    """Offset of the first ``[``/``{`` nested deeper than :data:`MAX_JSON_DEPTH` in ``text`` (None: not too deep).

    Linear: brackets inside strings are skipped with the strings. Text with at most
    :data:`MAX_JSON_DEPTH` brackets in all is answered without scanning.
    """
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return None
    depth = 0
    for token in _JSON_TOKEN.finditer(text):
        char = text[token.start()]
        if char in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return token.start()
        elif char in "]}":
            depth = max(depth - 1, 0)
    return None


def _too_deep(where: str) -> UserError:
    return UserError(f"{where} nests arrays/objects deeper than {MAX_JSON_DEPTH} levels; this is not a dataset row")


def _long_number(where: str) -> UserError:
    """The error for JSON holding an integer past Python's limit on converting digits (4,300 by default:
    ``json`` raises ValueError, not JSONDecodeError, for it)."""
    limit = sys.get_int_max_str_digits()
    return UserError(f"{where} holds an integer of more than {limit:,} digits; write a number that long as a string")


def _undecodable_line(path: Path) -> str:
    """``<path>: line N`` of the first line that is not UTF-8 (read in binary, only on that error)."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return f"{path}: line {number}"
    return str(path)


@dataclass(frozen=True)
class RawProblem:
    """One raw record: its problem text, the answer text found (None if none) and where it came from."""

    row: int
    problem: str
    answer: str | None
    answer_source: str
    """``<field>``, ``<field>:list``, ``<field>:####``, ``<field>:the_answer_is``, ``<field>:boxed`` or ``none``."""
    drop: str | None = None
    """A drop reason decided by the layout (``multiple_answers``: a list of several answers)."""


@dataclass(frozen=True)
class InputFile:
    """What :func:`read_input` found in one file."""

    path: Path
    format: str
    kind: str
    """``raw`` (problems to convert) or ``dapo`` (already-prepared rows)."""
    rows_read: int
    problem_field: str | None = None
    answer_sources: dict[str, int] = field(default_factory=dict)
    problems: tuple[RawProblem, ...] = ()
    dapo_rows: tuple[dict[str, Any], ...] = ()
    layout: Layout | None = None


def detect_format(path: Path) -> str:
    """``parquet``, ``jsonl`` or ``json`` from the extension, else from the first bytes."""
    by_extension = FORMATS.get(path.suffix.lower())
    if by_extension is not None:
        return by_extension
    with open(path, "rb") as handle:
        head = handle.read(4096)
    if head.startswith(b"PAR1"):
        return "parquet"
    if arrow_inputs.is_arrow_ipc(head):
        return "arrow"
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    if text.startswith("{"):
        return "jsonl"
    if text.startswith("["):
        return "json"
    raise UserError(f"cannot tell the format of {path}: expected a .parquet, .jsonl, .json or .arrow file")


PARQUET_BATCH_ROWS = 4096
"""Rows converted to Python at a time when a parquet file is streamed."""


def _parquet_file(path: Path) -> pq.ParquetFile:
    try:  # buffered column reads, no pre-buffering: memory stays at a batch, not a row group's column chunks
        return pq.ParquetFile(path, buffer_size=1 << 20, pre_buffer=False)
    except (pa.ArrowInvalid, OSError) as exc:
        raise UserError(f"cannot read {path} as parquet: {' '.join(str(exc).split())}") from None


def _rows_of(batches: Iterable[pa.RecordBatch], where: Path) -> Iterator[dict[str, Any]]:
    """The rows of record batches as dicts, one batch converted at a time."""
    start = 0
    for batch in batches:
        try:
            rows = batch.to_pylist()
        except RecursionError:  # a nested column deeper than Python's recursion limit
            raise _too_deep(f"{where}: a row of rows {start}-{start + batch.num_rows - 1}") from None
        yield from rows
        start += batch.num_rows


def _iter_parquet(path: Path) -> Iterator[dict[str, Any]]:
    try:
        with _parquet_file(path) as parquet:
            yield from _rows_of(parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS), path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise UserError(f"cannot read {path} as parquet: {' '.join(str(exc).split())}") from None


def _iter_json_lines(path: Path) -> Iterator[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                if json_nesting_excess(line) is not None:
                    raise _too_deep(f"{path}: line {number}")
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise UserError(f"{path}: line {number} is not valid JSON ({exc.msg})") from None
                except RecursionError:  # only with a recursion limit below MAX_JSON_DEPTH
                    raise _too_deep(f"{path}: line {number}") from None
                except ValueError:  # after JSONDecodeError: an integer past int_max_str_digits
                    raise _long_number(f"{path}: line {number}") from None
                if not isinstance(record, dict):
                    raise UserError(f"{path}: line {number} is not a JSON object")
                yield record
    except UnicodeDecodeError:
        raise UserError(f"{_undecodable_line(path)} is not UTF-8 text; expected a .parquet or .jsonl file") from None


def _read_json_array(path: Path) -> list[dict[str, Any]]:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise UserError(f"{path}: line {line} is not UTF-8 text; expected a .parquet or .jsonl file") from None
    del raw
    excess = json_nesting_excess(text)
    if excess is not None:
        raise _too_deep(f"{path}: line {text.count(chr(10), 0, excess) + 1}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return list(_iter_json_lines(path))  # a .json file holding JSON lines
    except RecursionError:
        raise _too_deep(str(path)) from None
    except ValueError:  # after JSONDecodeError: an integer past int_max_str_digits
        raise _long_number(str(path)) from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise UserError(f"{path}: expected a JSON array of objects")
    return data


@dataclass(frozen=True)
class InputSource:
    """An opened input: format, kind, row count, columns and layout known; rows read on demand.

    Each call of :meth:`records` (or :meth:`raw_problems`) is one fresh pass over the
    file that holds one parquet or Arrow batch or one JSON line at a time (a JSON array
    is held whole: the format cannot be streamed).
    """

    path: Path
    format: str
    """``parquet``, ``jsonl``, ``json``, ``arrow`` or ``datasets`` (a save_to_disk folder)."""
    kind: str
    """``raw`` (problems to convert) or ``dapo`` (already-prepared rows)."""
    rows_read: int
    columns: tuple[str, ...]
    layout: Layout | None = None
    """Where a raw file's problems and answers are (None for DAPO rows)."""
    data_files: tuple[Path, ...] = ()
    """The Arrow shards of a ``datasets`` folder (or the one ``.arrow`` file), in order."""
    split: str | None = None
    """The split a ``datasets`` folder holds (``train``, …), when it says."""
    splits: tuple[str, ...] = ()
    """Every split of a DatasetDict folder (one of them is read)."""
    _array: tuple[dict[str, Any], ...] | None = field(default=None, repr=False, compare=False)

    @property
    def problem_field(self) -> str | None:
        return self.layout.problem[0] if self.layout is not None else None

    def records(self) -> Iterator[dict[str, Any]]:
        """Every record (row dict) of the file, in file order."""
        if self._array is not None:
            return iter(self._array)
        if self.format == "parquet":
            return _iter_parquet(self.path)
        if self.data_files:
            return itertools.chain.from_iterable(_rows_of(arrow_inputs.iter_batches(f), f) for f in self.data_files)
        return _iter_json_lines(self.path)

    def integer_index(self) -> pa.ChunkedArray | None:
        """Every row's ``extra_info.index`` read alone, without the rows, when this is a parquet file whose
        index column holds signed integers and no null (None otherwise: the rows must be read to know).

        One column of 8 bytes a row (8 MB for a million rows), the cheap way to know which problems a
        ``dapo eval --limit`` evaluates before any row becomes Python objects."""
        if self.format != "parquet":
            return None
        with _parquet_file(self.path) as parquet:
            names = parquet.schema_arrow.names
            extra = parquet.schema_arrow.field("extra_info").type if "extra_info" in names else None
            if not (pa.types.is_struct(extra) and extra.get_field_index("index") >= 0):
                return None
            if not pa.types.is_signed_integer(extra.field("index").type):
                return None
            try:
                column = pc.struct_field(parquet.read(columns=["extra_info.index"]).column("extra_info"), "index")
            except (pa.ArrowInvalid, OSError) as exc:
                raise UserError(f"cannot read {self.path} as parquet: {' '.join(str(exc).split())}") from None
        return column if column.null_count == 0 else None

    def records_with_index(self, wanted: pa.Array, rows: int) -> Iterator[tuple[int, dict[str, Any]]]:
        """(row number, record) of the rows of this parquet file whose ``extra_info.index`` is in ``wanted``,
        in file order, stopping after ``rows`` of them: batch by batch, only the matching rows become Python
        objects, and no batch past the last one needed is read."""
        assert self.format == "parquet", "records_with_index() reads a parquet file"
        found, start = 0, 0
        try:
            with _parquet_file(self.path) as parquet:
                for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS):
                    index = pc.struct_field(batch.column("extra_info"), "index")
                    hits = pc.indices_nonzero(pc.fill_null(pc.is_in(index, value_set=wanted), False))
                    if len(hits):
                        try:
                            picked = batch.take(hits).to_pylist()
                        except RecursionError:  # a nested column deeper than Python's recursion limit
                            raise _too_deep(f"{self.path}: a row of rows {start}-{start + batch.num_rows - 1}") from None
                        yield from zip((start + i for i in hits.to_pylist()), picked)
                        found += len(hits)
                    start += batch.num_rows
                    if found >= rows:
                        return
        except (pa.ArrowInvalid, OSError) as exc:
            raise UserError(f"cannot read {self.path} as parquet: {' '.join(str(exc).split())}") from None

    def raw_problems(self) -> Iterator[RawProblem]:
        """Every record of a raw file as a :class:`RawProblem` (problem text, answer and where it came from)."""
        layout = self.layout
        assert layout is not None, "raw_problems() of prepared DAPO rows"
        for row, record in enumerate(self.records()):
            found = layout.answer_of(record)
            yield RawProblem(row, layout.problem_of(record), found.text, found.source, found.drop)

    def sha256(self) -> str:
        """SHA-256 of the file; of a folder, of its shards' names and SHA-256s in order."""
        if self.path.is_file():
            return sha256_file(self.path)
        digest = hashlib.sha256()
        for shard in self.data_files:
            digest.update(f"{shard.relative_to(self.path)}\0{sha256_file(shard)}\n".encode())
        return digest.hexdigest()

    def describe(self) -> str:
        """The detection report of this input in one line (the name, its format and split, its layout)."""
        split = ""
        if self.splits:
            split = f", split {self.split} of {', '.join(self.splits)}"
        elif self.split:
            split = f", split {self.split}"
        head = f"{self.format}{split}, {self.rows_read} rows"
        if self.layout is None:
            return f"{head}; prepared DAPO rows (prompt, reward_model.ground_truth)"
        return f"{head}; {self.layout.describe()}"


def _not_a_dataset_folder(path: Path) -> UserError:
    return UserError(
        f"input {path} is a directory but not a Hugging Face datasets folder (no state.json or dataset_dict.json); "
        f"give parquet, JSONL, JSON or .arrow files (e.g. {path}/*.parquet) or a save_to_disk folder"
    )


def open_input(path: str | Path, fields: FieldOptions | None = None) -> InputSource:
    """Open one input file or ``datasets`` folder: format, kind, rows and layout, without holding its rows."""
    path = Path(path)
    refuse_special(path, "input")
    array, files, split, splits = None, (), None, ()
    if path.is_dir():
        if not arrow_inputs.is_datasets_folder(path):
            raise _not_a_dataset_folder(path)
        folder = arrow_inputs.resolve_folder(path)
        fmt, files, split, splits = "datasets", folder.files, folder.split, folder.splits
    elif not path.is_file():
        raise UserError(f"input file not found: {path}")
    else:
        fmt = detect_format(path)
        files = (path,) if fmt == "arrow" else ()
    if files:
        columns, rows = arrow_inputs.schema_and_rows(files)
    elif fmt == "parquet":
        with _parquet_file(path) as parquet:
            rows, columns = parquet.metadata.num_rows, list(parquet.schema_arrow.names)
    elif fmt == "jsonl":
        rows, names = 0, {}  # one pass for the count and the union of the keys
        for record in _iter_json_lines(path):
            rows += 1
            names.update(dict.fromkeys(record))
        columns = list(names)
    else:
        array = tuple(_read_json_array(path))
        rows, columns = len(array), list(dict.fromkeys(key for record in array for key in record))
    if not rows:
        raise UserError(f"{path} holds no rows")
    source = InputSource(path, fmt, "dapo", rows, tuple(columns), None, files, split, splits, _array=array)
    if is_dapo_table(columns):
        return source
    sample = list(itertools.islice(source.records(), SAMPLE_ROWS))
    layout = detect_layout(columns, sample, fields or FieldOptions(), str(path))
    return replace(source, kind="raw", layout=layout)


def read_input(path: str | Path, fields: FieldOptions | None = None) -> InputFile:
    """Read one input whole: raw problems with their answers, or already-prepared DAPO rows."""
    source = open_input(path, fields)
    if source.kind == "dapo":
        return InputFile(source.path, source.format, "dapo", source.rows_read, dapo_rows=tuple(source.records()))
    problems = tuple(source.raw_problems())
    sources = Counter(p.answer_source for p in problems)
    return InputFile(
        source.path,
        source.format,
        "raw",
        source.rows_read,
        problem_field=source.problem_field,
        answer_sources=dict(sorted(sources.items())),
        problems=problems,
        layout=source.layout,
    )
