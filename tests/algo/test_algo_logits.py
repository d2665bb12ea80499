"""Tests for dapo_cli.algo.logits against torch.log_softmax and Categorical.entropy (float64)."""

from __future__ import annotations

import math

import pytest
import torch

from dapo_cli.algo.logits import entropy_from_logits, mean_token_prob, token_log_probs


def _random(scale=3.0):
    gen = torch.Generator().manual_seed(3)
    logits = scale * torch.randn(2, 5, 17, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, 17, (2, 5), generator=gen)
    return logits, tokens


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
def test_token_log_probs_match_log_softmax(temperature):
    logits, tokens = _random()
    logits.requires_grad_(True)
    got = token_log_probs(logits, tokens, temperature=temperature)
    ref = torch.log_softmax(logits / temperature, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-10)
    (grad,) = torch.autograd.grad(got.sum(), logits)
    (ref_grad,) = torch.autograd.grad(ref.sum(), logits)
    torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-10)


def test_token_log_probs_hand_derived():
    # logits [0, ln 3] -> probs [1/4, 3/4]; at temperature 0.5 -> logits [0, 2 ln 3] -> probs [1/10, 9/10].
    logits = torch.tensor([[[0.0, math.log(3.0)]]], dtype=torch.float64)
    tokens = torch.tensor([[1]])
    assert token_log_probs(logits, tokens).item() == pytest.approx(math.log(0.75), abs=1e-12)
    assert token_log_probs(logits, tokens, temperature=0.5).item() == pytest.approx(math.log(0.9), abs=1e-12)
    with pytest.raises(ValueError, match="temperature"):
        token_log_probs(logits, tokens, temperature=0.0)
    with pytest.raises(ValueError, match=r"\[B, T, V\]"):
        token_log_probs(logits[0], tokens)


@pytest.mark.parametrize("scale", [3.0, 300.0])
def test_entropy_matches_categorical(scale):
    logits, _ = _random(scale)
    got = entropy_from_logits(logits)
    ref = torch.distributions.Categorical(logits=logits).entropy()
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-9)


def test_entropy_hand_derived():
    # uniform over 4 -> ln 4; probs [1/4, 3/4] -> -(1/4 ln 1/4 + 3/4 ln 3/4).
    logits = torch.zeros(1, 1, 4, dtype=torch.float64)
    assert entropy_from_logits(logits).item() == pytest.approx(math.log(4.0), abs=1e-12)
    two = torch.tensor([[[0.0, math.log(3.0)]]], dtype=torch.float64)
    expected = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert entropy_from_logits(two).item() == pytest.approx(expected, abs=1e-12)


def test_mean_token_prob():
    # exp(log p) over the mask: (0.5 + 0.25) / 2 = 0.375; the masked 0.1 is ignored.
    log_prob = torch.log(torch.tensor([[0.5, 0.25, 0.1]]))
    assert mean_token_prob(log_prob, torch.tensor([[1, 1, 0]])) == pytest.approx(0.375, abs=1e-7)
    assert mean_token_prob(log_prob, torch.zeros(1, 3, dtype=torch.bool)) == 0.0
