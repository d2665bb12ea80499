"""The policy losses by name (``algorithm.policy_loss``): one dispatcher over one pure function each.

- ``dapo``: :func:`~dapo_cli.algo.losses.dapo_loss`, each token's ratio clipped with DAPO's decoupled ε_low /
  ε_high (Yu et al. 2025, Eq. 10), optional dual clip; settings ``clip_ratio_low``, ``clip_ratio_high``, ``clip_ratio_c``.
- ``gspo``: :func:`~dapo_cli.algo.gspo.gspo_loss`, each response's geometric-mean ratio clipped as a whole
  (Zheng et al. 2025); settings ``clip_ratio_low``, ``clip_ratio_high`` (of the sequence ratio).
- ``cispo``: :func:`~dapo_cli.algo.cispo.cispo_loss`, the detached importance weight clipped, never the gradient
  (MiniMax-M1, Chen et al. 2025); settings ``clip_ratio_low`` (None: no lower bound), ``clip_ratio_high``.
- ``gmpo``: :func:`~dapo_cli.algo.gmpo.gmpo_loss`, the geometric mean of each response's token-clipped terms
  (GMPO, Zhao et al. 2025); settings ``log_clip_low``, ``log_clip_high`` (the clip range in log space).

Every loss takes ``(log_prob, old_log_prob, advantages, mask)`` (``[B, T]``, ``[B, T]``, ``[B]``, ``[B, T]``), its own
hyper-parameters as keywords (their defaults are the schema's, ``config/schema.py``: each loss has its paper's),
``loss_agg_mode`` with the global counts (:func:`~dapo_cli.algo.losses.aggregate_loss`: exact under any micro-batch
or rank split) and ``token_weights`` (the behaviour correction of :mod:`dapo_cli.algo.rollout_correction`), and
returns ``(loss [], metrics)``. Metrics are token means over the mask, except :data:`SEQUENCE_METRICS`: means over
the rows holding a token, to be weighted by that row count when micro-batches are combined.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dapo_cli.algo.cispo import cispo_loss
from dapo_cli.algo.gmpo import gmpo_loss
from dapo_cli.algo.gspo import gspo_loss
from dapo_cli.algo.losses import dapo_loss

PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, float]]]

POLICY_LOSSES: dict[str, PolicyLoss] = {"dapo": dapo_loss, "gspo": gspo_loss, "cispo": cispo_loss, "gmpo": gmpo_loss}
"""The registry: ``algorithm.policy_loss`` → its function."""
POLICY_LOSS_NAMES: tuple[str, ...] = tuple(POLICY_LOSSES)

SEQUENCE_METRICS: frozenset[str] = frozenset({
    "actor/seq_clipfrac", "actor/seq_clipfrac_high", "actor/seq_clipfrac_low", "actor/seq_ratio_dev",
    "rollout/masked_seq_frac",
})
"""Metrics that are means over a micro-batch's non-empty rows (GSPO's clip at its own level; the share of
sequences a correction masked), not over its tokens."""


def get_policy_loss(name: str) -> PolicyLoss:
    """The loss registered as ``name``; an unknown name raises ValueError listing :data:`POLICY_LOSS_NAMES`."""
    if name not in POLICY_LOSSES:
        raise ValueError(f"unknown policy loss {name!r}; valid: {', '.join(POLICY_LOSS_NAMES)}")
    return POLICY_LOSSES[name]
