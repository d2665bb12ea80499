"""Pure torch functions for the DAPO objective (Yu et al. 2025, arXiv:2503.14476).

Nothing here sees a config object: tensors, floats and strings in; tensors and
dicts of detached, namespaced floats out.

- :mod:`.advantages` group-relative advantages (grpo / dr_grpo / rloo)
- :mod:`.losses`     decoupled-clip policy loss (Eq. 8/10) and loss aggregation (Eq. 12)
- :mod:`.overlong`   soft overlong punishment (Eq. 13) and overlong filtering
- :mod:`.sampling`   dynamic sampling (Eq. 11) and the group batch assembler
- :mod:`.logits`     token log-probs and entropy from logits
- :mod:`.kl`         per-token KL estimators (k1 / abs / k2 / k3)
"""

from dapo_cli.algo.advantages import ADVANTAGE_ESTIMATORS, group_advantages
from dapo_cli.algo.kl import KL_KINDS, kl_penalty
from dapo_cli.algo.logits import chunked_head_log_probs, entropy_from_logits, mean_token_prob, token_log_probs
from dapo_cli.algo.losses import LOSS_AGG_MODES, aggregate_loss, global_counts, masked_mean, policy_loss
from dapo_cli.algo.overlong import mask_responses, overlong_filter_mask, overlong_penalty
from dapo_cli.algo.sampling import GroupBatchAssembler, informative_groups

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "KL_KINDS",
    "LOSS_AGG_MODES",
    "GroupBatchAssembler",
    "aggregate_loss",
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
    "policy_loss",
    "token_log_probs",
]
