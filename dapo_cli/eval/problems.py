"""Group DAPO rows into distinct problems.

An evaluation file may list each problem once, or K times (the avg@K layout of
``aime-2024.parquet``: 30 problems × 32 shuffled rows). Either way we evaluate
*problems*: ``dapo eval --avg K`` draws K samples per distinct problem, never K
per row.

Identity of a row's problem: ``extra_info.index`` when present, otherwise the
prompt text. Rows of one problem must agree on prompt and ground truth.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dapo_cli.errors import UserError


@dataclass(frozen=True)
class Problem:
    """One distinct problem of an evaluation set.

    problem_id:   ``str(extra_info.index)``, or ``"p-<sha1 of the prompt>"`` without an index
    messages:     the DAPO prompt, a list of ``{"role", "content"}`` dicts
    ground_truth: ``reward_model.ground_truth``
    raw_problem:  ``extra_info.raw_problem`` (falls back to the last message's content)
    copies:       rows of the input that hold this problem (32 in the AIME file)
    """

    problem_id: str
    messages: list[dict[str, str]]
    ground_truth: str
    raw_problem: str
    copies: int = 1


def _messages(row: Mapping[str, Any], position: int) -> list[dict[str, str]]:
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not prompt:
        raise UserError(f"row {position} has an empty prompt")
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]


def _ground_truth(row: Mapping[str, Any], position: int) -> str:
    reward_model = row.get("reward_model") or {}
    truth = reward_model.get("ground_truth")
    if truth is None or str(truth).strip() == "":
        raise UserError(
            f"row {position} has no reward_model.ground_truth: evaluation needs the answer of every problem"
        )
    return str(truth)


def _problem_key(row: Mapping[str, Any], messages: list[dict[str, str]]) -> tuple[str, int | None]:
    index = (row.get("extra_info") or {}).get("index")
    if index is not None:
        return str(index), int(index)
    text = json.dumps(messages, sort_keys=True, ensure_ascii=False)
    return "p-" + hashlib.sha1(text.encode("utf-8")).hexdigest()[:12], None


def group_problems(rows: Sequence[Mapping[str, Any]], source: str = "") -> list[Problem]:
    """Distinct problems of ``rows`` (DAPO-schema dicts), with how many rows held each.

    Order: by ``extra_info.index`` when every row has one, else by first appearance.
    ``source`` names the dataset in the error for an empty ``rows``.
    Raises :class:`UserError` when a row lacks a prompt or ground truth, or when two
    rows with the same identity disagree on prompt or ground truth.
    """
    if not rows:
        what = f"dataset {source}" if source else "the dataset"
        raise UserError(
            f"{what} holds no rows; give a file with problems (--dataset, data.val_files) or, for synthetic:NAME, "
            "a size >= 1 (data.synthetic_val_size)"
        )
    first: dict[str, Problem] = {}
    counts: dict[str, int] = {}
    numeric: dict[str, int | None] = {}
    for position, row in enumerate(rows):
        messages = _messages(row, position)
        truth = _ground_truth(row, position)
        key, index = _problem_key(row, messages)
        seen = first.get(key)
        if seen is None:
            raw = (row.get("extra_info") or {}).get("raw_problem") or messages[-1]["content"]
            first[key] = Problem(key, messages, truth, str(raw))
            numeric[key] = index
        elif seen.ground_truth != truth or seen.messages != messages:
            what = "ground truth" if seen.ground_truth != truth else "prompt"
            raise UserError(f"rows with problem id {key} disagree on the {what} (row {position}); fix the dataset")
        counts[key] = counts.get(key, 0) + 1
    keys = list(first)
    if all(numeric[k] is not None for k in keys):
        keys.sort(key=lambda k: numeric[k])  # type: ignore[arg-type, return-value]
    return [
        Problem(first[k].problem_id, first[k].messages, first[k].ground_truth, first[k].raw_problem, counts[k])
        for k in keys
    ]


def describe_layout(problems: Sequence[Problem]) -> str:
    """One line for the terminal, e.g. ``960 rows → 30 problems (32 copies each)``."""
    rows = sum(p.copies for p in problems)
    copies = {p.copies for p in problems}
    if copies == {1}:
        layout = "one row each"
    else:
        layout = f"{copies.pop()} copies each" if len(copies) == 1 else "uneven copies"
    return f"{rows} rows → {len(problems)} problems ({layout})"
