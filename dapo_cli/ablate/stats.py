"""The report's pure statistics over seeds and problems (plain floats in, floats out).

Quantiles come from :mod:`scipy.stats` (Student's t, the noncentral t of the power calculation); the
formulas are written out in ``docs/ablation-statistics.md``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scipy import optimize
from scipy import stats as sps

Z_95 = float(sps.norm.ppf(0.975))
"""0.975 quantile of the standard normal (1.959964...)."""

POWER = 0.8
"""Power the report's detectable effects and seeds needed are computed for."""
ALPHA = 0.05
"""Two-sided level of every interval and test in the report."""


def t_critical_95(df: int) -> float:
    """:math:`t_{0.975,\\,df}` for a two-sided 95% interval (``df >= 1``)."""
    if df < 1:
        raise ValueError(f"t_critical_95 needs df >= 1, got {df}")
    return float(sps.t.ppf(0.975, df))


def seed_interval(values: Sequence[float]) -> tuple[float, float]:
    """``(mean, half-width)`` of the t 95% interval over seeds ``[n]``; half-width NaN when ``n < 2``."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    return mean, t_critical_95(n - 1) * sample_sd(values) / math.sqrt(n)


def sample_sd(values: Sequence[float]) -> float:
    """Sample standard deviation :math:`\\sqrt{\\sum (v-\\bar v)^2/(n-1)}`; NaN when ``n < 2``."""
    n = len(values)
    if n < 2:
        return math.nan
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def paired_t_power(delta: float, sd: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t-test with ``n`` pairs when the true mean difference is ``delta``.

    :math:`\\lambda = \\Delta\\sqrt n/\\sigma_d`, :math:`c = t_{1-\\alpha/2,\\,n-1}`,
    power :math:`= P(T'_{n-1,\\lambda} > c) + P(T'_{n-1,\\lambda} < -c)` with :math:`T'` the noncentral t.
    """
    if n < 2 or not sd > 0:
        return math.nan
    df, ncp = n - 1, abs(delta) * math.sqrt(n) / sd
    c = float(sps.t.ppf(1 - alpha / 2, df))
    upper, lower = float(sps.nct.sf(c, df, ncp)), float(sps.nct.cdf(-c, df, ncp))
    # scipy's noncentral t returns NaN far in a tail for large ncp: there the lower tail is ~0 (ncp >= 0)
    lower = lower if math.isfinite(lower) else 0.0
    upper = upper if math.isfinite(upper) else float(ncp > c)
    return upper + lower


def min_detectable_delta(sd: float, n: int, power: float = POWER, alpha: float = ALPHA) -> float:
    """Smallest :math:`|\\Delta|` the paired t-test with ``n`` pairs detects with probability ``power``.

    Solves ``paired_t_power(Δ, sd, n) = power`` for Δ (NaN when ``n < 2`` or ``sd`` is not positive).
    """
    if n < 2 or not sd > 0:
        return math.nan
    hi = sd
    while paired_t_power(hi, sd, n, alpha) < power:
        hi *= 2
    return float(optimize.brentq(lambda d: paired_t_power(d, sd, n, alpha) - power, 0.0, hi, xtol=1e-10 * sd))


def seeds_needed(delta: float, sd: float, power: float = POWER, alpha: float = ALPHA, cap: int = 10_000) -> int | None:
    """Fewest pairs ``n >= 2`` at which the paired t-test detects ``delta`` with probability ``power``.

    None when ``delta`` is zero or ``sd`` unknown, or more than ``cap`` pairs would be needed.
    """
    if not (math.isfinite(delta) and delta != 0 and math.isfinite(sd) and sd > 0):
        return None
    lo, hi = 2, 2
    while paired_t_power(delta, sd, hi, alpha) < power:
        lo, hi = hi, hi * 2
        if hi > cap:
            return None
    while lo < hi:  # power rises with n: bisect for the first n that reaches it
        mid = (lo + hi) // 2
        if paired_t_power(delta, sd, mid, alpha) >= power:
            hi = mid
        else:
            lo = mid + 1
    return hi


def mean_per_problem(tables: Sequence[dict[str, float]]) -> dict[str, float]:
    """Per-problem accuracy averaged over seeds, on the problems every seed evaluated."""
    common = set.intersection(*(set(t) for t in tables)) if tables else set()
    return {p: sum(t[p] for t in tables) / len(tables) for p in common}


def mean_or_nan(values: Sequence[float]) -> float:
    """Mean of the finite values; NaN when there are none."""
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan
