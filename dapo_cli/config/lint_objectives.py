"""``dapo lint`` rules about the policy loss and the rollout correction (registered into
:data:`dapo_cli.config.lint_base.RULES` after the paper's rules: :mod:`dapo_cli.config.lint` imports this module last).

Sources: GSPO is Zheng et al. 2025 (arXiv:2507.18071) and GMPO Zhao et al. 2025 (arXiv:2507.20673), whose
objectives average responses; the settings each loss and each correction reads are :mod:`dapo_cli.config.objectives`'.
"""

from __future__ import annotations

from dapo_cli.config.lint_base import WARN, Finding, rule
from dapo_cli.config.objectives import SEQUENCE_MEAN_LOSSES, ignored_settings
from dapo_cli.config.schema import Config


@rule("setting-ignored")
def setting_ignored(cfg: Config) -> list[Finding]:
    """A loss or correction setting changed from its default that the chosen ``algorithm.policy_loss`` or
    ``algorithm.rollout_is.mode`` does not read (:func:`~dapo_cli.config.objectives.ignored_settings`): e.g.
    ``algorithm.clip_ratio_c`` (DAPO's dual clip) with ``policy_loss: gspo``, ``algorithm.gspo.*`` with ``dapo``,
    ``rollout_is.cap`` with ``geo_mask``, or any correction setting when no correction runs. The run would not do
    what the setting says. Warning, one per key."""
    return [
        Finding(WARN, key, f"{key} is set but {why}", fix) for key, why, fix in ignored_settings(cfg)
    ]


@rule("sequence-loss-aggregation")
def sequence_loss_aggregation(cfg: Config) -> list[Finding]:
    """``policy_loss: gspo`` or ``gmpo`` (:data:`~dapo_cli.config.objectives.SEQUENCE_MEAN_LOSSES`) with a
    ``loss_agg_mode`` other than ``seq-mean-token-mean``: their objective is a mean over responses of one term each;
    ``token-mean`` (DAPO's default) and the sum modes weight each response's term by its length instead, another
    objective (exact, but not the paper's; docs/objectives.md). Warning."""
    algo = cfg.algorithm
    if algo.policy_loss not in SEQUENCE_MEAN_LOSSES or algo.loss_agg_mode == "seq-mean-token-mean":
        return []
    return [Finding(
        WARN, "algorithm.loss_agg_mode",
        f"policy_loss={algo.policy_loss} with loss_agg_mode={algo.loss_agg_mode}: {algo.policy_loss.upper()} averages one "
        "term per response, and this mode weights each response's term by its length, so it is not the paper's objective",
        "set algorithm.loss_agg_mode=seq-mean-token-mean (--no-token-level-loss)",
    )]
