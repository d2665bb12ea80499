"""Group DAPO rows into distinct problems, and read the problems ``dapo eval`` evaluates from a dataset.

An evaluation file may list each problem once, or K times (the avg@K layout of
``aime-2024.parquet``: 30 problems × 32 shuffled rows). Either way we evaluate
*problems*: ``dapo eval --avg K`` draws K samples per distinct problem, never K
per row.

Every row goes through :func:`dapo_cli.data.rows.check_row` (the row door training uses too)
as it is read, so a malformed row is one ``error:`` line naming the file, the row and the field.

Identity of a row's problem: ``extra_info.index`` when present (an integer, or a string id),
otherwise the prompt text. Rows of one problem must agree on prompt and ground truth.
Order: by index when every row has an integer index, else by first appearance.

``--limit N`` evaluates the first N problems of that order, read in memory bounded by N
(:class:`ProblemSelection`), never the whole file's rows at once:

* a parquet file whose ``extra_info.index`` is an integer column without nulls (what ``dapo
  prepare-data`` writes, and the AIME file): that column alone is read, the N smallest indexes and
  their copies counted, and then only their rows are read, batch by batch, stopping after the last
  one (:func:`read_problems`); a million-row file is a fraction of a second;
* any other file (JSONL, JSON, Arrow, a parquet file without such a column) is streamed one row at
  a time keeping at most N problems. Once a row without an integer index is seen the order is
  first appearance, and reading stops at the N-th distinct problem; while every row has one,
  a later row may hold a smaller index, so every row is read (and checked), none held.

With ``--limit`` only the rows read are checked, and the rows of the N problems (all of them, on the
first path) are compared with each other; without it every row is.
"""

from __future__ import annotations

import hashlib
import heapq
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dapo_cli.data.rows import check_row
from dapo_cli.errors import UserError

if TYPE_CHECKING:
    import pyarrow as pa

    from dapo_cli.data.readers import InputSource


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


def _problem_key(index: int | str | None, messages: list[dict[str, str]]) -> str:
    if index is not None:
        return str(index)
    text = json.dumps(messages, sort_keys=True, ensure_ascii=False)
    return "p-" + hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]


@dataclass
class _Entry:
    """A problem being collected: its first row's fields, its integer index (None: not one) and its copies."""

    problem: Problem
    index: int | None
    copies: int = 1

    def agree(self, messages: list[dict[str, str]], truth: str, where: str) -> None:
        """Raise when another row of this problem carries another prompt or ground truth."""
        if self.problem.ground_truth != truth or self.problem.messages != messages:
            what = "ground truth" if self.problem.ground_truth != truth else "prompt"
            raise UserError(f"{where}rows of problem id {self.problem.problem_id} disagree on the {what}; fix the dataset")

    def done(self) -> Problem:
        p = self.problem
        return Problem(p.problem_id, p.messages, p.ground_truth, p.raw_problem, self.copies)


class ProblemSelection:
    """The first ``limit`` problems (None: all) of rows given one at a time, in the order of the module
    docstring, holding at most ``limit`` problems (each with its first row's prompt) however many rows come.

    Two candidate sets are kept while rows arrive: the first ``limit`` distinct problems, and while every
    row so far has an integer index, the ``limit`` smallest indexes (a heap: a problem pushed out by
    smaller ones can never come back, since the largest kept only shrinks). Which one is the answer is
    known at the end, or as soon as a row without an integer index makes it first appearance.
    """

    def __init__(self, limit: int | None = None, source: str = "") -> None:
        self.limit = limit
        self.source = source
        self.rows = 0
        self.all_indexed = True
        self._first: dict[str, _Entry] = {}
        self._smallest: dict[str, _Entry] = {}
        self._heap: list[tuple[int, str]] = []  # (-index, key): the largest kept index on top

    def add(self, row: object, position: int) -> bool:
        """Check and count row ``position``; False once no later row can change which problems are selected."""
        checked = check_row(row, position, self.source)
        self.rows += 1
        messages, truth = checked["prompt"], checked["reward_model"]["ground_truth"]
        index = checked["extra_info"]["index"]
        key = _problem_key(index, messages)
        numeric = index if isinstance(index, int) else None
        if numeric is None and self.all_indexed:
            self.all_indexed = False
            self._smallest, self._heap = {}, []
        entry = self._first.get(key) or self._smallest.get(key)
        if entry is not None:
            entry.agree(messages, truth, f"{self.source}: row {position}: " if self.source else f"row {position}: ")
            entry.copies += 1
        else:
            raw = checked["extra_info"].get("raw_problem") or messages[-1]["content"]
            entry = _Entry(Problem(key, messages, truth, raw), numeric)
            if self.limit is None or len(self._first) < self.limit:
                self._first[key] = entry
            if self.limit is not None and numeric is not None and self.all_indexed:
                self._keep_if_smallest(key, numeric, entry)
        return self.limit is None or self.all_indexed or len(self._first) < self.limit

    def _keep_if_smallest(self, key: str, index: int, entry: _Entry) -> None:
        assert self.limit is not None
        if len(self._heap) == self.limit:
            if index > -self._heap[0][0]:
                return
            _, largest = heapq.heappop(self._heap)
            del self._smallest[largest]
        heapq.heappush(self._heap, (-index, key))
        self._smallest[key] = entry

    def problems(self) -> list[Problem]:
        """The selected problems, in order."""
        if self.all_indexed:
            chosen = self._first if self.limit is None else self._smallest
            return [e.done() for e in sorted(chosen.values(), key=lambda e: e.index)]  # type: ignore[arg-type, return-value]
        return [e.done() for e in self._first.values()]


