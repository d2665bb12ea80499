"""GSPO: Group Sequence Policy Optimization (Zheng et al. 2025, arXiv:2507.18071), one ratio and one clip per response.

GSPO replaces the per-token ratio of PPO/DAPO by the length-normalised sequence likelihood ratio

.. math::
    s_i(\\theta) = \\Big(\\frac{\\pi_\\theta(o_i \\mid q)}{\\pi_{\\theta_{old}}(o_i \\mid q)}\\Big)^{1/|o_i|}
               = \\exp\\Big(\\frac{1}{|o_i|}\\sum_{t=1}^{|o_i|}
                 \\log\\frac{\\pi_\\theta(o_{i,t} \\mid q, o_{i,<t})}{\\pi_{\\theta_{old}}(o_{i,t} \\mid q, o_{i,<t})}\\Big)

and maximises

.. math::
    \\mathcal J_{GSPO}(\\theta) = \\mathbb E\\Big[\\frac1G \\sum_{i=1}^G
        \\min\\big(s_i(\\theta) \\hat A_i,\\ \\operatorname{clip}(s_i(\\theta), 1-\\varepsilon_{low}, 1+\\varepsilon_{high}) \\hat A_i\\big)\\Big]

with the paper's ε_low = 3e-4, ε_high = 4e-4 (a geometric mean of ratios moves by ~1e-4 where DAPO's token ratios
move by ~0.1, so DAPO's 0.2 would never clip). The clip keeps or drops a whole response.

It is computed in the paper's GSPO-token form: every token of response ``i`` carries

.. math:: s_{i,t}(\\theta) = \\operatorname{sg}[s_i(\\theta)] \\cdot
          \\frac{\\pi_\\theta(o_{i,t} \\mid q, o_{i,<t})}{\\operatorname{sg}[\\pi_\\theta(o_{i,t} \\mid q, o_{i,<t})]}

whose value is :math:`s_i` and whose gradient is :math:`s_i \\nabla \\log\\pi_\\theta(o_{i,t})`; the per-token loss
:math:`\\max(-\\hat A_i s_{i,t}, -\\hat A_i \\operatorname{clip}(s_{i,t}))` is then aggregated like every loss here
(:func:`~dapo_cli.algo.losses.aggregate_loss`). With ``loss_agg_mode: seq-mean-token-mean`` (the paper's) the loss
and its gradient are exactly :math:`-\\mathcal J_{GSPO}`: a row's token mean of identical values is the row's value,
and its token mean of gradients is :math:`s_i \\frac{1}{|o_i|}\\sum_t \\nabla\\log\\pi_\\theta(o_{i,t}) = \\nabla s_i`.
With ``token-mean`` (DAPO's Eq. 12) each response's term is weighted by its length, :math:`|o_i| / \\sum_j |o_j|`
instead of :math:`1/G`: a different objective, still exact under any split (each row's term depends on that row
alone, and the global counts are the mini-batch's).

Shapes: ``B`` responses, ``T`` response tokens (right-padded); masks ``[B, T]``; advantages ``[B]`` (GSPO's
advantage is per response).
"""

from __future__ import annotations

import torch

from dapo_cli.algo.losses import (
    Count,
    aggregate_loss,
    apply_token_weights,
    clamped_log_ratio,
    masked_mean,
    row_mean,
    seq_mean,
    sequence_token_form,
    token_advantages,
)


def gspo_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    loss_agg_mode: str,
    global_tokens: Count | None = None,
    global_seqs: Count | None = None,
    norm_length: int | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """:math:`-\\mathcal J_{GSPO}` of the module docstring, in its GSPO-token form, aggregated by ``loss_agg_mode``.

    log_prob:     ``[B, T]`` log π_θ of the sampled tokens (with grad).
    old_log_prob: ``[B, T]`` log π_old (constant).
    advantages:   ``[B]``, one per response (constant).
    mask:         ``[B, T]`` bool or 0/1, the tokens in the loss; :math:`|o_i|` is the row's count.
    clip_ratio_low / clip_ratio_high: ε_low / ε_high of the sequence clip (paper: 3e-4 / 4e-4).
    ``token_weights`` ``[B, T]`` (constants) multiply each token's entry before aggregation; the global counts are
    :func:`~dapo_cli.algo.losses.dapo_loss`'s.

    The per-token log-ratio is clamped to ±20 before averaging (as in ``dapo_loss``). Returns ``(loss [], metrics)``:
    ``actor/pg_loss``; sequence means over the rows holding a token: ``actor/seq_clipfrac`` (the clipped branch is the
    max), ``actor/seq_clipfrac_high`` (s_i > 1+ε_high, A_i > 0), ``actor/seq_clipfrac_low`` (s_i < 1-ε_low, A_i < 0),
    ``actor/seq_ratio_dev`` (mean |s_i - 1|); token mean ``actor/ppo_kl`` (mean of -clamp(log π - log π_old)).
    """
    if advantages.dim() != 1 or advantages.shape[0] != log_prob.shape[0]:
        raise ValueError(f"GSPO takes one advantage per response, [B] = [{log_prob.shape[0]}]; got {list(advantages.shape)}")
    if not (0.0 <= clip_ratio_low < 1.0 and clip_ratio_high >= 0.0):
        raise ValueError(f"GSPO needs 0 <= clip_ratio_low < 1 and clip_ratio_high >= 0; got {clip_ratio_low}, {clip_ratio_high}")
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)  # [B, T]
    seq_log_ratio = row_mean(log_ratio.detach(), mask)  # [B]  log s_i
    token_ratio = sequence_token_form(log_ratio, mask)  # [B, T]  s_{i,t}: value s_i, gradient s_i ∇log π_t
    adv = token_advantages(advantages, log_prob)  # [B, T]
    loss_unclipped = -adv * token_ratio  # [B, T]
    loss_clipped = -adv * torch.clamp(token_ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)  # [B, T]
    loss_mat = apply_token_weights(torch.maximum(loss_unclipped, loss_clipped), token_weights)  # [B, T]
    loss = aggregate_loss(
        loss_mat, mask, loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, norm_length=norm_length
    )

    seq_ratio, seq_adv = torch.exp(seq_log_ratio), advantages.detach().to(seq_log_ratio.dtype)  # [B], [B]
    clipped = (-seq_adv * torch.clamp(seq_ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)) > (-seq_adv * seq_ratio)
    metrics = {
        "actor/pg_loss": float(loss.detach().item()),
        "actor/seq_clipfrac": seq_mean(clipped, mask),
        "actor/seq_clipfrac_high": seq_mean((seq_ratio > 1.0 + clip_ratio_high) & (seq_adv > 0), mask),
        "actor/seq_clipfrac_low": seq_mean((seq_ratio < 1.0 - clip_ratio_low) & (seq_adv < 0), mask),
        "actor/seq_ratio_dev": seq_mean((seq_ratio - 1.0).abs(), mask),
        "actor/ppo_kl": masked_mean(-log_ratio, mask),
    }
    return loss, metrics
