"""The optimisation phases of a training step: old log-probs, the update, and what the update logs.

:func:`dapo_cli.train.run_train` calls them in this order, after the batch has its advantages::

    old_log_probs_from_update(cfg)   one optimizer step? then the update's own forward is π_old's (config.schema)
    fill_old_log_probs               else: log π_old (+ entropy, + log π_ref for KL) without grad
    update_policy                    schedule_minibatches → micro_loss per micro-batch → engine.step per mini-batch
    rollout_mismatch                 |log π_old − log π_rollout| and the IS correction's effect (metrics)

With :func:`~dapo_cli.config.schema.behaviour_correction` (``algorithm.rollout_is`` or asynchronous rollouts) each token's loss is
weighted by min(π_old / π_rollout, C): the decoupled objective of :mod:`dapo_cli.algo.staleness`, π_old
being the proximal policy (the weights being updated) and π_rollout the behaviour policy that sampled.

Every function here is exact under any micro-batch or rank split (``tests/train/``, ``tests/distributed/``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dapo_cli.algo.importance import mismatch_sums
from dapo_cli.algo.kl import kl_penalty
from dapo_cli.algo.losses import LOG_RATIO_CLAMP, aggregate_loss, global_counts, masked_mean, policy_loss
from dapo_cli.algo.staleness import decoupled_policy_loss
from dapo_cli.batch import RolloutBatch
from dapo_cli.config import Config
from dapo_cli.config.schema import behaviour_correction
from dapo_cli.engine.base import TrainingEngine
from dapo_cli.engine.dist import Collective, reduce_sums
from dapo_cli.session import derive_seed


@torch.no_grad()
def fill_old_log_probs(engine: TrainingEngine, batch: RolloutBatch, cfg: Config) -> None:
    """log π_old (the policy that sampled), its entropy, and log π_ref when the KL term is on.

    Micro-batched without grad; every rank runs the same number of forwards (ZeRO-3 gathers
    parameters in each), padding with a one-row blank when it has fewer rows.
    """
    slices = micro_slices(len(batch), cfg.trainer.ppo_micro_batch_size)
    count = lockstep_counts(engine.dist, [len(slices)])[0]
    use_ref = cfg.algorithm.use_kl_loss
    logps, ents, refs = [], [], []
    for i in range(count):
        micro = batch.select(slices[i]) if i < len(slices) else blank_micro(batch)
        logp, ent = engine.log_probs(micro, temperature=cfg.rollout.temperature, with_entropy=True)
        ref = engine.ref_log_probs(micro, temperature=cfg.rollout.temperature) if use_ref else None
        if i < len(slices):
            logps.append(logp.cpu())
            ents.append(ent.cpu())
            if ref is not None:
                refs.append(ref.cpu())
    empty = torch.zeros(0, batch.response_ids.shape[1])
    batch.old_log_probs = torch.cat(logps) if logps else empty
    batch.entropy = torch.cat(ents) if ents else empty.clone()
    batch.ref_log_probs = (torch.cat(refs) if refs else empty.clone()) if use_ref else None


def rollout_mismatch(batch: RolloutBatch, cfg: Config, dist: Collective) -> dict[str, float]:
    """How far the rollout engine's log-probs of its samples are from the trainer's old log-probs
    (over all ranks' trained responses), and what the truncated-IS correction did.

    ``rollout/logprob_diff_mean`` / ``_max``: mean / max of |log π_old − log π_rollout| per token;
    with :func:`behaviour_correction`: ``rollout/is_weight_mean`` (of min(π_old / π_rollout, C) over the trained
    tokens, the weights the loss used) and ``rollout/is_truncated_frac`` (share of them whose ratio exceeded C).
    """
    if batch.rollout_log_probs is None:
        return {}
    old, rollout = batch.old_log_probs, batch.rollout_log_probs
    local = mismatch_sums(old, rollout, batch.response_mask)
    biggest = float(dist.all_reduce(torch.tensor([local.pop("max_abs_diff")], dtype=torch.float64), "max").item())
    out: dict[str, float] = {}
    sums = {**local}
    ris, corrected = cfg.algorithm.rollout_is, behaviour_correction(cfg)
    if corrected:
        keep = batch.loss_mask.bool()
        ratio = torch.exp(torch.clamp(old - rollout, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        sums.update({
            "is_weight": float(torch.clamp(ratio[keep], max=ris.cap).double().sum()),
            "is_truncated": float((ratio[keep] > ris.cap).sum()),
            "is_tokens": float(keep.sum()),
        })
    total = reduce_sums(dist, sums)
    out["rollout/logprob_diff_mean"] = total["abs_diff"] / total["tokens"] if total["tokens"] else 0.0
    out["rollout/logprob_diff_max"] = biggest
    if corrected and total["is_tokens"]:
        out["rollout/is_weight_mean"] = total["is_weight"] / total["is_tokens"]
        out["rollout/is_truncated_frac"] = total["is_truncated"] / total["is_tokens"]
    return out


@dataclass
class MiniBatch:
    """One optimizer step's share of the batch on this rank.

    rows:     LongTensor [M]  the mini-batch's rows in the step's batch (its groups this rank holds; may be empty)
    micro:    list of LongTensor, each [<= ppo_micro_batch_size], positions in ``rows`` per micro-batch
    lockstep: the number of micro-batches every rank runs (the most any rank has); a rank with fewer
              runs blank ones, so forwards and backwards (and their collectives) stay in step
    """

    rows: torch.Tensor
    micro: list[torch.Tensor]
    lockstep: int


def schedule_minibatches(batch: RolloutBatch, cfg: Config, dist: Collective, *, step: int) -> list[MiniBatch]:
    """``ppo_epochs`` × mini-batches of ``ppo_mini_batch_size`` groups, drawn from all ranks' groups with
    one permutation per epoch (seeded by the step), so every rank draws the same mini-batches."""
    trainer = cfg.trainer
    groups = [g for part in dist.all_gather_object(list(dict.fromkeys(batch.group_ids.tolist()))) for g in part]
    gen = torch.Generator().manual_seed(derive_seed(trainer.seed, "minibatch", step))
    drawn: list[tuple[torch.Tensor, list[torch.Tensor]]] = []
    for _epoch in range(trainer.ppo_epochs):
        order = [groups[i] for i in torch.randperm(len(groups), generator=gen).tolist()]
        for start in range(0, len(order), trainer.ppo_mini_batch_size):
            chosen = torch.tensor(order[start : start + trainer.ppo_mini_batch_size])
            rows = torch.isin(batch.group_ids, chosen).nonzero().squeeze(1)
            drawn.append((rows, micro_slices(len(rows), trainer.ppo_micro_batch_size)))
    counts = lockstep_counts(dist, [len(micro) for _, micro in drawn])
    return [MiniBatch(rows, micro, count) for (rows, micro), count in zip(drawn, counts)]


def update_policy(
    engine: TrainingEngine, batch: RolloutBatch, cfg: Config, *, step: int, old_from_update: bool = False
) -> dict[str, float]:
    """``ppo_epochs`` × mini-batches (by group) × micro-batches; one optimizer step per mini-batch.

    ``old_from_update`` (only where :func:`old_log_probs_from_update` holds: one optimizer step):
    each micro-batch's forward also provides its rows' ``old_log_probs`` (its log-probs, detached)
    and ``entropy``, which are written into ``batch``; :func:`fill_old_log_probs` is not needed.

    Exactness under any split: each micro-batch loss is normalised by the mini-batch's
    *global* token / sequence counts (summed over ranks), so the micro-batch losses of all
    ranks sum to the whole mini-batch's loss and the engine's gradient is its gradient.
    Mini-batches are drawn from all ranks' groups with one shared permutation
    (:func:`schedule_minibatches`); each rank trains the chosen groups it holds. Logged losses are sums of
    micro-batch terms over ranks (= the mini-batch loss), averaged over optimizer steps; fractions are
    token means over every trained token; both are therefore independent of micro-batch size and ranks.
    """
    algo, dist = cfg.algorithm, engine.dist
    norm_length = cfg.rollout.max_response_length
    schedule = schedule_minibatches(batch, cfg, dist, step=step)
    if old_from_update and len(schedule) != 1:
        raise RuntimeError(f"old log-probs from the update need one optimizer step per batch, not {len(schedule)}")
    if old_from_update:  # filled micro-batch by micro-batch below (dtype of the engine's log-probs)
        batch.old_log_probs = batch.entropy = None
    sums: dict[str, float] = {}
    grad_norms: list[float] = []  # one per optimizer step taken
    skipped = 0  # mini-batches whose gradient was not finite: no update
    for mb in schedule:
        mini = batch.select(mb.rows)
        counts = {**reduce_sums(dist, global_counts(mini.loss_mask, algo.loss_agg_mode)), "norm_length": norm_length}
        for i in range(mb.lockstep):
            micro = mini.select(mb.micro[i]) if i < len(mb.micro) else blank_micro(batch)
            if algo.loss_norm == "micro_batch":  # each micro-batch its own mean: not exact, for reproduction
                counts = {**global_counts(micro.loss_mask, algo.loss_agg_mode), "norm_length": norm_length}
            with engine.accumulate(last=i == mb.lockstep - 1):
                loss, m, weight = micro_loss(engine, micro, cfg, counts, old_from_update=old_from_update)
                engine.backward(loss)
            add_weighted(sums, m, weight)
            if old_from_update and i < len(mb.micro):
                keep_old_from_update(batch, mb.rows[mb.micro[i]], micro)
        norm, applied = engine.step()
        if applied:
            grad_norms.append(norm)
        else:
            skipped += 1
    if old_from_update and batch.old_log_probs is None:  # this rank trained no rows
        batch.old_log_probs, batch.entropy = torch.zeros(batch.response_ids.shape), torch.zeros(batch.response_ids.shape)
    return update_metrics(sums, grad_norms, skipped=skipped, optimizer_steps=len(schedule), lr=engine.lr, dist=dist)


def keep_old_from_update(batch: RolloutBatch, rows: torch.Tensor, micro: RolloutBatch) -> None:
    """Write a micro-batch's π_old log-probs and entropy (from the update's forward) into its ``rows`` of ``batch``."""
    if batch.old_log_probs is None:
        batch.old_log_probs = torch.zeros(batch.response_ids.shape, dtype=micro.old_log_probs.dtype)
        batch.entropy = torch.zeros(batch.response_ids.shape, dtype=micro.entropy.dtype)
    batch.old_log_probs[rows] = micro.old_log_probs.cpu()
    batch.entropy[rows] = micro.entropy.cpu()


def update_metrics(
    sums: dict[str, float], grad_norms: list[float], *, skipped: int, optimizer_steps: int, lr: float, dist: Collective
) -> dict[str, float]:
    """The update's logged values from every rank's token-weighted sums (:func:`add_weighted`): token means,
    ``actor/pg_loss`` per optimizer step, the mean gradient norm of the steps taken, and the counts."""
    totals = reduce_sums(dist, sums) if sums or dist.world_size > 1 else {}
    tokens = totals.pop("tokens", 0.0)
    pg_loss_sum = totals.pop("actor/pg_loss", 0.0)
    metrics = {k: v / tokens for k, v in totals.items()} if tokens else {}
    if tokens:
        metrics["actor/pg_loss"] = pg_loss_sum / optimizer_steps
    metrics["actor/grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else float("nan")
    metrics["actor/num_updates"] = float(len(grad_norms))
    metrics["actor/skipped_updates"] = float(skipped)
    metrics["actor/lr"] = lr
    return metrics


def micro_loss(
    engine: TrainingEngine, micro: RolloutBatch, cfg: Config, counts: dict[str, float], *, old_from_update: bool = False
) -> tuple[torch.Tensor, dict[str, float], float]:
    """One micro-batch's term of the mini-batch loss (decoupled clip, optional entropy and KL terms),
    its detached metrics (token means) and its token count.

    ``old_from_update``: this forward is π_old's (see :func:`old_log_probs_from_update`); its detached
    log-probs become ``micro.old_log_probs`` (ratio exactly 1) and its entropy ``micro.entropy``.
    With :func:`behaviour_correction` the clip term is the decoupled one (π_old = π_prox, the rollout
    engine's log-probs = π_behav; ``algo.staleness.decoupled_policy_loss``)."""
    algo = cfg.algorithm
    with_entropy = algo.entropy_coeff > 0 or old_from_update
    logp, ent = engine.log_probs(micro, temperature=cfg.rollout.temperature, with_entropy=with_entropy)
    if old_from_update:
        micro.old_log_probs, micro.entropy = logp.detach(), ent.detach()
    mask = micro.loss_mask.to(logp.device)
    clip = dict(clip_ratio_low=algo.clip_ratio_low, clip_ratio_high=algo.clip_ratio_high, clip_ratio_c=algo.clip_ratio_c,
                loss_agg_mode=algo.loss_agg_mode, **counts)
    old, adv = micro.old_log_probs.to(logp.device), micro.advantages.to(logp.device)
    if behaviour_correction(cfg) and micro.rollout_log_probs is not None:  # π_old is π_prox, the rollout engine's π_behav
        behav = micro.rollout_log_probs.to(logp.device)
        loss, m = decoupled_policy_loss(logp, old, behav, adv, mask, cap=algo.rollout_is.cap, **clip)
    else:
        loss, m = policy_loss(logp, old, adv, mask, **clip)
    if algo.entropy_coeff > 0:
        loss = loss - algo.entropy_coeff * aggregate_loss(ent, mask, algo.loss_agg_mode, **counts)
    if algo.use_kl_loss:
        kl = kl_penalty(logp, micro.ref_log_probs.to(logp.device), kind=algo.kl_loss_type)
        loss = loss + algo.kl_loss_coef * aggregate_loss(kl, mask, algo.loss_agg_mode, **counts)
        m["actor/kl_loss"] = masked_mean(kl.detach(), mask)
    return loss, m, float(mask.sum())


def add_weighted(sums: dict[str, float], m: dict[str, float], weight: float) -> None:
    """Accumulate token-weighted means (and the raw ``actor/pg_loss`` term, a sum by construction)."""
    sums["tokens"] = sums.get("tokens", 0.0) + weight
    for key, value in m.items():
        term = value if key == "actor/pg_loss" else value * weight
        sums[key] = sums.get(key, 0.0) + term


def micro_slices(n: int, size: int) -> list[torch.Tensor]:
    return [torch.arange(i, min(i + size, n)) for i in range(0, n, size)]


def lockstep_counts(dist: Collective, counts: list[int]) -> list[int]:
    """The most micro-batches any rank has, position by position (every rank runs that many)."""
    if dist.world_size == 1:
        return counts
    return [int(c) for c in dist.all_reduce(torch.tensor(counts, dtype=torch.long), "max").tolist()]


def blank_micro(batch: RolloutBatch) -> RolloutBatch:
    """A one-row, one-token micro-batch whose loss mask is empty: its loss and gradient are 0,
    but it runs the forward/backward that a rank with fewer rows owes the others' collectives."""
    one = torch.ones(1, 1, dtype=torch.bool)
    pad = torch.full((1, 1), batch.pad_id, dtype=torch.long)
    return RolloutBatch(
        prompt_ids=pad, prompt_mask=one, response_ids=pad.clone(), response_mask=~one,
        lengths=torch.zeros(1, dtype=torch.long), truncated=torch.zeros(1, dtype=torch.bool),
        group_ids=torch.full((1,), -1, dtype=torch.long), texts=[""], ground_truths=[""], prompts=[""],
        pad_id=batch.pad_id, loss_mask=~one, advantages=torch.zeros(1),
        old_log_probs=torch.zeros(1, 1), ref_log_probs=torch.zeros(1, 1), rollout_log_probs=torch.zeros(1, 1),
    )
