"""`dapo train`: the DAPO RL loop, readable top to bottom.

One step (DAPO Algorithm 1; Yu et al. 2025, arXiv:2503.14476)::

    prompts ─rollout.generate(n=G)─► responses, lengths, truncated
            ─verifier───────────────► score ±1, acc
            ─algo.overlong──────────► shaped reward (soft punishment, Eq. 13) / loss mask (filtering)
            ─algo.sampling──────────► keep groups with 0 < #correct < G; generate more rounds until full (Eq. 11)
            ─algo.advantages────────► Â per response (group-normalised)
            ─engine (no grad)───────► old log-probs, entropy
            ─epochs × mini-batches × micro-batches: policy_loss (decoupled clip Eq. 10, token-level Eq. 12)
            ─engine.step────────────► rollout.wake_up + sync_weights(engine)  (export_weights, in memory)
            ─tracker.log_metrics (one batched call) / checkpoint / validate

Departures from the paper, each deliberate: (1) no KL term unless ``algorithm.use_kl_loss``
(the paper removes it too); (2) when dynamic sampling runs out of generation rounds
the step trains on the groups it has (``filter_groups.on_exhausted: train``) instead of
stalling; (3) a collapse guard stops the run after ``trainer.collapse_patience`` steps
without any informative group (every group all-right or all-wrong gives no gradient).

Data parallel (``torchrun``): every rank runs this loop on its share of each round's
prompts; the few places where ranks must agree go through ``engine.dist`` — the dynamic
sampling filter over the whole round, the global loss counts, lockstep micro-batch counts,
and metric sums — so the update and every logged value equal the one-process ones.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dapo_cli.algo.advantages import group_advantages
from dapo_cli.algo.kl import kl_penalty
from dapo_cli.algo.importance import mismatch_sums, truncated_is_weights
from dapo_cli.algo.losses import LOG_RATIO_CLAMP, aggregate_loss, global_counts, masked_mean, policy_loss
from dapo_cli.algo.overlong import mask_responses, overlong_filter_mask, overlong_penalty
from dapo_cli.algo.sampling import GroupBatchAssembler, informative_groups
from dapo_cli.batch import RolloutBatch
from dapo_cli.config import Config
from dapo_cli.data.loader import Prompt, PromptStream
from dapo_cli.engine.base import TrainingEngine
from dapo_cli.engine.dist import Collective, SingleProcess, gather_cat, reduce_sums
from dapo_cli.diagnostics import contains_answer, group_length_spread, loops, on_correct_path
from dapo_cli.errors import UserError
from dapo_cli.rewards import score_batch
from dapo_cli.rollout.base import RolloutEngine, SamplingParams
from dapo_cli.session import TrainingSession, derive_seed
from dapo_cli.signals import sigint_deferred
from dapo_cli.components import open_tracker


# ---------------------------------------------------------------- the step's phases


def generate_round(
    rollout: RolloutEngine, prompts: list[Prompt], *, n: int, params: SamplingParams, first_group: int, pad_id: int
) -> RolloutBatch:
    """Sample ``n`` responses for each prompt; group ids ``first_group + prompt index``."""
    out = rollout.generate([p.text for p in prompts], n, params)
    return RolloutBatch(
        prompt_ids=out.prompt_ids,
        prompt_mask=out.prompt_mask,
        response_ids=out.response_ids,
        response_mask=out.response_mask,
        lengths=out.lengths,
        truncated=out.truncated,
        group_ids=out.prompt_index + first_group,
        texts=list(out.texts),
        ground_truths=[prompts[i].ground_truth for i in out.prompt_index.tolist()],
        prompts=[prompts[i].text for i in out.prompt_index.tolist()],
        pad_id=pad_id,
        rollout_log_probs=out.logprobs,
    )


def score_and_shape(batch: RolloutBatch, cfg: Config) -> None:
    """Verifier score (±1) and accuracy; shaped reward; loss mask (overlong filtering)."""
    scores, acc, preds = score_batch(cfg.reward.verifier, batch.texts, batch.ground_truths)
    batch.scores = torch.tensor(scores, dtype=torch.float32)
    batch.acc = torch.tensor(acc, dtype=torch.bool)
    batch.preds = preds
    algo = cfg.algorithm
    rewards = batch.scores.clone()
    if algo.overlong_buffer.enable:
        rewards += overlong_penalty(
            batch.lengths, cfg.rollout.max_response_length, algo.overlong_buffer.len, algo.overlong_buffer.penalty_factor
        )
    batch.rewards = rewards
    keep = overlong_filter_mask(batch.truncated) if algo.overlong_filter else torch.ones(len(batch), dtype=torch.bool)
    batch.loss_mask = mask_responses(batch.response_mask, keep)


@dataclass
class Collected:
    """A step's training batch (None when no informative group was found) and its generation stats."""

    batch: RolloutBatch | None
    """This rank's share of the trained groups (possibly no rows); None when no rank kept any."""
    generated: RolloutBatch
    """Everything this rank generated in the step."""
    metrics: dict[str, float] = field(default_factory=dict)
    generated_stats: dict[str, torch.Tensor] = field(default_factory=dict)
    """Per-response ``lengths``, ``truncated``, ``acc``, ``scores``, ``group_ids``, ``has_answer``, ``loops``, ``on_path`` of all ranks' generations."""


