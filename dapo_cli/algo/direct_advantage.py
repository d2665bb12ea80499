"""Pure torch functions of Direct Advantage-Based Policy Optimization (Liu et al. 2025, arXiv:2412.18279).

The other "DAPO": offline, step-level. A critic ``V(s)`` predicts the probability that a
solution prefix ``s`` ends correct; for each state ``s`` with candidate next steps
``a_1..a_K`` (the distinct first steps of its Monte-Carlo completions)

.. math::
    q_i = V(s \\circ a_i), \\qquad \\hat A_i = q_i - \\frac1K \\sum_j q_j ,

and the actor minimises the squared distance between the scaled advantage and the
log-ratio of the whole step against a fixed reference policy:

.. math::
    \\mathcal L(\\theta) = \\tfrac12\\, \\mathbb E_{s}\\, \\mathbb E_{a \\sim U(A_s)}
      \\Big[\\Big(\\frac{\\hat A(s, a)}{\\beta} - \\log\\frac{\\pi_\\theta(a\\mid s)}{\\pi_{ref}(a\\mid s)}\\Big)^2\\Big],
    \\qquad \\log \\pi(a\\mid s) = \\sum_{t \\in a} \\log \\pi(a_t \\mid s, a_{<t})

(the action's log-probability is the **sum** of its tokens' log-probs, not their mean).

Shapes: ``N`` candidates (state-action pairs), ``T`` action tokens (right-padded);
``state_index`` ``[N]`` holds any integer id per state. Nothing here sees a config.
"""

from __future__ import annotations

import torch


