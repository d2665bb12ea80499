"""rollout/sampling.py: the nucleus draw over a few candidates equals the draw over the fully sorted vocabulary.

``nucleus_draw`` must give the token ``inverse_cdf_draw(nucleus_probs(probs, p), u)`` gives, for every row and
uniform: the fast engine's samples are promised the same token for token whichever path a row takes. The
distributions below are built to reach each path (the first candidate count, the second, the full sort) and the
places an exactness argument can slip: ties at the nucleus' edge and at the candidates' edge, probabilities that
underflow to 0, one-hot rows, flat rows, and uniforms at 0 and just under 1.
"""

from __future__ import annotations

import pytest
import torch

from dapo_cli.config.tiny import TinyModelConfig
from dapo_cli.models.tiny import build_tiny_model_for
from dapo_cli.models.tokenizer import build_char_tokenizer
from dapo_cli.rollout import sampling
from dapo_cli.rollout.base import SamplingParams
from dapo_cli.rollout.fast import FastRolloutEngine
from dapo_cli.rollout.sampling import draw, inverse_cdf_draw, nucleus_draw, nucleus_probs, truncated_probs


def reference(probs: torch.Tensor, top_p: float, u: torch.Tensor) -> torch.Tensor:
    return inverse_cdf_draw(nucleus_probs(probs, top_p), u)


