"""Version lag and the decoupled PPO objective (``algo/staleness.py``), by hand."""

from __future__ import annotations

import math

import pytest
import torch

from dapo_cli.algo.losses import dapo_loss
from dapo_cli.algo.staleness import decoupled_policy_loss, version_lag

# dapo_loss has no defaults: the paper's values (DAPO Eq. 10, token-level loss, no dual clip), passed explicitly.
PAPER_DAPO = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": None, "loss_agg_mode": "token-mean"}


def test_lag_is_the_policy_version_minus_each_samples_version():
    # step 5 updates version 4; samples of versions 4, 3, 2 lag 0, 1, 2
    lag = version_lag(4, torch.tensor([4, 3, 2]))
    assert lag.tolist() == [0, 1, 2]


def test_a_sample_from_the_future_is_an_error():
    with pytest.raises(ValueError, match="newer than the policy"):
        version_lag(3, torch.tensor([3, 4]))


def test_decoupled_loss_clips_around_the_proximal_policy_and_weights_by_the_behaviour_ratio():
    # One response, two tokens, A = +1, token-mean, eps_low 0.2, eps_high 0.28, cap C = 1.5.
    #   token 1: pi_theta 0.6, pi_prox 0.5, pi_behav 0.25 -> r = 0.6/0.5 = 1.2 (inside [0.8, 1.28]),
    #            loss -A r = -1.2; w = min(0.5/0.25 = 2, 1.5) = 1.5 -> -1.8
    #   token 2: pi_theta 0.3, pi_prox 0.2, pi_behav 0.4 -> r = 1.5, clipped to 1.28: max(-1.5, -1.28) = -1.28;
    #            w = min(0.2/0.4 = 0.5, 1.5) = 0.5 -> -0.64
    #   token-mean: (-1.8 - 0.64) / 2 = -1.22
    # d loss / d log pi_theta: token 1 -w r / 2 = -1.5 * 1.2 / 2 = -0.9; token 2 is clipped: 0
    logp = torch.tensor([[math.log(0.6), math.log(0.3)]], dtype=torch.float64, requires_grad=True)
    prox = torch.tensor([[math.log(0.5), math.log(0.2)]], dtype=torch.float64)
    behav = torch.tensor([[math.log(0.25), math.log(0.4)]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, metrics = decoupled_policy_loss(
        logp, prox, behav, torch.tensor([1.0], dtype=torch.float64), mask, correction="token_tis", correction_args={"cap": 1.5},
        loss=dapo_loss, **PAPER_DAPO,
    )
    assert float(loss.detach()) == pytest.approx(-1.22, abs=1e-12)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.9, 0.0]], dtype=torch.float64), rtol=0, atol=1e-12)
    assert metrics["actor/clipfrac_high"] == pytest.approx(0.5)  # the clip is measured against pi_prox


def test_on_fresh_samples_on_the_trainers_own_numbers_it_is_the_plain_dapo_loss():
    # lag 0 and pi_behav == pi_prox: every weight is 1, the loss and its gradient are dapo_loss's exactly
    gen = torch.Generator().manual_seed(0)
    logp = (-torch.rand(3, 5, generator=gen, dtype=torch.float64) * 3).requires_grad_()
    prox = logp.detach() - 0.05 * torch.rand(3, 5, generator=gen, dtype=torch.float64)
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    mask = torch.rand(3, 5, generator=gen) > 0.3
    a, _ = decoupled_policy_loss(logp, prox, prox.clone(), adv, mask, correction="token_tis", correction_args={"cap": 2.0}, loss=dapo_loss,
                                 **PAPER_DAPO)
    (ga,) = torch.autograd.grad(a, logp)
    b, _ = dapo_loss(logp, prox, adv, mask, **PAPER_DAPO)
    (gb,) = torch.autograd.grad(b, logp)
    assert float(a.detach()) == float(b.detach())
    assert torch.equal(ga, gb)
