"""Tests for dapo_cli.algo.losses: every clip branch, every aggregation mode, micro-batch invariance."""

from __future__ import annotations

import math

import pytest
import torch

from dapo_cli.algo.losses import LOSS_AGG_MODES, aggregate_loss, global_counts, masked_mean, policy_loss

# Six tokens in one response, eps_low = 0.2, eps_high = 0.28 (clip range [0.8, 1.28]), c = 3.
#   tok  A    r     -A*r   -A*clip(r)   max (PPO)        dual clip (A<0): min(., -A*c = 3|A|)
#   t1  +1   1.5   -1.5   -1.28        -1.28 clipped    -
#   t2  +1   0.5   -0.5   -0.8         -0.5  unclipped  -
#   t3  -1   0.5   +0.5   +0.8         +0.8  clipped    0.8 (3 not binding)
#   t4  -1   1.5   +1.5   +1.28        +1.5  unclipped  1.5 (3 not binding)
#   t5  -1   4.0   +4.0   +1.28        +4.0  unclipped  3.0 (binding)
#   t6  +2   1.1   -2.2   -2.2         -2.2  inside     -
ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0, 2.0]], dtype=torch.float64)
RATIO = torch.tensor([[1.5, 0.5, 0.5, 1.5, 4.0, 1.1]], dtype=torch.float64)
PPO_TOKENS = [-1.28, -0.5, 0.8, 1.5, 4.0, -2.2]
DUAL_TOKENS = [-1.28, -0.5, 0.8, 1.5, 3.0, -2.2]


def _clip_case(clip_ratio_c=None):
    old = torch.zeros_like(RATIO)
    log_prob = torch.log(RATIO).requires_grad_(True)
    loss, metrics = policy_loss(log_prob, old, ADV, torch.ones_like(RATIO, dtype=torch.bool), clip_ratio_c=clip_ratio_c)
    loss.backward()
    return loss, metrics, log_prob.grad


def test_ppo_clip_branches_loss_grad_and_metrics():
    loss, metrics, grad = _clip_case()
    # token-mean: (-1.28 - 0.5 + 0.8 + 1.5 + 4.0 - 2.2) / 6 = 2.32 / 6
    assert loss.item() == pytest.approx(2.32 / 6, abs=1e-12)
    assert metrics["actor/pg_loss"] == pytest.approx(2.32 / 6, abs=1e-12)
    # d(-A r)/d log pi = -A r on unclipped tokens, 0 on clipped ones; / 6 tokens.
    expected_grad = torch.tensor([[0.0, -0.5, 0.0, 1.5, 4.0, -2.2]], dtype=torch.float64) / 6
    torch.testing.assert_close(grad, expected_grad, rtol=0, atol=1e-12)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 6)  # t1, t3
    assert metrics["actor/clipfrac_high"] == pytest.approx(1 / 6)  # t1
    assert metrics["actor/clipfrac_low"] == pytest.approx(1 / 6)  # t3
    assert metrics["actor/pg_clipfrac_lower"] == 0.0
    # ppo_kl = mean(-log r) = -(2 ln 1.5 + 2 ln 0.5 + ln 4 + ln 1.1) / 6 = -(2 ln 1.5 + ln 1.1) / 6
    assert metrics["actor/ppo_kl"] == pytest.approx(-(2 * math.log(1.5) + math.log(1.1)) / 6, abs=1e-12)
    assert all(isinstance(v, float) for v in metrics.values())


def test_dual_clip_binds_only_for_large_ratio_negative_advantage():
    loss, metrics, grad = _clip_case(clip_ratio_c=3.0)
    # only t5 changes: 4.0 -> 3.0, so (2.32 - 1) / 6; its gradient becomes 0 (constant -A*c).
    assert loss.item() == pytest.approx(1.32 / 6, abs=1e-12)
    expected_grad = torch.tensor([[0.0, -0.5, 0.0, 1.5, 0.0, -2.2]], dtype=torch.float64) / 6
    torch.testing.assert_close(grad, expected_grad, rtol=0, atol=1e-12)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1 / 6)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 6)


