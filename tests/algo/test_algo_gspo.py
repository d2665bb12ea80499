"""GSPO (``algo/gspo.py``): a hand-derived example, the plain sequence-level formula, and where it equals DAPO."""

from __future__ import annotations

import math

import pytest
import torch

from dapo_cli.algo.gspo import gspo_loss
from dapo_cli.algo.losses import dapo_loss

# Four responses, T = 3, log π_old = 0 so log π_θ is the per-token log-ratio; eps_low 0.1, eps_high 0.05
# (sequence clip range [0.9, 1.05]; not the paper's 3e-4 / 4e-4, so that both sides bind on round numbers).
#   row  tokens (log r)        |o|  mean    s_i = e^mean        A     -A s          -A clip(s)       max (loss)
#   0    0.3, -0.1, [pad 5.0]  2    0.1     1.105170918 (>1.05)  +1   -1.105170918  -1.05            -1.05  clipped high
#   1    -0.2, -0.2, -0.2      3    -0.2    0.818730753 (<0.9)   -2   +1.637461506  +1.8             +1.8   clipped low
#   2    0.02, [pad], [pad]    1    0.02    1.020201340 (inside) +0.5 -0.510100670  -0.510100670    -0.510100670
#   3    0.1, -0.1, 0.0        3    0.0     1.0         (inside) -1   +1            +1               +1
LOG_R = torch.tensor([[0.3, -0.1, 5.0], [-0.2, -0.2, -0.2], [0.02, -9.0, 7.0], [0.1, -0.1, 0.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
ADV = torch.tensor([1.0, -2.0, 0.5, -1.0], dtype=torch.float64)
ROW_LOSS = [-1.05, 1.8, -0.5 * math.exp(0.02), 1.0]


def _case(mode):
    log_prob = LOG_R.clone().requires_grad_(True)
    loss, metrics = gspo_loss(log_prob, torch.zeros_like(LOG_R), ADV, MASK, clip_ratio_low=0.1, clip_ratio_high=0.05,
                              loss_agg_mode=mode)
    loss.backward()
    return loss, metrics, log_prob.grad


def test_seq_mean_token_mean_is_the_papers_objective_by_hand():
    loss, metrics, grad = _case("seq-mean-token-mean")
    # 1/G Σ_i loss_i over the 4 rows: (-1.05 + 1.8 - 0.51010067 + 1) / 4
    assert float(loss.detach()) == pytest.approx(sum(ROW_LOSS) / 4, abs=1e-12)
    # clipped rows 0 and 1 get no gradient; an unclipped row's token t gets (1/G)(1/|o_i|) · (-A_i s_i):
    #   row 2 (|o| = 1): (1/4)(-0.5 e^0.02);  row 3 (|o| = 3): (1/4)(1/3)(+1 · 1) = 1/12 each; padding 0
    expected = torch.tensor([[0, 0, 0], [0, 0, 0], [-0.5 * math.exp(0.02) / 4, 0, 0], [1 / 12, 1 / 12, 1 / 12]],
                            dtype=torch.float64)
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-12)
    # sequence-level clip fractions over the 4 rows; |s - 1| mean; ppo_kl = token mean of -log r over 9 tokens:
    #   -(0.3 - 0.1 - 0.6 + 0.02 + 0) / 9 = 0.38 / 9
    assert metrics["actor/seq_clipfrac"] == pytest.approx(2 / 4, abs=1e-12)
    assert metrics["actor/seq_clipfrac_high"] == pytest.approx(1 / 4, abs=1e-12)
    assert metrics["actor/seq_clipfrac_low"] == pytest.approx(1 / 4, abs=1e-12)
    dev = (math.exp(0.1) - 1) + (1 - math.exp(-0.2)) + (math.exp(0.02) - 1) + 0.0
    assert metrics["actor/seq_ratio_dev"] == pytest.approx(dev / 4, abs=1e-12)
    assert metrics["actor/ppo_kl"] == pytest.approx(0.38 / 9, abs=1e-12)
    assert metrics["actor/pg_loss"] == pytest.approx(sum(ROW_LOSS) / 4, abs=1e-12)


def test_token_mean_weights_each_response_by_its_length():
    loss, _, grad = _case("token-mean")
    # Σ_i |o_i| loss_i / Σ|o| = (2·(-1.05) + 3·1.8 + 1·(-0.51010067) + 3·1) / 9
    lengths = [2, 3, 1, 3]
    assert float(loss.detach()) == pytest.approx(sum(n * v for n, v in zip(lengths, ROW_LOSS)) / 9, abs=1e-12)
    # row 2's token: -0.5 e^0.02 / 9; row 3's tokens: 1/9 each
    expected = torch.tensor([[0, 0, 0], [0, 0, 0], [-0.5 * math.exp(0.02) / 9, 0, 0], [1 / 9, 1 / 9, 1 / 9]],
                            dtype=torch.float64)
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-12)


def _plain_gspo(log_prob, old, adv, mask, lo, hi):
    """The paper's J_GSPO written directly: s_i with its full gradient, one min per sequence, mean over sequences."""
    rows = []
    for i in range(log_prob.shape[0]):
        keep = mask[i]
        if not keep.any():
            continue
        s = torch.exp((log_prob[i][keep] - old[i][keep]).mean())
        rows.append(torch.maximum(-adv[i] * s, -adv[i] * torch.clamp(s, 1 - lo, 1 + hi)))
    return torch.stack(rows).mean()


def test_the_gspo_token_form_has_the_sequence_formulas_value_and_gradient():
    gen = torch.Generator().manual_seed(3)
    lengths = torch.tensor([5, 1, 3, 0, 4, 2])
    mask = torch.arange(5).unsqueeze(0) < lengths.unsqueeze(1)  # [6, 5], row 3 empty
    old = -torch.rand(6, 5, generator=gen, dtype=torch.float64) * 3
    log_prob = (old + 0.05 * torch.randn(6, 5, generator=gen, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(6, generator=gen, dtype=torch.float64)
    loss, metrics = gspo_loss(log_prob, old, adv, mask, clip_ratio_low=0.01, clip_ratio_high=0.02,
                              loss_agg_mode="seq-mean-token-mean")
    (grad,) = torch.autograd.grad(loss, log_prob)
    plain = _plain_gspo(log_prob, old, adv, mask, 0.01, 0.02)
    (plain_grad,) = torch.autograd.grad(plain, log_prob)
    assert 0 < metrics["actor/seq_clipfrac"] < 1  # both branches present
    torch.testing.assert_close(loss.detach(), plain.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(grad, plain_grad, rtol=0, atol=1e-12)


def test_with_one_token_responses_gspo_is_token_level_dapo_with_the_same_epsilons():
    # |o_i| = 1: s_i is that token's ratio, and the sequence mean is the token mean (the paper's reduction)
    old = -torch.linspace(0.1, 2.0, 8, dtype=torch.float64).unsqueeze(-1)
    ratio = torch.tensor([[1.5], [0.5], [1.1], [0.7], [1.3], [0.95], [2.0], [0.6]], dtype=torch.float64)
    base = old + ratio.log()
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0, 1.0, 0.5, 2.0], dtype=torch.float64)
    mask = torch.ones(8, 1, dtype=torch.bool)
    a_in, b_in = base.clone().requires_grad_(True), base.clone().requires_grad_(True)
    a, ma = gspo_loss(a_in, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode="seq-mean-token-mean")
    b, mb = dapo_loss(b_in, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=None, loss_agg_mode="token-mean")
    (ga,), (gb,) = torch.autograd.grad(a, a_in), torch.autograd.grad(b, b_in)
    assert mb["actor/clipfrac_high"] > 0 and mb["actor/clipfrac_low"] > 0  # the clip binds on both sides
    torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(ga, gb, rtol=0, atol=1e-12)
    assert ma["actor/seq_clipfrac_high"] == pytest.approx(mb["actor/clipfrac_high"], abs=1e-12)
    assert ma["actor/seq_clipfrac_low"] == pytest.approx(mb["actor/clipfrac_low"], abs=1e-12)


def test_when_a_responses_tokens_share_one_ratio_gspo_is_dapo_with_the_sequence_mean():
    # every token of row i has ratio r_i: s_i = r_i, so GSPO (seq-mean-token-mean) = DAPO (seq-mean-token-mean)
    gen = torch.Generator().manual_seed(6)
    lengths = torch.tensor([4, 2, 3, 1])
    mask = torch.arange(4).unsqueeze(0) < lengths.unsqueeze(1)
    old = -torch.rand(4, 4, generator=gen, dtype=torch.float64)
    shift = 0.3 * torch.randn(4, 1, generator=gen, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0], dtype=torch.float64)
    a_in, b_in = (old + shift).requires_grad_(True), (old + shift).requires_grad_(True)
    a, _ = gspo_loss(a_in, old, adv, mask, clip_ratio_low=0.1, clip_ratio_high=0.1, loss_agg_mode="seq-mean-token-mean")
    b, _ = dapo_loss(b_in, old, adv, mask, clip_ratio_low=0.1, clip_ratio_high=0.1, clip_ratio_c=None,
                       loss_agg_mode="seq-mean-token-mean")
    (ga,), (gb,) = torch.autograd.grad(a, a_in), torch.autograd.grad(b, b_in)
    torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(ga, gb, rtol=0, atol=1e-12)


def test_gspo_refuses_per_token_advantages_and_bad_epsilons():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="one advantage per response"):
        gspo_loss(x, x, torch.zeros(2, 3), x, clip_ratio_low=3e-4, clip_ratio_high=4e-4, loss_agg_mode="token-mean")
    with pytest.raises(ValueError, match="clip_ratio_low < 1"):
        gspo_loss(x, x, torch.zeros(2), x, clip_ratio_low=1.5, clip_ratio_high=4e-4, loss_agg_mode="token-mean")
