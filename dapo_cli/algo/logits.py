"""From logits to per-token log-probabilities and entropies without a full log-softmax.

For logits :math:`z \\in \\mathbb R^V` at one position and temperature :math:`\\tau`
(the sampling distribution is :math:`\\operatorname{softmax}(z / \\tau)`):

.. math::
    \\log \\pi(y) = z_y / \\tau - \\operatorname{logsumexp}(z / \\tau), \\qquad
    H(\\pi) = \\operatorname{logsumexp}(z) - \\sum_v \\operatorname{softmax}(z)_v\\, z_v .

Shapes: ``B`` responses, ``T`` positions, ``V`` vocabulary.
"""

from __future__ import annotations

import torch


def token_log_probs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probability ``[B, T]`` of ``tokens`` ``[B, T]`` under ``softmax(logits / temperature)``.

    logits: ``[B, T, V]`` (position ``t`` predicts ``tokens[:, t]``).
    Computed as the gathered logit minus ``logsumexp`` over V. Memory: no ``[B, T, V]``
    log-softmax is kept; ``logsumexp`` needs one transient ``[B, T, V]`` buffer, freed on
    return, and with ``temperature == 1`` autograd saves only ``logits`` (already alive)
    and the ``[B, T]`` logsumexp, where ``log_softmax`` would save its ``[B, T, V]`` output.
    A temperature other than 1 costs one scaled ``[B, T, V]`` copy (the sampling logits).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if logits.dim() != 3 or tokens.shape != logits.shape[:2]:
        raise ValueError(f"expected logits [B, T, V] and tokens [B, T]; got {list(logits.shape)}, {list(tokens.shape)}")
    scaled = logits if temperature == 1.0 else logits / temperature
    picked = torch.gather(scaled, -1, tokens.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(scaled, dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy ``[B, T]`` of ``softmax(logits)`` for logits ``[B, T, V]`` (nats).

    :math:`H = \\operatorname{logsumexp}(z) - \\sum_v \\operatorname{softmax}(z)_v z_v`.
    Memory: the ``[B, T, V]`` softmax (unavoidable; saved for backward) plus a transient
    ``[B, T, V]`` buffer inside ``logsumexp``; the sum :math:`\\sum_v p_v z_v` is a batched
    dot product, so no ``p * z`` or log-prob ``[B, T, V]`` tensor is materialised
    (measured: 2 x ``[B, T, V]`` allocated vs 3 x for ``lse - (softmax(z) * z).sum(-1)``).
    Logits must be finite.
    """
    if logits.dim() != 3:
        raise ValueError(f"expected logits [B, T, V], got {list(logits.shape)}")
    probs = torch.softmax(logits, dim=-1)
    expected_logit = torch.einsum("btv,btv->bt", probs, logits)
    return torch.logsumexp(logits, dim=-1) - expected_logit


def mean_token_prob(log_prob: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of :math:`\\exp(\\log\\pi)` over ``mask`` ``[B, T]`` for ``log_prob`` ``[B, T]``; 0.0 when empty."""
    if log_prob.shape != mask.shape:
        raise ValueError(f"log_prob {list(log_prob.shape)} and mask {list(mask.shape)} differ")
    keep = mask.to(torch.bool)
    if not bool(keep.any()):
        return 0.0
    return float(torch.exp(log_prob.detach()[keep]).mean().item())
