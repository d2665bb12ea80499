"""The chunked head log-probs (algo/logits.chunked_head_log_probs) against the unchunked path.

The reference is what the trainer computed before: the full ``[M, V]`` logits ``h Wᵀ + b``, divided
by the temperature, then :func:`token_log_probs` and :func:`entropy_from_logits`, with autograd's
gradients. In float64 the two must agree to 1e-12 (the same sums, in another order only for ∂W);
a hand-computed two-token example pins the formula itself.
"""

from __future__ import annotations

import math

import pytest
import torch

from dapo_cli.algo.logits import chunked_head_log_probs, entropy_from_logits, token_log_probs


def reference(hidden, weight, bias, tokens, temperature):
    z = hidden @ weight.t() + (bias if bias is not None else 0.0)
    s = z / temperature
    return token_log_probs(s[None], tokens[None])[0], entropy_from_logits(s[None])[0]


def case(m=11, h=5, v=13, dtype=torch.float64, seed=0, with_bias=True):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(m, h, generator=gen, dtype=dtype, requires_grad=True)
    weight = torch.randn(v, h, generator=gen, dtype=dtype, requires_grad=True)
    bias = torch.randn(v, generator=gen, dtype=dtype, requires_grad=True) if with_bias else None
    tokens = torch.randint(0, v, (m,), generator=gen)
    return hidden, weight, bias, tokens


def test_two_tokens_by_hand():
    # V = 2, H = 1, W = [[1], [0]], b = 0, h = [ln 3]: z = (ln 3, 0), τ = 1.
    # lse = ln(3 + 1) = ln 4; log π(0) = ln 3 − ln 4; p = (3/4, 1/4);
    # H = ln 4 − (3/4 · ln 3 + 1/4 · 0) = ln 4 − 0.75 ln 3.
    # ∂ log π(0) / ∂z = (1 − 3/4, −1/4); ∂/∂h = Σ_v ∂z_v · W_v = 1/4.
    # ∂H/∂z_v = p_v (E_p[z] − z_v), E_p[z] = 0.75 ln 3: ∂H/∂z_0 = 0.75 (0.75 ln 3 − ln 3) = −0.1875 ln 3,
    # so ∂H/∂h = −0.1875 ln 3.
    h = torch.tensor([[math.log(3.0)]], dtype=torch.float64, requires_grad=True)
    w = torch.tensor([[1.0], [0.0]], dtype=torch.float64)
    logp, ent = chunked_head_log_probs(h, w, None, torch.tensor([0]), temperature=1.0, chunk=1, with_entropy=True)
    assert logp.item() == pytest.approx(math.log(3) - math.log(4), abs=1e-12)
    assert ent.item() == pytest.approx(math.log(4) - 0.75 * math.log(3), abs=1e-12)
    (g_logp,) = torch.autograd.grad(logp.sum(), h, retain_graph=True)
    (g_ent,) = torch.autograd.grad(ent.sum(), h)
    assert g_logp.item() == pytest.approx(0.25, abs=1e-12)
    assert g_ent.item() == pytest.approx(-0.1875 * math.log(3), abs=1e-12)


@pytest.mark.parametrize("chunk", [1, 3, 4, 11, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_bias", [True, False])
def test_matches_unchunked_float64(chunk, temperature, with_bias):
    hidden, weight, bias, tokens = case(with_bias=with_bias)
    inputs = [t for t in (hidden, weight, bias) if t is not None]
    gen = torch.Generator().manual_seed(1)
    a, c = torch.randn(11, generator=gen, dtype=torch.float64), torch.randn(11, generator=gen, dtype=torch.float64)
    ref_logp, ref_ent = reference(hidden, weight, bias, tokens, temperature)
    ref = torch.autograd.grad((a * ref_logp).sum() + (c * ref_ent).sum(), inputs)
    logp, ent = chunked_head_log_probs(hidden, weight, bias, tokens, temperature=temperature, chunk=chunk, with_entropy=True)
    got = torch.autograd.grad((a * logp).sum() + (c * ent).sum(), inputs)
    torch.testing.assert_close(logp, ref_logp, atol=1e-12, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-12, rtol=0)
    for x, y in zip(got, ref):
        torch.testing.assert_close(x, y, atol=1e-12, rtol=0)


def test_log_prob_gradient_alone_and_entropy_alone():
    """Only one output in the loss: the other's upstream gradient is None, and each path is still right."""
    hidden, weight, bias, tokens = case()
    for pick in (0, 1):
        ref = reference(hidden, weight, bias, tokens, 1.3)[pick].sum()
        want = torch.autograd.grad(ref, (hidden, weight, bias))
        out = chunked_head_log_probs(hidden, weight, bias, tokens, temperature=1.3, chunk=4, with_entropy=True)[pick].sum()
        for x, y in zip(torch.autograd.grad(out, (hidden, weight, bias)), want):
            torch.testing.assert_close(x, y, atol=1e-12, rtol=0)


def test_without_entropy_and_frozen_head():
    """with_entropy=False returns None; a head that does not require grad gets none (LoRA's frozen head)."""
    hidden, weight, _, tokens = case(with_bias=False)
    weight = weight.detach()
    logp, ent = chunked_head_log_probs(hidden, weight, None, tokens, temperature=1.0, chunk=5, with_entropy=False)
    assert ent is None
    (g,) = torch.autograd.grad(logp.sum(), hidden)
    ref_logp, _ = reference(hidden, weight, None, tokens, 1.0)
    (want,) = torch.autograd.grad(ref_logp.sum(), hidden)
    torch.testing.assert_close(g, want, atol=1e-12, rtol=0)


def test_float32_within_rounding():
    """float32, logits of a language model's scale (std ~2): within 1e-5 (sums of 1000 terms in another order)."""
    hidden, weight, bias, tokens = case(m=300, h=32, v=1000, dtype=torch.float32)
    weight = (weight.detach() * 0.35).requires_grad_()
    ref_logp, ref_ent = reference(hidden, weight, bias, tokens, 1.0)
    ref = torch.autograd.grad(ref_logp.sum() + 0.1 * ref_ent.sum(), (hidden, weight, bias))
    logp, ent = chunked_head_log_probs(hidden, weight, bias, tokens, temperature=1.0, chunk=64, with_entropy=True)
    got = torch.autograd.grad(logp.sum() + 0.1 * ent.sum(), (hidden, weight, bias))
    torch.testing.assert_close(logp, ref_logp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    for x, y in zip(got, ref):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)


def test_bad_arguments():
    hidden, weight, bias, tokens = case()
    with pytest.raises(ValueError, match="temperature"):
        chunked_head_log_probs(hidden, weight, bias, tokens, temperature=0.0, chunk=4, with_entropy=False)
    with pytest.raises(ValueError, match="chunk"):
        chunked_head_log_probs(hidden, weight, bias, tokens, temperature=1.0, chunk=0, with_entropy=False)
    with pytest.raises(ValueError, match="expected hidden"):
        chunked_head_log_probs(hidden, weight[:, :2], bias, tokens, temperature=1.0, chunk=4, with_entropy=False)
