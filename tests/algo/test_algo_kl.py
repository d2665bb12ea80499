"""Tests for dapo_cli.algo.kl: each estimator hand-derived, and the k3 clamp."""

from __future__ import annotations

import math

import pytest
import torch

from dapo_cli.algo.kl import KL_KINDS, kl_penalty

LN2 = math.log(2.0)
# log pi = [ln 1/2, ln 1/4, ln 1/2], log ref = [ln 1/4, ln 1/2, ln 1/2] -> Delta = log pi - log ref = [ln 2, -ln 2, 0].
LOG_PROB = torch.log(torch.tensor([[0.5, 0.25, 0.5]], dtype=torch.float64))
REF = torch.log(torch.tensor([[0.25, 0.5, 0.5]], dtype=torch.float64))


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("kl", [LN2, -LN2, 0.0]),  # k1 = Delta
        ("abs", [LN2, LN2, 0.0]),  # |Delta|
        ("mse", [0.5 * LN2**2, 0.5 * LN2**2, 0.0]),  # k2 = Delta^2 / 2
        # k3 with x = ref - logp = -Delta: e^x - x - 1 -> [1/2 + ln 2 - 1, 2 - ln 2 - 1, 0]
        ("low_var_kl", [LN2 - 0.5, 1.0 - LN2, 0.0]),
    ],
)
def test_each_kind_hand_derived(kind, expected):
    got = kl_penalty(LOG_PROB, REF, kind=kind)
    torch.testing.assert_close(got, torch.tensor([expected], dtype=torch.float64), rtol=0, atol=1e-12)


def test_low_var_kl_clamped_with_finite_gradient():
    # x = ref - logp = +1000: e^1000 overflows float64, yet the value is 10 and the gradient 0 (not NaN);
    # x = -30: e^-30 + 29 > 10 -> 10; x = 2.5: e^2.5 - 3.5 = 8.682 (unclamped).
    # (k3 >= 0 always, so the lower clamp at -10 can never bind.)
    log_prob = torch.tensor([[-1000.0, 30.0, -2.5]], dtype=torch.float64, requires_grad=True)
    ref = torch.zeros(1, 3, dtype=torch.float64)
    got = kl_penalty(log_prob, ref)
    expected = torch.tensor([[10.0, 10.0, math.exp(2.5) - 3.5]], dtype=torch.float64)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    got.sum().backward()
    # d/dlogp (e^x - x - 1) with x = ref - logp is 1 - e^x; clamped entries have gradient 0.
    torch.testing.assert_close(log_prob.grad, torch.tensor([[0.0, 0.0, 1.0 - math.exp(2.5)]], dtype=torch.float64))


def test_default_is_low_var_kl_and_errors():
    torch.testing.assert_close(kl_penalty(LOG_PROB, REF), kl_penalty(LOG_PROB, REF, kind="low_var_kl"))
    assert KL_KINDS == ("kl", "abs", "mse", "low_var_kl")
    with pytest.raises(ValueError, match="kl, abs, mse, low_var_kl"):
        kl_penalty(LOG_PROB, REF, kind="full")
    with pytest.raises(ValueError, match="differ"):
        kl_penalty(LOG_PROB, REF[:, :2])
