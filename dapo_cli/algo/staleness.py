"""Asynchronous rollouts: how stale a sample is, and the decoupled PPO objective that trains on it.

With asynchronous rollouts (``rollout.max_staleness = k > 0``) a worker samples the next steps'
responses while the trainer updates, so a response ``i`` of step ``t`` was drawn with weights
θ_{v_i} of an older *version* than the policy being updated. Versions count completed steps:
the policy updated at step ``t`` has version ``t − 1`` (the weights after step ``t − 1``), and

.. math:: \\Delta_i = (t - 1) - v_i \\ge 0

is the response's *version lag*. A response with :math:`\\Delta_i > k` is never trained on.

Three policies then meet in the loss (AReaL, Fu et al. 2025, arXiv:2505.24298, §5 "decoupled
PPO objective"): the behaviour policy :math:`\\pi_{behav} = \\pi_{\\theta_{v_i}}` that sampled
(its per-token log-probs are recorded by the rollout engine), the proximal policy
:math:`\\pi_{prox} = \\pi_{\\theta_{t-1}}` (the old log-probs, recomputed by the trainer at update
time), and the policy being optimised :math:`\\pi_\\theta`. PPO's trust region is taken around
the proximal policy and the behaviour mismatch is corrected by an importance weight:

.. math::
    J(\\theta) = \\mathbb{E}_{o \\sim \\pi_{behav}} \\Big[\\sum_t w_t \\,
        \\min\\big(r_t(\\theta) \\hat A_t,\\ \\operatorname{clip}(r_t(\\theta), 1-\\varepsilon_{low}, 1+\\varepsilon_{high}) \\hat A_t\\big)\\Big],
    \\quad r_t(\\theta) = \\frac{\\pi_\\theta(o_t \\mid q, o_{<t})}{\\pi_{prox}(o_t \\mid q, o_{<t})},
    \\quad w_t = \\min\\Big(\\frac{\\pi_{prox}(o_t \\mid q, o_{<t})}{\\pi_{behav}(o_t \\mid q, o_{<t})},\\ C\\Big)

aggregated like every other loss here (token-mean for DAPO's Eq. 12). AReaL uses the plain
ratio as :math:`w_t`; here the weight is whichever rollout correction ``algorithm.rollout_is.mode`` names
(:mod:`dapo_cli.algo.rollout_correction`: by default min(ratio, C), the truncated importance weight of
:mod:`dapo_cli.algo.importance` (Yao et al. 2025), which also absorbs the rollout engine's numerical mismatch;
or a sequence-level weight, or a mask), and the clipped term is whichever policy loss ``algorithm.policy_loss``
names (:mod:`dapo_cli.algo.objectives`: DAPO's above, GSPO's, CISPO's, GMPO's). With a lag of 0 on the rollout engine's own
kernels :math:`w_t \\approx 1` and the objective is the policy loss's own.

Shapes: ``N`` responses, ``B`` rows of a micro-batch, ``T`` response tokens.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from dapo_cli.algo.objectives import PolicyLoss
from dapo_cli.algo.rollout_correction import rollout_correction


def version_lag(policy_version: int, versions: torch.Tensor) -> torch.Tensor:
    """:math:`\\Delta_i = v_{policy} - v_i` per response.

    policy_version: the version of the policy being updated (``t − 1`` at step ``t``).
    versions:       LongTensor ``[N]``, the weight version each response was sampled with.
    Returns LongTensor ``[N]``. A version newer than the policy cannot exist: ValueError.
    """
    lag = policy_version - versions.long()
    if lag.numel() and int(lag.min()) < 0:
        raise ValueError(f"a sample of version {int(versions.max())} is newer than the policy being updated ({policy_version})")
    return lag


def decoupled_policy_loss(
    log_prob: torch.Tensor,
    prox_log_prob: torch.Tensor,
    behav_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    correction: str,
    correction_args: Mapping[str, float],
    loss: PolicyLoss,
    **loss_args: object,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The decoupled PPO loss :math:`-J(\\theta)` of the module docstring.

    log_prob:       ``[B, T]`` log π_θ of the sampled tokens (with grad).
    prox_log_prob:  ``[B, T]`` log π_prox, the old log-probs recomputed with the weights being updated (constant).
    behav_log_prob: ``[B, T]`` log π_behav, the rollout engine's log-probs of its own samples (constant).
    advantages:     ``[B]`` or ``[B, T]``; mask: ``[B, T]``.
    correction:     the rollout correction (:data:`~dapo_cli.algo.rollout_correction.ROLLOUT_CORRECTIONS`) and
                    ``correction_args`` its settings (``{"cap": C}`` for ``token_tis``).
    loss:           the policy loss function (one of :data:`~dapo_cli.algo.objectives.POLICY_LOSSES`) and
                    ``loss_args`` its clip, aggregation and global-count arguments.
    A correction that drops rows (``geo_mask``) drops them from ``mask`` here; a caller splitting a mini-batch
    computes its global counts without them (:data:`~dapo_cli.algo.rollout_correction.ROW_FILTERS`).
    Returns ``(loss [], metrics)``: the policy loss's, and the correction's.
    """
    kept, weights, corrected = rollout_correction(
        correction, log_prob=log_prob, old_log_prob=prox_log_prob, rollout_log_prob=behav_log_prob,
        advantages=advantages, mask=mask, **correction_args,
    )
    value, metrics = loss(log_prob, prox_log_prob, advantages, kept, token_weights=weights, **loss_args)
    return value, {**metrics, **corrected}
