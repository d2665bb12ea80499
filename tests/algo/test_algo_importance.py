"""Truncated importance weights and the mismatch sums, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from dapo_cli.algo.importance import mismatch_sums, truncated_is_weights
from dapo_cli.algo.losses import dapo_loss

# dapo_loss has no defaults: the paper's values (DAPO Eq. 10, token-level loss, no dual clip), passed explicitly.
PAPER_DAPO = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": None, "loss_agg_mode": "token-mean"}


def test_weights_are_the_ratio_truncated_at_the_cap_and_zero_off_the_mask():
    old = torch.tensor([[math.log(0.5), math.log(0.2), 0.0]])
    rollout = torch.tensor([[math.log(0.25), math.log(0.4), 5.0]])
    mask = torch.tensor([[True, True, False]])
    # ratios: 0.5/0.25 = 2 -> min(2, 1.5) = 1.5; 0.2/0.4 = 0.5 (below the cap, kept); masked -> 0
    w = truncated_is_weights(old, rollout, mask, cap=1.5)
    torch.testing.assert_close(w, torch.tensor([[1.5, 0.5, 0.0]]), rtol=0, atol=1e-6)
    assert not w.requires_grad


def test_garbage_on_padding_cannot_overflow_and_bad_arguments_raise():
    old = torch.tensor([[0.0, 1e4]])
    rollout = torch.tensor([[0.0, -1e4]])  # exp(2e4) would be inf; clamped, then masked
    w = truncated_is_weights(old, rollout, torch.tensor([[True, False]]), cap=2.0)
    assert torch.isfinite(w).all() and w.tolist() == [[1.0, 0.0]]
    with pytest.raises(ValueError, match="cap must be >= 1"):
        truncated_is_weights(old, rollout, torch.ones(1, 2, dtype=torch.bool), cap=0.5)
    with pytest.raises(ValueError, match="shapes differ"):
        truncated_is_weights(old, rollout[:, :1], torch.ones(1, 2, dtype=torch.bool), cap=2.0)


def test_mismatch_sums_count_only_masked_tokens():
    old = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, 0.0, 0.0]])
    rollout = torch.tensor([[-1.5, -2.0, -9.0], [-0.25, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    # |diffs| on the mask: 0.5, 0.0, 0.75 -> sum 1.25 over 3 tokens, max 0.75 (the 6.0 is padding)
    assert mismatch_sums(old, rollout, mask) == {"abs_diff": 1.25, "tokens": 3.0, "max_abs_diff": 0.75}
    assert mismatch_sums(old, rollout, torch.zeros_like(mask)) == {"abs_diff": 0.0, "tokens": 0.0, "max_abs_diff": 0.0}


def test_token_weights_scale_each_tokens_loss_not_the_denominator():
    # r = 1 everywhere (logp = old), A = +1: each token's loss is -1, token-mean over 3 tokens.
    # Weights 2, 1, 0.5 give loss = -(2 + 1 + 0.5) / 3 = -7/6; the gradient of each token's
    # log-prob is -w_t / 3.
    logp = torch.zeros(1, 3, requires_grad=True)
    old = torch.zeros(1, 3)
    mask = torch.ones(1, 3, dtype=torch.bool)
    loss, _ = dapo_loss(logp, old, torch.tensor([1.0]), mask, token_weights=torch.tensor([[2.0, 1.0, 0.5]]), **PAPER_DAPO)
    assert float(loss.detach()) == pytest.approx(-7 / 6, abs=1e-7)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-2 / 3, -1 / 3, -0.5 / 3]]), rtol=0, atol=1e-7)
    with pytest.raises(ValueError, match="token_weights shape"):
        dapo_loss(logp, old, torch.tensor([1.0]), mask, token_weights=torch.ones(1, 2), **PAPER_DAPO)
