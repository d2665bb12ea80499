"""The row door: one check of a DAPO-schema row, applied where a dataset is read, before any step meets it.

``dapo train`` (through :func:`dapo_cli.data.registry.load_dataset_rows`) and ``dapo eval`` (through
:mod:`dapo_cli.eval.problems`) both pass every row they read through :func:`check_row`, so a bad
row fails with one line naming the file, the row (counted from 0, as everywhere in dapo), the field
and the fix -- ``x.jsonl: row 17: prompt[0] has no 'role'; each message needs role and content
strings`` -- before a model loads, not as a ``KeyError`` in the middle of a run.

What is valid (the DAPO / verl schema of :mod:`dapo_cli.data.schema`, plus what real files hold):

* ``prompt``: a non-empty list of messages, each an object with a ``role`` among :data:`ROLES` and a
  ``content`` string; at least one content is not blank. A bare string is taken as one user
  message (what ``dapo eval`` always accepted). Other keys of a message are dropped.
* ``reward_model``: an object whose ``ground_truth`` is a non-blank string of at most
  :data:`MAX_GROUND_TRUTH_CHARS` characters (no verifier reads a longer one: every sample would
  score 0), or a number converted exactly: an integer (``27``) or a float holding a whole number up
  to 2**53 (``27.0`` → ``"27"``). A fractional or larger float, a boolean, a list or an object is
  refused: the digits written cannot be recovered from it. ``style`` is a string or null.
* ``extra_info``: an object or null. ``index`` identifies the problem: an integer in int64's range
  (the parquet schema's type; a float holding one up to 2**53, as pandas writes them), a string of
  ASCII digits (``"12"``, read as 12, as ``dapo prepare-data`` reads it), another printable string
  id of at most :data:`MAX_ID_CHARS` characters (DAPO-Math-17K's UUIDs), or null / missing (no id:
  eval identifies the problem by its prompt text, training by its row). ``raw_problem`` is a string
  or null.
* ``data_source`` and ``ability``: a string or null. Every other field passes through unchecked.

Numbers past Python's limits never reach here: a JSON integer of more than 4,300 digits is refused
by the reader (:mod:`dapo_cli.data.readers`), with its line, before Python would fail to parse it.

:func:`check_row` returns the row with the checked fields normalized (messages of exactly role and
content, the ground truth a string, the index an int, a str or None); a valid row written by
:func:`~dapo_cli.data.schema.make_row` comes back equal to itself. It is linear in the row's size
and allocates only the normalized copy, so checking a whole file up front costs far less than one
training step.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from dapo_cli.errors import UserError
from dapo_cli.redact import escape_controls
from dapo_cli.rewards.bounds import MAX_GROUND_TRUTH_CHARS  # no verifier reads a longer ground truth

ROLES = ("system", "user", "assistant")
"""Roles a prompt message may have (what chat templates render; a ``tool`` turn has no place in a problem)."""

MAX_ID_CHARS = 256
"""Longest text ``extra_info.index``: an id (a UUID has 36 characters), not a document."""

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""Range of an integer ``extra_info.index`` (the parquet schema stores it as int64)."""

EXACT_FLOAT = 2**53
"""Largest whole number up to which every integer is a float: a float answer or index past it is refused."""

_TOO_MANY_DIGITS = 10**MAX_GROUND_TRUTH_CHARS
_DIGITS = re.compile(r"-?[0-9]{1,19}")  # ASCII only: "²" or "１２" is an id, not a number
MESSAGES_FIX = "each message needs role and content strings"
PROMPT_FIX = "give a list of {role, content} messages"


def _quote(value: str, limit: int = 40) -> str:
    """``value`` (text from the dataset) quoted for a message: control characters escaped, cut at ``limit`` characters."""
    return f"'{escape_controls(value[:limit])}'" + ("…" if len(value) > limit else "")


def _kind(value: object) -> str:
    """``a list``, ``an integer``, … for a message about a value of the wrong type."""
    name = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "object"}.get(
        type(value), type(value).__name__
    )
    return ("an " if name[0] in "aeiou" else "a ") + name


class _Row:
    """Where a row is, for its messages: ``<source>: row <n>``."""

    def __init__(self, source: str, position: int) -> None:
        self.where = f"{source}: row {position}" if source else f"row {position}"

    def error(self, problem: str, fix: str) -> UserError:
        """``<where> has no prompt; <fix>`` for the row itself, ``<where>: prompt[0] has no 'role'; <fix>`` for a field."""
        separator = " " if problem.startswith(("has ", "is ")) else ": "
        return UserError(f"{self.where}{separator}{problem}; {fix}")


def _messages(prompt: object, row: _Row) -> list[dict[str, str]]:
    if prompt is None:
        raise row.error("has no prompt", PROMPT_FIX)
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list):
        raise row.error(f"prompt is {_kind(prompt)}", PROMPT_FIX)
    messages = []
    for i, message in enumerate(prompt):
        if not isinstance(message, Mapping):
            raise row.error(f"prompt[{i}] is {_kind(message)}, not a message", PROMPT_FIX)
        for key in ("role", "content"):
            if message.get(key) is None:
                raise row.error(f"prompt[{i}] has no '{key}'", MESSAGES_FIX)
            if not isinstance(message[key], str):
                raise row.error(f"prompt[{i}].{key} is {_kind(message[key])}", MESSAGES_FIX)
        if message["role"] not in ROLES:
            raise row.error(f"prompt[{i}].role {_quote(message['role'])} is not a chat role", f"use one of {', '.join(ROLES)}")
        messages.append({"role": message["role"], "content": message["content"]})
    if not any(m["content"].strip() for m in messages):
        raise row.error("has an empty prompt", "give the problem as the content of a user message")
    return messages


