"""CISPO: Clipped IS-weight Policy Optimization (MiniMax-M1, Chen et al. 2025, arXiv:2506.13585, §3.1).

PPO and DAPO clip the *update*: a token whose ratio left the clip range on the side its advantage pushes gets no
gradient, and the rare low-probability tokens that fork a chain of reasoning are the ones that leave it first.
CISPO clips the importance-sampling *weight* instead and keeps every token's gradient, REINFORCE-style:

.. math::
    \\mathcal J_{CISPO}(\\theta) = \\mathbb E\\Big[\\frac{1}{\\sum_{i=1}^G |o_i|}\\sum_{i=1}^G\\sum_{t=1}^{|o_i|}
        \\operatorname{sg}\\big(\\hat r_{i,t}(\\theta)\\big)\\, \\hat A_{i,t}\\,
        \\log\\pi_\\theta(o_{i,t} \\mid q, o_{i,<t})\\Big],
    \\qquad \\hat r_{i,t} = \\operatorname{clip}\\big(r_{i,t}, 1-\\varepsilon^{IS}_{low}, 1+\\varepsilon^{IS}_{high}\\big)

with :math:`r_{i,t} = \\pi_\\theta(o_{i,t}) / \\pi_{\\theta_{old}}(o_{i,t})` and ``sg`` the stop-gradient. Its
gradient is :math:`\\hat r_{i,t} \\hat A_{i,t} \\nabla\\log\\pi_\\theta(o_{i,t})` on every token: where no bound binds,
:math:`\\hat r = r` and that is exactly the gradient :math:`\\hat A\\,\\nabla r` of PPO's unclipped term, i.e. of DAPO
inside its clip range. The paper sets no lower bound (ε_low "large") and tunes only ε_high; ``clip_ratio_low=None``
is no lower bound. The normaliser is the token count (DAPO's token-mean); any
:func:`~dapo_cli.algo.losses.aggregate_loss` mode can be asked for.

Shapes: ``B`` responses, ``T`` response tokens (right-padded); masks ``[B, T]``.
"""

from __future__ import annotations

import torch

from dapo_cli.algo.losses import Count, aggregate_loss, apply_token_weights, clamped_log_ratio, masked_mean, token_advantages


def cispo_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: float | None,
    clip_ratio_high: float,
    loss_agg_mode: str,
    global_tokens: Count | None = None,
    global_seqs: Count | None = None,
    norm_length: int | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """:math:`-\\mathcal J_{CISPO}` of the module docstring, aggregated by ``loss_agg_mode``.

    log_prob:     ``[B, T]`` log π_θ of the sampled tokens (with grad).
    old_log_prob: ``[B, T]`` log π_old (constant).
    advantages:   ``[B]`` or ``[B, T]`` (constant).
    mask:         ``[B, T]`` bool or 0/1, the tokens in the loss.
    clip_ratio_low:  ε_low of the IS weight's lower bound 1 - ε_low (None: no lower bound, as the paper).
    clip_ratio_high: ε_high of its upper bound 1 + ε_high.
    ``token_weights`` ``[B, T]`` (constants) multiply each token's loss before aggregation.

    The per-token loss is :math:`-\\operatorname{sg}(\\hat r)\\hat A \\log\\pi_\\theta` (the ratio from the log-ratio
    clamped to ±20, as in ``dapo_loss``). Returns ``(loss [], metrics)``, token means over ``mask``:
    ``actor/pg_loss``, ``actor/is_weight_mean`` (of :math:`\\hat r`), ``actor/is_clipfrac_high`` (r > 1+ε_high: the
    weight capped), ``actor/is_clipfrac_low`` (r < 1-ε_low; 0.0 without a lower bound), ``actor/ppo_kl``.
    """
    if clip_ratio_high <= 0.0 or (clip_ratio_low is not None and not 0.0 < clip_ratio_low <= 1.0):
        raise ValueError(f"CISPO needs clip_ratio_high > 0 and clip_ratio_low in (0, 1] or None; got {clip_ratio_low}, {clip_ratio_high}")
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)  # [B, T]
    ratio = torch.exp(log_ratio.detach())  # [B, T]  r, constant
    low = None if clip_ratio_low is None else 1.0 - clip_ratio_low
    weight = torch.clamp(ratio, min=low, max=1.0 + clip_ratio_high)  # [B, T]  sg(r̂)
    adv = token_advantages(advantages, log_prob)  # [B, T]
    loss_mat = apply_token_weights(-weight * adv * log_prob, token_weights)  # [B, T]
    loss = aggregate_loss(
        loss_mat, mask, loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, norm_length=norm_length
    )
    below = ratio < low if low is not None else torch.zeros_like(ratio, dtype=torch.bool)
    metrics = {
        "actor/pg_loss": float(loss.detach().item()),
        "actor/is_weight_mean": masked_mean(weight, mask),
        "actor/is_clipfrac_high": masked_mean((ratio > 1.0 + clip_ratio_high).to(ratio.dtype), mask),
        "actor/is_clipfrac_low": masked_mean(below.to(ratio.dtype), mask),
        "actor/ppo_kl": masked_mean(-log_ratio, mask),
    }
    return loss, metrics
