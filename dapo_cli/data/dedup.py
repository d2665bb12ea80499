"""Exact-duplicate detection for ``dapo prepare-data``: one problem per (problem text, ground truth).

Two rows are **the same problem** when

* their problem texts are equal after :func:`normalize_problem` (case folded, runs of
  whitespace collapsed: the normalisation prepare-data has always deduplicated by), and
* their ground truths are the same integer (``"7"``, ``"07"`` and ``" 7 "`` are one answer).

The problem text of a raw record is its problem field; of a prepared (DAPO-schema) row
it is ``extra_info.raw_problem``, else the problem inside the DAPO instruction template
(DAPO-Math-17K's rows carry only the templated prompt), else the whole prompt text.

One pass, O(rows) time; memory O(distinct problems): a problem text is kept as a
16-byte BLAKE2b digest of its normalised form, never as the string (a collision needs
~2^64 distinct problems).

**Conflicts.** The same problem text with different ground truths is a *conflicting
duplicate*. prepare-data drops every row of such a text (reason
``conflicting_duplicate``), keeping none. Keeping the first would be a coin flip: the
ground truth is the reward, two answers mean at least one label is wrong, and nothing
in the file says which. Training on the wrong one rewards a wrong answer and
penalises the right one on every sample of that prompt, while dropping costs only
the few problems concerned; the manifest lists how many. Counts do not depend on row
order: the first row of each distinct (text, answer) of a conflicting text counts as
``conflicting_duplicate``, further copies of an answer count as ``duplicate``.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from dapo_cli.data.schema import DAPO_INSTRUCTION

T = TypeVar("T")

DIGEST_BYTES = 16
"""BLAKE2b digest size of a normalised problem text."""

_PREFIX, _SUFFIX = DAPO_INSTRUCTION.split("{problem}")


def normalize_problem(text: str) -> str:
    """The text two problems are compared by: case folded, whitespace runs collapsed to one space."""
    return " ".join(text.casefold().split())


def text_digest(text: str) -> bytes:
    """16-byte BLAKE2b digest of :func:`normalize_problem` of ``text``."""
    return hashlib.blake2b(normalize_problem(text).encode("utf-8"), digest_size=DIGEST_BYTES).digest()


def canonical_truth(truth: str) -> int:
    """An integer ground truth as a number (prepare-data keeps integer answers only)."""
    return int(str(truth).strip())


def untemplate(content: str) -> str | None:
    """The problem inside one message in the DAPO instruction template, else None."""
    if content.startswith(_PREFIX) and content.endswith(_SUFFIX) and len(content) > len(_PREFIX) + len(_SUFFIX):
        return content[len(_PREFIX) : len(content) - len(_SUFFIX)]
    return None


def template_problem(row: dict[str, Any]) -> str | None:
    """The problem inside a one-message prompt in the DAPO instruction template, else None."""
    prompt = row.get("prompt") or []
    if len(prompt) != 1 or not isinstance(prompt[0], dict):
        return None
    return untemplate(str(prompt[0].get("content") or ""))


def prompt_text(row: dict[str, Any]) -> str:
    """Every message's content of a prepared row, joined by spaces."""
    return " ".join(str(m.get("content") or "") for m in row.get("prompt") or [] if isinstance(m, dict))


def problem_text(row: dict[str, Any]) -> str:
    """The problem text of a prepared row: ``raw_problem``, else the templated problem, else the prompt."""
    return (row.get("extra_info") or {}).get("raw_problem") or template_problem(row) or prompt_text(row)


@dataclass(frozen=True)
class Seen(Generic[T]):
    """What :meth:`ProblemIndex.find` knows about one (problem text, ground truth)."""

    digest: bytes
    truth: int
    known: bool
    """This exact (text, ground truth) came earlier."""
    conflict: bool
    """The text came earlier with another ground truth."""
    owner: T | None = None
    """The problem holding the earlier row (``known`` only; None for an answer already dropped as conflicting)."""


class ProblemIndex(Generic[T]):
    """Every (problem text digest, ground truth) seen so far, each with the problem that holds it."""

    def __init__(self) -> None:
        self._answers: dict[bytes, dict[int, T | None]] = {}

    def find(self, text: str, truth: str) -> Seen[T]:
        digest, value = text_digest(text), canonical_truth(truth)
        answers = self._answers.get(digest)
        if answers is None:
            return Seen(digest, value, known=False, conflict=False)
        if value in answers:
            return Seen(digest, value, known=True, conflict=len(answers) > 1, owner=answers[value])
        return Seen(digest, value, known=False, conflict=True)

    def add(self, seen: Seen[T], owner: T | None) -> None:
        """Record ``seen`` (not ``known``) as held by ``owner`` (None: dropped)."""
        self._answers.setdefault(seen.digest, {})[seen.truth] = owner

    def conflicting(self) -> set[bytes]:
        """Digests of the texts seen with more than one ground truth."""
        return {digest for digest, answers in self._answers.items() if len(answers) > 1}

    def __len__(self) -> int:
        return len(self._answers)


def describe_layout(copies: Counter[Hashable]) -> str:
    """Rows per distinct problem of one input: ``1 per problem``, ``32 per problem`` or ``1–3 per problem``."""
    if not copies:
        return "-"
    low, high = min(copies.values()), max(copies.values())
    return f"{low} per problem" if low == high else f"{low}–{high} per problem"


def uniform_copies(copies: Counter[Hashable]) -> int:
    """K when every problem of an input has the same K rows (the avg@K layout), else 1."""
    values = set(copies.values())
    return values.pop() if len(values) == 1 else 1
