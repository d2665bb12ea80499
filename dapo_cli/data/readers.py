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
Every problem here raises :class:`~dapo_cli.errors.UserError` with one line.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
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


def _read_parquet(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise UserError(f"cannot read {path} as parquet: {' '.join(str(exc).split())}") from None
    return table.to_pylist(), list(table.column_names)


def _read_json_lines(path: Path) -> list[dict[str, Any]]:
    records = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}: line {number} is not valid JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise UserError(f"{path}: line {number} is not a JSON object")
            records.append(record)
    return records


def _read_json_array(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return _read_json_lines(path)  # a .json file holding JSON lines
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise UserError(f"{path}: expected a JSON array of objects")
    return data


def read_records(path: Path) -> tuple[str, list[dict[str, Any]], list[str]]:
    """(format, records, column names) of a parquet/JSONL/JSON file; UserError if missing or unreadable."""
    if not path.is_file():
        raise UserError(f"input file not found: {path}")
    fmt = detect_format(path)
    if fmt == "parquet":
        records, columns = _read_parquet(path)
    else:
        try:
            records = _read_json_lines(path) if fmt == "jsonl" else _read_json_array(path)
        except UnicodeDecodeError:
            raise UserError(f"{path} is not UTF-8 text; expected a .parquet or .jsonl file") from None
        columns = list(dict.fromkeys(key for record in records for key in record))
    return fmt, records, columns


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
    """Read one input file: raw problems with their answers, or already-prepared DAPO rows."""
    path = Path(path)
    fmt, records, columns = read_records(path)
    if not records:
        raise UserError(f"{path} holds no rows")
    if is_dapo_table(columns):
        return InputFile(path, fmt, "dapo", len(records), dapo_rows=tuple(records))
    field_name = problem_field(columns)
    if field_name is None:
        found = ", ".join(columns[:12]) or "none"
        raise UserError(f"{path} has no problem field: expected one of {', '.join(PROBLEM_FIELDS)} (found: {found})")
    problems = []
    for row, record in enumerate(records):
        problem = next((record[name] for name in PROBLEM_FIELDS if isinstance(record.get(name), str) and record[name].strip()), "")
        answer, source = extract_answer(record)
        problems.append(RawProblem(row, problem.strip(), answer, source))
    sources = Counter(p.answer_source for p in problems)
    return InputFile(
        path, fmt, "raw", len(records), problem_field=field_name, answer_sources=dict(sorted(sources.items())), problems=tuple(problems)
    )
