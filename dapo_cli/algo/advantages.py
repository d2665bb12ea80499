"""Group-relative advantages: one scalar per response, shared by all its tokens.

DAPO (Yu et al. 2025, arXiv:2503.14476, Eq. 8-9) uses the GRPO estimator

.. math::
    \\hat A_{i,t} = \\frac{R_i - \\operatorname{mean}(\\{R_j\\}_{j=1}^{G})}
                         {\\operatorname{std}(\\{R_j\\}_{j=1}^{G})}

over the ``G`` responses sampled for one prompt (a *group*). Two alternatives are
offered for ablations: Dr. GRPO (Liu et al. 2025, arXiv:2503.20783) drops the
division by the std, and RLOO (Ahmadian et al. 2024, arXiv:2402.14740) uses the
leave-one-out mean of the other members as the baseline.

Groups are formed by equal id, never by position, so interleaved ids are fine.
All estimators are vectorised with ``index_add_`` / ``scatter_reduce`` over group
indices; there is no Python loop over groups.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import torch

GroupIds = Sequence[Hashable] | torch.Tensor


def group_index(group_ids: GroupIds, n: int) -> tuple[torch.Tensor, int]:
    """Map arbitrary group ids to dense indices ``0..K-1`` in order of first appearance.

    group_ids: a sequence of ``n`` hashables, or an integer tensor ``[N]``.
    Returns ``(index, K)`` with ``index`` a LongTensor ``[N]``: responses with equal
    ids get equal indices, and group ``k`` is the ``k``-th distinct id met when
    reading left to right.
    """
    if isinstance(group_ids, torch.Tensor):
        if group_ids.dim() != 1 or group_ids.numel() != n:
            raise ValueError(f"group_ids must have shape [{n}], got {list(group_ids.shape)}")
        if group_ids.is_floating_point() or group_ids.is_complex():
            raise ValueError(f"group_ids tensor must be an integer tensor, got {group_ids.dtype}")
        distinct, inverse = torch.unique(group_ids.cpu(), return_inverse=True)
        return _first_appearance_order(inverse, distinct.numel()), distinct.numel()
    if len(group_ids) != n:
        raise ValueError(f"group_ids must have {n} entries, got {len(group_ids)}")
    dense: dict[Hashable, int] = {}
    index = [dense.setdefault(g, len(dense)) for g in group_ids]
    return torch.tensor(index, dtype=torch.long), len(dense)


def _first_appearance_order(inverse: torch.Tensor, num: int) -> torch.Tensor:
    """Relabel dense indices ``[N]`` in ``0..num-1`` (sorted-id order) to first-appearance order."""
    n = inverse.numel()
    positions = torch.arange(n, dtype=torch.long)
    first = torch.full((num,), n, dtype=torch.long).scatter_reduce(0, inverse, positions, reduce="amin")
    rank = torch.empty(num, dtype=torch.long)
    rank[torch.argsort(first)] = torch.arange(num, dtype=torch.long)
    return rank[inverse]


def group_sizes(index: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Members per group: ``[K]`` float64 counts for dense ``index`` ``[N]``."""
    return torch.zeros(num_groups, dtype=torch.float64).index_add_(
        0, index, torch.ones(index.numel(), dtype=torch.float64)
    )


