"""Where a raw record keeps its problem and its answer: the published layouts of the common math sets.

Each input file's layout is detected from its field names (:func:`detect_layout`) and
reported in one line (:meth:`Layout.describe`: printed per file by ``dapo prepare-data``,
kept in the manifest and the MLflow params). ``--problem-field``, ``--answer-field``,
``--solution-field`` and ``--context-field`` (:class:`FieldOptions`) name fields instead:
an option always wins over detection, and a named field the file does not have is a
one-line :class:`~dapo_cli.errors.UserError` listing the fields it has.

Detected fields, each role in order of precedence (the first present field is tried
first; per record, the next one is tried when a record has nothing in it):

============  ==============================================  =======================================
role          fields                                          layouts published this way
============  ==============================================  =======================================
problem       ``problem``, ``question``, ``prompt``,          MATH, NuminaMath, DeepScaleR, Omni-MATH
              ``input``, ``query``                            (problem); GSM8K, Gaokao (question);
                                                              DAPO/verl chat prompts (prompt);
                                                              MetaMathQA (query)
answer        ``answer``, ``final_answer``, ``ground_truth``,  DeepScaleR, Omni-MATH, AMC (a float),
              ``expected_answer``                             OlympiadBench (final_answer: a list);
                                                              GSM8K (a solution ending ``#### N``)
solution      ``solution``, ``response``, ``output``,         MATH, Minerva, NuminaMath (solution);
              ``completion``                                  MetaMathQA (response)
context       never guessed: ``--context-field NAME``         OlympiadBench (context)
============  ==============================================  =======================================

The answer comes from the answer fields first, then from the solution fields: a short
answer is what the set's authors checked against, a worked solution is read only for
its final answer. ``--answer-field`` / ``--solution-field`` replace that detection:
only the fields named are read (the answer field first).

Values (:func:`answer_from_value`): a string is the answer, unless it is a worked
solution (:func:`final_answer`); an int is that integer; a float is its ``repr``
(``27.0``: the conversion keeps an integral float as that integer, 27, and the manifest
the answer as written; ``1e+300`` is dropped as scientific notation); a list of one element
is that element, a list of several is dropped as ``multiple_answers``. A worked solution
gives, in this order: ``N`` of a last line ``#### N`` (GSM8K), the rest of a last line
``The answer is N`` (MetaMathQA; its ``\\boxed{}`` if it has one: then it counts as a box), the last
``\\boxed{…}``/``\\fbox{…}`` (MATH). A problem is a string, or chat messages
(``[{role, content}]``): the last user turn, with a DAPO instruction around it removed.
Context fields (strings or lists of strings) are prepended, a blank line apart.

Every step is linear in the record's text.
"""

from __future__ import annotations

import decimal
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dapo_cli.data.dedup import untemplate
from dapo_cli.errors import UserError
from dapo_cli.rewards.math_equiv import last_boxed

PROBLEM_FIELDS: tuple[str, ...] = ("problem", "question", "prompt", "input", "query")
ANSWER_FIELDS: tuple[str, ...] = ("answer", "final_answer", "ground_truth", "expected_answer")
SOLUTION_FIELDS: tuple[str, ...] = ("solution", "response", "output", "completion")
CONTEXT_HINTS: tuple[str, ...] = ("context", "preamble")
"""Fields that look like context: never prepended unless named, but mentioned in the report."""

_THE_ANSWER_IS = re.compile(r"The answer is\s*:?", re.IGNORECASE)
_HASHES = re.compile(r"####\s*(.*)", re.DOTALL)


@dataclass(frozen=True)
class FieldOptions:
    """Fields named on the command line (None / empty: detect)."""

    problem: str | None = None
    answer: str | None = None
    solution: str | None = None
    context: tuple[str, ...] = ()

    def named(self) -> list[tuple[str, str]]:
        """(option, field) of every field named, e.g. ``("--answer-field", "final_answer")``."""
        pairs = [("--problem-field", self.problem), ("--answer-field", self.answer), ("--solution-field", self.solution)]
        return [(option, name) for option, name in pairs if name] + [("--context-field", name) for name in self.context]


@dataclass(frozen=True)
class AnswerFound:
    """The answer text of one record (None: none), where it came from, and a drop reason when it is refused."""

    text: str | None
    source: str
    """``<field>``, ``<field>:list``, ``<field>:####``, ``<field>:the_answer_is``, ``<field>:boxed`` or ``none``."""
    drop: str | None = None


