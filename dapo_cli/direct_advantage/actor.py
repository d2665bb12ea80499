"""The actor phase: fit log π_θ(a|s) − log π_ref(a|s) of each candidate step to Â/β.

Runs on the project's training-engine protocol (:class:`~dapo_cli.engine.base.TrainingEngine`):
``engine.log_probs`` for π_θ, ``engine.ref_log_probs`` for the frozen reference (the
iteration's starting policy), ``accumulate``/``backward``/``step`` for the update. A
candidate is one row of a :class:`~dapo_cli.batch.RolloutBatch`: the prompt plus the state's
prefix as the left-padded "prompt", the step's tokens (plus EOS when the step finishes the
solution) as the right-padded "response"; its log-probability is the sum over those tokens.

One optimizer step per ``batch_states`` states with all their candidates; a state weighs
1/S of the batch loss, split evenly over its distinct candidates, and micro-batches carry
their share of those weights, so accumulation gives exactly the batch gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from dapo_cli.algo.direct_advantage import (
    action_log_probs,
    direct_advantage_loss,
    state_uniform_weights,
)
from dapo_cli.batch import RolloutBatch
from dapo_cli.direct_advantage.phases import state_batches


def candidate_batch(tokenizer: Any, contexts: Sequence[str], actions: Sequence[str], terminal: Sequence[bool]) -> RolloutBatch:
    """Rows ``context + action`` (+ EOS after a finishing action) with the action as the response.

    contexts: prompt + state prefix texts; tokenised apart from the action, so the action's
    tokens are exactly the ones scored.
    """
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    eos = int(tokenizer.eos_token_id)
    ctx = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in contexts]
    act = [tokenizer(a, add_special_tokens=False)["input_ids"] + ([eos] if t else []) for a, t in zip(actions, terminal)]
    if any(not a for a in act):
        raise ValueError("an open candidate step has no tokens")
    s = max(len(c) for c in ctx)
    t = max(len(a) for a in act)
    prompt_ids = torch.tensor([[pad] * (s - len(c)) + c for c in ctx], dtype=torch.long)
    prompt_mask = torch.tensor([[False] * (s - len(c)) + [True] * len(c) for c in ctx], dtype=torch.bool)
    response_ids = torch.tensor([a + [pad] * (t - len(a)) for a in act], dtype=torch.long)
    response_mask = torch.tensor([[True] * len(a) + [False] * (t - len(a)) for a in act], dtype=torch.bool)
    n = len(ctx)
    return RolloutBatch(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids, response_mask=response_mask,
        lengths=response_mask.sum(-1), truncated=torch.zeros(n, dtype=torch.bool), group_ids=torch.arange(n),
        texts=list(actions), ground_truths=[""] * n, prompts=list(contexts), pad_id=pad,
    )


@torch.no_grad()
def sequence_log_probs(engine: Any, tokenizer: Any, rows: Sequence[dict[str, Any]], *, micro_batch_size: int, reference: bool) -> torch.Tensor:
    """``[N]`` log-probability of every candidate step under the policy (or the frozen reference)."""
    out = []
    for i in range(0, len(rows), micro_batch_size):
        part = rows[i : i + micro_batch_size]
        batch = candidate_batch(tokenizer, [r["prompt"] + r["prefix"] for r in part], [r["action"] for r in part], [r["terminal"] for r in part])
        if reference:
            logp = engine.ref_log_probs(batch, temperature=1.0)
        else:
            logp, _ = engine.log_probs(batch, temperature=1.0)
        out.append(action_log_probs(logp.float(), batch.response_mask.to(logp.device)).cpu())
    return torch.cat(out) if out else torch.zeros(0)


def train_actor(
    engine: Any,
    tokenizer: Any,
    rows: Sequence[dict[str, Any]],
    *,
    beta: float,
    epochs: int,
    batch_states: int,
    micro_batch_size: int,
    seed: int,
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Train on the kept candidates ``rows`` (advantages-phase rows); returns per-candidate rows
    (advantage, target Â/β, reference and final log-probs) and metrics."""
    rows = list(rows)
    if not rows:
        return [], {"samples": 0.0, "tokens": 0.0, "candidates": 0.0, "states": 0.0, "optimizer_steps": 0.0}
    ref = sequence_log_probs(engine, tokenizer, rows, micro_batch_size=micro_batch_size, reference=True)
    start = sequence_log_probs(engine, tokenizer, rows, micro_batch_size=micro_batch_size, reference=False)
    adv = torch.tensor([float(r["advantage"]) for r in rows], dtype=torch.float32)
    sid = torch.tensor([int(r["state"]) for r in rows], dtype=torch.long)
    gen = torch.Generator().manual_seed(seed)
    losses, norms, skipped, tokens = [], [], 0, 0
    for _epoch in range(epochs):
        for batch_rows in state_batches(sid.tolist(), batch_states, gen):
            index = torch.tensor(batch_rows, dtype=torch.long)
            weights = state_uniform_weights(sid[index])  # every state 1/S of this batch, over its candidates
            slices = [index[i : i + micro_batch_size] for i in range(0, len(index), micro_batch_size)]
            wslices = [weights[i : i + micro_batch_size] for i in range(0, len(index), micro_batch_size)]
            step_loss = 0.0
            for m, (part, w) in enumerate(zip(slices, wslices)):
                chosen = [rows[i] for i in part.tolist()]
                batch = candidate_batch(
                    tokenizer, [r["prompt"] + r["prefix"] for r in chosen], [r["action"] for r in chosen], [r["terminal"] for r in chosen]
                )
                tokens += int(batch.response_mask.sum() + batch.prompt_mask.sum())
                with engine.accumulate(last=m == len(slices) - 1):
                    logp, _ = engine.log_probs(batch, temperature=1.0)
                    seq = action_log_probs(logp.float(), batch.response_mask.to(logp.device))
                    loss, _ = direct_advantage_loss(
                        seq, ref[part].to(seq.device), adv[part].to(seq.device), beta=beta, weights=w.to(seq.device)
                    )
                    engine.backward(loss)
                step_loss += float(loss.detach())
            norm, applied = engine.step()
            losses.append(step_loss)
            if applied:
                norms.append(norm)
            else:
                skipped += 1
    final = sequence_log_probs(engine, tokenizer, rows, micro_batch_size=micro_batch_size, reference=False)
    weights_all = state_uniform_weights(sid)
    _, before = direct_advantage_loss(start, ref, adv, beta=beta, weights=weights_all)
    _, after = direct_advantage_loss(final, ref, adv, beta=beta, weights=weights_all)
    ratio = final - ref
    target = adv / beta
    pos, neg = adv > 0, adv < 0
    out_rows = [
        {**{k: r[k] for k in ("state", "problem", "depth", "action", "terminal", "q", "advantage")},
         "target_log_ratio": float(target[i]), "ref_log_prob": float(ref[i]), "log_prob": float(final[i]),
         "log_ratio": float(ratio[i])}
        for i, r in enumerate(rows)
    ]
    moved = (adv != 0)
    metrics = {
        "samples": float(len(rows) * epochs),
        "tokens": float(tokens),
        "candidates": float(len(rows)),
        "states": float(len(set(sid.tolist()))),
        "optimizer_steps": float(len(losses)),
        "skipped_updates": float(skipped),
        "loss_first_step": losses[0] if losses else float("nan"),
        "loss_last_step": losses[-1] if losses else float("nan"),
        "loss_before": before["loss"],
        "loss_after": after["loss"],
        "start_log_ratio_abs_max": float((start - ref).abs().max()),
        "log_ratio_mean_pos_adv": float(ratio[pos].mean()) if bool(pos.any()) else 0.0,
        "log_ratio_mean_neg_adv": float(ratio[neg].mean()) if bool(neg.any()) else 0.0,
        "sign_agreement": float(((ratio > 0) == (adv > 0))[moved].float().mean()) if bool(moved.any()) else 0.0,
        "target_abs_mean": after["target_abs_mean"],
        "grad_norm_mean": sum(norms) / len(norms) if norms else float("nan"),
        "lr": float(engine.lr),
    }
    return out_rows, metrics
