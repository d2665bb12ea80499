"""Read raw math problems (parquet or JSONL) and find their problem and answer fields.

Field names vary in the wild; per record, the problem is the first non-empty of
:data:`PROBLEM_FIELDS` and the answer comes from the first rule that applies:

1. ``answer`` holds a whole solution ending ``The answer is: …`` → the text after
   the last ``The answer is`` (MetaMathQA style);
2. ``answer`` contains ``\\boxed{…}`` / ``\\fbox{…}`` → the last box (balanced braces);
3. ``answer`` is a non-empty string or a number (``27.0`` is read as ``"27.0"``);
4. ``solution`` → the last ``\\boxed{…}`` / ``\\fbox{…}`` in it.

A file whose columns are already the DAPO schema (``prompt`` and ``reward_model``,
e.g. DAPO-Math-17K or ``aime-2024.parquet``) is read as prepared rows instead.
The format comes from the extension (``.parquet``, ``.jsonl``/``.ndjson``,
``.json``) or, failing that, from the first bytes (``PAR1`` or ``{``/``[``).
Every problem here raises :class:`~dapo_cli.errors.UserError` with one line: a file
that is not UTF-8 (naming the first bad line), JSON nested deeper than
:data:`MAX_JSON_DEPTH` (naming the line, checked before parsing), a broken parquet file.

:func:`open_input` streams: parquet in record batches, JSONL line by line (one
extra pass first for the column names), so ``dapo prepare-data`` holds only the
rows it keeps (DAPO-Math-17K's 1.79 M rows are read, never all held);
:func:`read_input` is the same, materialised.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dapo_cli.data.schema import is_dapo_table
from dapo_cli.errors import UserError
from dapo_cli.rewards.math_equiv import last_boxed

PROBLEM_FIELDS: tuple[str, ...] = ("problem", "question")
"""Problem-text fields, in order of preference."""

ANSWER_FIELD = "answer"
SOLUTION_FIELD = "solution"

FORMATS: dict[str, str] = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json"}
"""File extension → format; anything else is sniffed."""

_THE_ANSWER_IS = re.compile(r"The answer is\s*:?", re.IGNORECASE)

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
    """``answer``, ``answer:the_answer_is``, ``answer:boxed``, ``solution:boxed`` or ``none``."""


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


def detect_format(path: Path) -> str:
    """``parquet``, ``jsonl`` or ``json`` from the extension, else from the first bytes."""
    by_extension = FORMATS.get(path.suffix.lower())
    if by_extension is not None:
        return by_extension
    with open(path, "rb") as handle:
        head = handle.read(4096)
    if head.startswith(b"PAR1"):
        return "parquet"
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    if text.startswith("{"):
        return "jsonl"
    if text.startswith("["):
        return "json"
    raise UserError(f"cannot tell the format of {path}: expected a .parquet or .jsonl file")


PARQUET_BATCH_ROWS = 4096
"""Rows converted to Python at a time when a parquet file is streamed."""


def _parquet_file(path: Path) -> pq.ParquetFile:
    try:  # buffered column reads, no pre-buffering: memory stays at a batch, not a row group's column chunks
        return pq.ParquetFile(path, buffer_size=1 << 20, pre_buffer=False)
    except (pa.ArrowInvalid, OSError) as exc:
        raise UserError(f"cannot read {path} as parquet: {' '.join(str(exc).split())}") from None


def _iter_parquet(path: Path) -> Iterator[dict[str, Any]]:
    try:
        with _parquet_file(path) as parquet:
            start = 0
            for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS):
                try:
                    rows = batch.to_pylist()
                except RecursionError:  # a nested column deeper than Python's recursion limit
                    raise _too_deep(f"{path}: a row of rows {start}-{start + batch.num_rows - 1}") from None
                yield from rows
                start += batch.num_rows
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
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise UserError(f"{path}: expected a JSON array of objects")
    return data


@dataclass(frozen=True)
class InputSource:
    """An opened input file: format, kind, row count and columns known; rows read on demand.

    Each call of :meth:`records` (or :meth:`raw_problems`) is one fresh pass over the
    file that holds one parquet batch or one JSON line at a time (a JSON array is
    held whole: the format cannot be streamed).
    """

    path: Path
    format: str
    kind: str
    """``raw`` (problems to convert) or ``dapo`` (already-prepared rows)."""
    rows_read: int
    columns: tuple[str, ...]
    problem_field: str | None = None
    _array: tuple[dict[str, Any], ...] | None = field(default=None, repr=False, compare=False)

    def records(self) -> Iterator[dict[str, Any]]:
        """Every record (row dict) of the file, in file order."""
        if self._array is not None:
            return iter(self._array)
        if self.format == "parquet":
            return _iter_parquet(self.path)
        return _iter_json_lines(self.path)

    def raw_problems(self) -> Iterator[RawProblem]:
        """Every record of a raw file as a :class:`RawProblem` (problem text, answer and where it came from)."""
        for row, record in enumerate(self.records()):
            problem = next(
                (record[name] for name in PROBLEM_FIELDS if isinstance(record.get(name), str) and record[name].strip()), ""
            )
            answer, source = extract_answer(record)
            yield RawProblem(row, problem.strip(), answer, source)


def open_input(path: str | Path) -> InputSource:
    """Open one input file: its format, kind (raw or DAPO rows) and row count, without holding its rows."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"input file not found: {path}")
    fmt = detect_format(path)
    array = None
    if fmt == "parquet":
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
    if is_dapo_table(columns):
        return InputSource(path, fmt, "dapo", rows, tuple(columns), _array=array)
    field_name = problem_field(columns)
    if field_name is None:
        found = ", ".join(columns[:12]) or "none"
        raise UserError(f"{path} has no problem field: expected one of {', '.join(PROBLEM_FIELDS)} (found: {found})")
    return InputSource(path, fmt, "raw", rows, tuple(columns), field_name, _array=array)


def answer_text(value: Any) -> str | None:
    """An answer cell as text: strings stripped, numbers as written (``27.0`` → ``"27.0"``), else None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float):
        return None if not math.isfinite(value) else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return value.strip() or None
    return None


def extract_answer(record: dict[str, Any]) -> tuple[str | None, str]:
    """(answer text, source) of one record by the rules in the module docstring."""
    answer = answer_text(record.get(ANSWER_FIELD))
    if answer is not None:
        said = list(_THE_ANSWER_IS.finditer(answer))
        if said:
            final = answer[said[-1].end() :].strip().rstrip(".").strip()
            return (final or None), "answer:the_answer_is"
        boxed = last_boxed(answer)
        if boxed is not None:
            return (boxed.strip() or None), "answer:boxed"
        return answer, "answer"
    solution = record.get(SOLUTION_FIELD)
    if isinstance(solution, str):
        boxed = last_boxed(solution)
        if boxed is not None:
            return (boxed.strip() or None), "solution:boxed"
    return None, "none"


def problem_field(columns: list[str]) -> str | None:
    """The first of :data:`PROBLEM_FIELDS` among ``columns``."""
    return next((name for name in PROBLEM_FIELDS if name in columns), None)


def read_input(path: str | Path) -> InputFile:
    """Read one input file whole: raw problems with their answers, or already-prepared DAPO rows."""
    source = open_input(path)
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
    )
