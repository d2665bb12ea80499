"""Saturating fits of a child's validation curve over compute (issue 48; ScaleRL, Khatri et al., arXiv 2510.13786).

.. math::  R(C) = R_0 + \\frac{A - R_0}{1 + (C_{mid} / C)^B}

``R0`` is the step-0 validation (``C = 0``), ``A`` the ceiling the curve approaches, ``B`` its efficiency (how
sharply it bends), ``C_mid`` the budget at which half of the gain ``A − R0`` is reached. The fit is a grid over
``(A, B, C_mid)`` evaluated for many curves at once (vectorised, so the bootstrap's refits are one matrix
product), refined by bounded least squares (:func:`scipy.optimize.least_squares`) for the point estimate.
Plain floats and numpy arrays in, dataclasses out; formulas in ``docs/ablation-statistics.md``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

from dapo_cli.ablate.stats import seed_interval

MIN_POINTS = 5
"""Validations a fit needs, step 0 included (three parameters and at least two points to spare)."""
MARGIN_A = 0.02
"""Rungs whose ceilings A differ by less than this are compared on B as well (ScaleRL's ±0.02)."""
B_GRID = np.geomspace(0.25, 8.0, 40)
MID_SPAN = (0.1, 30.0)
"""C_mid's grid spans these multiples of the largest budget measured (log-spaced, :data:`MID_POINTS` values)."""
MID_POINTS = 60
CHI2_1_95 = float(stats.chi2.ppf(0.95, 1))
"""3.84: a curve that has not bent is ruled out when it fits worse than the best by this many noise variances."""
EDGE = 0.01
"""A within this of 0 or 1 is 'at the edge of its range'."""


def saturating(c: np.ndarray | float, r0: float, a: float, b: float, c_mid: float) -> np.ndarray:
    """:math:`R(C) = R_0 + (A - R_0) / (1 + (C_{mid}/C)^B)`; ``R(0) = R_0``. ``c`` any shape, same shape out."""
    c = np.asarray(c, dtype=float)
    with np.errstate(divide="ignore"):
        frac = 1.0 / (1.0 + np.where(c > 0, (c_mid / np.where(c > 0, c, 1.0)) ** b, np.inf))
    return r0 + (a - r0) * frac


@dataclass
class CurveFit:
    """One curve's fit: the parameters, a verdict, and (when bootstrapped) intervals over validation problems."""

    r0: float
    a: float
    b: float
    c_mid: float
    budget: float
    """The largest budget measured (C of the last validation)."""
    points: int
    """Validations fitted, step 0 included."""
    verdict: str
    """``fitted`` or ``not identified``."""
    why: str = ""
    """Why not identified: too few points, the budget (possibly) below C_mid, or A at the edge of its range; the
    same words for every fit, so the report counts them over seeds."""
    detail: str = ""
    """This fit's numbers behind :attr:`why`."""
    a_interval: tuple[float, float] | None = None
    """95% percentile bootstrap interval of A over the validation problems (None without per-problem tables)."""
    b_interval: tuple[float, float] | None = None

    @property
    def fitted(self) -> bool:
        return self.verdict == "fitted"

    @property
    def reason(self) -> str:
        """:attr:`why` with :attr:`detail` (``""`` for a fitted curve)."""
        return f"{self.why} ({self.detail})" if self.detail else self.why

    def predict(self, c: float) -> float:
        """Accuracy the fitted curve gives at budget ``c`` (e.g. 2x or 10x :attr:`budget`)."""
        return float(saturating(c, self.r0, self.a, self.b, self.c_mid))


def _grid(budget: float) -> tuple[np.ndarray, np.ndarray]:
    """Flattened ``(B, C_mid)`` over the grid ``[G]`` each (A is solved exactly at each grid point)."""
    b, m = np.meshgrid(B_GRID, np.geomspace(MID_SPAN[0] * budget, MID_SPAN[1] * budget, MID_POINTS), indexing="ij")
    return b.ravel(), m.ravel()


def grid_fit(c: np.ndarray, r0: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, ...]:
    """Least-squares fit of many curves at the same budgets: a grid over ``(B, C_mid)``, A exact at each point.

    ``c`` ``[P]`` budgets (all > 0), ``r0`` ``[N]`` step-0 accuracies, ``y`` ``[N, P]`` accuracies. At fixed
    ``(B, C_mid)`` the shape ``s = 1/(1 + (C_mid/C)^B)`` ``[G, P]`` is known and ``R = r0 + g s`` is linear in the
    gain ``g = A − r0``: the least-squares gain is ``g* = (e·s)/(s·s)`` with ``e = y − r0``, clipped to A in [0, 1]
    (the sum of squares is a parabola in g), and ``Σ_p (e − g s)² = Σ e² − 2 g (e·s) + g² (s·s)``.
    Returns ``(A, B, C_mid)`` ``[N]`` each, the sum of squares ``[N, G]`` and the grid's C_mid ``[G]``.
    """
    gb, gm = _grid(float(c.max()))
    s = 1.0 / (1.0 + (gm[:, None] / c[None, :]) ** gb[:, None])  # [G, P]
    ss = (s * s).sum(1)  # [G]
    e = y - r0[:, None]  # [N, P] gain over R0 at each validation
    es = e @ s.T  # [N, G]
    g = np.clip(es / ss[None, :], -r0[:, None], 1.0 - r0[:, None])  # [N, G] best gain, A = r0 + g in [0, 1]
    sse = -2.0 * g * es + g * g * ss[None, :]  # [N, G] (Σ e² left out: the same at every grid point)
    best = sse.argmin(1)  # [N]
    rows = np.arange(len(y))
    return r0 + g[rows, best], gb[best], gm[best], sse + (e * e).sum(1, keepdims=True), gm


def unbent_excess(sse: np.ndarray, mids: np.ndarray, budget: float, noise_var: float) -> float:
    r"""How much worse the best curve that has NOT bent within the budget (``C_mid > budget``) fits, in units of the
    noise: :math:`(\min_{C_{mid} > C} SSE - \min SSE)/\sigma^2`, a likelihood-ratio statistic (≈ χ²₁ when the
    curve may not have bent). ``sse`` ``[G]`` one curve's grid, ``mids`` ``[G]`` the grid's C_mid."""
    later = mids > budget
    return float((sse[later].min() - sse.min()) / noise_var) if later.any() else math.inf


def fit_curve(c: Sequence[float], y: Sequence[float], problems: np.ndarray | None = None,
              samples: int = 0, boot: int = 200, seed: int = 0) -> CurveFit:
    """Fit one validation curve: ``c[0] == 0`` is step 0 (its ``y[0]`` is R0), the rest budgets > 0.

    ``problems`` ``[len(c), Q]`` (optional): per-problem accuracy at each validation; the intervals of A and B are
    then the 2.5/97.5 percentiles of ``boot`` refits on problems drawn with replacement (the same draw at every
    validation, as one validation set).

    The fit is ``not identified`` with its reason when it has fewer than :data:`MIN_POINTS` validations, when A
    lies at the edge of [0, 1], or when the budget may be below C_mid: the best curve with ``C_mid > budget``
    fits within the noise (:func:`unbent_excess` below the χ²₁ 95% quantile). The noise variance per validation
    is the per-problem variance over ``Q`` (with ``problems``), else the binomial ``y(1 − y)/samples`` (with
    ``samples``, the validation's problems × k), else the residual variance of the fit.
    """
    c_arr, y_arr = np.asarray(c, dtype=float), np.asarray(y, dtype=float)
    if len(c_arr) == 0 or c_arr[0] != 0:
        raise ValueError("fit_curve needs the step-0 validation first (budget 0)")
    r0, budget, points = float(y_arr[0]), float(c_arr[-1]), len(c_arr)
    if points < MIN_POINTS:
        return CurveFit(r0, math.nan, math.nan, math.nan, budget, points, "not identified",
                        "too few points", f"{points} validations, a fit needs {MIN_POINTS}")
    ga, gb, gm, sse, mids = grid_fit(c_arr[1:], np.array([r0]), y_arr[None, 1:])
    a, b, m = _refine(c_arr[1:], r0, y_arr[1:], float(ga[0]), float(gb[0]), float(gm[0]))
    fit = CurveFit(r0, a, b, m, budget, points, "fitted")
    if problems is not None:
        noise_var = float(problems[1:].var(1, ddof=1).mean() / problems.shape[1])
    elif samples:
        noise_var = float(np.mean(np.clip(y_arr[1:] * (1 - y_arr[1:]), 1e-4, None)) / samples)
    else:
        noise_var = float(sse[0].min() / max(points - 4, 1))
    excess = unbent_excess(sse[0], mids, budget, max(noise_var, 1e-12))
    if problems is not None:
        rng = np.random.default_rng(seed)
        q = problems.shape[1]
        draws = problems[:, rng.integers(0, q, size=(boot, q))].mean(2).T  # [boot, P]
        ba, bb, *_ = grid_fit(c_arr[1:], draws[:, 0], draws[:, 1:])
        fit.a_interval = (float(np.percentile(ba, 2.5)), float(np.percentile(ba, 97.5)))
        fit.b_interval = (float(np.percentile(bb, 2.5)), float(np.percentile(bb, 97.5)))
    if m > budget:
        fit.verdict, fit.why, fit.detail = "not identified", "budget below C_mid", f"C_mid ≈ {m:.3g} > budget {budget:.3g}"
    elif excess < CHI2_1_95:
        fit.verdict, fit.why, fit.detail = "not identified", "budget may be below C_mid", (
            f"best C_mid ≈ {m:.3g}, budget {budget:.3g}; a curve still rising at the budget fits within the noise, "
            f"Δχ² = {excess:.2f} < {CHI2_1_95:.2f}")
    elif a < EDGE or a > 1 - EDGE:
        fit.verdict, fit.why, fit.detail = "not identified", "A at the edge of its range", f"A = {a:.3f}"
    return fit


def _refine(c: np.ndarray, r0: float, y: np.ndarray, a: float, b: float, m: float) -> tuple[float, float, float]:
    """Bounded least squares (:func:`scipy.optimize.least_squares`) from the grid's optimum, in
    ``(A, log B, log C_mid)`` with the grid's bounds."""
    lo = [0.0, math.log(B_GRID[0]), math.log(MID_SPAN[0] * c.max())]
    hi = [1.0, math.log(B_GRID[-1]), math.log(MID_SPAN[1] * c.max())]
    x0 = np.clip([a, math.log(b), math.log(m)], lo, hi)
    res = optimize.least_squares(lambda x: saturating(c, r0, x[0], math.exp(x[1]), math.exp(x[2])) - y, x0,
                                 bounds=(lo, hi))
    return float(res.x[0]), float(math.exp(res.x[1])), float(math.exp(res.x[2]))


@dataclass
class SeedFits:
    """A variant's fits over its seeds and the t intervals of A and B over the seeds whose fit is identified."""

    fits: list[CurveFit]
    a_mean: float = math.nan
    a_half: float = math.nan
    b_mean: float = math.nan
    b_half: float = math.nan
    c_mid_mean: float = math.nan

    @property
    def verdict(self) -> str:
        return "fitted" if self.fits and all(f.fitted for f in self.fits) else "not identified"


def over_seeds(fits: Sequence[CurveFit]) -> SeedFits:
    """Mean ± Student t 95% half-width of A and B over the identified fits (every fit kept, with its reason)."""
    ok = [f for f in fits if f.fitted]
    out = SeedFits(list(fits))
    if ok:
        out.a_mean, out.a_half = seed_interval([f.a for f in ok])
        out.b_mean, out.b_half = seed_interval([f.b for f in ok])
        out.c_mid_mean = sum(f.c_mid for f in ok) / len(ok)
    return out


@dataclass
class FitComparison:
    """A variant's fitted curves against a reference's, paired by seed (both identified)."""

    variant: str
    vs: str
    pairs: int
    delta_a: float
    delta_a_half: float
    delta_b: float | None = None
    """Compared only when the ceilings lie within :data:`MARGIN_A` (then efficiency decides)."""
    delta_b_half: float | None = None


def compare_fits(variant: str, fits: Sequence[CurveFit], vs: str, ref: Sequence[CurveFit],
                 margin: float = MARGIN_A) -> FitComparison | None:
    """ΔA (and ΔB when ``|ΔA| < margin``) paired by seed position, t 95% over the pairs both identified."""
    pairs = [(f, r) for f, r in zip(fits, ref) if f.fitted and r.fitted]
    if not pairs:
        return None
    da = [f.a - r.a for f, r in pairs]
    mean_a, half_a = seed_interval(da)
    out = FitComparison(variant, vs, len(pairs), mean_a, half_a)
    if abs(mean_a) < margin:
        out.delta_b, out.delta_b_half = seed_interval([f.b - r.b for f, r in pairs])
    return out


__all__ = ["CurveFit", "FitComparison", "MARGIN_A", "MIN_POINTS", "SeedFits", "compare_fits", "fit_curve",
           "grid_fit", "over_seeds", "saturating"]
