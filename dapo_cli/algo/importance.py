"""Train-inference mismatch: how far the rollout engine's log-probs are from the trainer's, and
truncated importance sampling (TIS) to correct for it.

The rollout engine (vLLM, a faster sampler) samples ``o ~ π_rollout`` with its own kernels and
precision; the trainer's "old" policy π_old has the same weights but not the same numbers. PPO's
ratio assumes the samples came from π_old. Truncated importance sampling (Yao et al. 2025,
"Your efficient RL framework secretly brings you off-policy RL training") weights each token's
loss by

.. math:: w_t = \\min\\Big(\\frac{\\pi_{old}(o_t \\mid q, o_{<t})}{\\pi_{rollout}(o_t \\mid q, o_{<t})},\\ C\\Big)

a constant (no gradient) that makes the estimator unbiased up to the truncation at ``C``.

Shapes: ``B`` responses, ``T`` response tokens; masks ``[B, T]``.
"""

from __future__ import annotations

import torch

from dapo_cli.algo.losses import LOG_RATIO_CLAMP

SAMPLER_LOGPROB_TOL = 1e-5
"""Largest |log π_trainer − log π_rollout| per token the float32 ``fast`` and ``hf`` rollout engines are held to
against the trainer's float32 forward of the same weights on the tiny test policy
(``tests/rollout/test_rollout_conformance.py``; vLLM's other kernels: 1e-4; SmolLM2-135M measured 1.6e-5 on average,
docs/performance.md). Within it a token's truncated-IS weight min(π_old / π_rollout, C) is 1 ± 1e-5."""


def truncated_is_weights(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor, *, cap: float
) -> torch.Tensor:
    """:math:`w = \\min(\\exp(\\log\\pi_{old} - \\log\\pi_{rollout}), C)` on ``mask``, 0 elsewhere.

    old_log_prob, rollout_log_prob: ``[B, T]``; mask: ``[B, T]`` bool or 0/1.
    Returns detached float ``[B, T]``. The log-ratio is clamped to ±20 before ``exp`` (as in the
    policy loss), so padding holding garbage cannot overflow. ``cap`` must be >= 1.
    """
    if cap < 1.0:
        raise ValueError(f"cap must be >= 1, got {cap}")
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != mask.shape:
        raise ValueError(
            f"shapes differ: old {list(old_log_prob.shape)}, rollout {list(rollout_log_prob.shape)}, mask {list(mask.shape)}"
        )
    log_ratio = torch.clamp(old_log_prob.detach() - rollout_log_prob.detach(), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    weights = torch.clamp(torch.exp(log_ratio), max=cap)
    return torch.where(mask.bool(), weights, torch.zeros_like(weights))


def mismatch_sums(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """Sums to reduce over micro-batches and ranks: ``abs_diff`` = Σ |log π_old − log π_rollout| over
    ``mask``, ``tokens`` = Σ mask; and ``max_abs_diff`` (reduce with max). All 0.0 when empty."""
    keep = mask.bool()
    diff = (old_log_prob.detach() - rollout_log_prob.detach()).abs()[keep]
    if diff.numel() == 0:
        return {"abs_diff": 0.0, "tokens": 0.0, "max_abs_diff": 0.0}
    return {"abs_diff": float(diff.double().sum()), "tokens": float(diff.numel()), "max_abs_diff": float(diff.max())}


def ratio_sums(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The token probability ratio :math:`\\rho = \\pi_{old} / \\pi_{rollout}` (log-ratio clamped to ±20) over ``mask``
    ``[B, T]``, as values to reduce over micro-batches and ranks: ``ratio`` = Σ ρ and ``mult_error`` = Σ
    :math:`e^{|\\log\\rho|}` (NeMo-RL's token_mult_prob_error: 1 when the engines agree, 1.01 for a 1% gap either way)
    with sum; ``ratio_min`` (reduce with min) and ``ratio_max`` (with max), +inf / -inf when empty (neutral under
    those reductions). ``E_rollout[ρ] = 1``, so
    a mean of ``ratio`` far from 1 says the two engines do not sample the same distribution."""
    keep = mask.bool()
    log_ratio = torch.clamp(old_log_prob.detach() - rollout_log_prob.detach(), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)[keep]
    if log_ratio.numel() == 0:
        return {"ratio": 0.0, "mult_error": 0.0, "ratio_min": float("inf"), "ratio_max": float("-inf")}
    log_ratio = log_ratio.double()
    ratio = torch.exp(log_ratio)
    return {"ratio": float(ratio.sum()), "mult_error": float(torch.exp(log_ratio.abs()).sum()),
            "ratio_min": float(ratio.min()), "ratio_max": float(ratio.max())}
