"""Power of the paired t-test (``ablate/stats.py``) against a Monte-Carlo simulation of the test itself."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from dapo_cli.ablate.stats import min_detectable_delta, paired_t_power, sample_sd, seeds_needed


def simulated_power(delta: float, sd: float, n: int, draws: int = 40_000, seed: int = 0) -> float:
    """Share of ``draws`` simulated ablations (n paired seeds, differences ~ N(delta, sd²)) whose two-sided
    5% paired t-test rejects Δ = 0: the definition of power, computed without the noncentral t."""
    d = np.random.default_rng(seed).normal(delta, sd, size=(draws, n))
    t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))
    return float((np.abs(t) > sps.t.ppf(0.975, n - 1)).mean())


@pytest.mark.slow
@pytest.mark.parametrize("n", [3, 6, 10])
def test_minimum_detectable_delta_has_80_percent_simulated_power(n: int) -> None:
    sd = 15.9  # the real-model ladder's paired sd (points)
    mdd = min_detectable_delta(sd, n)
    assert simulated_power(mdd, sd, n) == pytest.approx(0.8, rel=0.10)
    # smaller effects are detected less often: half the detectable Δ has clearly less power
    assert simulated_power(mdd / 2, sd, n) < 0.6


@pytest.mark.slow
@pytest.mark.parametrize("delta", [12.0, 20.0, 30.0])
def test_seeds_needed_reaches_80_percent_simulated_power_and_one_fewer_does_not(delta: float) -> None:
    sd = 15.9
    n = seeds_needed(delta, sd)
    assert n is not None and n >= 2
    assert simulated_power(delta, sd, n) >= 0.8 * 0.9
    if n > 2:
        assert simulated_power(delta, sd, n - 1, seed=1) < 0.8 * 1.1
        assert paired_t_power(delta, sd, n - 1) < 0.8 <= paired_t_power(delta, sd, n)


def test_power_edge_cases() -> None:
    # one pair: no test; zero sd or zero effect: nothing to size
    assert math.isnan(paired_t_power(5.0, 10.0, 1)) and math.isnan(min_detectable_delta(0.0, 5))
    assert seeds_needed(0.0, 10.0) is None and seeds_needed(5.0, math.nan) is None
    # with no effect the test rejects at its level: power(0) = α = 0.05
    assert paired_t_power(0.0, 10.0, 8) == pytest.approx(0.05, abs=1e-9)
    # an effect 1/100 of the sd needs ~ ((1.96 + 0.84)/0.01)² ≈ 78,500 pairs: beyond the cap
    assert seeds_needed(0.1, 10.0) is None
    # sd of [1, 2, 3] = 1 by hand
    assert sample_sd([1.0, 2.0, 3.0]) == 1.0 and math.isnan(sample_sd([1.0]))


def test_the_ladders_closing_note_is_reproduced() -> None:
    """docs/real-model-ladder-36.md worked by hand: 'at the paired sd of 15.9, about 8 seeds' for Δ ≈ 14.7 (the
    DAPO−GRPO mean of +9.5, +2.0, +32.5). The normal approximation n ≈ ((z.975 + z.8)·sd/Δ)² = 9.2 is a
    lower bound for the t-test, which needs a few more because the sd is estimated."""
    delta = (9.5 + 2.0 + 32.5) / 3
    n = seeds_needed(delta, 15.9)
    normal = ((1.959964 + 0.841621) * 15.9 / delta) ** 2
    assert normal < n <= normal + 3


def test_power_stays_finite_where_scipys_noncentral_t_tail_is_nan() -> None:
    # nct.cdf(-c, 1, ncp=40) is NaN in scipy 1.17; the lower tail there is below 1e-15, the upper 0.998
    assert paired_t_power(40 * 10.0 / math.sqrt(2), 10.0, 2) == pytest.approx(0.9983, abs=1e-3)
    assert math.isfinite(min_detectable_delta(1e-6, 2))
