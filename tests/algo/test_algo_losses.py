"""Tests for dapo_cli.algo.losses: every clip branch, every aggregation mode, micro-batch invariance (of every
registered policy loss, ``algo/objectives.POLICY_LOSSES``)."""

from __future__ import annotations

import math

import pytest
import torch

from functools import partial

from dapo_cli.algo.losses import LOSS_AGG_MODES, aggregate_loss, global_counts, masked_mean
from dapo_cli.algo.losses import dapo_loss as dapo_policy_loss
from dapo_cli.algo.objectives import POLICY_LOSS_NAMES, SEQUENCE_METRICS, get_policy_loss

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

# dapo_loss has no defaults: the paper's values (DAPO Eq. 10, token-level loss, no dual clip), passed explicitly.
dapo_loss = partial(dapo_policy_loss, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=None, loss_agg_mode="token-mean")


def _clip_case(clip_ratio_c=None):
    old = torch.zeros_like(RATIO)
    log_prob = torch.log(RATIO).requires_grad_(True)
    loss, metrics = dapo_loss(log_prob, old, ADV, torch.ones_like(RATIO, dtype=torch.bool), clip_ratio_c=clip_ratio_c)
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
    loss, metrics = dapo_loss(log_prob, torch.zeros(1, 1, dtype=torch.float64), torch.tensor([1.0]),
                                torch.ones(1, 1), clip_ratio_c=3.0)
    assert loss.item() == pytest.approx(-1.28, abs=1e-12)
    assert metrics["actor/pg_clipfrac_lower"] == 0.0 and metrics["actor/clipfrac_high"] == 1.0


def test_per_token_losses_and_masking():
    # Masking out t5 and t6: (-1.28 - 0.5 + 0.8 + 1.5) / 4 = 0.13; clipfrac over 4 tokens = 2/4.
    mask = torch.tensor([[1, 1, 1, 1, 0, 0]], dtype=torch.float32)
    loss, metrics = dapo_loss(torch.log(RATIO), torch.zeros_like(RATIO), ADV, mask)
    assert loss.item() == pytest.approx(0.13, abs=1e-12)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)
    # Per-token values via seq-mean-token-sum on one row = plain sum of token losses.
    for tokens, c in ((PPO_TOKENS, None), (DUAL_TOKENS, 3.0)):
        for i, value in enumerate(tokens):
            one = torch.zeros(1, 6, dtype=torch.bool)
            one[0, i] = True
            loss, _ = dapo_loss(torch.log(RATIO), torch.zeros_like(RATIO), ADV, one,
                                  clip_ratio_c=c, loss_agg_mode="seq-mean-token-sum")
            assert loss.item() == pytest.approx(value, abs=1e-12)


def test_advantages_broadcast_and_log_ratio_clamp():
    log_prob = torch.tensor([[30.0, 0.0]], dtype=torch.float64)
    old = torch.zeros_like(log_prob)
    mask = torch.ones_like(log_prob)
    # log-ratio 30 is clamped to 20 -> r = e^20; A = -1 (unclipped branch) -> loss e^20 on token 0.
    loss_b, metrics = dapo_loss(log_prob, old, torch.tensor([-1.0]), mask)
    loss_bt, _ = dapo_loss(log_prob, old, torch.tensor([[-1.0, -1.0]]), mask)
    assert loss_b.item() == loss_bt.item() == pytest.approx((math.exp(20.0) + 1.0) / 2, rel=1e-12)
    assert metrics["actor/ppo_kl"] == pytest.approx(-10.0)  # mean(-20, 0)


