"""The optimisation phases of a training step: old log-probs, the update, and what the update logs.

:func:`dapo_cli.train.run_train` calls the first three in this order, after the batch has its advantages;
:func:`~dapo_cli.train.records.record_step` calls the last when it records the step::

    old_log_probs_from_update(cfg)   one optimizer step? then the update's own forward is π_old's (config.schema)
    fill_old_log_probs               else: log π_old (+ entropy, + log π_ref for KL) without grad
    update_policy                    schedule_minibatches → micro_loss per micro-batch → engine.step per mini-batch
    rollout_mismatch                 |log π_old − log π_rollout| and the IS correction's effect (metrics)

What is minimised is the run's :class:`~dapo_cli.train.objective.Objective`, built once when the session opens:
the policy loss ``algorithm.policy_loss`` names (:mod:`dapo_cli.algo.objectives`: dapo, gspo, cispo, gmpo) with its
own settings, and, with :func:`~dapo_cli.config.schema.behaviour_correction` (``algorithm.rollout_is`` or
asynchronous rollouts), the decoupled objective of :mod:`dapo_cli.algo.staleness`, π_old being the proximal policy
(the weights being updated) and π_rollout the behaviour policy that sampled, corrected by
``algorithm.rollout_is.mode`` (:mod:`dapo_cli.algo.rollout_correction`; by default each token weighted by
min(π_old / π_rollout, C)). A correction that drops responses (``geo_mask``) drops them before the update
(:meth:`~dapo_cli.train.objective.Objective.trained_mask`), so the global counts never hold them.

Every function here is exact under any micro-batch or rank split (``tests/train/``, ``tests/distributed/``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dapo_cli.algo.importance import mismatch_sums, ratio_sums
from dapo_cli.algo.losses import global_counts
from dapo_cli.algo.objectives import SEQUENCE_METRICS
from dapo_cli.algo.rollout_correction import ROW_FILTERS, correction_sums, geo_mask_keep, opsm_keep
from dapo_cli.batch import RolloutBatch
from dapo_cli.config.schema import RolloutISConfig, TrainerConfig
from dapo_cli.engine.base import TrainingEngine
from dapo_cli.engine.dist import Collective, reduce_sums
from dapo_cli.runs import derive_seed
from dapo_cli.train.objective import Objective


@torch.no_grad()
def fill_old_log_probs(engine: TrainingEngine, batch: RolloutBatch, objective: Objective, micro_batch_size: int) -> None:
    """log π_old (the policy that sampled), its entropy, and log π_ref when the objective's KL term is on.

    Micro-batched (``micro_batch_size`` rows) without grad; every rank runs the same number of forwards (ZeRO-3
    gathers parameters in each), padding with a one-row blank when it has fewer rows.
    """
    slices = micro_slices(len(batch), micro_batch_size)
    count = lockstep_counts(engine.dist, [len(slices)])[0]
    use_ref = objective.use_kl
    logps, ents, refs = [], [], []
    for i in range(count):
        micro = batch.select(slices[i]) if i < len(slices) else blank_micro(batch)
        logp, ent = engine.log_probs(micro, temperature=objective.temperature, with_entropy=True)
        ref = engine.ref_log_probs(micro, temperature=objective.temperature) if use_ref else None
        if i < len(slices):
            logps.append(logp.cpu())
            ents.append(ent.cpu())
            if ref is not None:
                refs.append(ref.cpu())
    empty = torch.zeros(0, batch.response_ids.shape[1])
    batch.old_log_probs = torch.cat(logps) if logps else empty
    batch.entropy = torch.cat(ents) if ents else empty.clone()
    batch.ref_log_probs = (torch.cat(refs) if refs else empty.clone()) if use_ref else None


def rollout_mismatch(batch: RolloutBatch, objective: Objective, ris: RolloutISConfig, dist: Collective) -> dict[str, float]:
    """How far the rollout engine's log-probs of its samples are from the trainer's old log-probs
    (over all ranks' trained responses), and what the corrections do or would do.

    Always (when the rollout engine gave log-probs): ``rollout/logprob_diff_mean`` / ``_max``, the mean / max of
    |log π_old − log π_rollout| per token; the token probability ratio ρ = π_old / π_rollout over the same tokens,
    ``rollout/token_prob_ratio_mean`` / ``_min`` / ``_max`` and ``rollout/token_prob_ratio_mult_error`` (mean of
    e^|log ρ|, NeMo-RL's token_mult_prob_error); the share of trained responses each masking correction masks with
    configured bound in ``ris``, at π_θ = π_old (the update's start): ``rollout/geo_mask_seq_frac`` and
    ``rollout/opsm_seq_frac``. When the objective corrects (``objective.correction``) with ``token_tis``: ``rollout/is_weight_mean`` (of
    min(ρ, C) over the trained tokens, the weights the loss used) and ``rollout/is_truncated_frac`` (share of them
    whose ratio exceeded C); with ``seq_tis`` the same at its own level, over trained responses and their sequence
    ratios. Every value is exact under any rank split (sums, min, max reduced over ranks).
    """
    if batch.rollout_log_probs is None:
        return {}
    old, rollout = batch.old_log_probs, batch.rollout_log_probs
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
    if objective.correction is not None:
        sums = correction_sums(objective.correction, old, rollout, trained, **objective.correction_args)
        local.update({f"is_{k}": v for k, v in sums.items()})
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


def dropped_rows(batch: RolloutBatch, objective: Objective, dist: Collective) -> dict[str, float]:
    """``rollout/masked_seq_frac`` of a row-dropping correction: the share of all ranks' trained responses it dropped."""
    if objective.correction not in ROW_FILTERS:
        return {}
    rows = batch.loss_mask.bool().any(-1)
    kept = objective.trained_mask(batch).bool().any(-1)
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


def schedule_minibatches(batch: RolloutBatch, trainer: TrainerConfig, dist: Collective, *, step: int) -> list[MiniBatch]:
    """``ppo_epochs`` × mini-batches of ``ppo_mini_batch_size`` groups, drawn from all ranks' groups with
    one permutation per epoch (seeded by the step), so every rank draws the same mini-batches."""
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
    engine: TrainingEngine, batch: RolloutBatch, objective: Objective, trainer: TrainerConfig, *, step: int,
    old_from_update: bool = False,
) -> dict[str, float]:
    """``objective`` minimised over ``ppo_epochs`` × mini-batches (by group) × micro-batches of ``trainer``; one
    optimizer step per mini-batch.

    ``old_from_update`` (only where :func:`~dapo_cli.config.schema.old_log_probs_from_update` holds: one optimizer step):
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
    dist, agg, norm_length = engine.dist, objective.agg_mode, objective.norm_length
    schedule = schedule_minibatches(batch, trainer, dist, step=step)
    if old_from_update and len(schedule) != 1:
        raise RuntimeError(f"old log-probs from the update need one optimizer step per batch, not {len(schedule)}")
    if old_from_update:  # filled micro-batch by micro-batch below (dtype of the engine's log-probs)
        batch.old_log_probs = batch.entropy = None
    sums: dict[str, float] = {}
    grad_norms: list[float] = []  # one per optimizer step taken
    skipped = 0  # mini-batches whose gradient was not finite: no update
    for mb in schedule:
        mini = batch.select(mb.rows)
        counts = {**reduce_sums(dist, global_counts(objective.trained_mask(mini), agg)), "norm_length": norm_length}
        for i in range(mb.lockstep):
            micro = mini.select(mb.micro[i]) if i < len(mb.micro) else blank_micro(batch)
            if objective.loss_norm == "micro_batch":  # each micro-batch its own mean: not exact, for reproduction
                counts = {**global_counts(objective.trained_mask(micro), agg), "norm_length": norm_length}
            with engine.accumulate(last=i == mb.lockstep - 1):
                loss, m, weights = micro_loss(engine, micro, objective, counts, old_from_update=old_from_update)
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
    return {**metrics, **dropped_rows(batch, objective, dist)}


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
    engine: TrainingEngine, micro: RolloutBatch, objective: Objective, counts: dict[str, float], *,
    old_from_update: bool = False,
) -> tuple[torch.Tensor, dict[str, float], tuple[float, float]]:
    """One micro-batch's term of the mini-batch loss (``objective``: the policy loss, optional entropy and KL terms),
    its detached metrics (token means, and sequence means for :data:`~dapo_cli.algo.objectives.SEQUENCE_METRICS`)
    and the tokens and responses they are means over.

    ``old_from_update``: this forward is π_old's (see :func:`~dapo_cli.config.schema.old_log_probs_from_update`); its detached
    log-probs become ``micro.old_log_probs`` (ratio exactly 1) and its entropy ``micro.entropy``."""
    with_entropy = objective.with_entropy or old_from_update
    logp, ent = engine.log_probs(micro, temperature=objective.temperature, with_entropy=with_entropy)
    if old_from_update:
        micro.old_log_probs, micro.entropy = logp.detach(), ent.detach()
    mask = objective.trained_mask(micro).to(logp.device)
    loss, m = objective(logp, ent, micro, mask, counts)
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
