"""The run's training objective, resolved from the config once, when the session opens.

:func:`build_objective` reads every setting the update's loss needs (the policy loss ``algorithm.policy_loss`` with
its own settings, :func:`~dapo_cli.config.objectives.loss_args`; the rollout correction when
:func:`~dapo_cli.config.schema.behaviour_correction` holds, with its settings; the aggregation mode and its
normaliser; the entropy and KL weights; the sampling temperature the log-probs are taken at) and looks the policy
loss up in its registry once (:func:`~dapo_cli.algo.objectives.get_policy_loss`). ``train.update`` then reads only
this object: no micro-batch reads the config again. The correction, the aggregation mode and the KL estimator stay
names, which their ``algo/`` functions dispatch on at each call.

Shapes: ``B`` rows of a micro-batch, ``T`` response tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from dapo_cli.algo.kl import kl_penalty
from dapo_cli.algo.losses import aggregate_loss, masked_mean
from dapo_cli.algo.objectives import PolicyLoss, get_policy_loss
from dapo_cli.algo.rollout_correction import ROW_FILTERS
from dapo_cli.algo.staleness import decoupled_policy_loss
from dapo_cli.batch import RolloutBatch
from dapo_cli.config import Config
from dapo_cli.config.objectives import correction_args, loss_args
from dapo_cli.config.schema import behaviour_correction


@dataclass(frozen=True)
class Objective:
    """What the update minimises, every setting bound: ``loss`` with ``loss_args`` (the policy term), aggregated by
    ``agg_mode`` (``norm_length`` for the modes that divide by a fixed length; ``loss_norm``: over the mini-batch's
    global counts, or each micro-batch its own); with ``correction`` (None: the loss sees π_old only) the decoupled
    objective of :mod:`dapo_cli.algo.staleness`, corrected with ``correction_args``; minus ``entropy_coeff`` x the
    entropy and plus ``kl_coef`` x the ``kl_type`` KL to the reference when ``use_kl``. Log-probs are taken at
    ``temperature``."""

    loss: PolicyLoss
    loss_args: Mapping[str, Any]
    agg_mode: str
    loss_norm: str
    norm_length: int
    temperature: float
    correction: str | None = None
    correction_args: Mapping[str, Any] = field(default_factory=dict)
    entropy_coeff: float = 0.0
    use_kl: bool = False
    kl_coef: float = 0.0
    kl_type: str = "low_var_kl"

    @property
    def corrected(self) -> bool:
        """The loss corrects for π_rollout ≠ π_old (:func:`~dapo_cli.config.schema.behaviour_correction`)."""
        return self.correction is not None

    @property
    def with_entropy(self) -> bool:
        return self.entropy_coeff > 0

    def trained_mask(self, batch: RolloutBatch) -> torch.Tensor:
        """``batch.loss_mask`` ``[N, T]`` without the responses a row-dropping correction drops (``geo_mask``, from
        π_old and π_rollout): the tokens the loss and its global counts hold."""
        if not (self.correction in ROW_FILTERS and batch.rollout_log_probs is not None):
            return batch.loss_mask
        keep = ROW_FILTERS[self.correction](batch.old_log_probs, batch.rollout_log_probs, batch.loss_mask, **self.correction_args)
        return batch.loss_mask.bool() & keep.unsqueeze(-1)

    def __call__(
        self, logp: torch.Tensor, ent: torch.Tensor | None, micro: RolloutBatch, mask: torch.Tensor, counts: Mapping[str, float]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """One micro-batch's term of the mini-batch loss and its detached metrics.

        logp: ``[B, T]`` log π_θ (with grad); ent: ``[B, T]`` its entropy (None unless :attr:`with_entropy`);
        mask: ``[B, T]`` :meth:`trained_mask`; counts: the global token / sequence counts of the aggregation
        (:func:`~dapo_cli.algo.losses.global_counts`, with ``norm_length``)."""
        device = logp.device
        args = {**self.loss_args, "loss_agg_mode": self.agg_mode, **counts}
        old, adv = micro.old_log_probs.to(device), micro.advantages.to(device)
        if self.correction is not None and micro.rollout_log_probs is not None:  # π_old is π_prox, the engine's π_behav
            loss, m = decoupled_policy_loss(
                logp, old, micro.rollout_log_probs.to(device), adv, mask, correction=self.correction,
                correction_args=self.correction_args, loss=self.loss, **args,
            )
        else:
            loss, m = self.loss(logp, old, adv, mask, **args)
        if self.with_entropy:
            loss = loss - self.entropy_coeff * aggregate_loss(ent, mask, self.agg_mode, **counts)
        if self.use_kl:
            kl = kl_penalty(logp, micro.ref_log_probs.to(device), kind=self.kl_type)
            loss = loss + self.kl_coef * aggregate_loss(kl, mask, self.agg_mode, **counts)
            m["actor/kl_loss"] = masked_mean(kl.detach(), mask)
        return loss, m


def build_objective(cfg: Config) -> Objective:
    """The run's :class:`Objective`, the config read once: the policy loss is looked up here (an unknown name raises
    ValueError, as its registry does); the correction, aggregation and KL names are kept as they are."""
    algo = cfg.algorithm
    corrected = behaviour_correction(cfg)
    return Objective(
        loss=get_policy_loss(algo.policy_loss),
        loss_args=loss_args(cfg),
        agg_mode=algo.loss_agg_mode,
        loss_norm=algo.loss_norm,
        norm_length=cfg.rollout.max_response_length,
        temperature=cfg.rollout.temperature,
        correction=algo.rollout_is.mode if corrected else None,
        correction_args=correction_args(cfg) if corrected else {},
        entropy_coeff=algo.entropy_coeff,
        use_kl=algo.use_kl_loss,
        kl_coef=algo.kl_loss_coef,
        kl_type=algo.kl_loss_type,
    )
