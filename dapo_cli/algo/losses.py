"""The DAPO policy-gradient loss: decoupled clip (Eq. 8/10) and token-level aggregation (Eq. 12).

DAPO (Yu et al. 2025, arXiv:2503.14476) maximises

.. math::
    \\mathcal J(\\theta) = \\mathbb E\\Big[\\frac{1}{\\sum_{i=1}^G |o_i|}\\sum_{i=1}^G\\sum_{t=1}^{|o_i|}
      \\min\\big(r_{i,t}\\hat A_{i,t},\\ \\operatorname{clip}(r_{i,t}, 1-\\varepsilon_{low},
      1+\\varepsilon_{high})\\hat A_{i,t}\\big)\\Big],
    \\qquad r_{i,t} = \\frac{\\pi_\\theta(o_{i,t}\\mid q, o_{i,<t})}{\\pi_{\\theta_{old}}(o_{i,t}\\mid q, o_{i,<t})}

so the per-token *loss* is :math:`\\max(-A r, -A\\,\\operatorname{clip}(r))` and the
default aggregation is the token mean over the whole batch (Eq. 12), not the
GRPO sample mean. The optional dual clip (Ye et al. 2020, arXiv:1912.09729) caps
the loss of negative-advantage tokens at :math:`-A\\,c`.

Shapes: ``B`` responses, ``T`` response tokens (right-padded); masks are ``[B, T]``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

LOG_RATIO_CLAMP = 20.0

Count = float | int | torch.Tensor


def _weights(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Mask ``[B, T]`` (bool or 0/1 float) as a float tensor of ``like``'s dtype."""
    if mask.shape != like.shape:
        raise ValueError(f"mask shape {list(mask.shape)} does not match {list(like.shape)}")
    return mask.to(like.dtype)


def _positive(count: Count, like: torch.Tensor) -> torch.Tensor:
    """A normaliser as a 0-d tensor; a count of 0 (empty batch) becomes 1 so the loss is 0, not NaN."""
    value = torch.as_tensor(count, dtype=like.dtype, device=like.device)
    return torch.where(value > 0, value, torch.ones_like(value))


def _masked_sum(loss_mat: torch.Tensor, weights: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """``sum(L * m)`` with padded entries zeroed first, so NaN/inf on padding cannot leak in."""
    masked = torch.where(weights != 0, loss_mat, torch.zeros_like(loss_mat)) * weights
    return masked.sum() if dim is None else masked.sum(dim)


def _token_mean(
    loss_mat: torch.Tensor,
    weights: torch.Tensor,
    global_tokens: Count | None,
    global_seqs: Count | None,
    norm_length: int | None,
) -> torch.Tensor:
    """``token-mean`` (DAPO Eq. 12): :math:`\\sum_{i,t} L_{i,t} m_{i,t} / N_{tok}`."""
    n_tok = weights.sum() if global_tokens is None else global_tokens
    return _masked_sum(loss_mat, weights) / _positive(n_tok, loss_mat)


def _nonempty_seqs(weights: torch.Tensor) -> torch.Tensor:
    """Number of rows of ``weights`` ``[B, T]`` with at least one token."""
    return (weights != 0).any(dim=-1).sum()


def _seq_mean_token_mean(
    loss_mat: torch.Tensor,
    weights: torch.Tensor,
    global_tokens: Count | None,
    global_seqs: Count | None,
    norm_length: int | None,
) -> torch.Tensor:
    """``seq-mean-token-mean`` (GRPO): :math:`\\frac{1}{S}\\sum_i \\frac{\\sum_t L_{i,t} m_{i,t}}{\\sum_t m_{i,t}}`,
    ``S`` = non-empty sequences; empty rows contribute 0."""
    per_seq = _masked_sum(loss_mat, weights, dim=-1) / _positive(weights.sum(-1), loss_mat)
    n_seq = _nonempty_seqs(weights) if global_seqs is None else global_seqs
    return per_seq.sum() / _positive(n_seq, loss_mat)


def _seq_mean_token_sum(
    loss_mat: torch.Tensor,
    weights: torch.Tensor,
    global_tokens: Count | None,
    global_seqs: Count | None,
    norm_length: int | None,
) -> torch.Tensor:
    """``seq-mean-token-sum``: :math:`\\frac{1}{S}\\sum_i \\sum_t L_{i,t} m_{i,t}`, ``S`` = non-empty sequences."""
    n_seq = _nonempty_seqs(weights) if global_seqs is None else global_seqs
    return _masked_sum(loss_mat, weights) / _positive(n_seq, loss_mat)


def _seq_mean_token_sum_norm(
    loss_mat: torch.Tensor,
    weights: torch.Tensor,
    global_tokens: Count | None,
    global_seqs: Count | None,
    norm_length: int | None,
) -> torch.Tensor:
    """``seq-mean-token-sum-norm`` (Dr. GRPO, arXiv:2503.20783):
    :math:`\\sum_{i,t} L_{i,t} m_{i,t} / (B \\cdot L_{norm})`, ``B`` = all rows (empty ones too)."""
    n_rows = loss_mat.shape[0] if global_seqs is None else global_seqs
    length = loss_mat.shape[-1] if norm_length is None else norm_length
    if length <= 0:
        raise ValueError(f"norm_length must be > 0, got {length}")
    return _masked_sum(loss_mat, weights) / (_positive(n_rows, loss_mat) * length)


_AGGREGATORS: dict[str, Callable[..., torch.Tensor]] = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}
LOSS_AGG_MODES: tuple[str, ...] = tuple(_AGGREGATORS)


def _check_mode(mode: str) -> None:
    if mode not in _AGGREGATORS:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; valid: {', '.join(LOSS_AGG_MODES)}")


def aggregate_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    global_tokens: Count | None = None,
    global_seqs: Count | None = None,
    norm_length: int | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss ``loss_mat`` ``[B, T]`` over ``mask`` ``[B, T]`` to a scalar ``[]``.

    Modes (:data:`LOSS_AGG_MODES`; ``m`` the mask, ``S`` the non-empty rows):

    - ``token-mean`` (DAPO Eq. 12): :math:`\\sum L m / N_{tok}`, :math:`N_{tok} = \\sum m`.
    - ``seq-mean-token-mean`` (GRPO): mean over the ``S`` non-empty rows of each row's token mean.
    - ``seq-mean-token-sum``: mean over the ``S`` non-empty rows of each row's token sum.
    - ``seq-mean-token-sum-norm`` (Dr. GRPO): :math:`\\sum L m / (B \\cdot L_{norm})` with
      ``B`` = all rows and :math:`L_{norm}` = ``norm_length`` or ``T``.

    Micro-batching / data parallelism: when a mini-batch is split by rows into pieces
    whose losses are **summed**, pass the whole mini-batch's counts (see
    :func:`global_counts`): ``global_tokens`` replaces :math:`N_{tok}`, ``global_seqs``
    replaces ``S`` (seq-mean modes) or ``B`` (Dr. GRPO mode). The summed loss and its
    gradient then equal those of the unsplit mini-batch. For Dr. GRPO also pass
    ``norm_length`` when the pieces are padded to different ``T``. (With DDP's
    gradient *averaging*, multiply each rank's loss by the world size.)

    An empty mask gives a zero loss that keeps its ``grad_fn`` (gradient 0), never NaN.
    Padded positions are zeroed before summing, so NaN/inf there cannot leak in.
    """
    _check_mode(mode)
    if loss_mat.dim() != 2:
        raise ValueError(f"loss_mat must be [B, T], got shape {list(loss_mat.shape)}")
    weights = _weights(mask, loss_mat)
    return _AGGREGATORS[mode](loss_mat, weights, global_tokens, global_seqs, norm_length)


def global_counts(mask: torch.Tensor, mode: str) -> dict[str, float]:
    """The ``global_tokens`` / ``global_seqs`` to pass to every micro-batch of ``mask`` ``[B, T]``.

    ``global_tokens`` = :math:`\\sum m`; ``global_seqs`` = non-empty rows for the seq-mean
    modes, all ``B`` rows for ``seq-mean-token-sum-norm``. Across data-parallel ranks,
    sum each value over ranks (all-reduce) before passing it on.
    """
    _check_mode(mode)
    weights = mask.to(torch.float64)
    seqs = weights.shape[0] if mode == "seq-mean-token-sum-norm" else _nonempty_seqs(weights).item()
    return {"global_tokens": float(weights.sum().item()), "global_seqs": float(seqs)}


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    """Detached token mean of ``values`` ``[B, T]`` over ``mask`` ``[B, T]`` (0.0 when empty)."""
    values = values.detach()
    weights = _weights(mask, values)
    total = weights.sum()
    if total.item() == 0:
        return 0.0
    return float((_masked_sum(values, weights) / total).item())


def clamped_log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    """:math:`\\operatorname{clamp}(\\log\\pi - \\log\\pi_{old}, -20, 20)` ``[B, T]`` (gradient through ``log_prob`` only).

    Both must be ``[B, T]`` of one shape (ValueError otherwise); the clamp keeps ``exp`` finite on garbage padding.
    """
    if old_log_prob.shape != log_prob.shape or log_prob.dim() != 2:
        raise ValueError(
            f"log_prob and old_log_prob must both be [B, T]; got {list(log_prob.shape)}, {list(old_log_prob.shape)}"
        )
    return torch.clamp(log_prob - old_log_prob.detach(), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def token_advantages(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Advantages ``[B]`` (one per response) or ``[B, T]`` as a detached ``[B, T]`` tensor of ``like``'s dtype."""
    adv = advantages.detach().to(like.dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1)
    return adv.expand_as(like)


def apply_token_weights(loss_mat: torch.Tensor, token_weights: torch.Tensor | None) -> torch.Tensor:
    """``loss_mat * token_weights`` (both ``[B, T]``; the weights are constants), or ``loss_mat`` when None."""
    if token_weights is None:
        return loss_mat
    if token_weights.shape != loss_mat.shape:
        raise ValueError(f"token_weights shape {list(token_weights.shape)} does not match {list(loss_mat.shape)}")
    return loss_mat * token_weights.detach().to(loss_mat.dtype)


def row_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-row mean ``[B]`` of ``values`` ``[B, T]`` over ``mask`` ``[B, T]`` (0 for an empty row; keeps the gradient)."""
    weights = _weights(mask, values)
    return _masked_sum(values, weights, dim=-1) / _positive(weights.sum(-1), values)


def sequence_token_form(log_terms: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The token form of a per-response geometric mean (GSPO-token, GMPO): ``[B, T]`` entries
    :math:`\\exp(\\operatorname{sg}[\\bar x_i] + x_{i,t} - \\operatorname{sg}[x_{i,t}])` of ``log_terms`` ``[B, T]`` (with
    grad), :math:`\\bar x_i` its row mean over ``mask``. Every token of row ``i`` carries the value
    :math:`e^{\\bar x_i}`, and its gradient is :math:`e^{\\bar x_i} \\nabla x_{i,t}`: a row's token mean of them is
    :math:`\\nabla e^{\\bar x_i}`, so aggregated by the sequence mean they are the sequence formula exactly."""
    return torch.exp(row_mean(log_terms.detach(), mask).unsqueeze(-1) + log_terms - log_terms.detach())


def seq_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    """Detached mean of per-row ``values`` ``[B]`` (or flags) over the rows of ``mask`` ``[B, T]`` holding a token
    (0.0 when none): a *sequence* mean, where :func:`masked_mean` is a token mean."""
    rows = (mask != 0).any(dim=-1)
    count = int(rows.sum())
    return float(values.detach().to(torch.float64)[rows].sum() / count) if count else 0.0


def dapo_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float | None,
    loss_agg_mode: str,
    global_tokens: Count | None = None,
    global_seqs: Count | None = None,
    norm_length: int | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DAPO's policy loss: the clipped policy gradient with the decoupled clip, clip-higher (ε_high > ε_low, Eq. 8/10),
    aggregated by mode (the token-level loss, Eq. 12, is ``token-mean``).

    log_prob:     ``[B, T]`` log-probs of the sampled tokens under the current policy (with grad).
    old_log_prob: ``[B, T]`` the same under the behaviour policy (treated as a constant).
    advantages:   ``[B]`` (broadcast over T) or ``[B, T]`` (treated as a constant).
    mask:         ``[B, T]`` bool or 0/1 float, True on response tokens that enter the loss.
    clip_ratio_low / clip_ratio_high / clip_ratio_c / loss_agg_mode: required, no defaults here (the paper's values
    are the schema's: ``algorithm.clip_ratio_low`` / ``clip_ratio_high`` / ``clip_ratio_c`` / ``loss_agg_mode``).

    .. math::
        r = \\exp(\\operatorname{clamp}(\\log\\pi - \\log\\pi_{old}, -20, 20)),\\quad
        L = \\max\\big(-A r,\\ -A \\operatorname{clip}(r, 1-\\varepsilon_{low}, 1+\\varepsilon_{high})\\big)

    With ``clip_ratio_c = c`` (> 1) the dual clip applies to tokens with ``A < 0``:
    :math:`L \\leftarrow \\min(L, -A c)`. The loss matrix is then reduced by
    :func:`aggregate_loss` with ``loss_agg_mode`` and the global counts.

    ``token_weights`` ``[B, T]`` (constants, e.g. truncated importance weights from
    :mod:`dapo_cli.algo.importance`) multiply each token's loss before aggregation; the
    denominators (token / sequence counts) still come from ``mask``.

    Returns ``(loss [], metrics)``; metrics are token means over ``mask`` (floats):
    ``actor/pg_loss`` (the aggregated loss), ``actor/pg_clipfrac`` (clipped branch strictly
    the max), ``actor/clipfrac_high`` (r > 1+ε_high and A > 0), ``actor/clipfrac_low``
    (r < 1-ε_low and A < 0), ``actor/pg_clipfrac_lower`` (dual clip binding; 0.0 without
    it), ``actor/ppo_kl`` (mean of :math:`-\\operatorname{clamp}(\\log\\pi - \\log\\pi_{old})`).
    """
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for the dual clip, got {clip_ratio_c}")
    _check_mode(loss_agg_mode)
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)  # [B, T], with grad
    adv = token_advantages(advantages, log_prob)  # [B, T]
    ratio = torch.exp(log_ratio)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss_mat = torch.maximum(loss_unclipped, loss_clipped)
    dual_hit = torch.zeros_like(loss_mat, dtype=torch.bool)
    if clip_ratio_c is not None:
        loss_dual = -adv * clip_ratio_c
        dual_hit = (adv < 0) & (loss_dual < loss_mat)
        loss_mat = torch.where(dual_hit, loss_dual, loss_mat)
    loss_mat = apply_token_weights(loss_mat, token_weights)

    loss = aggregate_loss(
        loss_mat, mask, loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, norm_length=norm_length
    )
    ratio = ratio.detach()
    clipped_high = (ratio > 1.0 + clip_ratio_high) & (adv > 0)
    clipped_low = (ratio < 1.0 - clip_ratio_low) & (adv < 0)
    metrics = {
        "actor/pg_loss": float(loss.detach().item()),
        "actor/pg_clipfrac": masked_mean((loss_clipped > loss_unclipped).to(log_prob.dtype), mask),
        "actor/clipfrac_high": masked_mean(clipped_high.to(log_prob.dtype), mask),
        "actor/clipfrac_low": masked_mean(clipped_low.to(log_prob.dtype), mask),
        "actor/pg_clipfrac_lower": masked_mean(dual_hit.to(log_prob.dtype), mask),
        "actor/ppo_kl": masked_mean(-log_ratio, mask),
    }
    return loss, metrics