def action_log_probs(token_log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[N]`` log π(a | s) = sum over the action's tokens of ``token_log_probs`` ``[N, T]`` where ``mask``.

    Padded positions are zeroed before summing (NaN/inf there cannot leak in).
    """
    if token_log_probs.shape != mask.shape:
        raise ValueError(f"token_log_probs {list(token_log_probs.shape)} and mask {list(mask.shape)} differ")
    keep = mask.to(torch.bool)
    return torch.where(keep, token_log_probs, torch.zeros_like(token_log_probs)).sum(-1)


def dense_state_ids(state_index: torch.Tensor) -> tuple[torch.Tensor, int]:
    """State ids renumbered ``0..S-1`` (in order of first appearance is not needed: sorted unique), and ``S``."""
    unique, inverse = torch.unique(state_index, return_inverse=True)
    return inverse, int(unique.numel())


def state_mean(values: torch.Tensor, state_index: torch.Tensor) -> torch.Tensor:
    """``[N]``: the mean of ``values`` over each candidate's state, broadcast back to the candidates."""
    ids, num = dense_state_ids(state_index)
    sums = torch.zeros(num, dtype=values.dtype, device=values.device).index_add_(0, ids, values)
    counts = torch.zeros(num, dtype=values.dtype, device=values.device).index_add_(0, ids, torch.ones_like(values))
    return (sums / counts)[ids]


def centered_advantages(q: torch.Tensor, state_index: torch.Tensor) -> torch.Tensor:
    """Â_i = q_i − mean of q over the candidates of i's state (each distinct action counted once)."""
    return q - state_mean(q, state_index)


def state_gaps(advantages: torch.Tensor, state_index: torch.Tensor) -> torch.Tensor:
    """``[N]``: max − min advantage of each candidate's state (the same for every candidate of a state)."""
    ids, num = dense_state_ids(state_index)
    high = torch.full((num,), -torch.inf, dtype=advantages.dtype, device=advantages.device)
    low = torch.full((num,), torch.inf, dtype=advantages.dtype, device=advantages.device)
    high = high.scatter_reduce(0, ids, advantages, reduce="amax")
    low = low.scatter_reduce(0, ids, advantages, reduce="amin")
    return (high - low)[ids]


def gap_filter(advantages: torch.Tensor, state_index: torch.Tensor, min_gap: float) -> torch.Tensor:
    """BoolTensor ``[N]``: candidates of states whose advantage spread (max − min) is at least ``min_gap``.

    A state is kept or dropped whole, so its candidates stay together.
    """
    if min_gap < 0:
        raise ValueError(f"min_gap must be >= 0, got {min_gap}")
    return state_gaps(advantages, state_index) >= min_gap - 1e-6  # float rounding: a gap of exactly min_gap counts


def state_uniform_weights(state_index: torch.Tensor, num_states: int | None = None) -> torch.Tensor:
    """``[N]`` weights: every state weighs ``1 / S`` in total, split evenly over its candidates.

    ``S`` is the number of distinct states in ``state_index`` unless ``num_states`` says
    otherwise (a micro-batch that holds some of a batch's states passes the batch's count,
    so micro-batch losses add up to the batch loss). Weights sum to ``S_here / S``.
    """
    ids, num = dense_state_ids(state_index)
    per_state = torch.zeros(num, dtype=torch.float32, device=state_index.device).index_add_(
        0, ids, torch.ones(ids.shape[0], dtype=torch.float32, device=state_index.device)
    )
    total = float(num if num_states is None else num_states)
    if total <= 0:
        raise ValueError(f"num_states must be > 0, got {num_states}")
    return 1.0 / (per_state[ids] * total)


def direct_advantage_loss(
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    beta: float,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """½ Σ_i w_i (Â_i/β − (log π_θ(a_i|s_i) − log π_ref(a_i|s_i)))²; ``w`` defaults to 1/N (a plain mean).

    ``log_probs`` / ``ref_log_probs``: ``[N]`` whole-action log-probabilities (see
    :func:`action_log_probs`), ``advantages`` ``[N]``. Returns the loss (differentiable in
    ``log_probs``) and detached metrics: ``loss``, ``log_ratio_mean``, ``log_ratio_abs_mean``,
    ``target_abs_mean`` and ``residual_abs_mean`` (weighted means).
    """
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if not (log_probs.shape == ref_log_probs.shape == advantages.shape) or log_probs.dim() != 1:
        raise ValueError(
            f"expected three [N] tensors; got {list(log_probs.shape)}, {list(ref_log_probs.shape)}, {list(advantages.shape)}"
        )
    n = log_probs.shape[0]
    if weights is None:
        weights = torch.full((n,), 1.0 / max(n, 1), dtype=log_probs.dtype, device=log_probs.device)
    weights = weights.to(log_probs.dtype).to(log_probs.device)
    target = advantages.to(log_probs.dtype) / beta
    log_ratio = log_probs - ref_log_probs.to(log_probs.dtype)
    residual = target - log_ratio
    loss = 0.5 * (weights * residual.square()).sum()
    with torch.no_grad():
        total = float(weights.sum()) or 1.0
        metrics = {
            "loss": float(loss),
            "log_ratio_mean": float((weights * log_ratio).sum()) / total,
            "log_ratio_abs_mean": float((weights * log_ratio.abs()).sum()) / total,
            "target_abs_mean": float((weights * target.abs()).sum()) / total,
            "residual_abs_mean": float((weights * residual.abs()).sum()) / total,
        }
    return loss, metrics


def soft_bce_loss(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Binary cross-entropy of ``sigmoid(logits)`` against soft targets in [0, 1] (weighted mean; default plain mean).

    −[y log σ(z) + (1 − y) log(1 − σ(z))] per example; its minimum over z is the entropy of
    Bernoulli(y) (:func:`bernoulli_entropy`), reached at σ(z) = y.
    """
    if logits.shape != targets.shape:
        raise ValueError(f"logits {list(logits.shape)} and targets {list(targets.shape)} differ")
    per = torch.nn.functional.binary_cross_entropy_with_logits(logits, targets.to(logits.dtype), reduction="none")
    if weights is None:
        return per.mean()
    weights = weights.to(per.dtype)
    return (per * weights).sum() / weights.sum().clamp(min=1e-12)


def bernoulli_entropy(targets: torch.Tensor) -> torch.Tensor:
    """``[N]`` entropy of Bernoulli(y) in nats: the lowest BCE a critic can reach on soft target y."""
    y = targets.clamp(0.0, 1.0)
    return -(torch.special.xlogy(y, y) + torch.special.xlogy(1 - y, 1 - y))


def calibration_bins(predicted: torch.Tensor, target: torch.Tensor, num_bins: int = 10) -> dict[str, torch.Tensor]:
    """Reliability table of predicted success probabilities against Monte-Carlo success rates.

    Equal-width bins on [0, 1] (a prediction of exactly 1 falls in the last). Returns
    ``low``, ``high``, ``count``, ``mean_predicted``, ``mean_target`` (``[num_bins]``; NaN
    for empty bins) and ``ece`` (0-d: count-weighted mean |mean_predicted − mean_target|).
    """
    if num_bins < 1:
        raise ValueError(f"num_bins must be >= 1, got {num_bins}")
    if predicted.shape != target.shape:
        raise ValueError(f"predicted {list(predicted.shape)} and target {list(target.shape)} differ")
    p = predicted.detach().double().clamp(0.0, 1.0)
    y = target.detach().double()
    idx = torch.clamp((p * num_bins).long(), max=num_bins - 1)
    count = torch.zeros(num_bins, dtype=torch.float64).index_add_(0, idx, torch.ones_like(p))
    sum_p = torch.zeros(num_bins, dtype=torch.float64).index_add_(0, idx, p)
    sum_y = torch.zeros(num_bins, dtype=torch.float64).index_add_(0, idx, y)
    safe = count.clamp(min=1.0)
    nan = torch.full_like(count, float("nan"))
    mean_p = torch.where(count > 0, sum_p / safe, nan)
    mean_y = torch.where(count > 0, sum_y / safe, nan)
    gaps = torch.where(count > 0, (sum_p - sum_y).abs(), torch.zeros_like(count))
    edges = torch.linspace(0.0, 1.0, num_bins + 1, dtype=torch.float64)
    ece = gaps.sum() / count.sum().clamp(min=1.0)
    return {"low": edges[:-1], "high": edges[1:], "count": count, "mean_predicted": mean_p, "mean_target": mean_y, "ece": ece}
