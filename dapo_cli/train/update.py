"""The optimisation phases of a training step: old log-probs, the update, and what the update logs.

:func:`dapo_cli.train.run_train` calls them in this order, after the batch has its advantages::

    old_log_probs_from_update(cfg)   one optimizer step? then the update's own forward is π_old's (config.schema)
    fill_old_log_probs               else: log π_old (+ entropy, + log π_ref for KL) without grad
    update_policy                    schedule_minibatches → micro_loss per micro-batch → engine.step per mini-batch
    rollout_mismatch                 |log π_old − log π_rollout| and the IS correction's effect (metrics)

The policy loss is the one ``algorithm.policy_loss`` names (:mod:`dapo_cli.algo.objectives`: dapo, gspo, cispo), with
its own settings (:func:`~dapo_cli.config.objectives.loss_args`). With
:func:`~dapo_cli.config.schema.behaviour_correction` (``algorithm.rollout_is`` or asynchronous rollouts) it is the
decoupled objective of :mod:`dapo_cli.algo.staleness`, π_old being the proximal policy (the weights being updated)
and π_rollout the behaviour policy that sampled, corrected by ``algorithm.rollout_is.mode``
(:mod:`dapo_cli.algo.rollout_correction`; by default each token weighted by min(π_old / π_rollout, C)). A
correction that drops responses (``geo_mask``) drops them before the update (:func:`trained_mask`), so the global
counts never hold them.

Every function here is exact under any micro-batch or rank split (``tests/train/``, ``tests/distributed/``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dapo_cli.algo.importance import mismatch_sums, ratio_sums
from dapo_cli.algo.kl import kl_penalty
from dapo_cli.algo.losses import aggregate_loss, global_counts, masked_mean
from dapo_cli.algo.objectives import SEQUENCE_METRICS, get_policy_loss
from dapo_cli.algo.rollout_correction import ROW_FILTERS, correction_sums, geo_mask_keep, opsm_keep
from dapo_cli.algo.staleness import decoupled_policy_loss
from dapo_cli.batch import RolloutBatch
from dapo_cli.config import Config
from dapo_cli.config.objectives import correction_args, loss_args
from dapo_cli.config.schema import behaviour_correction
from dapo_cli.engine.base import TrainingEngine
from dapo_cli.engine.dist import Collective, reduce_sums
from dapo_cli.runs import derive_seed


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
    (over all ranks' trained responses), and what the corrections do or would do.

    Always (when the rollout engine gave log-probs): ``rollout/logprob_diff_mean`` / ``_max``, the mean / max of
    |log π_old − log π_rollout| per token; the token probability ratio ρ = π_old / π_rollout over the same tokens,
    ``rollout/token_prob_ratio_mean`` / ``_min`` / ``_max`` and ``rollout/token_prob_ratio_mult_error`` (mean of
    e^|log ρ|, NeMo-RL's token_mult_prob_error); the share of trained responses each masking correction masks with
    its configured bound, at π_θ = π_old (the update's start): ``rollout/geo_mask_seq_frac`` and
    ``rollout/opsm_seq_frac``. With :func:`behaviour_correction` and ``token_tis``: ``rollout/is_weight_mean`` (of
    min(ρ, C) over the trained tokens, the weights the loss used) and ``rollout/is_truncated_frac`` (share of them
    whose ratio exceeded C); with ``seq_tis`` the same at its own level, over trained responses and their sequence
    ratios. Every value is exact under any rank split (sums, min, max reduced over ranks).
    """
    if batch.rollout_log_probs is None:
        return {}
    old, rollout, ris = batch.old_log_probs, batch.rollout_log_probs, cfg.algorithm.rollout_is
    local = {**mismatch_sums(old, rollout, batch.response_mask), **ratio_sums(old, rollout, batch.response_mask)}
    biggest, highest = (float(dist.all_reduce(torch.tensor([local.pop(k)], dtype=torch.float64), "max").item())
                        for k in ("max_abs_diff", "ratio_max"))
    lowest = -float(dist.all_reduce(torch.tensor([-local.pop("ratio_min")], dtype=torch.float64), "max").item())
    trained = batch.loss_mask.bool()
    rows = trained.any(-1)
    local["seqs"] = float(rows.sum())
    local["geo_masked"] = float((rows & ~geo_mask_keep(old, rollout, trained, geo_bound=ris.geo_bound)).sum())
    opsm = opsm_keep(old, rollout, batch.advantages, trained, opsm_delta=ris.opsm_delta) | ~trained
    local["opsm_masked"] = float((rows & ~opsm.all(-1)).sum())
    if behaviour_correction(cfg):
        local.update({f"is_{k}": v for k, v in correction_sums(ris.mode, old, rollout, trained, **correction_args(cfg)).items()})
    total = reduce_sums(dist, local)
    out = {
        "rollout/logprob_diff_mean": total["abs_diff"] / total["tokens"] if total["tokens"] else 0.0,
        "rollout/logprob_diff_max": biggest,
    }
    if total["tokens"]:
        out.update({
            "rollout/token_prob_ratio_mean": total["ratio"] / total["tokens"],
            "rollout/token_prob_ratio_min": lowest,
            "rollout/token_prob_ratio_max": highest,
            "rollout/token_prob_ratio_mult_error": total["mult_error"] / total["tokens"],
        })
    if total["seqs"]:
        out["rollout/geo_mask_seq_frac"] = total["geo_masked"] / total["seqs"]
        out["rollout/opsm_seq_frac"] = total["opsm_masked"] / total["seqs"]
    if total.get("is_count"):
        out["rollout/is_weight_mean"] = total["is_weight"] / total["is_count"]
        out["rollout/is_truncated_frac"] = total["is_truncated"] / total["is_count"]
    return out