def collect_batch(
    rollout: RolloutEngine, stream: PromptStream, cfg: Config, *, step: int, pad_id: int, dist: Collective | None = None
) -> Collected:
    """Generate, score and shape; with dynamic sampling, repeat rounds until enough informative groups.

    Data parallel: every rank draws the same round of prompts from its (identical) stream and
    generates for its own contiguous share; the group filter runs on the whole round's
    accuracies (gathered, rank order), so every rank agrees when the batch is full and the
    ranks together train exactly ``train_batch_size`` groups. Group ids are global.
    """
    dist = dist or SingleProcess()
    target = cfg.data.train_batch_size
    per_round = cfg.data.gen_batch_size or target
    share = per_round // dist.world_size
    fg = cfg.algorithm.filter_groups
    assembler = GroupBatchAssembler(target, fg.max_num_gen_batches) if fg.enable else None
    kept: list[RolloutBatch] = []
    generated: list[RolloutBatch] = []
    round_idx = 0
    while True:
        # one process keeps its historical seeds; an engine that keys its random streams by prompt text
        # (rollout/fast.py) needs no rank either, so its samples do not depend on the world size
        by_prompt = getattr(rollout, "seeds_per_prompt", False)
        rank_part = [dist.rank] if dist.world_size > 1 and not by_prompt else []
        params = rollout_params(cfg, seed=derive_seed(cfg.trainer.seed, "rollout", step, round_idx, *rank_part))
        prompts = stream.next(per_round)[dist.rank * share : (dist.rank + 1) * share]
        first = round_idx * per_round + dist.rank * share
        batch = generate_round(rollout, prompts, n=cfg.rollout.n, params=params, first_group=first, pad_id=pad_id)
        score_and_shape(batch, cfg)
        generated.append(batch)
        round_idx += 1
        if assembler is None:
            kept.append(batch)
            break
        metric = batch.acc.float() if fg.metric == "acc" else batch.rewards
        parts = dist.all_gather_object((metric, batch.group_ids))
        offset = sum(len(m) for m, _ in parts[: dist.rank])
        index = assembler.add(torch.cat([m for m, _ in parts]), torch.cat([g for _, g in parts]))
        mine = index[(index >= offset) & (index < offset + len(batch))] - offset
        kept.append(batch.select(mine))
        if assembler.done:
            break
        if assembler.exhausted:
            if fg.on_exhausted == "error":
                raise UserError(
                    f"dynamic sampling kept {assembler.num_kept_groups}/{target} groups in {assembler.num_gen_batches} "
                    "rounds; raise algorithm.filter_groups.max_num_gen_batches or set on_exhausted=train"
                )
            break
    everything = RolloutBatch.concat(generated)
    stats = gather_cat(dist, {
        "lengths": everything.lengths, "truncated": everything.truncated, "acc": everything.acc,
        "scores": everything.scores, "group_ids": everything.group_ids,
        "has_answer": contains_answer(everything.texts, everything.ground_truths), "loops": loops(everything.texts),
        "on_path": on_correct_path(everything.texts, everything.acc.bool(), everything.group_ids),  # groups are rank-local
    })
    if assembler is not None:
        metrics = assembler.metrics()
        nothing = assembler.num_kept_groups == 0  # the same on every rank
    else:  # no filtering: report the share of groups that carry signal, comparable with the kept share
        informative = informative_groups(stats["acc"].float(), stats["group_ids"])
        n_groups = len(set(stats["group_ids"].tolist()))
        metrics = {
            "train/num_gen_batches": 1.0,
            "train/kept_group_frac": len(set(stats["group_ids"][informative].tolist())) / n_groups,
            "train/samples_generated": float(len(stats["lengths"])),
        }
        nothing = False
    trained = None if nothing else RolloutBatch.concat(kept)
    return Collected(batch=trained, generated=everything, metrics=metrics, generated_stats=stats)


