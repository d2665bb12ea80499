"""``dapo eval --compare A B``: two generations files (:mod:`dapo_cli.eval.generations`) paired.

A comparison pairs the two runs problem by problem: with per-problem accuracies
:math:`a_p` and :math:`b_p` on the problems both contain, it bootstraps problems to
get a 95% interval for :math:`\\bar d = \\frac1P \\sum_p (a_p - b_p)` and the share of
resamples where :math:`\\bar d > 0`. On 30 AIME problems, 50% vs 44% is often
inside the noise; this is the number that says so.

Sizes are checked before anything large is held (a pair of 10^6-problem files once took 5 GB):
a file's samples from the parquet footer (at most :data:`MAX_COMPARE_SAMPLES`), then, from its
``problem_id`` and ``acc`` columns alone (no other column is read), its distinct problems (at most
:data:`MAX_COMPARE_PROBLEMS`). Past either, one line says how many there are and the limit. Within
them a comparison holds two columns of at most 4 M rows in Arrow (tens of MB), one accuracy per
problem, and the bootstrap in chunks (:func:`~dapo_cli.eval.metrics.bootstrap_means`): well under
1 GB, in seconds.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dapo_cli.errors import UserError
from dapo_cli.eval.generations import generations_path
from dapo_cli.eval.metrics import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, PairedComparison, paired_bootstrap
from dapo_cli.redact import escape_controls

if TYPE_CHECKING:
    import pyarrow as pa

MAX_COMPARE_SAMPLES = 4_000_000
"""Most rows (samples) of one generations file: 125,000 problems at avg@32, 1,000 at the largest --avg
(4,096). Its two columns take tens of MB in Arrow."""

MAX_COMPARE_PROBLEMS = 100_000
"""Most distinct problems of one file. The paired bootstrap draws 2,000 resamples of every common problem:
2 x 10^8 draws at this bound, a few seconds; a million problems would be ten times that, for an
interval no wider than the rounding of the printed numbers."""

_NUMBER = re.compile(r"-?[0-9]{1,4000}")
"""A problem id read as a number: ASCII digits (``²`` and ``--5`` are text), within Python's 4,300-digit conversion limit."""


def _accuracies(table: pa.Table) -> dict[str, float]:
    """Mean ``acc`` of each ``problem_id`` of a table of the two columns, computed in Arrow."""
    grouped = table.group_by("problem_id").aggregate([("acc", "sum"), ("acc", "count")])
    ids, correct, counts = (grouped.column(c).to_pylist() for c in ("problem_id", "acc_sum", "acc_count"))
    return {pid: c / n for pid, c, n in zip(ids, correct, counts)}


def per_problem_accuracy(rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Mean ``acc`` of each ``problem_id`` (``problem_id`` → share of correct samples)."""
    import pyarrow as pa

    rows = list(rows)
    table = pa.table({"problem_id": [str(r["problem_id"]) for r in rows], "acc": [bool(r["acc"]) for r in rows]})
    return _accuracies(table)


def read_accuracies(spec: str) -> dict[str, float]:
    """Per-problem accuracy of one ``--compare`` input (a result dir or a generations parquet), within
    :data:`MAX_COMPARE_SAMPLES` and :data:`MAX_COMPARE_PROBLEMS` (a UserError with both numbers past them)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    path = generations_path(spec)
    where = f"--compare {escape_controls(str(spec))}"
    try:
        with pq.ParquetFile(path) as parquet:
            samples, schema = parquet.metadata.num_rows, parquet.schema_arrow
            missing = {"problem_id", "acc"} - set(schema.names)
            if missing:
                raise UserError(f"{path} is not a generations file (missing {', '.join(sorted(missing))})")
            if samples > MAX_COMPARE_SAMPLES:
                raise UserError(f"{where}: {samples:,} samples; at most {MAX_COMPARE_SAMPLES:,} (compare smaller evaluations)")
            table = parquet.read(columns=["problem_id", "acc"])
    except (pa.ArrowInvalid, OSError) as exc:
        raise UserError(f"cannot read {path} as parquet: {' '.join(str(exc).split())}") from None
    ids, acc = table.column("problem_id"), table.column("acc")
    if pa.types.is_integer(ids.type):
        ids = ids.cast(pa.string())  # exact: integer ids are their decimal text
    if not (pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type)) or not pa.types.is_boolean(acc.type):
        raise UserError(f"{where}: problem_id must be text and acc true/false (got {ids.type} and {acc.type}); give a generations file of dapo eval")
    if ids.null_count or acc.null_count:
        raise UserError(f"{where}: a row has no problem_id or acc; give a generations file of dapo eval")
    problems = pc.count_distinct(ids).as_py()
    if problems > MAX_COMPARE_PROBLEMS:
        raise UserError(f"{where}: {problems:,} problems; at most {MAX_COMPARE_PROBLEMS:,} (compare on a subset: dapo eval --limit)")
    return _accuracies(pa.table({"problem_id": ids, "acc": acc}))


@dataclass(frozen=True)
class ComparisonReport:
    """A paired comparison of A and B on their common problems, and what was left out."""

    comparison: PairedComparison
    common: list[str]
    only_a: list[str]
    only_b: list[str]


def compare_accuracies(
    a: dict[str, float], b: dict[str, float], *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> ComparisonReport:
    """Paired bootstrap of ``a - b`` on the problems both hold; UserError when they share none."""
    common = sorted(set(a) & set(b), key=_natural)
    if not common:
        raise UserError("the two results share no problem; compare evaluations of the same dataset")
    comparison = paired_bootstrap([a[p] for p in common], [b[p] for p in common], resamples=resamples, seed=seed)
    return ComparisonReport(
        comparison=comparison,
        common=common,
        only_a=sorted(set(a) - set(b), key=_natural),
        only_b=sorted(set(b) - set(a), key=_natural),
    )


def compare_results(spec_a: str, spec_b: str) -> ComparisonReport:
    """``dapo eval --compare A B``: A and B are result dirs or generations parquets."""
    return compare_accuracies(read_accuracies(spec_a), read_accuracies(spec_b))


def _natural(problem_id: str) -> tuple[int, int | str]:
    """Numeric ids (ASCII digits, at most 4,000 of them) in numeric order, then the others as text."""
    return (0, int(problem_id)) if _NUMBER.fullmatch(problem_id) else (1, problem_id)