def distributions(vocab: int, seed: int) -> torch.Tensor:
    """Rows of many shapes (softmax of float32 logits, as the engine's are)."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for scale in (0.1, 1.0, 3.0, 8.0, 30.0, 200.0):  # flat ... one-hot with underflow to exactly 0
        rows.append(torch.randn(24, vocab, generator=gen) * scale)
    quantised = torch.randint(0, 4, (24, vocab), generator=gen).float() * 2.0  # many exact ties everywhere
    rows.append(quantised)
    edge = torch.randn(24, vocab, generator=gen)
    edge[:, :6] = 5.0  # six tied leaders: the nucleus edge falls inside the tie
    rows.append(edge)
    return torch.softmax(torch.cat(rows), dim=-1)


@pytest.mark.parametrize("top_p", [0.05, 0.3, 0.7, 0.9, 0.99])
def test_nucleus_draw_equals_the_full_sort_on_every_path(monkeypatch, top_p):
    probs = distributions(200, seed=int(top_p * 100))
    paths = {"full": 0}
    full = sampling.nucleus_probs

    def counted(p, q):
        paths["full"] += p.shape[0]
        return full(p, q)

    monkeypatch.setattr(sampling, "nucleus_probs", counted)
    monkeypatch.setattr(sampling, "TOP_P_CANDIDATES", (4, 32))
    gen = torch.Generator().manual_seed(1)
    for u in (torch.rand(probs.shape[0], generator=gen, dtype=torch.float64),
              torch.zeros(probs.shape[0], dtype=torch.float64),
              torch.full((probs.shape[0],), 1.0 - 2**-53, dtype=torch.float64)):
        assert nucleus_draw(probs, top_p, u).tolist() == reference(probs, top_p, u).tolist()
    # the test reaches both the candidates (most rows) and the full sort (flat rows at a large top_p)
    assert paths["full"] < 3 * probs.shape[0]
    if top_p >= 0.7:
        assert paths["full"] > 0


def test_ties_at_the_edge_keep_the_lower_token_ids():
    # four tokens tied at 0.25 (hand: the nucleus at p = 0.3 holds two of them: before = 0, 0.25, 0.5, ...):
    # by the full sort's rule the two lower ids, 0 and 1 (here topk may return any two of the four first)
    probs = torch.tensor([[0.25, 0.25, 0.25, 0.25] + [0.0] * 12])
    kept = nucleus_probs(probs, 0.3)
    assert kept[0, :4].tolist() == [0.25, 0.25, 0.0, 0.0]
    for u in (0.0, 0.49, 0.51, 1.0 - 2**-53):
        x = torch.tensor([u], dtype=torch.float64)
        assert nucleus_draw(probs, 0.3, x).tolist() == reference(probs, 0.3, x).tolist()


def test_draw_with_top_p_matches_the_reference_on_real_sized_logits():
    # SmolLM2's vocabulary size with the default candidate counts, logits shaped like a language model's
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(16, 49_152, generator=gen) * 2.5
    logits[:, :40] += torch.linspace(8, 2, 40)
    u = torch.rand(16, generator=gen, dtype=torch.float64)
    for params in (SamplingParams(temperature=1.0, top_p=0.7), SamplingParams(temperature=0.6, top_p=0.95, top_k=50)):
        z = logits / params.temperature
        want = inverse_cdf_draw(truncated_probs(z, params.top_k, params.top_p), u)
        tok, logp = draw(logits, params, u)
        assert tok.tolist() == want.tolist()
        torch.testing.assert_close(logp, torch.log_softmax(z, -1).gather(1, want[:, None]).squeeze(1), rtol=0, atol=0)


@pytest.mark.parametrize("loop", [{}, {"prefix_cache": False, "refill": False}], ids=["refilled", "chunked"])
def test_the_engines_samples_are_the_same_with_candidates_or_the_full_sort(monkeypatch, loop):
    # the tiny model's ~100-token vocabulary is below the default candidate counts: smaller ones make every path run
    tok = build_char_tokenizer()
    cfg = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    model = build_tiny_model_for(cfg, tok)
    with torch.no_grad():
        model.model.norm.weight.mul_(4.0)  # peaked rows (the nucleus among a few tokens) beside flat ones
    prompts = ["What is 12+7?\n", "Q", "What is 12+8?\n", "Q"]
    params = SamplingParams(temperature=1.0, top_p=0.8, max_tokens=12, seed=5, logprobs=True)
    monkeypatch.setattr(sampling, "TOP_P_CANDIDATES", (3, 12))
    fast = FastRolloutEngine(model, tok, batch_size=5, **loop).generate(prompts, 3, params)
    monkeypatch.setattr(sampling, "TOP_P_CANDIDATES", ())
    full = FastRolloutEngine(model, tok, batch_size=5, **loop).generate(prompts, 3, params)
    assert fast.response_ids.tolist() == full.response_ids.tolist()
    assert fast.lengths.tolist() == full.lengths.tolist()
    torch.testing.assert_close(fast.logprobs, full.logprobs, rtol=0, atol=0)
    assert len({tuple(r) for r in fast.response_ids.tolist()}) > 6  # sampled, not one greedy answer repeated


# ---------------------------------------------------------------- the inverse-CDF draw located by blocks


def test_blocked_draw_equals_the_sequential_scan_and_is_sure_almost_everywhere():
    gen = torch.Generator().manual_seed(7)
    vocab = 49_152 + 37  # not a multiple of the block: the padded tail must never be drawn
    logits = torch.randn(48, vocab, generator=gen) * torch.tensor([0.5, 2.0, 6.0, 40.0]).repeat(12)[:, None]
    probs = torch.softmax(logits, dim=-1)
    probs[:8, ::3] = 0.0  # rows with zeros inside (a top-k mask): a zero-probability token is never drawn
    u = torch.rand(48, generator=gen, dtype=torch.float64)
    u[0], u[1] = 0.0, 1.0 - 2**-53  # the ends of the unit interval
    tok, sure = sampling.blocked_cdf_draw(probs, u)
    want = sampling.sequential_cdf_draw(probs, u)
    assert tok[sure].tolist() == want[sure].tolist()
    assert int(sure.sum()) >= 46  # a row is unsure only within ~1e-11 of a boundary (the ends may be unsure)
    assert sampling.inverse_cdf_draw(probs, u).tolist() == want.tolist()
    assert bool((probs.gather(1, want[:, None]) > 0).all())


def test_a_uniform_on_a_boundary_is_not_sure_and_falls_back_to_the_scan():
    # u chosen so u * total is exactly a running sum s_j: the scan answers j + 1 (the first s_i > x); the blocks
    # cannot tell s_j from x within their error bound, so they must say unsure rather than guess
    gen = torch.Generator().manual_seed(8)
    probs = torch.softmax(torch.randn(6, 8192, generator=gen), dim=-1)
    cdf = torch.cumsum(probs.double(), dim=-1)
    at = torch.tensor([0, 63, 64, 1000, 4095, 8000])
    u = cdf.gather(1, at[:, None]).squeeze(1) / cdf[:, -1]
    _, sure = sampling.blocked_cdf_draw(probs, u)
    assert not bool(sure.any())
    assert sampling.inverse_cdf_draw(probs, u).tolist() == sampling.sequential_cdf_draw(probs, u).tolist()


def test_small_vocabularies_take_the_scan():
    probs = torch.softmax(torch.randn(4, 100), dim=-1)
    u = torch.rand(4, dtype=torch.float64)
    assert probs.shape[1] < sampling.BLOCKED_CDF_MIN
    assert sampling.inverse_cdf_draw(probs, u).tolist() == sampling.sequential_cdf_draw(probs, u).tolist()
