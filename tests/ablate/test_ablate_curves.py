"""Saturating curve fits (``ablate/curves.py``) on curves drawn from known A, B, C_mid with binomial noise at the
ladder's validation size (100 problems x 2 samples, experiments/smollm2-ladder.yaml)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dapo_cli.ablate.curves import compare_fits, fit_curve, over_seeds, saturating

R0, A, B, C_MID = 0.10, 0.70, 1.5, 1000.0  # the budget (4096) is 4x C_mid: the curve has bent
BUDGETS = np.array([0.0] + [512.0 * i for i in range(1, 9)])  # step 0 and 8 validations, 512 samples a step
PROBLEMS, K = 100, 2


def draw_problems(rng: np.random.Generator, c: np.ndarray, c_mid: float = C_MID) -> np.ndarray:
    """Per-problem accuracy ``[points, PROBLEMS]``: K Bernoulli samples per problem at the true R(C)."""
    p = saturating(c, R0, A, B, c_mid)
    return rng.binomial(K, np.repeat(p[:, None], PROBLEMS, 1)) / K


def test_the_form() -> None:
    # R(0) = R0; R(C_mid) = (R0 + A)/2 by hand (the denominator is 1 + 1); R → A as C → ∞
    assert saturating(0.0, R0, A, B, C_MID) == R0
    assert saturating(C_MID, R0, A, B, C_MID) == pytest.approx((R0 + A) / 2, abs=1e-15)
    assert saturating(1e12, R0, A, B, C_MID) == pytest.approx(A, abs=1e-9)


def test_a_noiseless_curve_is_recovered_and_predicted() -> None:
    y = saturating(BUDGETS, R0, A, B, C_MID)
    fit = fit_curve(BUDGETS, y, samples=PROBLEMS * K)
    assert fit.verdict == "fitted" and fit.points == 9 and fit.budget == 4096.0
    assert (fit.a, fit.b, fit.c_mid) == (pytest.approx(A, abs=1e-6), pytest.approx(B, rel=1e-5), pytest.approx(C_MID, rel=1e-5))
    # 2x and 10x the budget: the true curve's values
    assert fit.predict(2 * 4096) == pytest.approx(float(saturating(8192.0, R0, A, B, C_MID)), abs=1e-6)
    assert fit.predict(10 * 4096) == pytest.approx(float(saturating(40960.0, R0, A, B, C_MID)), abs=1e-6)


@pytest.mark.slow
def test_a_lies_in_its_bootstrap_interval_in_90_percent_of_200_draws() -> None:
    rng = np.random.default_rng(0)
    hits = 0
    for draw in range(200):
        problems = draw_problems(rng, BUDGETS)
        fit = fit_curve(BUDGETS, problems.mean(1), problems, boot=200, seed=draw)
        lo, hi = fit.a_interval
        hits += lo <= A <= hi
    assert hits >= 180, f"A = {A} inside its interval in {hits} of 200 draws"


def test_a_curve_cut_before_c_mid_is_not_identified() -> None:
    # noiseless: the curve with C_mid = 2x the budget is the best fit, so C_mid > budget
    y = saturating(BUDGETS, R0, A, B, 2 * 4096.0)
    fit = fit_curve(BUDGETS, y, samples=PROBLEMS * K)
    assert fit.verdict == "not identified" and fit.reason.startswith("budget below C_mid (C_mid ≈ 8.19e+03 > budget 4.1e+03)")
    assert fit.why == "budget below C_mid"
    # with binomial noise: at least 45 of 50 draws
    rng = np.random.default_rng(1)
    verdicts = [fit_curve(BUDGETS, draw_problems(rng, BUDGETS, 2 * 4096.0).mean(1), samples=PROBLEMS * K).verdict
                for _ in range(50)]
    assert verdicts.count("not identified") >= 45


def test_a_curve_whose_bend_the_noise_hides_may_be_below_c_mid() -> None:
    # noiseless, the best fit bends before the budget (C_mid = 1,000, budget 4,096); but a validation of 8 samples
    # has a binomial sd of ~0.16, and a curve still rising at the budget fits within that: Δχ² < 3.84, "may be"
    fit = fit_curve(BUDGETS, saturating(BUDGETS, R0, A, B, C_MID), samples=8)
    assert fit.c_mid < fit.budget
    assert fit.verdict == "not identified" and fit.why == "budget may be below C_mid", fit.reason
    assert "a curve still rising at the budget fits within the noise, Δχ² = " in fit.reason


def test_too_few_points_and_a_at_its_edge() -> None:
    few = fit_curve([0.0, 512.0, 1024.0, 1536.0], [0.1, 0.3, 0.4, 0.45])
    assert few.verdict == "not identified" and few.reason == "too few points (4 validations, a fit needs 5)"
    assert math.isnan(few.a)
    # a curve rising to 1 by step 2 and staying there: the ceiling is the bound A = 1
    top = fit_curve(BUDGETS, [0.1, 0.9, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], samples=PROBLEMS * K)
    assert top.verdict == "not identified" and top.reason.startswith("A at the edge of its range")
    with pytest.raises(ValueError):
        fit_curve([1.0, 2.0, 3.0, 4.0, 5.0], [0.1] * 5)


def test_seed_intervals_and_the_comparison_on_a_then_b() -> None:
    def fits(a: float, b: float) -> list:
        return [fit_curve(BUDGETS, saturating(BUDGETS, R0, a + d, b, C_MID), samples=PROBLEMS * K)
                for d in (-0.01, 0.0, 0.01)]
    base, up = fits(0.60, 2.0), fits(0.70, 2.0)
    seeds = over_seeds(base)
    # A over seeds .59, .60, .61: mean .60, sd .01, half = t(.975, 2) · .01/√3 with t(.975, 2) = 4.302653
    assert seeds.verdict == "fitted" and seeds.a_mean == pytest.approx(0.60, abs=1e-5)
    assert seeds.a_half == pytest.approx(4.302653 * 0.01 / math.sqrt(3), rel=1e-3)
    far = compare_fits("up", up, "base", base)
    assert far.pairs == 3 and far.delta_a == pytest.approx(0.10, abs=1e-5) and far.delta_b is None
    # ceilings within the ±0.02 margin: efficiency decides, B 4.0 against 2.0
    steep = fits(0.61, 4.0)
    near = compare_fits("steep", steep, "base", base)
    assert near.delta_a == pytest.approx(0.01, abs=1e-5) and near.delta_b == pytest.approx(2.0, abs=1e-3)