def exact_integer_text(value: int | float) -> str | None:
    """The decimal text of an integer of at most :data:`MAX_GROUND_TRUTH_CHARS` digits, or of a float holding a
    whole number of at most :data:`EXACT_FLOAT` (``27.0`` → ``"27"``); None otherwise. A fractional float
    (``0.1`` is not one tenth) or a larger one (``1e20`` holds whichever integer is nearest) does not keep
    the digits that were written, and a longer integer no verifier reads. The size is compared before any
    conversion: ``str()`` of an integer past 4,300 digits raises."""
    if isinstance(value, float):
        if not (math.isfinite(value) and value.is_integer() and abs(value) <= EXACT_FLOAT):
            return None
        value = int(value)
    return str(value) if abs(value) < _TOO_MANY_DIGITS else None


def _ground_truth(reward_model: object, row: _Row) -> str:
    fix = "evaluation and training need the answer of every problem, as a string"
    if reward_model is None:
        raise row.error("has no reward_model.ground_truth", fix)
    if not isinstance(reward_model, Mapping):
        raise row.error(f"reward_model is {_kind(reward_model)}", "give an object {ground_truth, style}")
    truth = reward_model.get("ground_truth")
    if isinstance(truth, (int, float)) and not isinstance(truth, bool):
        text = exact_integer_text(truth)
        if text is None:
            what = f"{truth!r} is not a whole number a float holds exactly" if isinstance(truth, float) else f"has more than {MAX_GROUND_TRUTH_CHARS:,} digits"
            raise row.error(f"reward_model.ground_truth {what}", "write it as a string, digit for digit")
        truth = text
    elif truth is not None and not isinstance(truth, str):
        raise row.error(f"reward_model.ground_truth is {_kind(truth)}", fix)
    if truth is None or not truth.strip():
        raise row.error("has no reward_model.ground_truth", fix)
    if len(truth) > MAX_GROUND_TRUTH_CHARS:
        raise row.error(
            f"reward_model.ground_truth has {len(truth):,} characters", f"no verifier reads more than {MAX_GROUND_TRUTH_CHARS:,}"
        )
    _text_or_null(reward_model, "style", "reward_model.", row)
    return truth


def _index(value: object, row: _Row) -> int | str | None:
    fix = f"give an integer, or a printable string id of at most {MAX_ID_CHARS} characters"
    if value is None:
        return None
    if isinstance(value, float):  # pandas writes an integer column with nulls as floats: 17.0
        if not (math.isfinite(value) and value.is_integer() and abs(value) <= EXACT_FLOAT):
            raise row.error(f"extra_info.index {value!r} is not a whole number a float holds exactly", fix)
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        if not INT64_MIN <= value <= INT64_MAX:
            raise row.error("extra_info.index is outside int64's range", fix)
        return value
    if not isinstance(value, str):
        raise row.error(f"extra_info.index is {_kind(value)}", fix)
    if _DIGITS.fullmatch(value.strip()) and INT64_MIN <= int(value) <= INT64_MAX:
        return int(value)
    if not value.strip() or len(value) > MAX_ID_CHARS or not value.isprintable():
        what = "blank" if not value.strip() else f"{len(value):,} characters" if len(value) > MAX_ID_CHARS else "not printable"
        raise row.error(f"extra_info.index {_quote(value)} is {what}", fix)
    return value


def _text_or_null(container: Mapping[str, Any], key: str, prefix: str, row: _Row) -> None:
    value = container.get(key)
    if value is not None and not isinstance(value, str):
        raise row.error(f"{prefix}{key} is {_kind(value)}", "give a string (or leave it out)")


def check_row(row: object, position: int, source: str = "") -> dict[str, Any]:
    """``row`` (row ``position`` of ``source``) checked against the schema of this module's docstring and
    normalized; a :class:`UserError` naming the source, the row, the field and the fix otherwise."""
    at = _Row(source, position)
    if not isinstance(row, Mapping):
        raise at.error(f"is {_kind(row)}", "each row is an object with prompt and reward_model")
    messages = _messages(row.get("prompt"), at)
    truth = _ground_truth(row.get("reward_model"), at)
    extra = row.get("extra_info")
    if extra is None:
        extra = {}
    if not isinstance(extra, Mapping):
        raise at.error(f"extra_info is {_kind(extra)}", "give an object {index, raw_problem, ...} or leave it out")
    index = _index(extra.get("index"), at)
    _text_or_null(extra, "raw_problem", "extra_info.", at)
    _text_or_null(row, "data_source", "", at)
    _text_or_null(row, "ability", "", at)
    return {
        **row,
        "prompt": messages,
        "reward_model": {**row["reward_model"], "ground_truth": truth},
        "extra_info": {**extra, "index": index},
    }


def checked_rows(rows: Iterable[object], source: str = "", start: int = 0) -> Iterator[dict[str, Any]]:
    """:func:`check_row` of every row of ``rows`` (row numbers from ``start``), one at a time."""
    for position, row in enumerate(rows, start=start):
        yield check_row(row, position, source)