def test_invalid_arguments():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        dapo_loss(x, x, torch.ones(1), x, clip_ratio_c=1.0)
    with pytest.raises(ValueError, match=", ".join(LOSS_AGG_MODES)):
        dapo_loss(x, x, torch.ones(1), x, loss_agg_mode="sample-mean")
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
    loss, metrics = dapo_loss(log_prob, log_prob.detach() - 0.1, torch.tensor([1.0, -1.0]), empty,
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


LOSS_ARGS = {
    # hyper-parameters chosen so that every clip of every loss binds on this mini-batch (checked below)
    "dapo": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 1.4},
    "gspo": {"clip_ratio_low": 0.05, "clip_ratio_high": 0.08},
    "cispo": {"clip_ratio_low": 0.3, "clip_ratio_high": 0.4},
    "gmpo": {"log_clip_low": 0.2, "log_clip_high": 0.2},
}
CLIP_METRICS = {
    "dapo": ("actor/clipfrac_high", "actor/clipfrac_low", "actor/pg_clipfrac_lower"),
    "gspo": ("actor/seq_clipfrac_high", "actor/seq_clipfrac_low"),
    "cispo": ("actor/is_clipfrac_high", "actor/is_clipfrac_low"),
    "gmpo": ("actor/clipfrac_high", "actor/clipfrac_low"),
}


def _summed_grad(mode, num_micro, use_global, loss="dapo"):
    """The summed micro-batch loss, its gradient, and the micro-batches' metrics combined as the update combines
    them (token means weighted by tokens, SEQUENCE_METRICS by the rows holding a token, pg_loss summed)."""
    log_prob, old, adv, mask = _minibatch()
    log_prob.requires_grad_(True)
    counts = global_counts(mask, mode) if use_global else {}
    total = torch.zeros((), dtype=torch.float64)
    sums: dict[str, float] = {}
    for rows in torch.arange(8).chunk(num_micro):
        value, metrics = get_policy_loss(loss)(log_prob[rows], old[rows], adv[rows], mask[rows], loss_agg_mode=mode,
                                               **LOSS_ARGS[loss], **counts)
        total = total + value
        tokens, seqs = float(mask[rows].sum()), float(mask[rows].any(-1).sum())
        for key, v in metrics.items():
            weight = 1.0 if key == "actor/pg_loss" else seqs if key in SEQUENCE_METRICS else tokens
            sums[key] = sums.get(key, 0.0) + v * weight
    total.backward()
    tokens, seqs = float(mask.sum()), float(mask.any(-1).sum())
    combined = {k: v if k == "actor/pg_loss" else v / (seqs if k in SEQUENCE_METRICS else tokens) for k, v in sums.items()}
    return total.detach(), log_prob.grad, combined


@pytest.mark.parametrize("loss", POLICY_LOSS_NAMES)
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_microbatch_split_with_global_counts_matches_whole_minibatch(mode, loss):
    whole_loss, whole_grad, whole_metrics = _summed_grad(mode, 1, use_global=False, loss=loss)
    assert whole_grad.abs().sum() > 0
    assert all(whole_metrics[key] > 0 for key in CLIP_METRICS[loss]), whole_metrics  # every clip binds somewhere
    for num_micro in (1, 2, 4):
        value, grad, metrics = _summed_grad(mode, num_micro, use_global=True, loss=loss)
        torch.testing.assert_close(value, whole_loss, rtol=0, atol=1e-6)
        torch.testing.assert_close(grad, whole_grad, rtol=0, atol=1e-6)
        assert metrics.keys() == whole_metrics.keys()
        for key, v in whole_metrics.items():
            assert metrics[key] == pytest.approx(v, rel=1e-9, abs=1e-12), (num_micro, key)


@pytest.mark.parametrize("loss", POLICY_LOSS_NAMES)
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_microbatch_split_without_global_counts_differs(mode, loss):
    # Local counts differ per micro-batch (ragged rows, an empty row), so summing local means is wrong.
    _, whole_grad, _ = _summed_grad(mode, 1, use_global=False, loss=loss)
    _, split_grad, _ = _summed_grad(mode, 4, use_global=False, loss=loss)
    assert (split_grad - whole_grad).abs().max() > 1e-3
