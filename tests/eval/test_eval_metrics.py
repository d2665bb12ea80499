"""Estimators of dapo_cli/eval/metrics.py against hand-computed values."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from dapo_cli.eval import metrics as M

# pass@k for n = 4 samples, c correct, k drawn: 1 - C(4-c, k) / C(4, k).
#   C(4,1)=4  C(4,2)=6  C(4,3)=4  C(4,4)=1
#   c=0: C(4,k)/C(4,k) = 1 → 0 for every k
#   c=1: k=1: 1 - C(3,1)/4 = 1 - 3/4 = 1/4
#        k=2: 1 - C(3,2)/6 = 1 - 3/6 = 1/2
#        k=3: 1 - C(3,3)/4 = 1 - 1/4 = 3/4
#        k=4: C(3,4) = 0      → 1
#   c=2: k=1: 1 - C(2,1)/4 = 1/2
#        k=2: 1 - C(2,2)/6 = 5/6
#        k=3, 4: n-c = 2 < k  → 1
#   c=3: k=1: 1 - C(1,1)/4 = 3/4;  k>=2: n-c = 1 < k → 1
#   c=4: 1 for every k
PASS_AT_K_N4 = {
    0: [0.0, 0.0, 0.0, 0.0],
    1: [1 / 4, 1 / 2, 3 / 4, 1.0],
    2: [1 / 2, 5 / 6, 1.0, 1.0],
    3: [3 / 4, 1.0, 1.0, 1.0],
    4: [1.0, 1.0, 1.0, 1.0],
}


@pytest.mark.parametrize("c", range(5))
@pytest.mark.parametrize("k", range(1, 5))
def test_pass_at_k_n4_hand_values(c: int, k: int) -> None:
    assert M.pass_at_k(4, c, k) == pytest.approx(PASS_AT_K_N4[c][k - 1], abs=1e-12)


def test_pass_at_k_product_matches_binomials_at_n32() -> None:
    # the stable product against the textbook ratio of exact binomials (math.comb is exact)
    for c in range(33):
        for k in (1, 8, 16, 32):
            exact = 1.0 - math.comb(32 - c, k) / math.comb(32, k)
            assert M.pass_at_k(32, c, k) == pytest.approx(exact, abs=1e-12)


def test_pass_at_1_is_the_accuracy() -> None:
    # pass@1 = 1 - (n-c)/n = c/n for every n, c
    for n in (1, 5, 32):
        for c in range(n + 1):
            assert M.pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_rejects_impossible_arguments(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError):
        M.pass_at_k(n, c, k)


def test_mean_pass_at_k_averages_problems() -> None:
    # problems with c = 1 and c = 2 of n = 4, k = 2: (1/2 + 5/6) / 2 = 2/3
    assert M.mean_pass_at_k([(4, 1), (4, 2)], 2) == pytest.approx(2 / 3, abs=1e-12)


def test_majority_vote_plain_majority() -> None:
    assert M.majority_vote(["5", "7", "7", "5", "7"]) == "7"


def test_majority_vote_tie_goes_to_earliest_first_occurrence() -> None:
    # "9" and "3" both occur twice; "9" occurs first (position 0) → "9"
    assert M.majority_vote(["9", "3", "3", "9"]) == "9"
    # same counts, other order → the other answer
    assert M.majority_vote(["3", "9", "9", "3"]) == "3"


def test_majority_vote_never_picks_invalid_unless_all_invalid() -> None:
    # [INVALID] is the most frequent (3×) but is ignored; "4" (1×) wins
    assert M.majority_vote([M.INVALID, M.INVALID, "4", M.INVALID]) == "4"
    assert M.majority_vote([M.INVALID, M.INVALID]) == M.INVALID


def test_majority_correct_uses_the_winning_answer_acc() -> None:
    assert M.majority_correct(["1", "2", "2"], [True, False, False]) == ("2", False)
    assert M.majority_correct(["1", "2", "1"], [True, False, True]) == ("1", True)
    assert M.majority_correct([M.INVALID], [False]) == (M.INVALID, False)


def test_standard_error_hand_value() -> None:
    # values 0, 0.5, 1: mean 0.5, sample variance ((0.25 + 0 + 0.25) / 2) = 0.25, s = 0.5,
    # stderr = 0.5 / sqrt(3) = 0.28867513...
    assert M.standard_error([0.0, 0.5, 1.0]) == pytest.approx(0.5 / math.sqrt(3), abs=1e-12)
    assert math.isnan(M.standard_error([0.3]))


def test_bootstrap_ci_of_a_constant_is_that_constant() -> None:
    assert M.bootstrap_ci([0.25] * 7) == pytest.approx((0.25, 0.25), abs=1e-12)


def test_bootstrap_ci_two_values_hand_distribution() -> None:
    # values {0, 1}: a resample of 2 has mean 0 (p=1/4), 0.5 (p=1/2) or 1 (p=1/4);
    # the 2.5% and 97.5% percentiles of 2000 such means are 0 and 1.
    low, high = M.bootstrap_ci([0.0, 1.0])
    assert (low, high) == (0.0, 1.0)
    means = M.bootstrap_means([0.0, 1.0])
    assert means.shape == (M.BOOTSTRAP_RESAMPLES,)
    assert set(np.unique(means)) == {0.0, 0.5, 1.0}
    assert (means == 0.5).mean() == pytest.approx(0.5, abs=0.04)


def test_bootstrap_is_seeded_and_matches_a_plain_loop() -> None:
    values = [random.Random(1).random() for _ in range(9)]
    a = M.bootstrap_means(values, resamples=50, seed=3)
    b = M.bootstrap_means(values, resamples=50, seed=3)
    assert np.array_equal(a, b)
    rng = np.random.default_rng(3)
    idx = rng.integers(0, 9, size=(50, 9))
    loop = [sum(values[j] for j in row) / 9 for row in idx]
    assert np.allclose(a, loop, atol=1e-12)


def test_paired_bootstrap_constant_difference() -> None:
    # a - b = 0.1 on every problem: every resampled mean is 0.1, CI [0.1, 0.1], share > 0 is 1
    a = [0.6, 0.3, 0.9, 0.2]
    b = [0.5, 0.2, 0.8, 0.1]
    cmp = M.paired_bootstrap(a, b)
    assert cmp.diff == pytest.approx(0.1, abs=1e-12)
    assert (cmp.ci_low, cmp.ci_high) == pytest.approx((0.1, 0.1), abs=1e-12)
    assert cmp.share_positive == 1.0
    assert (cmp.mean_a, cmp.mean_b) == pytest.approx((0.5, 0.4), abs=1e-12)


def test_paired_bootstrap_symmetric_differences() -> None:
    # d = (+1, -1): a resample has mean > 0 only when both draws are +1 → P = 1/4;
    # the CI spans the extremes [-1, 1] and the observed difference is 0.
    cmp = M.paired_bootstrap([1.0, 0.0], [0.0, 1.0])
    assert cmp.diff == 0.0
    assert (cmp.ci_low, cmp.ci_high) == (-1.0, 1.0)
    assert cmp.share_positive == pytest.approx(0.25, abs=0.03)


def test_metric_keys_and_tracking_keys() -> None:
    keys = M.metric_keys(4, [1, 2])
    assert keys == [
        "avg@4", "pass@1", "pass@2", "maj@4", "avg@4_stderr", "avg@4_ci95_low", "avg@4_ci95_high",
        "mean_length", "truncation_rate", "num_problems", "num_samples",
    ]
    assert M.tracking_metrics({"avg@4": 0.5, "mean_length": 3.0}, prefix="val/") == {
        "val/avg_at_4": 0.5,
        "val/mean_length": 3.0,
    }
