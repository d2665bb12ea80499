"""``dapo eval --compare A B``: two generations files (:mod:`dapo_cli.eval.generations`) paired.

A comparison pairs the two runs problem by problem: with per-problem accuracies
:math:`a_p` and :math:`b_p` on the problems both contain, it bootstraps problems to
get a 95% interval for :math:`\\bar d = \\frac1P \\sum_p (a_p - b_p)` and the share of
resamples where :math:`\\bar d > 0`. On 30 AIME problems, 50% vs 44% is often
inside the noise; this is the number that says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dapo_cli.errors import UserError
from dapo_cli.eval.generations import read_generations
from dapo_cli.eval.metrics import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, PairedComparison, paired_bootstrap


def per_problem_accuracy(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Mean ``acc`` of each ``problem_id`` (``problem_id`` → share of correct samples)."""
    totals: dict[str, list[int]] = {}
    for row in rows:
        entry = totals.setdefault(str(row["problem_id"]), [0, 0])
        entry[0] += int(bool(row["acc"]))
        entry[1] += 1
    return {pid: correct / n for pid, (correct, n) in totals.items()}


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
    return compare_accuracies(
        per_problem_accuracy(read_generations(spec_a)), per_problem_accuracy(read_generations(spec_b))
    )


def _natural(problem_id: str) -> tuple[int, int | str]:
    """Numeric ids in numeric order, then the others alphabetically."""
    return (0, int(problem_id)) if problem_id.lstrip("-").isdigit() else (1, problem_id)
