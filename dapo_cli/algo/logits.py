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

    :math:`H = -\\sum_v p_v \\log p_v` with :math:`\\log p = z - \\operatorname{logsumexp}(z)`, summed by
    ``sum`` (pairwise). The equal form :math:`\\operatorname{logsumexp}(z) - \\sum_v p_v z_v` cancels two
    numbers of the logits' size, and a batched dot product (``einsum``) runs 49,152 float32 terms through
    one accumulator: on 13 positions of SmolLM2-135M at T = 1, that form (as dapo computed it before,
    ``einsum`` over ``[1, K, V]``) was up to 2.4e-4 nats from float64, and 4.6e-3 with ``einsum`` over
    ``[K, V]``; this one 2.8e-6. Memory: the ``[B, T, V]`` log-probs and probabilities (both kept for the
    backward) and one transient; the trainer's forwards use :func:`chunked_head_log_probs`, which never
    holds them for more than a chunk of rows. Logits must be finite.
    """
    if logits.dim() != 3:
        raise ValueError(f"expected logits [B, T, V], got {list(logits.shape)}")
    log_p = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    return -(log_p.exp() * log_p).sum(-1)


def mean_token_prob(log_prob: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of :math:`\\exp(\\log\\pi)` over ``mask`` ``[B, T]`` for ``log_prob`` ``[B, T]``; 0.0 when empty."""
    if log_prob.shape != mask.shape:
        raise ValueError(f"log_prob {list(log_prob.shape)} and mask {list(mask.shape)} differ")
    keep = mask.to(torch.bool)
    if not bool(keep.any()):
        return 0.0
    return float(torch.exp(log_prob.detach()[keep]).mean().item())


# ---------------------------------------------------------------- chunked through the output head


