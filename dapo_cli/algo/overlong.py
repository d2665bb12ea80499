"""Overlong reward shaping (DAPO §3.4): soft punishment (Eq. 13) and overlong filtering.

Soft overlong punishment, DAPO (Yu et al. 2025, arXiv:2503.14476) Eq. 13, scaled by
a penalty factor :math:`\\lambda` (the paper uses :math:`\\lambda = 1`):

.. math::
    R_{length}(y) = \\lambda \\cdot \\begin{cases}
      0, & |y| \\le L_{max} - L_{cache} \\\\
      \\frac{(L_{max} - L_{cache}) - |y|}{L_{cache}}, & L_{max} - L_{cache} < |y| \\le L_{max} \\\\
      -1, & L_{max} < |y|
    \\end{cases}

It is added to the rule-based correctness reward. Overlong filtering (DAPO §3.4,
Fig. 5) instead masks truncated responses (no EOS within the limit) out of the loss.
"""

from __future__ import annotations

import torch


def overlong_penalty(
    lengths: torch.Tensor, *, max_length: int, buffer_length: int, penalty_factor: float
) -> torch.Tensor:
    """Soft overlong punishment (DAPO Eq. 13) times ``penalty_factor``.

    lengths: ``[N]`` response lengths in tokens (any numeric dtype).
    Returns float32 ``[N]``: 0 for ``L <= Lmax - Lcache``; ``((Lmax - Lcache) - L) / Lcache
    * factor`` for ``Lmax - Lcache < L <= Lmax`` (reaching ``-factor`` at ``L = Lmax``);
    ``-factor`` for ``L > Lmax``. ``buffer_length`` (:math:`L_{cache}`) must lie in
    ``(0, max_length]``, else ValueError. No defaults: the paper's values are the schema's
    (``rollout.max_response_length``, ``algorithm.overlong_buffer.len`` / ``penalty_factor``).
    """
    if not 0 < buffer_length <= max_length:
        raise ValueError(
            f"buffer_length must be in (0, max_length={max_length}], got {buffer_length}; "
            "the DAPO paper uses max_length=20480 with buffer_length=4096"
        )
    length = lengths.to(torch.float64)
    expected = float(max_length - buffer_length)
    inside = (expected - length) / buffer_length * penalty_factor
    zero = torch.zeros_like(length)
    beyond = torch.full_like(length, -penalty_factor)
    penalty = torch.where(length <= expected, zero, torch.where(length <= max_length, inside, beyond))
    return penalty.to(torch.float32)


def overlong_filter_mask(truncated: torch.Tensor) -> torch.Tensor:
    """Overlong filtering (DAPO §3.4): BoolTensor ``[N]``, True = keep the response in the loss.

    truncated: BoolTensor ``[N]``, True when no EOS was produced within the length limit;
    those responses are dropped (False).
    """
    if truncated.dtype != torch.bool:
        raise ValueError(f"truncated must be a bool tensor, got {truncated.dtype}")
    return ~truncated


def mask_responses(token_mask: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Apply a per-response keep mask ``[N]`` (bool) to a token mask ``[N, T]``.

    Returns a tensor of ``token_mask``'s shape and dtype whose rows with ``keep = False``
    are all zero/False; other rows are unchanged.
    """
    if keep.dim() != 1 or token_mask.dim() != 2 or keep.shape[0] != token_mask.shape[0]:
        raise ValueError(f"keep [N] and token_mask [N, T] disagree: {list(keep.shape)} vs {list(token_mask.shape)}")
    keep_rows = keep.to(torch.bool).unsqueeze(-1)
    return torch.where(keep_rows, token_mask, torch.zeros_like(token_mask))
