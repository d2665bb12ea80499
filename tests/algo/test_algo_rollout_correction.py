"""The rollout corrections (``algo/rollout_correction.py``) by hand, the ratio statistics, and the decoupled loss
with each of them."""

from __future__ import annotations

import math

import pytest
import torch

from dapo_cli.algo.importance import ratio_sums
from dapo_cli.algo.losses import global_counts, dapo_loss
from dapo_cli.algo.objectives import get_policy_loss
from dapo_cli.algo.rollout_correction import (
    ROLLOUT_CORRECTION_NAMES,
    correction_sums,
    geo_mask_keep,
    opsm_keep,
    rollout_correction,
    seq_truncated_is_weights,
)
from dapo_cli.algo.staleness import decoupled_policy_loss


def test_seq_tis_weights_each_response_by_its_truncated_sequence_ratio():
    # rollout log-probs 0; old: row 0 ln 2 + ln 1.5 -> R = 3 -> min(3, 2) = 2 on both tokens; row 1 ln 0.5 -> 0.5;
    # the padding (log 40 on row 1, token 1) is outside the sum and gets weight 0
    old = torch.tensor([[math.log(2.0), math.log(1.5)], [math.log(0.5), math.log(40.0)]], dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, False]])
    w = seq_truncated_is_weights(old, torch.zeros_like(old), mask, cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 2.0], [0.5, 0.0]], dtype=torch.float64), rtol=0, atol=1e-12)
    # its sums are at the sequence level: weights 2 + 0.5, one of the two sequences above the cap
    assert correction_sums("seq_tis", old, torch.zeros_like(old), mask, cap=2.0) == pytest.approx(
        {"weight": 2.5, "truncated": 1.0, "count": 2.0}, abs=1e-12)
    # token_tis over the same tokens: min(2, 2) + min(1.5, 2) + min(0.5, 2); none strictly above the cap
    assert correction_sums("token_tis", old, torch.zeros_like(old), mask, cap=2.0) == pytest.approx(
        {"weight": 4.0, "truncated": 0.0, "count": 3.0}, abs=1e-12)
    assert correction_sums("opsm", old, torch.zeros_like(old), mask, opsm_delta=0.1) == {}


def test_geo_mask_keeps_a_response_whose_geometric_mean_ratio_is_within_one_over_c_and_c():
    # c = 1.001, so the band is [0.999000999, 1.001]:
    #   row 0: mean(0.002, 0.0) = 0.001 -> g = e^0.001 = 1.0010005 > 1.001: dropped
    #   row 1: mean(0.0009, 0.0009) = 0.0009 -> g = 1.00090040: kept
    #   row 2: -0.0011 -> g = 0.99890060 < 0.999000999: dropped
    #   row 3: no token -> g = 1: kept (nothing to drop)
    old = torch.tensor([[0.002, 0.0], [0.0009, 0.0009], [-0.0011, 3.0], [5.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, True], [True, False], [False, False]])
    keep = geo_mask_keep(old, torch.zeros_like(old), mask, geo_bound=1.001)
    assert keep.tolist() == [False, True, False, True]
    with pytest.raises(ValueError, match="geo_bound must be > 1"):
        geo_mask_keep(old, old, mask, geo_bound=1.0)


def test_opsm_masks_negative_advantage_responses_that_drifted_past_delta():
    # divergence = mean(log pi_rollout - log pi_theta); delta 0.1
    #   row 0: A -1, rollout -1.0 vs theta -1.2 on both tokens -> 0.2 > 0.1: masked
    #   row 1: A +1, the same drift -> kept (only negative advantages are masked)
    #   row 2: A -1, drift 0.05 -> kept
    theta = torch.tensor([[-1.2, -1.2], [-1.2, -1.2], [-1.05, -1.05]], dtype=torch.float64)
    rollout = torch.full_like(theta, -1.0)
    mask = torch.ones_like(theta, dtype=torch.bool)
    adv = torch.tensor([-1.0, 1.0, -1.0], dtype=torch.float64)
    keep = opsm_keep(theta, rollout, adv, mask, opsm_delta=0.1)
    assert keep.tolist() == [[False, False], [True, True], [True, True]]
    _, weights, metrics = rollout_correction("opsm", log_prob=theta, old_log_prob=theta, rollout_log_prob=rollout,
                                             advantages=adv, mask=mask, opsm_delta=0.1)
    torch.testing.assert_close(weights, keep.to(torch.float64), rtol=0, atol=0)
    assert metrics == {"rollout/masked_seq_frac": pytest.approx(1 / 3, abs=1e-12)}