def chunked_head_log_probs(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tokens: torch.Tensor, *,
    temperature: float, chunk: int, with_entropy: bool, compute_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`token_log_probs` and :func:`entropy_from_logits` of the output head's logits, computed
    ``chunk`` rows at a time so that no ``[M, V]`` tensor ever exists, in the forward or the backward.

    hidden ``[M, H]`` (final hidden states, one row per token to score), weight ``[V, H]`` and bias
    ``[V]`` (or None) of the head, tokens ``[M]``. Per row, with :math:`z = W h + b` (computed in
    ``compute_dtype``, default the weight's, then float32) and :math:`s = z / \\tau`:

    .. math::
        \\log \\pi(y) = s_y - \\operatorname{lse}(s), \\qquad
        H = -\\textstyle\\sum_v p_v \\log p_v, \\quad \\log p = s - \\operatorname{lse}(s)

    (summed as :func:`entropy_from_logits` sums it, for its accuracy).

    Backward (recomputing each chunk's logits instead of keeping them), for upstream gradients
    :math:`g_\\ell` of the log-prob and :math:`g_H` of the entropy of a row:

    .. math::
        \\frac{\\partial}{\\partial s_v} = g_\\ell\\,(\\mathbb 1[v = y] - p_v) + g_H\\, p_v\\,(\\mathbb E_p[s] - s_v),
        \\qquad \\mathbb E_p[s] - s_v = -(\\log p_v + H),

    then :math:`\\partial z = \\partial s / \\tau`, :math:`\\partial h = \\partial z\\, W`,
    :math:`\\partial W = \\sum_{\\text{rows}} \\partial z^\\top h`, :math:`\\partial b = \\sum_{\\text{rows}} \\partial z`.
    (:math:`\\partial H / \\partial s_k = -p_k(\\log p_k + H)` with :math:`\\log p_k = s_k - \\operatorname{lse}(s)`.)

    Memory: a few ``[chunk, V]`` float32 buffers at a time; autograd keeps ``hidden`` and the ``[M]``
    log-sum-exps (and entropies). Equal to the unchunked path to float32 rounding (each chunk's matmul
    sums in another order only for ``∂W``). Returns log-probs ``[M]`` and entropies ``[M]`` (or None).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1] or tokens.shape != hidden.shape[:1]:
        raise ValueError(f"expected hidden [M, H], weight [V, H], tokens [M]; got {list(hidden.shape)}, "
                         f"{list(weight.shape)}, {list(tokens.shape)}")
    dtype = compute_dtype or weight.dtype
    logp, ent = _HeadLogProbs.apply(hidden, weight, bias, tokens.long(), float(temperature), int(chunk), bool(with_entropy), dtype)
    return logp, (ent if with_entropy else None)


def _chunk_logits(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """Float32 ``s = (h Wᵀ + b) / τ`` ``[c, V]`` of one chunk (``h``, ``w``, ``b`` already in the compute dtype)."""
    z = torch.mm(h, w.t()) if b is None else torch.addmm(b, h, w.t())
    z = z.float() if z.dtype != torch.float32 and z.dtype != torch.float64 else z
    return z if temperature == 1.0 else z / temperature


class _HeadLogProbs(torch.autograd.Function):
    """The autograd function behind :func:`chunked_head_log_probs` (its docstring has the math)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, tokens, temperature, chunk, with_entropy, dtype):  # type: ignore[override]
        with torch.autocast(hidden.device.type, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            b = bias.to(dtype) if bias is not None else None
            m = hidden.shape[0]
            out_dtype = torch.float64 if dtype == torch.float64 else torch.float32
            logp = torch.empty(m, dtype=out_dtype, device=hidden.device)
            lse = torch.empty_like(logp)
            ent = torch.empty_like(logp) if with_entropy else logp.new_empty(0)
            for r in range(0, m, chunk):
                s = _chunk_logits(h[r : r + chunk], w, b, temperature)
                lse[r : r + chunk] = torch.logsumexp(s, dim=-1)
                logp[r : r + chunk] = s.gather(1, tokens[r : r + chunk, None]).squeeze(1) - lse[r : r + chunk]
                if with_entropy:  # H = -Σ p log p, log p = s - lse, a pairwise sum (entropy_from_logits' docstring)
                    log_p = s.sub_(lse[r : r + chunk, None])
                    ent[r : r + chunk] = -log_p.exp().mul_(log_p).sum(-1)
        ctx.set_materialize_grads(False)  # an output nothing reads (often the entropy) gets None, not zeros
        if not with_entropy:
            ctx.mark_non_differentiable(ent)
        ctx.save_for_backward(hidden, weight, bias, tokens, lse, ent)
        ctx.temperature, ctx.chunk, ctx.dtype, ctx.with_entropy = temperature, chunk, dtype, with_entropy
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):  # type: ignore[override]
        hidden, weight, bias, tokens, lse, ent = ctx.saved_tensors
        tau, chunk, dtype = ctx.temperature, ctx.chunk, ctx.dtype
        want_h, want_w, want_b = ctx.needs_input_grad[:3]
        use_ent = ctx.with_entropy and g_ent is not None
        with torch.autocast(hidden.device.type, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            b = bias.to(dtype) if bias is not None else None
            grad_h = torch.empty_like(hidden) if want_h else None
            acc = torch.float64 if weight.dtype == torch.float64 else torch.float32
            grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if want_w else None
            grad_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if want_b and bias is not None else None
            for r in range(0, hidden.shape[0], chunk):
                rows = slice(r, r + chunk)
                s = _chunk_logits(h[rows], w, b, tau)
                log_p = s.sub_(lse[rows, None])
                g = log_p.exp()  # p
                gl = g_logp[rows, None] if g_logp is not None else None
                if use_ent:  # g_H p (E_p[s] - s) - g_l p, with E_p[s] - s = -(log p + H)
                    coeff = log_p.add_(ent[rows, None]).neg_().mul_(g_ent[rows, None])
                    if gl is not None:
                        coeff.sub_(gl)
                    g.mul_(coeff)
                elif gl is not None:
                    g.mul_(-gl)
                else:
                    g.zero_()
                if gl is not None:
                    g.scatter_add_(1, tokens[rows, None], gl)
                if tau != 1.0:
                    g.div_(tau)
                g = g.to(dtype)
                if grad_h is not None:
                    grad_h[rows] = torch.mm(g, w).to(hidden.dtype)
                if grad_w is not None:
                    grad_w += torch.mm(g.t(), h[rows]).to(acc)
                if grad_b is not None:
                    grad_b += g.sum(0).to(acc)
        grad_w = grad_w.to(weight.dtype) if grad_w is not None else None
        grad_b = grad_b.to(bias.dtype) if grad_b is not None else None
        return grad_h, grad_w, grad_b, None, None, None, None, None