def trained_mask(batch: RolloutBatch, cfg: Config, *, corrected: bool) -> torch.Tensor:
    """``batch.loss_mask`` ``[N, T]`` without the responses a row-dropping correction drops (``geo_mask``, from π_old
    and π_rollout; only when ``corrected``, :func:`behaviour_correction`): the tokens the loss and its global counts hold."""
    mode = cfg.algorithm.rollout_is.mode
    if not (corrected and mode in ROW_FILTERS and batch.rollout_log_probs is not None):
        return batch.loss_mask
    keep = ROW_FILTERS[mode](batch.old_log_probs, batch.rollout_log_probs, batch.loss_mask, **correction_args(cfg))
    return batch.loss_mask.bool() & keep.unsqueeze(-1)


def dropped_rows(batch: RolloutBatch, cfg: Config, dist: Collective, *, corrected: bool) -> dict[str, float]:
    """``rollout/masked_seq_frac`` of a row-dropping correction: the share of all ranks' trained responses it dropped."""
    if not (corrected and cfg.algorithm.rollout_is.mode in ROW_FILTERS):
        return {}
    rows = batch.loss_mask.bool().any(-1)
    kept = trained_mask(batch, cfg, corrected=corrected).bool().any(-1)
    total = reduce_sums(dist, {"rows": float(rows.sum()), "dropped": float((rows & ~kept).sum())})
    return {"rollout/masked_seq_frac": total["dropped"] / total["rows"]} if total["rows"] else {}


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
    corrected = behaviour_correction(cfg)  # decided once for the update, read by every micro-batch
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
        trained = trained_mask(mini, cfg, corrected=corrected)
        counts = {**reduce_sums(dist, global_counts(trained, algo.loss_agg_mode)), "norm_length": norm_length}
        for i in range(mb.lockstep):
            micro = mini.select(mb.micro[i]) if i < len(mb.micro) else blank_micro(batch)
            if algo.loss_norm == "micro_batch":  # each micro-batch its own mean: not exact, for reproduction
                trained = trained_mask(micro, cfg, corrected=corrected)
                counts = {**global_counts(trained, algo.loss_agg_mode), "norm_length": norm_length}
            with engine.accumulate(last=i == mb.lockstep - 1):
                loss, m, weights = micro_loss(engine, micro, cfg, counts, corrected=corrected, old_from_update=old_from_update)
                engine.backward(loss)
            add_weighted(sums, m, *weights)
            if old_from_update and i < len(mb.micro):
                keep_old_from_update(batch, mb.rows[mb.micro[i]], micro)
        norm, applied = engine.step()
        if applied:
            grad_norms.append(norm)
        else:
            skipped += 1
    if old_from_update and batch.old_log_probs is None:  # this rank trained no rows
        batch.old_log_probs, batch.entropy = torch.zeros(batch.response_ids.shape), torch.zeros(batch.response_ids.shape)
    metrics = update_metrics(sums, grad_norms, skipped=skipped, optimizer_steps=len(schedule), lr=engine.lr, dist=dist)
    return {**metrics, **dropped_rows(batch, cfg, dist, corrected=corrected)}


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
    """The update's logged values from every rank's weighted sums (:func:`add_weighted`): token means (and, for
    :data:`~dapo_cli.algo.objectives.SEQUENCE_METRICS`, sequence means), ``actor/pg_loss`` per optimizer step, the
    mean gradient norm of the steps taken, and the counts."""
    totals = reduce_sums(dist, sums) if sums or dist.world_size > 1 else {}
    tokens, seqs = totals.pop("tokens", 0.0), totals.pop("seqs", 0.0)
    pg_loss_sum = totals.pop("actor/pg_loss", 0.0)
    metrics = {k: v / (seqs if k in SEQUENCE_METRICS else tokens) for k, v in totals.items()} if tokens else {}
    if tokens:
        metrics["actor/pg_loss"] = pg_loss_sum / optimizer_steps
    metrics["actor/grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else float("nan")
    metrics["actor/num_updates"] = float(len(grad_norms))
    metrics["actor/skipped_updates"] = float(skipped)
    metrics["actor/lr"] = lr
    return metrics


def micro_loss(
    engine: TrainingEngine, micro: RolloutBatch, cfg: Config, counts: dict[str, float], *, corrected: bool,
    old_from_update: bool = False,
) -> tuple[torch.Tensor, dict[str, float], tuple[float, float]]:
    """One micro-batch's term of the mini-batch loss (the chosen policy loss, optional entropy and KL terms),
    its detached metrics (token means, and sequence means for :data:`~dapo_cli.algo.objectives.SEQUENCE_METRICS`)
    and the tokens and responses they are means over.

    ``old_from_update``: this forward is π_old's (see :func:`old_log_probs_from_update`); its detached
    log-probs become ``micro.old_log_probs`` (ratio exactly 1) and its entropy ``micro.entropy``.
    When ``corrected`` (:func:`behaviour_correction`, decided once per update) the loss is the decoupled one
    (π_old = π_prox, the rollout engine's log-probs = π_behav; ``algo.staleness.decoupled_policy_loss``) with
    ``algorithm.rollout_is.mode``."""
    algo = cfg.algorithm
    with_entropy = algo.entropy_coeff > 0 or old_from_update
    logp, ent = engine.log_probs(micro, temperature=cfg.rollout.temperature, with_entropy=with_entropy)
    if old_from_update:
        micro.old_log_probs, micro.entropy = logp.detach(), ent.detach()
    mask = trained_mask(micro, cfg, corrected=corrected).to(logp.device)
    args = {**loss_args(cfg), "loss_agg_mode": algo.loss_agg_mode, **counts}
    old, adv = micro.old_log_probs.to(logp.device), micro.advantages.to(logp.device)
    if corrected and micro.rollout_log_probs is not None:  # π_old is π_prox, the rollout engine's π_behav
        behav = micro.rollout_log_probs.to(logp.device)
        loss, m = decoupled_policy_loss(
            logp, old, behav, adv, mask, correction=algo.rollout_is.mode, correction_args=correction_args(cfg),
            loss=algo.policy_loss, **args,
        )
    else:
        loss, m = get_policy_loss(algo.policy_loss)(logp, old, adv, mask, **args)
    if algo.entropy_coeff > 0:
        loss = loss - algo.entropy_coeff * aggregate_loss(ent, mask, algo.loss_agg_mode, **counts)
    if algo.use_kl_loss:
        kl = kl_penalty(logp, micro.ref_log_probs.to(logp.device), kind=algo.kl_loss_type)
        loss = loss + algo.kl_loss_coef * aggregate_loss(kl, mask, algo.loss_agg_mode, **counts)
        m["actor/kl_loss"] = masked_mean(kl.detach(), mask)
    return loss, m, (float(mask.sum()), float(mask.bool().any(-1).sum()))


def add_weighted(sums: dict[str, float], m: dict[str, float], tokens: float, seqs: float) -> None:
    """Accumulate means weighted by what they are means over: ``tokens``, or ``seqs`` (the micro-batch's responses
    holding a token) for :data:`~dapo_cli.algo.objectives.SEQUENCE_METRICS`; ``actor/pg_loss`` raw (a sum by
    construction)."""
    sums["tokens"] = sums.get("tokens", 0.0) + tokens
    sums["seqs"] = sums.get("seqs", 0.0) + seqs
    for key, value in m.items():
        term = value if key == "actor/pg_loss" else value * (seqs if key in SEQUENCE_METRICS else tokens)
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