def compute_advantages(batch: RolloutBatch, cfg: Config) -> None:
    """Â_i = (R_i − mean(R_group)) / std(R_group) for GRPO (DAPO Eq. 9), on shaped rewards.

    A group lives on one rank, so advantages need no communication."""
    batch.advantages = group_advantages(batch.rewards, batch.group_ids, estimator=cfg.algorithm.adv_estimator)


def old_log_probs_from_update(cfg: Config) -> bool:
    """True when the update's own forwards can give log π_old and its entropy (no separate no-grad pass).

    With one epoch and one mini-batch per step (every trained group fits ``ppo_mini_batch_size``)
    the optimizer steps only after every micro-batch has run its forward, so each forward is
    π_old itself: its log-probs, detached, ARE the old log-probs (the ratio is exactly 1) and its
    entropy is the old policy's. Not with the KL term (its reference forward stays in
    :func:`fill_old_log_probs`) nor truncated IS (its weights scale the loss, so they must exist
    before the first forward). Decided from the config alone, so every rank agrees.
    """
    t, a = cfg.trainer, cfg.algorithm
    most_groups = max(cfg.data.train_batch_size, cfg.data.gen_batch_size)  # trained groups in a step, at most
    return t.ppo_epochs == 1 and most_groups <= t.ppo_mini_batch_size and not a.use_kl_loss and not a.rollout_is.enable


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
    (over all ranks' trained responses), and the truncated-IS weights when the correction is on.

    ``rollout/logprob_diff_mean`` / ``_max``: mean / max of |log π_old − log π_rollout| per token;
    with ``algorithm.rollout_is.enable``: ``batch.is_weights`` and ``rollout/is_weight_mean``,
    ``rollout/is_truncated_frac`` (share of trained tokens whose ratio exceeded the cap).
    """
    if batch.rollout_log_probs is None:
        return {}
    old, rollout = batch.old_log_probs, batch.rollout_log_probs
    local = mismatch_sums(old, rollout, batch.response_mask)
    biggest = float(dist.all_reduce(torch.tensor([local.pop("max_abs_diff")], dtype=torch.float64), "max").item())
    out: dict[str, float] = {}
    sums = {**local}
    ris = cfg.algorithm.rollout_is
    if ris.enable:
        batch.is_weights = truncated_is_weights(old, rollout, batch.loss_mask, cap=ris.cap)
        keep = batch.loss_mask.bool()
        ratio = torch.exp(torch.clamp(old - rollout, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        sums.update({
            "is_weight": float(batch.is_weights[keep].double().sum()),
            "is_truncated": float((ratio[keep] > ris.cap).sum()),
            "is_tokens": float(keep.sum()),
        })
    total = reduce_sums(dist, sums)
    out["rollout/logprob_diff_mean"] = total["abs_diff"] / total["tokens"] if total["tokens"] else 0.0
    out["rollout/logprob_diff_max"] = biggest
    if ris.enable and total["is_tokens"]:
        out["rollout/is_weight_mean"] = total["is_weight"] / total["is_tokens"]
        out["rollout/is_truncated_frac"] = total["is_truncated"] / total["is_tokens"]
    return out


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
    Mini-batches are drawn from all ranks' groups with one shared permutation; each rank
    trains the chosen groups it holds. Logged losses are sums of micro-batch terms over
    ranks (= the mini-batch loss), averaged over optimizer steps; fractions are token means
    over every trained token; both are therefore independent of micro-batch size and ranks.
    """
    algo, trainer, dist = cfg.algorithm, cfg.trainer, engine.dist
    groups = [g for part in dist.all_gather_object(list(dict.fromkeys(batch.group_ids.tolist()))) for g in part]
    gen = torch.Generator().manual_seed(derive_seed(trainer.seed, "minibatch", step))
    plan: list[tuple[RolloutBatch, list[torch.Tensor]]] = []
    plan_rows: list[torch.Tensor] = []  # each mini-batch's rows in ``batch``
    for _epoch in range(trainer.ppo_epochs):
        order = [groups[i] for i in torch.randperm(len(groups), generator=gen).tolist()]
        for start in range(0, len(order), trainer.ppo_mini_batch_size):
            chosen = torch.tensor(order[start : start + trainer.ppo_mini_batch_size])
            plan_rows.append(torch.isin(batch.group_ids, chosen).nonzero().squeeze(1))
            mini = batch.select(plan_rows[-1])
            plan.append((mini, micro_slices(len(mini), trainer.ppo_micro_batch_size)))
    counts_per_step = lockstep_counts(dist, [len(slices) for _, slices in plan])
    if old_from_update and len(plan) != 1:
        raise RuntimeError(f"old log-probs from the update need one optimizer step per batch, not {len(plan)}")
    if old_from_update:  # filled micro-batch by micro-batch below (dtype of the engine's log-probs)
        batch.old_log_probs = batch.entropy = None
    sums: dict[str, float] = {}
    grad_norms: list[float] = []  # one per optimizer step taken
    skipped = 0  # mini-batches whose gradient was not finite: no update
    for (mini, slices), count in zip(plan, counts_per_step):
        local = global_counts(mini.loss_mask, algo.loss_agg_mode)
        counts = {**reduce_sums(dist, local), "norm_length": cfg.rollout.max_response_length}
        for i in range(count):
            micro = mini.select(slices[i]) if i < len(slices) else blank_micro(batch)
            if algo.loss_norm == "micro_batch":  # each micro-batch its own mean: not exact, for reproduction
                counts = {**global_counts(micro.loss_mask, algo.loss_agg_mode), "norm_length": cfg.rollout.max_response_length}
            with engine.accumulate(last=i == count - 1):
                loss, m, weight = micro_loss(engine, micro, cfg, counts, old_from_forward=old_from_update)
                engine.backward(loss)
            add_weighted(sums, m, weight)
            if old_from_update and i < len(slices):
                if batch.old_log_probs is None:
                    batch.old_log_probs = torch.zeros(batch.response_ids.shape, dtype=micro.old_log_probs.dtype)
                    batch.entropy = torch.zeros(batch.response_ids.shape, dtype=micro.entropy.dtype)
                rows = plan_rows[0][slices[i]]
                batch.old_log_probs[rows] = micro.old_log_probs.cpu()
                batch.entropy[rows] = micro.entropy.cpu()
        norm, applied = engine.step()
        if applied:
            grad_norms.append(norm)
        else:
            skipped += 1
    totals = reduce_sums(dist, sums) if sums or dist.world_size > 1 else {}
    tokens = totals.pop("tokens", 0.0)
    pg_loss_sum = totals.pop("actor/pg_loss", 0.0)
    metrics = {k: v / tokens for k, v in totals.items()} if tokens else {}
    if tokens:
        metrics["actor/pg_loss"] = pg_loss_sum / len(plan)
    metrics["actor/grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else float("nan")
    metrics["actor/num_updates"] = float(len(grad_norms))
    metrics["actor/skipped_updates"] = float(skipped)
    metrics["actor/lr"] = engine.lr
    if old_from_update and batch.old_log_probs is None:  # this rank trained no rows
        batch.old_log_probs, batch.entropy = torch.zeros(batch.response_ids.shape), torch.zeros(batch.response_ids.shape)
    return metrics


def micro_loss(
    engine: TrainingEngine, micro: RolloutBatch, cfg: Config, counts: dict[str, float], *, old_from_forward: bool = False
) -> tuple[torch.Tensor, dict[str, float], float]:
    """One micro-batch's term of the mini-batch loss (decoupled clip, optional entropy and KL terms),
    its detached metrics (token means) and its token count.

    ``old_from_forward``: this forward is π_old's (see :func:`old_log_probs_from_update`); its detached
    log-probs become ``micro.old_log_probs`` (ratio exactly 1) and its entropy ``micro.entropy``."""
    algo = cfg.algorithm
    with_entropy = algo.entropy_coeff > 0 or old_from_forward
    logp, ent = engine.log_probs(micro, temperature=cfg.rollout.temperature, with_entropy=with_entropy)
    if old_from_forward:
        micro.old_log_probs, micro.entropy = logp.detach(), ent.detach()
    mask = micro.loss_mask.to(logp.device)
    weights = micro.is_weights.to(logp.device) if algo.rollout_is.enable and micro.is_weights is not None else None
    loss, m = policy_loss(
        logp, micro.old_log_probs.to(logp.device), micro.advantages.to(logp.device), mask,
        clip_ratio_low=algo.clip_ratio_low, clip_ratio_high=algo.clip_ratio_high,
        clip_ratio_c=algo.clip_ratio_c, loss_agg_mode=algo.loss_agg_mode, token_weights=weights, **counts,
    )
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


def step_metrics(collected: Collected, batch: RolloutBatch | None, cfg: Config, dist: Collective | None = None) -> dict[str, float]:
    """The paper's monitors on the trained batch, plus accuracy over everything generated (all ranks)."""
    dist = dist or SingleProcess()
    gen = collected.generated_stats
    lengths = gen["lengths"].float()
    out = {
        "rollout/acc": float(gen["acc"].float().mean()),
        "rollout/score_mean": float(gen["scores"].mean()),
        "overlong/truncated_frac": float(gen["truncated"].float().mean()),
        "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()),
        "response_length/min": float(lengths.min()),
        "response_length/clip_ratio": float((gen["lengths"] >= cfg.rollout.max_response_length).float().mean()),
        **collected.metrics,
    }
    spread = group_length_spread(gen["lengths"], gen["group_ids"])
    out["response_length/group_std_mean"], out["response_length/group_cv_mean"] = spread
    truncated = gen["truncated"].bool()
    if truncated.any():  # what the length limit cuts: runaway text, or work that already holds the answer
        out["overlong/truncated_with_answer_frac"] = float(gen["has_answer"][truncated].float().mean())
        out["overlong/truncated_looping_frac"] = float(gen["loops"][truncated].float().mean())
        out["overlong/truncated_on_correct_path_frac"] = float(gen["on_path"][truncated].float().mean())
    if batch is not None:
        mask = batch.loss_mask.float()
        s = reduce_sums(dist, {
            "rows": float(len(batch)),
            "tokens": float(mask.sum()),
            "score": float(batch.scores.sum()),
            "acc": float(batch.acc.float().sum()),
            "shaped": float(batch.rewards.sum()),
            "adv_abs": float(batch.advantages.abs().sum()),
            "entropy": float((batch.entropy * mask).sum()),
            "prob": float((torch.exp(batch.old_log_probs) * mask).sum()),
            "filtered": float((batch.loss_mask.sum(-1) == 0).sum()),
        })
        rows, tokens = max(s["rows"], 1.0), s["tokens"]
        out.update(
            {
                "reward/score_mean": s["score"] / rows,
                "reward/acc_mean": s["acc"] / rows,
                "reward/shaped_mean": s["shaped"] / rows,
                "reward/advantage_abs_mean": s["adv_abs"] / rows,
                "actor/entropy": s["entropy"] / tokens if tokens else 0.0,
                "actor/mean_prob": s["prob"] / tokens if tokens else 0.0,
                "overlong/filtered_frac": s["filtered"] / rows,
                "train/batch_responses": s["rows"],
                "train/loss_tokens": tokens,
            }
        )
    return out


def informative_step(batch: RolloutBatch | None, dist: Collective) -> bool:
    """True when some rank trained a response with a non-zero advantage (same answer on every rank)."""
    local = batch is not None and len(batch) > 0 and bool(batch.advantages.abs().max() > 0)
    return bool(dist.all_reduce(torch.tensor([float(local)]), "max").item())


# ---------------------------------------------------------------- small helpers


def rollout_params(cfg: Config, *, seed: int) -> SamplingParams:
    """Training rollouts: the config's sampling, with the engine's log-probs of its samples
    (the train-inference mismatch metric and the truncated-IS correction use them)."""
    r = cfg.rollout
    return SamplingParams(
        temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_tokens=r.max_response_length, seed=seed, logprobs=True
    )


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
        old_log_probs=torch.zeros(1, 1), ref_log_probs=torch.zeros(1, 1), is_weights=torch.zeros(1, 1),
    )


def due(step: int, freq: int, last: int) -> bool:
    """True every ``freq`` steps and at the last step (``freq <= 0``: only the last)."""
    return step == last or (freq > 0 and step % freq == 0)


# ---------------------------------------------------------------- the loop


def run_train(
    cfg: Config,
    *,
    resume: bool = False,
    command: str = "dapo train",
    parent_run_id: str | None = None,
    extra_tags: dict[str, str] | None = None,
    quiet: bool = False,
    verbose: bool = False,
) -> dict[str, Any]:
    """Run (or resume) one training run; returns its summary (run dir, MLflow run id, metrics).

    Under torchrun every rank runs this function; rank 0 alone tracks, prints and validates.
    ``quiet``: no progress or step lines on stderr; ``verbose``: every metric of every step too.
    Ctrl-C raises :class:`TrainingInterrupted` after the MLflow run is marked KILLED, an
    unfinished checkpoint write is removed and the run directory's lock is released.
    """
    s = TrainingSession.open(cfg, resume=resume, verbosity=-1 if quiet else int(verbose))
    trainer, dist = cfg.trainer, s.dist
    step, metrics = s.start_step, {}
    try:
        with open_tracker(
            cfg.tracking, dist, s.display_name, tags=s.tags(command, extra_tags), parent_run_id=parent_run_id,
            resume_run_id=s.mlflow_run_id,
        ) as tracker:
            s.record_start(tracker)
            s.close_orphans(tracker)
            if s.start_step == 0:
                s.log_validation(tracker, step=0)
            with s.reporter:
                for step in range(s.start_step + 1, trainer.total_steps + 1):
                    t0 = time.perf_counter()
                    s.reporter.phase(step, "generate + score")
                    collected = collect_batch(s.rollout, s.stream, cfg, step=step, pad_id=s.pad_id, dist=dist)
                    t_gen = elapsed(t0)
                    s.rollout.sleep()  # a colocated engine hands its GPU memory to the update
                    batch, update = collected.batch, {}
                    if batch is not None:
                        compute_advantages(batch, cfg)
                        reuse = old_log_probs_from_update(cfg)  # one optimizer step: the update's forward is π_old's
                        if not reuse:
                            s.reporter.phase(step, "old log-probs")
                            fill_old_log_probs(s.engine, batch, cfg)
                            mismatch = rollout_mismatch(batch, cfg, dist)
                        t_old = elapsed(t0) - t_gen
                        s.reporter.phase(step, "update")
                        update = update_policy(s.engine, batch, cfg, step=step, old_from_update=reuse)
                        if reuse:
                            mismatch = rollout_mismatch(batch, cfg, dist)
                        update.update(mismatch, **{"timing/old_log_prob": t_old})
                    if batch is not None and not s.engine.params_finite():
                        s.stop_non_finite(tracker, step)  # raises: nothing generates with NaN weights
                    t_sync = time.perf_counter()
                    s.rollout.wake_up()
                    if batch is not None:
                        s.rollout.sync_weights(s.engine)  # in memory, from engine.export_weights()
                        update["timing/weight_sync"] = elapsed(t_sync)
                    if update.get("actor/skipped_updates"):
                        s.reporter.note(f"step {step}: {int(update['actor/skipped_updates'])} update(s) skipped: the loss or gradient was not finite")
                    s.barren_steps = 0 if informative_step(batch, dist) else s.barren_steps + 1
                    metrics = {**step_metrics(collected, batch, cfg, dist), **update}
                    metrics["timing/gen_and_score"] = t_gen
                    metrics["timing/step"] = elapsed(t0)
                    metrics["perf/gen_tokens_per_s"] = float(collected.generated_stats["lengths"].sum()) / max(t_gen, 1e-9)
                    tracker.log_metrics(metrics, step=step)
                    s.reporter.step_done(step, metrics)
                    if trainer.log_samples_freq > 0 and step % trainer.log_samples_freq == 0:
                        tracker.log_table(sample_rows(collected.generated), f"samples/step_{step:06d}.json")
                    collapsed = 0 < trainer.collapse_patience <= s.barren_steps
                    last = trainer.total_steps if not collapsed else step
                    if due(step, trainer.test_freq, last):
                        s.log_validation(tracker, step=step)
                    if due(step, trainer.save_freq, last):
                        with sigint_deferred():  # Ctrl-C stops the run after this checkpoint, not inside it
                            s.save(step)
                    if collapsed:
                        s.stop_collapsed(tracker, step)
                        break
            return s.finish(tracker, metrics)
    except KeyboardInterrupt as exc:  # the tracker has marked the run KILLED on its way out
        if dist.is_main:
            s.ckpt.clean_stale()  # a checkpoint write the interrupt cut short
        raise TrainingInterrupted(s.run_dir, step, s.ckpt.latest()) from exc
    finally:
        s.close()


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`run_train`: the run directory, the step it was in, its newest checkpoint (or None)."""

    def __init__(self, run_dir: Path, step: int, checkpoint: Path | None) -> None:
        super().__init__(f"interrupted in step {step} of {run_dir}")
        self.run_dir, self.step, self.checkpoint = run_dir, step, checkpoint


def sample_rows(batch: RolloutBatch, limit: int = 16) -> list[dict[str, Any]]:
    """The first ``limit`` responses of a step as an MLflow table."""
    return [
        {
            "prompt": batch.prompts[i],
            "response": batch.texts[i],
            "pred": batch.preds[i],
            "ground_truth": batch.ground_truths[i],
            "score": float(batch.scores[i]),
            "reward": float(batch.rewards[i]),
            "length": int(batch.lengths[i]),
            "truncated": bool(batch.truncated[i]),
        }
        for i in range(min(limit, len(batch)))
    ]


def elapsed(t0: float) -> float:
    return time.perf_counter() - t0
