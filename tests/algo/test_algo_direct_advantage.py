"""Direct Advantage Policy Optimization's tensor maths against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from dapo_cli.algo.direct_advantage import (
    action_log_probs,
    bernoulli_entropy,
    calibration_bins,
    centered_advantages,
    direct_advantage_loss,
    gap_filter,
    soft_bce_loss,
    state_gaps,
    state_uniform_weights,
)

# two candidate steps: 2 tokens and 1 token (right-padded)
TOKEN_LOGP = torch.tensor([[-1.0, -2.0, -7.0], [-0.5, -9.0, -9.0]])
MASK = torch.tensor([[True, True, False], [True, False, False]])
REF = torch.tensor([-2.5, -1.0])
ADV = torch.tensor([0.2, -0.1])


def test_action_log_prob_is_the_sum_of_its_tokens_not_the_mean():
    assert action_log_probs(TOKEN_LOGP, MASK).tolist() == [-3.0, -0.5]  # the mean would give -1.5 for the first


def test_action_log_probs_ignore_nan_on_padding():
    logp = TOKEN_LOGP.clone()
    logp[0, 2] = float("nan")
    assert action_log_probs(logp, MASK).tolist() == [-3.0, -0.5]


def test_loss_matches_the_hand_computed_value():
    # log ratios: -3 - (-2.5) = -0.5 and -0.5 - (-1) = 0.5; targets A/beta = 2 and -1
    # residuals 2.5 and -1.5; loss = 1/2 * mean(6.25, 2.25) = 2.125
    logp = action_log_probs(TOKEN_LOGP, MASK)
    loss, m = direct_advantage_loss(logp, REF, ADV, beta=0.1)
    assert float(loss) == pytest.approx(2.125)
    assert m["loss"] == pytest.approx(2.125)
    assert m["log_ratio_mean"] == pytest.approx(0.0)
    assert m["target_abs_mean"] == pytest.approx(1.5)
    assert m["residual_abs_mean"] == pytest.approx(2.0)


def test_loss_with_token_means_would_differ():
    mean_logp = (TOKEN_LOGP * MASK).sum(-1) / MASK.sum(-1)  # [-1.5, -0.5]
    loss_mean, _ = direct_advantage_loss(mean_logp, REF, ADV, beta=0.1)
    loss_sum, _ = direct_advantage_loss(action_log_probs(TOKEN_LOGP, MASK), REF, ADV, beta=0.1)
    # with the mean: residuals 2 - 1 = 1 and -1.5 -> 1/2 * mean(1, 2.25) = 0.8125
    assert float(loss_mean) == pytest.approx(0.8125)
    assert float(loss_sum) != pytest.approx(float(loss_mean))


def test_beta_scales_the_target():
    logp = action_log_probs(TOKEN_LOGP, MASK)
    # beta 0.2: targets 1 and -0.5; residuals 1.5 and -1.0 -> 1/2 * mean(2.25, 1.0) = 0.8125
    loss, m = direct_advantage_loss(logp, REF, ADV, beta=0.2)
    assert float(loss) == pytest.approx(0.8125)
    assert m["target_abs_mean"] == pytest.approx(0.75)


def test_gradient_is_minus_the_weighted_residual():
    logp = action_log_probs(TOKEN_LOGP, MASK).requires_grad_(True)
    loss, _ = direct_advantage_loss(logp, REF, ADV, beta=0.1)
    loss.backward()
    # d/dlogp 1/2 w (t - (logp - ref))^2 = -w (t - r): w = 1/2 -> [-1.25, 0.75]
    assert logp.grad.tolist() == pytest.approx([-1.25, 0.75])


def test_token_gradient_reaches_every_action_token_equally():
    token_logp = TOKEN_LOGP.clone().requires_grad_(True)
    loss, _ = direct_advantage_loss(action_log_probs(token_logp, MASK), REF, ADV, beta=0.1)
    loss.backward()
    assert torch.allclose(token_logp.grad, torch.tensor([[-1.25, -1.25, 0.0], [0.75, 0.0, 0.0]]))


def test_loss_is_zero_when_the_log_ratio_equals_the_scaled_advantage():
    loss, _ = direct_advantage_loss(REF + ADV / 0.05, REF, ADV, beta=0.05)
    assert float(loss) == pytest.approx(0.0, abs=1e-10)


def test_explicit_weights_replace_the_mean():
    logp = action_log_probs(TOKEN_LOGP, MASK)
    loss, _ = direct_advantage_loss(logp, REF, ADV, beta=0.1, weights=torch.tensor([1.0, 0.0]))
    assert float(loss) == pytest.approx(0.5 * 6.25)


def test_loss_rejects_bad_inputs():
    with pytest.raises(ValueError, match="beta"):
        direct_advantage_loss(REF, REF, ADV, beta=0.0)
    with pytest.raises(ValueError, match="three"):
        direct_advantage_loss(REF, REF, torch.zeros(3), beta=0.1)


def test_state_uniform_weights_give_each_state_equal_mass():
    w = state_uniform_weights(torch.tensor([7, 7, 3]))
    assert w.tolist() == pytest.approx([0.25, 0.25, 0.5])
    # a micro-batch with one of the batch's two states carries half the batch's mass
    assert state_uniform_weights(torch.tensor([7, 7]), num_states=2).tolist() == pytest.approx([0.25, 0.25])


def test_advantages_are_centred_per_state_and_gaps_span_the_state():
    q = torch.tensor([0.9, 0.5, 0.1, 0.3, 0.3])
    sid = torch.tensor([4, 4, 4, 9, 9])
    adv = centered_advantages(q, sid)
    assert adv.tolist() == pytest.approx([0.4, 0.0, -0.4, 0.0, 0.0])
    assert state_gaps(adv, sid).tolist() == pytest.approx([0.8, 0.8, 0.8, 0.0, 0.0])
    assert gap_filter(adv, sid, 0.1).tolist() == [True, True, True, False, False]
    assert gap_filter(adv, sid, 0.0).tolist() == [True] * 5
    assert gap_filter(adv, sid, 0.8).tolist() == [True, True, True, False, False]  # >= is inclusive


def test_soft_bce_is_minimal_at_the_soft_target():
    y = torch.tensor([0.3])
    assert float(soft_bce_loss(torch.zeros(1), y)) == pytest.approx(math.log(2))
    at_target = float(soft_bce_loss(torch.logit(y), y))
    assert at_target == pytest.approx(-(0.3 * math.log(0.3) + 0.7 * math.log(0.7)))
    assert at_target == pytest.approx(float(bernoulli_entropy(y)[0]))
    z = torch.logit(y).clone().requires_grad_(True)
    soft_bce_loss(z, y).backward()
    assert float(z.grad) == pytest.approx(0.0, abs=1e-6)  # sigma(z) - y = 0
    for other in (-1.0, 0.0, 1.0):
        assert float(soft_bce_loss(torch.tensor([other]), y)) > at_target


def test_soft_bce_weights():
    logits, y = torch.tensor([0.0, 2.0]), torch.tensor([0.5, 1.0])
    only_first = soft_bce_loss(logits, y, torch.tensor([1.0, 0.0]))
    assert float(only_first) == pytest.approx(math.log(2))


def test_calibration_bins_by_hand():
    pred = torch.tensor([0.05, 0.15, 0.12, 1.0])
    target = torch.tensor([0.0, 0.5, 0.0, 1.0])
    out = calibration_bins(pred, target, num_bins=10)
    assert out["count"].tolist() == [1, 2, 0, 0, 0, 0, 0, 0, 0, 1]
    assert float(out["mean_predicted"][1]) == pytest.approx(0.135)
    assert float(out["mean_target"][1]) == pytest.approx(0.25)
    assert math.isnan(float(out["mean_target"][2]))
    assert float(out["ece"]) == pytest.approx((0.05 + 0.23) / 4)
    assert out["low"][0] == 0.0 and float(out["high"][-1]) == 1.0
