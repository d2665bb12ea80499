"""CISPO (``algo/cispo.py``): a hand-derived example, and where its gradient is DAPO's."""

from __future__ import annotations

import math

import pytest
import torch

from dapo_cli.algo.cispo import cispo_loss
from dapo_cli.algo.losses import dapo_loss

# Two responses, eps_high 0.5 (the weight is capped at 1.5), no lower bound (the paper's choice), token-mean.
#   tok        pi_theta  pi_old  r = pi_theta / pi_old   w = sg(clip(r))   A    loss -w A log pi_theta
#   (0, 0)     0.6       0.5     1.2                     1.2               +1   -1.2 ln 0.6 = +0.612990748
#   (0, 1)     0.4       0.2     2.0                     1.5 (capped)      +1   -1.5 ln 0.4 = +1.374436098
#   (0, 2)     0.1       0.5     0.2                     0.2 (no floor)    +1   -0.2 ln 0.1 = +0.460517019
#   (1, 0)     0.3       0.3     1.0                     1.0               -2   +2.0 ln 0.3 = -2.407945609
#   (1, 1..2)  padding (garbage log-probs, masked)
# The gradient of token t is -w A / N (N = 4 tokens): -0.3, -0.375, -0.05, +0.5, whatever the clip.
LOGP = torch.tensor([[math.log(0.6), math.log(0.4), math.log(0.1)], [math.log(0.3), 9.0, -50.0]], dtype=torch.float64)
OLD = torch.tensor([[math.log(0.5), math.log(0.2), math.log(0.5)], [math.log(0.3), 0.0, 0.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
ADV = torch.tensor([1.0, -2.0], dtype=torch.float64)


def _case(clip_ratio_low):
    log_prob = LOGP.clone().requires_grad_(True)
    loss, metrics = cispo_loss(log_prob, OLD, ADV, MASK, clip_ratio_low=clip_ratio_low, clip_ratio_high=0.5,
                               loss_agg_mode="token-mean")
    loss.backward()
    return loss, metrics, log_prob.grad


def test_the_weight_is_clipped_and_detached_and_every_token_keeps_its_gradient():
    loss, metrics, grad = _case(None)
    terms = [-1.2 * math.log(0.6), -1.5 * math.log(0.4), -0.2 * math.log(0.1), 2.0 * math.log(0.3)]
    assert float(loss.detach()) == pytest.approx(sum(terms) / 4, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor([[-0.3, -0.375, -0.05], [0.5, 0.0, 0.0]], dtype=torch.float64),
                               rtol=0, atol=1e-12)
    assert metrics["actor/is_clipfrac_high"] == pytest.approx(1 / 4, abs=1e-12)  # token (0, 1)
    assert metrics["actor/is_clipfrac_low"] == 0.0  # no lower bound
    assert metrics["actor/is_weight_mean"] == pytest.approx((1.2 + 1.5 + 0.2 + 1.0) / 4, abs=1e-12)
    # ppo_kl: mean of -log r = -(ln 1.2 + ln 2 + ln 0.2 + 0) / 4
    assert metrics["actor/ppo_kl"] == pytest.approx(-(math.log(1.2) + math.log(2.0) + math.log(0.2)) / 4, abs=1e-12)


def test_a_lower_bound_raises_the_small_weights_to_it():
    # eps_low 0.5: token (0, 2) gets w = max(0.2, 0.5) = 0.5: its term -0.5 ln 0.1, its gradient -0.5 / 4
    loss, metrics, grad = _case(0.5)
    terms = [-1.2 * math.log(0.6), -1.5 * math.log(0.4), -0.5 * math.log(0.1), 2.0 * math.log(0.3)]
    assert float(loss.detach()) == pytest.approx(sum(terms) / 4, abs=1e-12)
    assert float(grad[0, 2]) == pytest.approx(-0.125, abs=1e-12)
    assert metrics["actor/is_clipfrac_low"] == pytest.approx(1 / 4, abs=1e-12)


def test_inside_both_clip_ranges_the_gradient_is_dapos():
    # where no bound binds, sg(r) A ∇log pi = A ∇r: CISPO's gradient is PPO's unclipped one, i.e. DAPO's
    gen = torch.Generator().manual_seed(11)
    lengths = torch.tensor([4, 2, 0, 3])
    mask = torch.arange(4).unsqueeze(0) < lengths.unsqueeze(1)
    old = -torch.rand(4, 4, generator=gen, dtype=torch.float64) * 2
    ratio = 0.85 + 0.4 * torch.rand(4, 4, generator=gen, dtype=torch.float64)  # in (0.85, 1.25) ⊂ [0.8, 1.28]
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5], dtype=torch.float64)
    a_in, b_in = (old + ratio.log()).requires_grad_(True), (old + ratio.log()).requires_grad_(True)
    a, ma = cispo_loss(a_in, old, adv, mask, clip_ratio_low=None, clip_ratio_high=3.0, loss_agg_mode="token-mean")
    b, mb = dapo_loss(b_in, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=None, loss_agg_mode="token-mean")
    (ga,), (gb,) = torch.autograd.grad(a, a_in), torch.autograd.grad(b, b_in)
    assert mb["actor/pg_clipfrac"] == 0.0 and ma["actor/is_clipfrac_high"] == 0.0
    assert ga.abs().max() > 0.05
    torch.testing.assert_close(ga, gb, rtol=0, atol=1e-12)


def test_bad_bounds_raise():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="CISPO needs"):
        cispo_loss(x, x, torch.ones(1), x, clip_ratio_low=None, clip_ratio_high=0.0, loss_agg_mode="token-mean")
    with pytest.raises(ValueError, match="CISPO needs"):
        cispo_loss(x, x, torch.ones(1), x, clip_ratio_low=1.5, clip_ratio_high=3.0, loss_agg_mode="token-mean")