def test_dual_clip_never_touches_positive_advantage():
    # A = +1, r = 10: PPO gives -1.28 (clipped high); the dual clip (c = 3) must leave it alone.
    log_prob = torch.log(torch.tensor([[10.0]], dtype=torch.float64))
    loss, metrics = policy_loss(log_prob, torch.zeros(1, 1, dtype=torch.float64), torch.tensor([1.0]),
                                torch.ones(1, 1), clip_ratio_c=3.0)
    assert loss.item() == pytest.approx(-1.28, abs=1e-12)
    assert metrics["actor/pg_clipfrac_lower"] == 0.0 and metrics["actor/clipfrac_high"] == 1.0


def test_per_token_losses_and_masking():
    # Masking out t5 and t6: (-1.28 - 0.5 + 0.8 + 1.5) / 4 = 0.13; clipfrac over 4 tokens = 2/4.
    mask = torch.tensor([[1, 1, 1, 1, 0, 0]], dtype=torch.float32)
    loss, metrics = policy_loss(torch.log(RATIO), torch.zeros_like(RATIO), ADV, mask)
    assert loss.item() == pytest.approx(0.13, abs=1e-12)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)
    # Per-token values via seq-mean-token-sum on one row = plain sum of token losses.
    for tokens, c in ((PPO_TOKENS, None), (DUAL_TOKENS, 3.0)):
        for i, value in enumerate(tokens):
            one = torch.zeros(1, 6, dtype=torch.bool)
            one[0, i] = True
            loss, _ = policy_loss(torch.log(RATIO), torch.zeros_like(RATIO), ADV, one,
                                  clip_ratio_c=c, loss_agg_mode="seq-mean-token-sum")
            assert loss.item() == pytest.approx(value, abs=1e-12)


def test_advantages_broadcast_and_log_ratio_clamp():
    log_prob = torch.tensor([[30.0, 0.0]], dtype=torch.float64)
    old = torch.zeros_like(log_prob)
    mask = torch.ones_like(log_prob)
    # log-ratio 30 is clamped to 20 -> r = e^20; A = -1 (unclipped branch) -> loss e^20 on token 0.
    loss_b, metrics = policy_loss(log_prob, old, torch.tensor([-1.0]), mask)
    loss_bt, _ = policy_loss(log_prob, old, torch.tensor([[-1.0, -1.0]]), mask)
    assert loss_b.item() == loss_bt.item() == pytest.approx((math.exp(20.0) + 1.0) / 2, rel=1e-12)
    assert metrics["actor/ppo_kl"] == pytest.approx(-10.0)  # mean(-20, 0)


def test_invalid_arguments():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        policy_loss(x, x, torch.ones(1), x, clip_ratio_c=1.0)
    with pytest.raises(ValueError, match=", ".join(LOSS_AGG_MODES)):
        policy_loss(x, x, torch.ones(1), x, loss_agg_mode="sample-mean")
    assert LOSS_AGG_MODES == ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="valid"):
        aggregate_loss(x, x, "mean")
    with pytest.raises(ValueError, match="mask shape"):
        aggregate_loss(x, torch.zeros(2, 2), "token-mean")


# Ragged 3x4 example; row 2 is empty; a NaN on padding must not leak into the loss.
LOSS_MAT = torch.tensor([[1.0, 2.0, 3.0, float("nan")], [5.0, 6.0, 7.0, 8.0], [9.0, 10.0, 11.0, 12.0]],
                        dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)


