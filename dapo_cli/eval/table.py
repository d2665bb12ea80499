"""The eval's generations as an MLflow table (``eval/generations.json``), bounded in size.

MLflow's run page previews a ``log_table`` artifact as a table in the Artifacts tab; the
complete samples stay in ``eval/generations.parquet``. The table holds the first
``max_rows`` samples (problem order, then sample index: the first ``max_rows // K`` problems
whole) and cuts the text fields at ``max_chars`` characters, marking each cut with
``… [+N chars]``. The run's tag ``dapo.generations_table`` says how many samples it holds
and where text was cut.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

TABLE_FILE = "eval/generations.json"
TABLE_TEXT_CHARS = 2000
"""Longest response kept in a table cell; problems are cut at a quarter of it."""
TABLE_COLUMNS = ("problem_id", "sample", "problem", "response", "pred", "ground_truth", "acc", "score", "length", "truncated")


def clip(text: str, limit: int) -> str:
    """``text`` whole, or its first ``limit`` characters and ``… [+N chars]``."""
    return text if len(text) <= limit else f"{text[:limit]}… [+{len(text) - limit} chars]"


def generations_rows(
    records: Sequence[Any], problems: Mapping[str, str], *, max_rows: int, max_chars: int = TABLE_TEXT_CHARS
) -> list[dict[str, Any]]:
    """One row per sample (``records``: :class:`~dapo_cli.eval.run.SampleRecord`), at most ``max_rows``;
    ``problems``: problem id → problem text."""
    return [
        {
            "problem_id": r.problem_id,
            "sample": r.sample_index,
            "problem": clip(" ".join(problems.get(r.problem_id, "").split()), max_chars // 4),
            "response": clip(r.response, max_chars),
            "pred": clip(r.pred, max_chars // 4),
            "ground_truth": clip(r.ground_truth, max_chars // 4),
            "acc": bool(r.acc),
            "score": float(r.score),
            "length": int(r.length),
            "truncated": bool(r.truncated),
        }
        for r in records[: max(max_rows, 0)]
    ]


def log_generations_table(tracker: Any, records: Sequence[Any], problems: Mapping[str, str], *, max_rows: int) -> str:
    """Log the table and its ``dapo.generations_table`` tag; the tag's text (``""`` with ``max_rows`` 0)."""
    rows = generations_rows(records, problems, max_rows=max_rows)
    if not rows:
        return ""
    note = (
        f"{TABLE_FILE}: {len(rows)} of {len(records)} samples (--table-rows {max_rows}); responses cut at "
        f"{TABLE_TEXT_CHARS} chars, problem/pred/ground_truth at {TABLE_TEXT_CHARS // 4}; all samples: eval/generations.parquet"
    )
    tracker.log_table(rows, TABLE_FILE)
    tracker.set_tags({"dapo.generations_table": note})
    return note
