"""The report's pure statistics over seeds and problems (plain floats in, floats out)."""

from __future__ import annotations

import math
from collections.abc import Sequence

Z_95 = 1.959964
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
"""0.975 quantile of Student's t with 1..30 degrees of freedom (beyond 30: the normal 1.96)."""


def t_critical_95(df: int) -> float:
    """:math:`t_{0.975,\\,df}` for a two-sided 95% interval (``df >= 1``)."""
    if df < 1:
        raise ValueError(f"t_critical_95 needs df >= 1, got {df}")
    return T_975[df - 1] if df <= len(T_975) else Z_95


def seed_interval(values: Sequence[float]) -> tuple[float, float]:
    """``(mean, half-width)`` of the t 95% interval over seeds ``[n]``; half-width NaN when ``n < 2``."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, t_critical_95(n - 1) * sd / math.sqrt(n)


def mean_per_problem(tables: Sequence[dict[str, float]]) -> dict[str, float]:
    """Per-problem accuracy averaged over seeds, on the problems every seed evaluated."""
    common = set.intersection(*(set(t) for t in tables)) if tables else set()
    return {p: sum(t[p] for t in tables) / len(tables) for p in common}


def mean_or_nan(values: Sequence[float]) -> float:
    """Mean of the finite values; NaN when there are none."""
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan
