"""Rollout corrections by name (``algorithm.rollout_is.mode``): what the loss does about samples drawn by a policy
other than π_old.

The responses were sampled by :math:`\\pi_{rollout}` (the rollout engine's numbers, or older weights with
asynchronous rollouts) while the loss is built around :math:`\\pi_{old}` (the trainer's, the proximal policy of
:mod:`dapo_cli.algo.staleness`). Each correction turns the per-token log-ratio
:math:`\\delta_{i,t} = \\log\\pi_{old}(o_{i,t}) - \\log\\pi_{rollout}(o_{i,t})` (clamped to ±20) into constant
per-token weights :math:`w_{i,t}` that multiply the policy loss, or into a mask:

- ``token_tis`` (Yao et al. 2025, truncated IS; the default): :math:`w_{i,t} = \\min(e^{\\delta_{i,t}}, C)`.
- ``seq_tis`` (sequence-level truncated IS): :math:`w_{i,t} = \\min\\big(\\exp(\\sum_t \\delta_{i,t}), C\\big)`, the
  sequence likelihood ratio, the same for every token of response ``i``.
- ``geo_mask`` (geometric-mean rejection, the "geometric" rejection sampling of verl's rollout correction): response
  ``i`` is *dropped* (out of the loss and of its denominators, like a filtered row) when its geometric-mean ratio
  :math:`g_i = \\exp(\\frac{1}{|o_i|}\\sum_t \\delta_{i,t})` leaves :math:`[1/c, c]`; kept tokens weigh 1.
- ``opsm`` (off-policy sequence masking, DeepSeek-V3.2 2025): a response with negative advantage whose divergence
  :math:`\\frac{1}{|o_i|}\\sum_t \\log\\frac{\\pi_{rollout}(o_{i,t})}{\\pi_\\theta(o_{i,t})} > \\delta` (π_θ the policy
  being updated, evaluated at every micro-batch) gets weight 0, the others 1; the denominators keep it, as the
  paper's objective does (the mask multiplies the summand).

``geo_mask`` depends on π_old and π_rollout only, so whoever splits a mini-batch computes its kept rows
(:func:`geo_mask_keep`, :data:`ROW_FILTERS`) before the global counts; :func:`rollout_correction` drops them again
(idempotent), so a caller that passes no counts gets the same loss.

Shapes: ``B`` responses, ``T`` response tokens; masks ``[B, T]``; advantages ``[B]`` or ``[B, T]``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dapo_cli.algo.importance import truncated_is_weights
from dapo_cli.algo.losses import LOG_RATIO_CLAMP, row_mean, seq_mean, token_advantages


def _log_ratio(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """δ = clamp(log π_old − log π_rollout, ±20) ``[B, T]``, detached; shapes must agree."""
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != mask.shape:
        raise ValueError(
            f"shapes differ: old {list(old_log_prob.shape)}, rollout {list(rollout_log_prob.shape)}, mask {list(mask.shape)}"
        )
    return torch.clamp(old_log_prob.detach() - rollout_log_prob.detach(), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def seq_log_ratio(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """:math:`\\log R_i = \\operatorname{clamp}(\\sum_t \\delta_{i,t}, \\pm 20)` ``[B]``: the sequence likelihood log-ratio."""
    delta = _log_ratio(old_log_prob, rollout_log_prob, mask)
    summed = torch.where(mask.bool(), delta, torch.zeros_like(delta)).sum(-1)  # [B]
    return torch.clamp(summed, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def seq_truncated_is_weights(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor, *, cap: float
) -> torch.Tensor:
    """``seq_tis``: :math:`w_{i,t} = \\min(R_i, C)` on ``mask``, 0 elsewhere; ``[B, T]`` detached. ``cap`` >= 1."""
    if cap < 1.0:
        raise ValueError(f"cap must be >= 1, got {cap}")
    weight = torch.clamp(torch.exp(seq_log_ratio(old_log_prob, rollout_log_prob, mask)), max=cap)  # [B]
    return torch.where(mask.bool(), weight.unsqueeze(-1).expand_as(mask).to(old_log_prob.dtype), torch.zeros_like(old_log_prob))


def geo_mean_ratio(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """:math:`g_i = \\exp(\\frac{1}{|o_i|}\\sum_t \\delta_{i,t})` ``[B]`` (1 for a row without tokens)."""
    return torch.exp(row_mean(_log_ratio(old_log_prob, rollout_log_prob, mask), mask))


def geo_mask_keep(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor, *, geo_bound: float
) -> torch.Tensor:
    """``geo_mask``: BoolTensor ``[B]``, True for the responses kept, :math:`1/c \\le g_i \\le c` (``geo_bound`` c > 1)."""
    if geo_bound <= 1.0:
        raise ValueError(f"geo_bound must be > 1, got {geo_bound}")
    g = geo_mean_ratio(old_log_prob, rollout_log_prob, mask)
    return (g >= 1.0 / geo_bound) & (g <= geo_bound)


def opsm_keep(
    log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
    opsm_delta: float,
) -> torch.Tensor:
    """``opsm``: BoolTensor ``[B, T]``, False where :math:`\\hat A_{i,t} < 0` and the response's
    :math:`\\frac{1}{|o_i|}\\sum_t (\\log\\pi_{rollout} - \\log\\pi_\\theta) > \\delta` (``log_prob`` is π_θ, detached)."""
    if opsm_delta < 0.0:
        raise ValueError(f"opsm_delta must be >= 0, got {opsm_delta}")
    divergence = row_mean(-_log_ratio(log_prob, rollout_log_prob, mask), mask)  # [B]
    adv = token_advantages(advantages, log_prob)  # [B, T]
    return ~((adv < 0) & (divergence > opsm_delta).unsqueeze(-1))


Weights = tuple[torch.Tensor, dict[str, float]]


def _token_tis(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, advantages: torch.Tensor,
    mask: torch.Tensor, *, cap: float,
) -> Weights:
    return truncated_is_weights(old_log_prob, rollout_log_prob, mask, cap=cap), {}


def _seq_tis(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, advantages: torch.Tensor,
    mask: torch.Tensor, *, cap: float,
) -> Weights:
    return seq_truncated_is_weights(old_log_prob, rollout_log_prob, mask, cap=cap), {}


def _geo_mask(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, advantages: torch.Tensor,
    mask: torch.Tensor, *, geo_bound: float,
) -> Weights:
    return mask.to(old_log_prob.dtype), {}  # its rows are dropped from the mask first (ROW_FILTERS): kept tokens weigh 1


def _opsm(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, advantages: torch.Tensor,
    mask: torch.Tensor, *, opsm_delta: float,
) -> Weights:
    keep = opsm_keep(log_prob.detach(), rollout_log_prob, advantages, mask, opsm_delta=opsm_delta) & mask.bool()  # [B, T]
    masked = (mask.bool() & ~keep).any(-1)  # [B]
    return keep.to(old_log_prob.dtype), {"rollout/masked_seq_frac": seq_mean(masked, mask)}


ROLLOUT_CORRECTIONS: dict[str, Callable[..., Weights]] = {
    "token_tis": _token_tis, "seq_tis": _seq_tis, "geo_mask": _geo_mask, "opsm": _opsm,
}
"""The registry: ``algorithm.rollout_is.mode`` → ``fn(log_prob, old, rollout, advantages, mask, **its settings)``
returning the constant weights ``[B, T]`` (0 off the mask) and its metrics."""
ROLLOUT_CORRECTION_NAMES: tuple[str, ...] = tuple(ROLLOUT_CORRECTIONS)

ROW_FILTERS: dict[str, Callable[..., torch.Tensor]] = {"geo_mask": geo_mask_keep}
"""Corrections that drop whole responses from the loss and its denominators: ``fn(old, rollout, mask, **settings)``
→ kept rows ``[B]``, known before the update (they read π_old and π_rollout only)."""


def rollout_correction(
    mode: str,
    *,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    **settings: float,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """``(mask, weights, metrics)`` of correction ``mode`` for one micro-batch.

    log_prob: ``[B, T]`` π_θ (read detached, by ``opsm`` only); old_log_prob / rollout_log_prob: ``[B, T]``;
    advantages: ``[B]`` or ``[B, T]``; mask ``[B, T]``; ``settings``: the mode's own (``cap``; ``geo_bound``;
    ``opsm_delta``). The returned mask is ``mask`` without the rows a :data:`ROW_FILTERS` mode drops; the weights
    ``[B, T]`` are constants, 0 off it. Metrics: ``opsm``'s ``rollout/masked_seq_frac`` (a sequence mean over the
    rows of ``mask`` holding a token); the others log theirs per step (:func:`correction_sums`).
    Unknown ``mode``: ValueError listing :data:`ROLLOUT_CORRECTION_NAMES`.
    """
    if mode not in ROLLOUT_CORRECTIONS:
        raise ValueError(f"unknown rollout correction {mode!r}; valid: {', '.join(ROLLOUT_CORRECTION_NAMES)}")
    if mode in ROW_FILTERS:
        keep = ROW_FILTERS[mode](old_log_prob, rollout_log_prob, mask, **settings)  # [B]
        mask = mask.bool() & keep.unsqueeze(-1)
    weights, metrics = ROLLOUT_CORRECTIONS[mode](log_prob, old_log_prob, rollout_log_prob, advantages, mask, **settings)
    return mask, weights, metrics


def correction_sums(
    mode: str, old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor, **settings: float
) -> dict[str, float]:
    """What ``token_tis`` / ``seq_tis`` weighted over ``mask`` ``[B, T]``, as sums to reduce over ranks:
    ``weight`` (Σ of the weights), ``truncated`` (how many exceeded the cap) and ``count``, over tokens for
    ``token_tis`` and over responses holding a token for ``seq_tis`` (its own level). ``{}`` for the other modes."""
    keep = mask.bool()
    if mode == "token_tis":
        ratio = torch.exp(_log_ratio(old_log_prob, rollout_log_prob, mask))[keep]
    elif mode == "seq_tis":
        ratio = torch.exp(seq_log_ratio(old_log_prob, rollout_log_prob, mask))[keep.any(-1)]
    else:
        return {}
    cap = settings["cap"]
    return {"weight": float(torch.clamp(ratio, max=cap).double().sum()), "truncated": float((ratio > cap).sum()),
            "count": float(ratio.numel())}
