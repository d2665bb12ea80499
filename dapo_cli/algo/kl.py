"""Per-token KL estimators between the policy and a reference policy.

DAPO itself drops the KL term (Yu et al. 2025, arXiv:2503.14476, §2.3); these exist
for GRPO-style baselines and ablations. With :math:`\\Delta = \\log\\pi_\\theta(y) -
\\log\\pi_{ref}(y)` for a token ``y`` sampled from :math:`\\pi_\\theta`, the estimators of
:math:`KL(\\pi_\\theta \\| \\pi_{ref})` are Schulman's (http://joschu.net/blog/kl-approx.html):

- ``kl`` (k1): :math:`\\Delta` — unbiased, high variance, can be negative.
- ``abs``: :math:`|\\Delta|` — a non-negative heuristic (not an unbiased estimator).
- ``mse`` (k2): :math:`\\tfrac12 \\Delta^2` — biased, low variance, non-negative.
- ``low_var_kl`` (k3): :math:`e^{-\\Delta} + \\Delta - 1` — unbiased, low variance,
  non-negative (the estimator of GRPO, arXiv:2402.03300 Eq. 4); clamped to ``[-10, 10]``
  for stability.

All take and return ``[B, T]`` tensors.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

LOW_VAR_KL_CLAMP = 10.0


def _k1(delta: torch.Tensor) -> torch.Tensor:
    return delta


def _abs(delta: torch.Tensor) -> torch.Tensor:
    return delta.abs()


def _k2(delta: torch.Tensor) -> torch.Tensor:
    return 0.5 * delta.square()


def _k3(delta: torch.Tensor) -> torch.Tensor:
    """``exp(ref - logp) - (ref - logp) - 1`` clamped to [-10, 10].

    ``ref - logp`` is first clamped to [-20, 20]: this changes no value (beyond it the
    result is already >= 10 and clamped) but keeps ``exp`` finite so the gradient of the
    clamped region is 0 rather than NaN.
    """
    neg = torch.clamp(-delta, -20.0, 20.0)
    return torch.clamp(torch.exp(neg) - neg - 1.0, -LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP)


_KL_KINDS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"kl": _k1, "abs": _abs, "mse": _k2, "low_var_kl": _k3}
KL_KINDS: tuple[str, ...] = tuple(_KL_KINDS)


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL estimate ``[B, T]`` from ``log_prob`` and ``ref_log_prob`` (both ``[B, T]``).

    ``kind`` is one of :data:`KL_KINDS` (see the module docstring for the formulas);
    an unknown kind raises ValueError listing them. Reduce the result with
    :func:`dapo_cli.algo.losses.aggregate_loss`.
    """
    if kind not in _KL_KINDS:
        raise ValueError(f"unknown KL kind {kind!r}; valid: {', '.join(KL_KINDS)}")
    if log_prob.shape != ref_log_prob.shape:
        raise ValueError(f"log_prob {list(log_prob.shape)} and ref_log_prob {list(ref_log_prob.shape)} differ")
    return _KL_KINDS[kind](log_prob - ref_log_prob)
