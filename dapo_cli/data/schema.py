"""The DAPO / verl dataset schema, shared by every reader and writer.

One row per prompt, exactly as in DAPO-Math-17K and ``eval/aime-2024.parquet``::

    data_source:  str                       e.g. "math_dapo"
    prompt:       list[{role: str, content: str}]
    ability:      str                       e.g. "MATH"
    reward_model: {ground_truth: str, style: str}
    extra_info:   {index: int, raw_problem: str, split: str | None,
                   original_answer: str | None, conversion: str | None}

``extra_info.index`` identifies the problem: a file laid out as K copies per problem
(the avg@32 layout) repeats the same index K times.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dapo_cli.errors import UserError
from dapo_cli.fileio import atomic_path

DAPO_INSTRUCTION = (
    "Solve the following math problem step by step. The last line of your response "
    "should be of the form Answer: $Answer (without quotes) where $Answer is the answer "
    "to the problem.\n\n{problem}\n\nRemember to put your answer on its own line after "
    '"Answer:".'
)
"""The DAPO prompt template; ``{problem}`` is replaced by the problem text."""

DAPO_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("ground_truth", pa.string()), ("style", pa.string())])),
        (
            "extra_info",
            pa.struct(
                [
                    ("index", pa.int64()),
                    ("raw_problem", pa.string()),
                    ("split", pa.string()),
                    ("original_answer", pa.string()),
                    ("conversion", pa.string()),
                ]
            ),
        ),
    ]
)


def make_row(
    problem: str,
    ground_truth: str,
    *,
    index: int,
    template: str = DAPO_INSTRUCTION,
    data_source: str = "math_dapo",
    ability: str = "MATH",
    style: str = "rule-lighteval/MATH_v2",
    split: str | None = None,
    original_answer: str | None = None,
    conversion: str | None = None,
) -> dict[str, Any]:
    """Build one DAPO row; the prompt is ``template`` with ``{problem}`` filled in."""
    return {
        "data_source": data_source,
        "prompt": [{"content": template.replace("{problem}", problem), "role": "user"}],
        "ability": ability,
        "reward_model": {"ground_truth": str(ground_truth), "style": style},
        "extra_info": {
            "index": int(index),
            "raw_problem": problem,
            "split": split,
            "original_answer": original_answer,
            "conversion": conversion,
        },
    }


def write_dapo_table(rows: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """Write rows (from :func:`make_row`) to ``path`` in the DAPO schema (not atomic: see below)."""
    pq.write_table(pa.Table.from_pylist(list(rows), schema=DAPO_SCHEMA), path)


def write_dapo_parquet(rows: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """Write rows (from :func:`make_row`) to ``path`` atomically in the DAPO schema."""
    with atomic_path(path) as tmp:
        write_dapo_table(rows, tmp)


def is_dapo_table(columns: Sequence[str]) -> bool:
    """True when the columns look like an already-prepared DAPO/verl file."""
    return {"prompt", "reward_model"}.issubset(columns)


def read_dapo_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a DAPO-schema parquet file into a list of row dicts, each checked by
    :func:`dapo_cli.data.rows.check_row` (a row without ``extra_info.index`` gets its row number).

    Raises :class:`UserError` (one line, what to fix) when the file is missing,
    unreadable, not in the DAPO schema, empty, or holds a row that is not valid.
    """
    from dapo_cli.data.rows import checked_rows

    p = Path(path)
    if not p.is_file():
        raise UserError(f"dataset file not found: {p} (give a parquet file in the DAPO schema)")
    try:
        table = pq.read_table(p)
    except (pa.ArrowInvalid, OSError) as exc:
        raise UserError(f"cannot read {p} as parquet: {exc}") from None
    if not is_dapo_table(table.column_names):
        raise UserError(
            f"{p} is not in the DAPO schema (needs 'prompt' and 'reward_model' columns); "
            "convert it with `dapo prepare-data`"
        )
    rows = list(checked_rows(table.to_pylist(), str(p)))
    for i, row in enumerate(rows):
        if row["extra_info"]["index"] is None:
            row["extra_info"]["index"] = i
    if not rows:
        raise UserError(f"{p} holds no rows")
    return rows
