"""GMPO (``algo/gmpo.py``): a hand-derived example, the paper's product formula, and where it equals DAPO."""

from __future__ import annotations

import math

import pytest
import torch

from dapo_cli.algo.gmpo import gmpo_loss
from dapo_cli.algo.losses import dapo_loss

# Three responses, log pi_old = 0 (log pi_theta is the log-ratio), log-space clip eps_low = eps_high = 0.1.
# The clip binds on the side the advantage pushes: log m = min(log rho, 0.1) for A > 0, max(log rho, -0.1) for A < 0.
#   row  A     log rho            log m              mean    term e^mean    loss -A e^mean
#   0    +1    0.3, -0.2          0.1 (clip), -0.2   -0.05   e^-0.05        -e^-0.05
#   1    -2    -0.3, 0.05, 0.2    -0.1 (clip), 0.05, 0.2   0.05   e^0.05    +2 e^0.05
#   2    +0.5  0.0, [pad], [pad]  0.0                0.0     1              -0.5
LOG_R = torch.tensor([[0.3, -0.2, 4.0], [-0.3, 0.05, 0.2], [0.0, 6.0, -3.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
ADV = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
ROW_LOSS = [-math.exp(-0.05), 2 * math.exp(0.05), -0.5]


def _case(mode):
    log_prob = LOG_R.clone().requires_grad_(True)
    loss, metrics = gmpo_loss(log_prob, torch.zeros_like(LOG_R), ADV, MASK, log_clip_low=0.1, log_clip_high=0.1,
                              loss_agg_mode=mode)
    loss.backward()
    return loss, metrics, log_prob.grad


def test_the_geometric_mean_of_the_clipped_terms_by_hand():
    loss, metrics, grad = _case("seq-mean-token-mean")
    assert float(loss.detach()) == pytest.approx(sum(ROW_LOSS) / 3, abs=1e-12)
    # d/d log pi_t of -A e^{mean log m} = -A e^{mean} (1/|o|) on an unclipped token, 0 on a clipped one; then 1/G:
    #   row 0 token 1: (1/3)(1/2)(-e^-0.05);  row 1 tokens 1, 2: (1/3)(1/3)(2 e^0.05);  row 2: (1/3)(-0.5)
    expected = torch.tensor([
        [0.0, -math.exp(-0.05) / 6, 0.0],
        [0.0, 2 * math.exp(0.05) / 9, 2 * math.exp(0.05) / 9],
        [-0.5 / 3, 0.0, 0.0],
    ], dtype=torch.float64)
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-12)
    # token means over the 6 tokens: one clipped high (row 0, A > 0), one clipped low (row 1, A < 0);
    # ppo_kl = -(0.3 - 0.2 - 0.3 + 0.05 + 0.2 + 0) / 6 = -0.05 / 6
    assert metrics["actor/clipfrac_high"] == pytest.approx(1 / 6, abs=1e-12)
    assert metrics["actor/clipfrac_low"] == pytest.approx(1 / 6, abs=1e-12)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 6, abs=1e-12)
    assert metrics["actor/ppo_kl"] == pytest.approx(-0.05 / 6, abs=1e-12)


def test_token_mean_weights_each_response_by_its_length():
    loss, _, grad = _case("token-mean")
    assert float(loss.detach()) == pytest.approx((2 * ROW_LOSS[0] + 3 * ROW_LOSS[1] + ROW_LOSS[2]) / 6, abs=1e-12)
    assert float(grad[1, 2]) == pytest.approx(2 * math.exp(0.05) / 6, abs=1e-12)
    assert float(grad[2, 0]) == pytest.approx(-0.5 / 6, abs=1e-12)


def _plain_gmpo(log_prob, old, adv, mask, eps):
    """The paper's J_GMPO as written: the |o_i|-th root of the product of |min(rho A, clip(rho) A)|, times sgn A."""
    rows = []
    for i in range(log_prob.shape[0]):
        keep = mask[i]
        if not keep.any():
            continue
        rho = torch.exp(log_prob[i][keep] - old[i][keep])
        clipped = torch.clamp(rho, math.exp(-eps), math.exp(eps))
        terms = torch.minimum(rho * adv[i], clipped * adv[i]).abs()
        rows.append(torch.prod(terms) ** (1.0 / float(keep.sum())) * torch.sign(adv[i]))
    return -torch.stack(rows).mean()


def test_the_token_form_has_the_papers_value_and_gradient():
    gen = torch.Generator().manual_seed(8)
    lengths = torch.tensor([5, 1, 3, 0, 4])
    mask = torch.arange(5).unsqueeze(0) < lengths.unsqueeze(1)
    old = -torch.rand(5, 5, generator=gen, dtype=torch.float64) * 3
    log_prob = (old + 0.3 * torch.randn(5, 5, generator=gen, dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([1.0, -0.7, 0.4, 2.0, -1.5], dtype=torch.float64)
    loss, metrics = gmpo_loss(log_prob, old, adv, mask, log_clip_low=0.2, log_clip_high=0.2, loss_agg_mode="seq-mean-token-mean")
    (grad,) = torch.autograd.grad(loss, log_prob)
    plain = _plain_gmpo(log_prob, old, adv, mask, 0.2)
    (plain_grad,) = torch.autograd.grad(plain, log_prob)
    assert 0 < metrics["actor/pg_clipfrac"] < 1
    torch.testing.assert_close(loss.detach(), plain.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(grad, plain_grad, rtol=0, atol=1e-12)


def test_with_one_token_responses_gmpo_is_token_level_dapo_with_the_same_range():
    # |o_i| = 1: the geometric mean of one term is that term, DAPO's min(rho A, clip(rho) A) with the clip range
    # (e^-0.4, e^0.4), i.e. eps_low = 1 - e^-0.4, eps_high = e^0.4 - 1
    old = -torch.linspace(0.1, 2.0, 8, dtype=torch.float64).unsqueeze(-1)
    ratio = torch.tensor([[1.8], [0.5], [1.1], [0.6], [1.6], [0.95], [2.0], [0.62]], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0, 1.0, 0.5, 2.0], dtype=torch.float64)
    mask = torch.ones(8, 1, dtype=torch.bool)
    a_in, b_in = (old + ratio.log()).requires_grad_(True), (old + ratio.log()).requires_grad_(True)
    a, ma = gmpo_loss(a_in, old, adv, mask, log_clip_low=0.4, log_clip_high=0.4, loss_agg_mode="seq-mean-token-mean")
    b, mb = dapo_loss(b_in, old, adv, mask, clip_ratio_low=1 - math.exp(-0.4), clip_ratio_high=math.exp(0.4) - 1,
                        clip_ratio_c=None, loss_agg_mode="token-mean")
    (ga,), (gb,) = torch.autograd.grad(a, a_in), torch.autograd.grad(b, b_in)
    assert mb["actor/clipfrac_high"] > 0 and mb["actor/clipfrac_low"] > 0
    torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(ga, gb, rtol=0, atol=1e-12)
    for key in ("actor/clipfrac_high", "actor/clipfrac_low", "actor/pg_clipfrac"):
        assert ma[key] == pytest.approx(mb[key], abs=1e-12), key


def test_gmpo_refuses_per_token_advantages_and_bad_ranges():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="one advantage per response"):
        gmpo_loss(x, x, torch.zeros(2, 3), x, log_clip_low=0.4, log_clip_high=0.4, loss_agg_mode="token-mean")
    with pytest.raises(ValueError, match="log_clip_low > 0"):
        gmpo_loss(x, x, torch.zeros(2), x, log_clip_low=0.0, log_clip_high=0.4, loss_agg_mode="token-mean")