NO_ANSWER = AnswerFound(None, "none")


def quote(name: str) -> str:
    """A field name for a one-line message: JSON-quoted (control characters escaped), at most 60 characters."""
    return json.dumps(name if len(name) <= 60 else name[:57] + "...", ensure_ascii=False)


def _listing(columns: Sequence[str], most: int = 20) -> str:
    shown = ", ".join(quote(c) for c in columns[:most]) or "none"
    return shown if len(columns) <= most else f"{shown} (and {len(columns) - most} more)"


# ---------------------------------------------------------------------------
# Values


def final_answer(text: str) -> tuple[str, str] | None:
    """(how, answer) of a worked solution's final answer (rules in the module docstring), else None."""
    last = text.rstrip().rsplit("\n", 1)[-1].strip()
    hashes = _HASHES.fullmatch(last)
    if hashes is not None:
        return "####", hashes.group(1).strip()
    said = None
    for said in _THE_ANSWER_IS.finditer(text):
        pass
    if said is not None and "\n" not in text[said.end() :].strip():
        rest = text[said.end() :].strip()
        boxed = last_boxed(rest)
        if boxed is not None:  # "So the answer is $\\boxed{6630}$ Angstroms." (Minerva)
            return "boxed", boxed.strip()
        return "the_answer_is", rest.rstrip(".").strip()
    boxed = last_boxed(text)
    if boxed is not None:
        return "boxed", boxed.strip()
    return None


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def answer_from_value(value: Any, name: str) -> AnswerFound:
    """The answer held by an answer field's value (rules in the module docstring)."""
    if isinstance(value, list | tuple):
        items = [item for item in value if not _blank(item)]
        if len(items) > 1:
            return AnswerFound(None, f"{name}:list", drop="multiple_answers")
        inner = answer_from_value(items[0], name) if items else NO_ANSWER
        return inner if inner.text is None else AnswerFound(inner.text, f"{name}:list")
    if isinstance(value, bool) or value is None:
        return NO_ANSWER
    if isinstance(value, int):
        return AnswerFound(str(value), name)
    if isinstance(value, float | decimal.Decimal):  # as written: 27.0, which the conversion reads as the integer 27
        return AnswerFound(repr(value) if isinstance(value, float) else str(value), name) if math.isfinite(value) else NO_ANSWER
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return NO_ANSWER
        final = final_answer(text)
        if final is not None:
            return AnswerFound(final[1] or None, f"{name}:{final[0]}")
        return AnswerFound(text, name)
    return NO_ANSWER


def _text(value: Any) -> str:
    """A string, or a list of strings joined by newlines; "" for anything else."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
        return "\n".join(item.strip() for item in value if item.strip())
    return ""


def answer_in_solution(value: Any, name: str) -> AnswerFound:
    """The final answer of a worked solution (a string, or a list of strings), else :data:`NO_ANSWER`."""
    text = _text(value)
    final = final_answer(text) if text else None
    if final is None:
        return NO_ANSWER
    return AnswerFound(final[1] or None, f"{name}:{final[0]}")


def user_turn(messages: list[Any]) -> str:
    """The content of the last user message, with a DAPO instruction around it removed ("" if none)."""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user" and isinstance(message.get("content"), str):
            content = message["content"]
            return (untemplate(content) or content).strip()
    return ""


def problem_from_value(value: Any) -> str:
    """A problem field's text: a string, or the user turn of chat messages."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, list):
        return user_turn(value)
    return ""


# ---------------------------------------------------------------------------
# Layouts