def test_the_token_probability_ratio_statistics():
    # rho = pi_old / pi_rollout on the mask: e^0.1, e^-0.2, 1 (the 7.0 is padding)
    old = torch.tensor([[0.1, -0.2], [0.0, 7.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, False]])
    sums = ratio_sums(old, torch.zeros_like(old), mask)
    assert sums["ratio"] == pytest.approx(math.exp(0.1) + math.exp(-0.2) + 1.0, abs=1e-12)
    # e^|log rho|: e^0.1 + e^0.2 + 1
    assert sums["mult_error"] == pytest.approx(math.exp(0.1) + math.exp(0.2) + 1.0, abs=1e-12)
    assert sums["ratio_min"] == pytest.approx(math.exp(-0.2), abs=1e-12)
    assert sums["ratio_max"] == pytest.approx(math.exp(0.1), abs=1e-12)
    empty = ratio_sums(old, old, torch.zeros_like(mask))
    assert empty["ratio_min"] == math.inf and empty["ratio_max"] == -math.inf and empty["ratio"] == 0.0


def test_geo_mask_drops_rows_from_the_loss_and_its_denominator():
    # The decoupled loss with geo_mask is dapo_loss on the kept rows only: the dropped row is out of the token
    # mean's denominator, not a zero-weighted row in it.
    gen = torch.Generator().manual_seed(2)
    logp = (-torch.rand(3, 4, generator=gen, dtype=torch.float64)).requires_grad_(True)
    prox = logp.detach() - 0.01
    behav = prox.clone()
    behav[1] -= 0.5  # row 1: g = e^0.5, far outside [1/1.001, 1.001]: dropped
    mask = torch.ones(3, 4, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)
    a, _ = decoupled_policy_loss(logp, prox, behav, adv, mask, correction="geo_mask", correction_args={"geo_bound": 1.001},
                                 loss=dapo_loss, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=None, loss_agg_mode="token-mean")
    kept = mask.clone()
    kept[1] = False
    b, _ = dapo_loss(logp, prox, adv, kept, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=None, loss_agg_mode="token-mean")
    assert float(a.detach()) == pytest.approx(float(b.detach()), abs=1e-12)
    # with global counts, the caller counts only the kept rows (ROW_FILTERS): the same loss again
    counts = global_counts(kept, "token-mean")
    c, _ = decoupled_policy_loss(logp, prox, behav, adv, mask, correction="geo_mask", correction_args={"geo_bound": 1.001},
                                 loss=dapo_loss, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=None, loss_agg_mode="token-mean",
                                 **counts)
    assert float(c.detach()) == pytest.approx(float(b.detach()), abs=1e-12)


@pytest.mark.parametrize("loss", ["gspo", "cispo"])
def test_the_decoupled_objective_takes_any_registered_loss(loss):
    # the seq_tis weight of a response scales its whole term: with one response, R = e^0.3 (cap 2), the decoupled
    # loss and gradient are w times the loss's own
    logp = torch.tensor([[-1.0, -0.5, -2.0]], dtype=torch.float64, requires_grad=True)
    prox = logp.detach() - torch.tensor([[0.01, -0.02, 0.005]], dtype=torch.float64)
    behav = prox - 0.1
    mask, adv = torch.ones(1, 3, dtype=torch.bool), torch.tensor([1.0], dtype=torch.float64)
    args = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.3, "loss_agg_mode": "token-mean"}
    a, _ = decoupled_policy_loss(logp, prox, behav, adv, mask, correction="seq_tis", correction_args={"cap": 2.0},
                                 loss=get_policy_loss(loss), **args)
    (ga,) = torch.autograd.grad(a, logp)
    b, _ = get_policy_loss(loss)(logp, prox, adv, mask, **args)
    (gb,) = torch.autograd.grad(b, logp)
    w = math.exp(0.3)
    assert float(a.detach()) == pytest.approx(w * float(b.detach()), abs=1e-12)
    torch.testing.assert_close(ga, w * gb, rtol=0, atol=1e-12)


def test_an_unknown_correction_lists_the_valid_ones():
    x = torch.zeros(1, 1)
    with pytest.raises(ValueError, match=", ".join(ROLLOUT_CORRECTION_NAMES)):
        rollout_correction("is", log_prob=x, old_log_prob=x, rollout_log_prob=x, advantages=torch.ones(1), mask=x.bool())
    assert ROLLOUT_CORRECTION_NAMES == ("token_tis", "seq_tis", "geo_mask", "opsm")
