"""Budget axes and Δ at equal budget read from the curves (issue 48).

A child's validations sit at steps; its budget at a step is the sum over the steps up to it of a per-step metric
(generated samples, generated tokens, trained tokens, counted FLOPs) or the step itself. Δ at equal budget reads
both children of a seed at the smaller of their final budgets, interpolating each child's validation curve linearly
between the two validations around that budget: never an earlier validation standing in for it (the old Δ at equal
samples took each child's latest validation within the budget, step 0 where the first validation after it was
over budget).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from dapo_cli.ablate.results import SAMPLES_METRIC, VAL_CURVE, ChildResult
from dapo_cli.ablate.stats import seed_interval

AXES = {
    "samples": SAMPLES_METRIC,
    "generated tokens": "compute/generated_tokens",
    "trained tokens": "compute/trained_tokens",
    "FLOPs": "compute/flops",
    "steps": "",
}
"""Budget axis → the per-step metric summed into it (``steps``: the step itself)."""


def budget_curve(child: ChildResult, axis: str = "samples") -> tuple[list[int], list[float], list[float]]:
    """``(steps, C, R)``: the child's validation steps, the budget spent by each, the accuracy there.
    Empty lists when the child did not log the axis's metric."""
    val = child.curves.get(VAL_CURVE, {})
    key = AXES[axis]
    per_step = child.curves.get(key, {}) if key else {}
    if key and not per_step:
        return [], [], []
    steps = sorted(val)
    c = [float(s) if not key else float(sum(v for t, v in per_step.items() if t <= s)) for s in steps]
    return steps, c, [val[s] for s in steps]


@dataclass
class Reading:
    """A curve read at a budget: the value and the two validation steps it was interpolated between."""

    value: float
    steps: tuple[int, int]
    """``(lower, upper)`` validation steps; equal when the budget falls on a validation."""


def read_at(steps: Sequence[int], c: Sequence[float], r: Sequence[float], budget: float) -> Reading | None:
    """``R`` at ``budget``, linear between the validations ``i``, ``i + 1`` with ``c[i] <= budget <= c[i + 1]``:
    ``r[i] + (r[i+1] − r[i]) (budget − c[i]) / (c[i+1] − c[i])``. None outside ``[c[0], c[-1]]``."""
    for i in range(len(c)):
        if c[i] == budget:
            return Reading(r[i], (steps[i], steps[i]))
        if i + 1 < len(c) and c[i] < budget < c[i + 1]:
            w = (budget - c[i]) / (c[i + 1] - c[i])
            return Reading(r[i] + w * (r[i + 1] - r[i]), (steps[i], steps[i + 1]))
    return None


@dataclass
class BudgetPair:
    """One seed's Δ at equal budget (accuracy units) and where each value came from."""

    seed: int
    budget: float
    variant: Reading
    ref: Reading

    @property
    def delta(self) -> float:
        return self.variant.value - self.ref.value


@dataclass
class EqualBudget:
    """A variant against a reference at equal budget on one axis: per seed, and mean ± t 95% over the seeds."""

    variant: str
    vs: str
    axis: str
    pairs: list[BudgetPair]
    mean: float
    half: float


def equal_budget(variant: str, children: Sequence[ChildResult], vs: str, ref: Sequence[ChildResult],
                 axis: str = "samples") -> EqualBudget | None:
    """Δ at equal budget over the seeds both finished: each pair read at the smaller of the two final budgets."""
    refs = {ch.seed: ch for ch in ref}
    pairs = []
    for ch in sorted(children, key=lambda ch: ch.seed):
        if ch.seed not in refs:
            continue
        a, b = budget_curve(ch, axis), budget_curve(refs[ch.seed], axis)
        if not a[1] or not b[1]:
            continue
        budget = min(a[1][-1], b[1][-1])
        ra, rb = read_at(*a, budget), read_at(*b, budget)
        if ra is not None and rb is not None:
            pairs.append(BudgetPair(ch.seed, budget, ra, rb))
    if not pairs:
        return None
    mean, half = seed_interval([p.delta for p in pairs])
    return EqualBudget(variant, vs, axis, pairs, mean, half)


def steps_text(r: Reading) -> str:
    """``6`` on a validation, ``4–8`` between two."""
    return str(r.steps[0]) if r.steps[0] == r.steps[1] else f"{r.steps[0]}–{r.steps[1]}"


def budget_rows(report_pairs: Sequence[EqualBudget]) -> list[dict[str, str]]:
    """Text cells: Δ at equal budget per comparison, with each seed's budget and the validation steps read."""
    rows = []
    for e in report_pairs:
        rows.append({
            "variant": e.variant, "vs": e.vs, "axis": e.axis,
            "Δ %": f"{100 * e.mean:+.1f}", "95% CI (t)": f"±{100 * e.half:.1f}" if math.isfinite(e.half) else "—",
            "budget per seed": ", ".join(f"{p.budget:.4g}" for p in e.pairs),
            "steps read (variant; vs)": ", ".join(f"{steps_text(p.variant)}; {steps_text(p.ref)}" for p in e.pairs),
        })
    return rows
