"""GMPO: Geometric-Mean Policy Optimization (Zhao et al. 2025, arXiv:2507.20673), the geometric mean of each
response's token-level clipped terms in place of GRPO's arithmetic mean.

GRPO averages :math:`\\min(\\rho_{i,t}\\hat A_i, \\operatorname{clip}(\\rho_{i,t})\\hat A_i)` over a response's tokens;
GMPO takes their geometric mean, which an outlier ratio moves far less:

.. math::
    \\mathcal J_{GMPO}(\\theta) = \\mathbb E\\Big[\\frac1G \\sum_{i=1}^G
        \\Big(\\prod_{t=1}^{|o_i|} \\big|\\min\\big(\\rho_{i,t}\\hat A_i,\\ \\operatorname{clip}(\\rho_{i,t}, e^{-\\varepsilon_{low}},
        e^{\\varepsilon_{high}})\\hat A_i\\big)\\big|\\Big)^{1/|o_i|} \\operatorname{sgn}(\\hat A_i)\\Big],
    \\qquad \\rho_{i,t} = \\frac{\\pi_\\theta(o_{i,t} \\mid q, o_{i,<t})}{\\pi_{\\theta_{old}}(o_{i,t} \\mid q, o_{i,<t})}

The clip is per token, in log space and before the mean, with the paper's wider range :math:`(e^{-0.4}, e^{0.4})`.
Since :math:`\\hat A_i` is one number per response, the term is
:math:`\\hat A_i \\exp(\\frac{1}{|o_i|}\\sum_t \\log m_{i,t})` with :math:`\\log m_{i,t} = \\min(\\log\\rho_{i,t},
\\varepsilon_{high})` where :math:`\\hat A_i > 0` and :math:`\\max(\\log\\rho_{i,t}, -\\varepsilon_{low})` where
:math:`\\hat A_i < 0` (the side the advantage pushes; the other side's clip never binds under the min).

Computed, like GSPO, in token form: every token of response ``i`` carries
:math:`-\\hat A_i \\exp(\\operatorname{sg}[\\bar m_i] + \\log m_{i,t} - \\operatorname{sg}[\\log m_{i,t}])` with
:math:`\\bar m_i` the row mean of :math:`\\log m`: its value is the response's loss, its gradient that loss times
:math:`\\nabla\\log m_{i,t}` (0 where clipped). With ``loss_agg_mode: seq-mean-token-mean`` (the paper's mean over
responses) loss and gradient are exactly :math:`-\\mathcal J_{GMPO}`; ``token-mean`` weights each response by its
length (exact under any split either way; ``docs/objectives.md``).

Shapes: ``B`` responses, ``T`` response tokens (right-padded); masks ``[B, T]``; advantages ``[B]``.
"""

from __future__ import annotations

import torch

from dapo_cli.algo.losses import (
    Count,
    aggregate_loss,
    apply_token_weights,
    clamped_log_ratio,
    masked_mean,
    sequence_token_form,
    token_advantages,
)


def gmpo_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    log_clip_low: float,
    log_clip_high: float,
    loss_agg_mode: str,
    global_tokens: Count | None = None,
    global_seqs: Count | None = None,
    norm_length: int | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """:math:`-\\mathcal J_{GMPO}` of the module docstring, in token form, aggregated by ``loss_agg_mode``.

    log_prob:     ``[B, T]`` log π_θ of the sampled tokens (with grad).
    old_log_prob: ``[B, T]`` log π_old (constant).
    advantages:   ``[B]``, one per response (constant).
    mask:         ``[B, T]`` bool or 0/1, the tokens in the loss; :math:`|o_i|` is the row's count.
    log_clip_low / log_clip_high: ε_low / ε_high of the log-space clip, ratios kept in
    :math:`(e^{-\\varepsilon_{low}}, e^{\\varepsilon_{high}})` (paper: 0.4 / 0.4).
    ``token_weights`` ``[B, T]`` (constants) multiply each token's entry before aggregation.

    Returns ``(loss [], metrics)``, token means over ``mask``: ``actor/pg_loss``, ``actor/pg_clipfrac`` (the clip
    binds), ``actor/clipfrac_high`` (log ρ > ε_high, A > 0), ``actor/clipfrac_low`` (log ρ < -ε_low, A < 0),
    ``actor/ppo_kl``.
    """
    if advantages.dim() != 1 or advantages.shape[0] != log_prob.shape[0]:
        raise ValueError(f"GMPO takes one advantage per response, [B] = [{log_prob.shape[0]}]; got {list(advantages.shape)}")
    if log_clip_low <= 0.0 or log_clip_high <= 0.0:
        raise ValueError(f"GMPO needs log_clip_low > 0 and log_clip_high > 0; got {log_clip_low}, {log_clip_high}")
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)  # [B, T]
    adv = token_advantages(advantages, log_prob)  # [B, T]
    log_m = torch.where(adv > 0, torch.clamp(log_ratio, max=log_clip_high), torch.clamp(log_ratio, min=-log_clip_low))  # [B, T]
    term = sequence_token_form(log_m, mask)  # [B, T]  value exp(mean_t log m_i), gradient that times ∇log m_t
    loss_mat = apply_token_weights(-adv * term, token_weights)  # [B, T]
    loss = aggregate_loss(
        loss_mat, mask, loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, norm_length=norm_length
    )
    ratio = log_ratio.detach()
    high = (ratio > log_clip_high) & (adv > 0)
    low = (ratio < -log_clip_low) & (adv < 0)
    metrics = {
        "actor/pg_loss": float(loss.detach().item()),
        "actor/pg_clipfrac": masked_mean((high | low).to(log_prob.dtype), mask),
        "actor/clipfrac_high": masked_mean(high.to(log_prob.dtype), mask),
        "actor/clipfrac_low": masked_mean(low.to(log_prob.dtype), mask),
        "actor/ppo_kl": masked_mean(-log_ratio, mask),
    }
    return loss, metrics