def group_sum(values: torch.Tensor, index: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Per-group sum ``[K]`` of ``values`` ``[N]`` (float64)."""
    return torch.zeros(num_groups, dtype=torch.float64).index_add_(0, index, values)


def constant_groups(values: torch.Tensor, index: torch.Tensor, num_groups: int) -> torch.Tensor:
    """BoolTensor ``[K]``: True where every member of the group has the same value."""
    values = values.to(torch.float64)
    low = torch.full((num_groups,), float("inf"), dtype=torch.float64)
    high = torch.full((num_groups,), float("-inf"), dtype=torch.float64)
    low = low.scatter_reduce(0, index, values, reduce="amin")
    high = high.scatter_reduce(0, index, values, reduce="amax")
    return low == high


def _grpo(s: torch.Tensor, index: torch.Tensor, sizes: torch.Tensor, mean: torch.Tensor, eps: float) -> torch.Tensor:
    """GRPO / DAPO Eq. 8-9: ``(s - mean) / (std + eps)`` with the unbiased (n-1) std.

    A group of size 1 uses mean 0 and std 1, so its advantage is ``s / (1 + eps)``.
    """
    centered = s - mean[index]
    sq = group_sum(centered * centered, index, sizes.numel())
    std = torch.sqrt(sq / (sizes - 1).clamp(min=1))
    std = torch.where(sizes > 1, std, torch.ones_like(std))
    return centered / (std[index] + eps)


def _dr_grpo(s: torch.Tensor, index: torch.Tensor, sizes: torch.Tensor, mean: torch.Tensor, eps: float) -> torch.Tensor:
    """Dr. GRPO: ``s - mean`` (no std division); a size-1 group uses mean 0, so A = s."""
    return s - mean[index]


def _rloo(s: torch.Tensor, index: torch.Tensor, sizes: torch.Tensor, mean: torch.Tensor, eps: float) -> torch.Tensor:
    """RLOO: ``s_i - (sum_{j != i} s_j) / (n - 1)``; a size-1 group has no other member, so A = 0."""
    n = sizes[index]
    total = group_sum(s, index, sizes.numel())[index]
    others = (total - s) / (n - 1).clamp(min=1)
    return torch.where(n > 1, s - others, torch.zeros_like(s))


_ESTIMATORS: dict[str, Callable[..., torch.Tensor]] = {"grpo": _grpo, "dr_grpo": _dr_grpo, "rloo": _rloo}
ADVANTAGE_ESTIMATORS: tuple[str, ...] = tuple(_ESTIMATORS)


def group_advantages(
    scores: torch.Tensor, group_ids: GroupIds, *, estimator: str, eps: float = 1e-6
) -> torch.Tensor:
    """Advantage of each response relative to its group.

    scores:    float ``[N]``, one scalar reward per response (e.g. ±1 plus overlong shaping).
    group_ids: ``N`` hashables or an integer tensor ``[N]``; equal id = same prompt.
    Returns ``[N]``: float64 when ``scores`` is float64, float32 otherwise (statistics
    are computed in float64 either way), on ``scores``' device.

    Estimators (``n`` = group size, ``\\bar s`` = group mean):

    - ``grpo`` (DAPO Eq. 8-9): :math:`A_i = (s_i - \\bar s) / (\\sigma + \\epsilon)`,
      :math:`\\sigma = \\sqrt{\\sum_j (s_j - \\bar s)^2 / (n - 1)}` (unbiased). A group of
      size 1 takes mean 0 and std 1, i.e. :math:`A = s / (1 + \\epsilon)`.
    - ``dr_grpo``: :math:`A_i = s_i - \\bar s`; a size-1 group takes mean 0, i.e. ``A = s``
      (the same group statistics as ``grpo``).
    - ``rloo``: :math:`A_i = s_i - \\frac{1}{n-1}\\sum_{j \\ne i} s_j`; a size-1 group has no
      other member and gets ``A = 0``.

    For every estimator a group of size >= 2 whose scores are all equal gets exactly 0.
    Unknown ``estimator`` raises ValueError listing :data:`ADVANTAGE_ESTIMATORS`.
    """
    if estimator not in _ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; valid: {', '.join(ADVANTAGE_ESTIMATORS)}")
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D [N], got shape {list(scores.shape)}")
    out_dtype = torch.float64 if scores.dtype == torch.float64 else torch.float32
    n = scores.numel()
    index, num_groups = group_index(group_ids, n)
    s = scores.detach().to("cpu", torch.float64)
    sizes = group_sizes(index, num_groups)
    mean = group_sum(s, index, num_groups) / sizes.clamp(min=1)
    mean = torch.where(sizes > 1, mean, torch.zeros_like(mean))
    adv = _ESTIMATORS[estimator](s, index, sizes, mean, eps)
    flat = (constant_groups(s, index, num_groups) & (sizes > 1))[index]
    adv = torch.where(flat, torch.zeros_like(adv), adv)
    return adv.to(scores.device, out_dtype)