@dataclass(frozen=True)
class Layout:
    """The fields one file's problems and answers are read from, each role in order of precedence."""

    problem: tuple[str, ...]
    answer: tuple[str, ...]
    solution: tuple[str, ...]
    context: tuple[str, ...] = ()
    named: frozenset[str] = frozenset()
    """Roles given by an option (``problem``, ``answer``, ``context``) rather than detected."""
    problem_kind: str = "text"
    """``text`` or ``chat messages`` (the first value found in the first problem field)."""
    unused_context: tuple[str, ...] = ()

    def problem_of(self, record: dict[str, Any]) -> str:
        """The problem text of one record ("" if none), context fields prepended."""
        text = next((t for t in (problem_from_value(record.get(n)) for n in self.problem) if t), "")
        if text and self.context:
            text = "\n\n".join([*(c for c in (_text(record.get(n)) for n in self.context) if c), text])
        return text

    def answer_of(self, record: dict[str, Any]) -> AnswerFound:
        """The answer of one record: its answer fields in order, then its solution fields."""
        for name in self.answer:
            found = answer_from_value(record.get(name), name)
            if found.source != "none":
                return found
        for name in self.solution:
            found = answer_in_solution(record.get(name), name)
            if found.source != "none":
                return found
        return NO_ANSWER

    def describe(self) -> str:
        """One line, e.g. ``problem from "question"; answer from "answer", else the worked solution in "solution"``."""

        def fields(names: tuple[str, ...]) -> str:
            return ", else ".join(quote(n) for n in names)

        def how(role: str) -> str:
            return f" (--{role}-field)" if role in self.named else ""

        kind = " (chat messages: the user turn)" if self.problem_kind == "chat messages" else ""
        parts = [f"problem from {fields(self.problem)}{kind}{how('problem')}"]
        if self.context:
            parts.append(f"context {', '.join(quote(n) for n in self.context)} prepended (--context-field)")
        answer = []
        if self.answer:
            answer.append(f"answer from {fields(self.answer)}{how('answer')}")
        if self.solution:
            lead = "else from" if self.answer else "answer from"
            answer.append(f"{lead} the worked solution in {fields(self.solution)}{how('solution')}")
        parts.append(", ".join(answer))
        if self.unused_context:
            names = ", ".join(quote(n) for n in self.unused_context)
            parts.append(f"{names} not prepended (--context-field {self.unused_context[0]} to prepend it)")
        return "; ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        """For the manifest."""
        return {
            "problem": list(self.problem),
            "problem_kind": self.problem_kind,
            "context": list(self.context),
            "answer": list(self.answer),
            "solution": list(self.solution),
            "named_by_option": sorted(self.named),
        }

    def compact(self) -> str:
        """For an MLflow param, e.g. ``problem=question answer=answer solution=-``."""
        roles = [("problem", self.problem), ("context", self.context), ("answer", self.answer), ("solution", self.solution)]
        return " ".join(f"{role}={'|'.join(names) or '-'}" for role, names in roles if names or role != "context")


def _kind(sample: Sequence[dict[str, Any]], name: str) -> str:
    value = next((r.get(name) for r in sample if r.get(name) is not None), None)
    return "chat messages" if isinstance(value, list) else "text"


def detect_layout(columns: Sequence[str], sample: Sequence[dict[str, Any]], options: FieldOptions, where: str) -> Layout:
    """The layout of a raw file with these columns (and these first records); UserError when it has none."""
    present = set(columns)
    for option, name in options.named():
        if name not in present:
            raise UserError(f"{where} has no field {quote(name)} ({option}); its fields: {_listing(columns)}")
    problem = (options.problem,) if options.problem else tuple(n for n in PROBLEM_FIELDS if n in present)
    if not problem:
        raise UserError(
            f"{where} has no problem field: expected one of {', '.join(PROBLEM_FIELDS)} "
            f"or --problem-field NAME (found: {_listing(columns)})"
        )
    named = {role for role, name in (("problem", options.problem), ("answer", options.answer), ("solution", options.solution)) if name}
    if options.answer or options.solution:
        answer = (options.answer,) if options.answer else ()
        solution = (options.solution,) if options.solution else ()
    else:
        answer = tuple(n for n in ANSWER_FIELDS if n in present and n not in problem)
        solution = tuple(n for n in SOLUTION_FIELDS if n in present and n not in problem)
    if not answer and not solution:
        raise UserError(
            f"{where} has no answer field: expected one of {', '.join(ANSWER_FIELDS)}, or a worked solution in one of "
            f"{', '.join(SOLUTION_FIELDS)}, or --answer-field / --solution-field NAME (found: {_listing(columns)})"
        )
    used = {*problem, *answer, *solution, *options.context}
    return Layout(
        problem=problem,
        answer=answer,
        solution=solution,
        context=options.context,
        named=frozenset(named | ({"context"} if options.context else set())),
        problem_kind=_kind(sample, problem[0]),
        unused_context=tuple(n for n in CONTEXT_HINTS if n in present and n not in used),
    )