def _no_rows(source: str) -> UserError:
    what = f"dataset {source}" if source else "the dataset"
    return UserError(
        f"{what} holds no rows; give a file with problems (--dataset, data.val_files) or, for synthetic:NAME, "
        "a size >= 1 (data.synthetic_val_size)"
    )


def group_problems(rows: Sequence[Mapping[str, Any]], source: str = "") -> list[Problem]:
    """Distinct problems of ``rows`` (DAPO-schema dicts, each checked by :func:`~dapo_cli.data.rows.check_row`),
    with how many rows held each, in the order of the module docstring.

    ``source`` names the dataset in the errors. Raises :class:`UserError` for no rows, a row that is
    not valid, or two rows with the same identity that disagree on prompt or ground truth.
    """
    if not rows:
        raise _no_rows(source)
    selection = ProblemSelection(None, source)
    for position, row in enumerate(rows):
        selection.add(row, position)
    return selection.problems()


def layout_line(rows: int, problems: int, copies: set[int]) -> str:
    """``960 rows → 30 problems (32 copies each)`` from the counts (``copies``: every problem's number of rows)."""
    if copies == {1}:
        layout = "one row each"
    else:
        layout = f"{next(iter(copies))} copies each" if len(copies) == 1 else "uneven copies"
    return f"{rows} rows → {problems} problems ({layout})"


def describe_layout(problems: Sequence[Problem]) -> str:
    """One line for the terminal, e.g. ``960 rows → 30 problems (32 copies each)``."""
    return layout_line(sum(p.copies for p in problems), len(problems), {p.copies for p in problems})


@dataclass(frozen=True)
class ProblemFile:
    """What ``dapo eval`` evaluates: the problems, the file they came from, and a line describing it."""

    problems: list[Problem]
    source: Path
    layout: str


def read_problems(spec: str, limit: int | None = None) -> ProblemFile:
    """The first ``limit`` problems (None: all) of a dataset spec (path or registered name); see the
    module docstring for what is read. A raw file is converted whole by the ``prepare-data`` library."""
    from dapo_cli.data.registry import DatasetRows, convert_raw, open_dataset

    opened = open_dataset(spec)
    path, source = opened.path, opened.source
    where = str(path)
    if source.kind == "raw":
        rows: Iterable[Any] = convert_raw(path)
        name = DatasetRows(list(rows), path, raw_rows=source.rows_read).describe()
    else:
        rows, name = source.records(), path.name
    index = source.integer_index() if limit is not None and source.kind == "dapo" else None
    if index is not None and limit is not None:
        return _by_index_column(source, index, limit, where, name)
    selection = ProblemSelection(limit, where)
    for position, row in enumerate(rows):
        if not selection.add(row, position):
            break
    if not selection.rows:
        raise _no_rows(where)
    problems = selection.problems()
    if limit is None:
        return ProblemFile(problems, path, f"{name}: {describe_layout(problems)}")
    return ProblemFile(problems, path, f"{name}: --limit {limit}: the first {len(problems)} problems, from {selection.rows} rows read")


def _by_index_column(source: InputSource, index: pa.ChunkedArray, limit: int, where: str, name: str) -> ProblemFile:
    """``--limit`` on a parquet file with an integer index column: the ``limit`` smallest indexes and their
    copies from the column alone, then only their rows (:meth:`~dapo_cli.data.readers.InputSource.records_with_index`)."""
    import pyarrow.compute as pc

    counts = pc.value_counts(index)
    values, copies = counts.field("values"), counts.field("counts")
    order = pc.sort_indices(values)[:limit]
    wanted, wanted_copies = values.take(order), copies.take(order)
    selection = ProblemSelection(limit, where)
    for position, row in source.records_with_index(wanted, pc.sum(wanted_copies).as_py()):
        selection.add(row, position)
    problems = selection.problems()
    layout = layout_line(len(index), len(values), set(pc.unique(copies).to_pylist()))
    return ProblemFile(problems, source.path, f"{name}: {layout}; --limit {limit}: the first {len(problems)}")