@pytest.mark.parametrize(
    ("mode", "kwargs", "expected"),
    [
        ("token-mean", {}, 29 / 6),  # (1+2 + 5+6+7+8) / 6 tokens
        ("token-mean", {"global_tokens": 10}, 29 / 10),
        ("seq-mean-token-mean", {}, (1.5 + 6.5) / 2),  # row means 3/2, 26/4; 2 non-empty rows
        ("seq-mean-token-mean", {"global_seqs": 4}, (1.5 + 6.5) / 4),
        ("seq-mean-token-sum", {}, (3 + 26) / 2),
        ("seq-mean-token-sum", {"global_seqs": 4}, 29 / 4),
        ("seq-mean-token-sum-norm", {}, 29 / (3 * 4)),  # B = 3 rows (empty one too), T = 4
        ("seq-mean-token-sum-norm", {"norm_length": 10}, 29 / (3 * 10)),
        ("seq-mean-token-sum-norm", {"global_seqs": 4, "norm_length": 10}, 29 / (4 * 10)),
    ],
)
def test_aggregation_modes_hand_derived(mode, kwargs, expected):
    assert aggregate_loss(LOSS_MAT, MASK, mode, **kwargs).item() == pytest.approx(expected, abs=1e-12)
    float_mask = MASK.to(torch.float32)
    assert aggregate_loss(LOSS_MAT, float_mask, mode, **kwargs).item() == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_empty_mask_gives_zero_loss_with_grad(mode):
    log_prob = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    empty = torch.zeros(2, 3, dtype=torch.bool)
    loss, metrics = policy_loss(log_prob, log_prob.detach() - 0.1, torch.tensor([1.0, -1.0]), empty,
                                loss_agg_mode=mode)
    assert loss.item() == 0.0 and loss.grad_fn is not None
    loss.backward()
    assert torch.equal(log_prob.grad, torch.zeros(2, 3, dtype=torch.float64))
    assert metrics["actor/pg_clipfrac"] == 0.0 and metrics["actor/ppo_kl"] == 0.0
    for kwargs in ({"global_tokens": 0, "global_seqs": 0}, {"global_tokens": 0.0, "global_seqs": 0.0}):
        assert aggregate_loss(log_prob, empty, mode, **kwargs).item() == 0.0


def test_global_counts():
    assert global_counts(MASK, "token-mean") == {"global_tokens": 6.0, "global_seqs": 2.0}
    assert global_counts(MASK, "seq-mean-token-mean")["global_seqs"] == 2.0
    assert global_counts(MASK, "seq-mean-token-sum-norm")["global_seqs"] == 3.0  # all rows: B
    with pytest.raises(ValueError, match="valid"):
        global_counts(MASK, "bogus")


def test_masked_mean():
    assert masked_mean(torch.tensor([[1.0, 3.0, 100.0]]), torch.tensor([[True, True, False]])) == 2.0
    assert masked_mean(torch.ones(1, 2), torch.zeros(1, 2)) == 0.0


def _minibatch():
    """B = 8, T = 7, ragged lengths (row 5 empty), ratios spread so that both clip sides fire."""
    gen = torch.Generator().manual_seed(7)
    lengths = torch.tensor([7, 3, 1, 5, 6, 0, 2, 4])
    mask = torch.arange(7).unsqueeze(0) < lengths.unsqueeze(1)  # [8, 7]
    log_prob = torch.randn(8, 7, generator=gen, dtype=torch.float64) - 1.0
    old = log_prob + 0.4 * torch.randn(8, 7, generator=gen, dtype=torch.float64)
    adv = torch.randn(8, generator=gen, dtype=torch.float64)
    return log_prob, old, adv, mask


def _summed_grad(mode, num_micro, use_global):
    log_prob, old, adv, mask = _minibatch()
    log_prob.requires_grad_(True)
    counts = global_counts(mask, mode) if use_global else {}
    total = torch.zeros((), dtype=torch.float64)
    for rows in torch.arange(8).chunk(num_micro):
        loss, _ = policy_loss(log_prob[rows], old[rows], adv[rows], mask[rows], loss_agg_mode=mode,
                              clip_ratio_c=3.0, **counts)
        total = total + loss
    total.backward()
    return total.detach(), log_prob.grad


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_microbatch_split_with_global_counts_matches_whole_minibatch(mode):
    whole_loss, whole_grad = _summed_grad(mode, 1, use_global=False)
    assert whole_grad.abs().sum() > 0
    for num_micro in (1, 2, 4):
        loss, grad = _summed_grad(mode, num_micro, use_global=True)
        torch.testing.assert_close(loss, whole_loss, rtol=0, atol=1e-6)
        torch.testing.assert_close(grad, whole_grad, rtol=0, atol=1e-6)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_microbatch_split_without_global_counts_differs(mode):
    # Local counts differ per micro-batch (ragged rows, an empty row), so summing local means is wrong.
    _, whole_grad = _summed_grad(mode, 1, use_global=False)
    _, split_grad = _summed_grad(mode, 4, use_global=False)
    assert (split_grad - whole_grad).abs().max() > 1e-2
