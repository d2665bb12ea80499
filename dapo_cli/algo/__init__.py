"""Pure torch functions for the DAPO objective (Yu et al. 2025, arXiv:2503.14476), the other policy losses
and rollout corrections it is compared with, and the math of direct-advantage (Liu et al. 2025).

Nothing here sees a config object: tensors, floats and strings in; tensors and
dicts of detached, namespaced floats out.

- :mod:`.advantages`         group-relative advantages, one per response (grpo / dr_grpo / rloo)
- :mod:`.losses`             DAPO's decoupled-clip policy loss (Eq. 8/10, optional dual clip) and loss aggregation (Eq. 12)
- :mod:`.gspo`               GSPO's loss: one length-normalised sequence ratio and one clip per response
- :mod:`.cispo`              CISPO's loss: the detached importance weight clipped, every token's gradient kept
- :mod:`.gmpo`               GMPO's loss: the geometric mean of each response's token-clipped terms
- :mod:`.objectives`         the policy losses by name (``algorithm.policy_loss``: dapo / gspo / cispo / gmpo)
- :mod:`.importance`         train-inference mismatch of the rollout engine's log-probs, truncated IS weights
- :mod:`.rollout_correction` the rollout corrections by name (``algorithm.rollout_is.mode``: token_tis / seq_tis / geo_mask / opsm)
- :mod:`.staleness`          version lag of asynchronous rollouts and the decoupled PPO objective that trains on them
- :mod:`.overlong`           soft overlong punishment (Eq. 13) and overlong filtering
- :mod:`.sampling`           dynamic sampling (Eq. 11) and the group batch assembler
- :mod:`.logits`             token log-probs and entropy from logits, and from the output head chunk by chunk
- :mod:`.kl`                 per-token KL estimators (``kl`` k1 / ``abs`` / ``mse`` k2 / ``low_var_kl`` k3)
- :mod:`.direct_advantage`   direct-advantage's state-centred advantages, actor loss and critic loss (soft BCE)
"""

from dapo_cli.algo.advantages import ADVANTAGE_ESTIMATORS, group_advantages
from dapo_cli.algo.kl import KL_KINDS, kl_penalty
from dapo_cli.algo.logits import chunked_head_log_probs, entropy_from_logits, mean_token_prob, token_log_probs
from dapo_cli.algo.losses import LOSS_AGG_MODES, aggregate_loss, dapo_loss, global_counts, masked_mean
from dapo_cli.algo.overlong import mask_responses, overlong_filter_mask, overlong_penalty
from dapo_cli.algo.sampling import GroupBatchAssembler, informative_groups

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "KL_KINDS",
    "LOSS_AGG_MODES",
    "GroupBatchAssembler",
    "aggregate_loss",
    "dapo_loss",
    "chunked_head_log_probs",
    "entropy_from_logits",
    "global_counts",
    "group_advantages",
    "informative_groups",
    "kl_penalty",
    "mask_responses",
    "masked_mean",
    "mean_token_prob",
    "overlong_filter_mask",
    "overlong_penalty",
    "token_log_probs",
]
