"""`dapo train`: the DAPO RL loop, readable top to bottom.

One step (DAPO Algorithm 1; Yu et al. 2025, arXiv:2503.14476)::

    prompts ─rollout.generate(n=G)─► responses, lengths, truncated
            ─verifier───────────────► score ±1, acc
            ─algo.overlong──────────► shaped reward (soft punishment, Eq. 13) / loss mask (filtering)
            ─algo.sampling──────────► keep groups with 0 < #correct < G; generate more rounds until full (Eq. 11)
            ─algo.advantages────────► Â per response (group-normalised)
            ─engine (no grad)───────► old log-probs, entropy
            ─epochs × mini-batches × micro-batches: policy_loss (decoupled clip Eq. 10, token-level Eq. 12)
            ─engine.step────────────► rollout.sync_weights
            ─tracker.log_metrics (one batched call) / checkpoint / validate

Departures from the paper, each deliberate: (1) no KL term unless ``algorithm.use_kl_loss``
(the paper removes it too); (2) when dynamic sampling runs out of generation rounds
the step trains on the groups it has (``filter_groups.on_exhausted: train``) instead of
stalling; (3) a collapse guard stops the run after ``trainer.collapse_patience`` steps
without any informative group (every group all-right or all-wrong gives no gradient).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from dapo_cli.algo.advantages import group_advantages
from dapo_cli.algo.kl import kl_penalty
from dapo_cli.algo.logits import mean_token_prob
from dapo_cli.algo.losses import aggregate_loss, global_counts, masked_mean, policy_loss
from dapo_cli.algo.overlong import mask_responses, overlong_filter_mask, overlong_penalty
from dapo_cli.algo.sampling import GroupBatchAssembler, informative_groups
from dapo_cli.batch import RolloutBatch
from dapo_cli.config import Config
from dapo_cli.data.loader import Prompt, PromptStream
from dapo_cli.errors import UserError
from dapo_cli.rewards import score_batch
from dapo_cli.rollout.base import RolloutEngine, SamplingParams
from dapo_cli.session import TrainingSession, derive_seed
from dapo_cli.tracking import start_run


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
    generated: RolloutBatch
    metrics: dict[str, float] = field(default_factory=dict)


def collect_batch(rollout: RolloutEngine, stream: PromptStream, cfg: Config, *, step: int, pad_id: int) -> Collected:
    """Generate, score and shape; with dynamic sampling, repeat rounds until enough informative groups."""
    target = cfg.data.train_batch_size
    per_round = cfg.data.gen_batch_size or target
    fg = cfg.algorithm.filter_groups
    assembler = GroupBatchAssembler(target, fg.max_num_gen_batches) if fg.enable else None
    kept: list[RolloutBatch] = []
    generated: list[RolloutBatch] = []
    round_idx = 0
    while True:
        params = rollout_params(cfg, seed=derive_seed(cfg.trainer.seed, "rollout", step, round_idx))
        batch = generate_round(
            rollout, stream.next(per_round), n=cfg.rollout.n, params=params, first_group=round_idx * per_round, pad_id=pad_id
        )
        score_and_shape(batch, cfg)
        generated.append(batch)
        round_idx += 1
        if assembler is None:
            kept.append(batch)
            break
        metric = batch.acc.float() if fg.metric == "acc" else batch.rewards
        index = assembler.add(metric, batch.group_ids)
        if len(index):
            kept.append(batch.select(index))
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
    if assembler is not None:
        metrics = assembler.metrics()
    else:  # no filtering: report the share of groups that carry signal, comparable with the kept share
        informative = informative_groups(everything.acc.float(), everything.group_ids)
        n_groups = len(set(everything.group_ids.tolist()))
        metrics = {
            "train/num_gen_batches": 1.0,
            "train/kept_group_frac": len(set(everything.group_ids[informative].tolist())) / n_groups,
            "train/samples_generated": float(len(everything)),
        }
    return Collected(batch=RolloutBatch.concat(kept) if kept else None, generated=everything, metrics=metrics)


def compute_advantages(batch: RolloutBatch, cfg: Config) -> None:
    """Â_i = (R_i − mean(R_group)) / std(R_group) for GRPO (DAPO Eq. 9), on shaped rewards."""
    batch.advantages = group_advantages(batch.rewards, batch.group_ids, estimator=cfg.algorithm.adv_estimator)


@torch.no_grad()
def fill_old_log_probs(engine: Any, batch: RolloutBatch, cfg: Config, ref_model: torch.nn.Module | None) -> None:
    """log π_old (the policy that sampled) and its entropy, micro-batched without grad."""
    from dapo_cli.engine.torch import policy_forward

    logps, ents, refs = [], [], []
    for idx in micro_slices(len(batch), cfg.trainer.ppo_micro_batch_size):
        micro = batch.select(idx)
        logp, ent = engine.log_probs(micro, temperature=cfg.rollout.temperature, with_entropy=True)
        logps.append(logp.cpu())
        ents.append(ent.cpu())
        if ref_model is not None:
            ref, _ = policy_forward(ref_model, micro, temperature=cfg.rollout.temperature, with_entropy=False, device=engine.device)
            refs.append(ref.cpu())
    batch.old_log_probs = torch.cat(logps)
    batch.entropy = torch.cat(ents)
    batch.ref_log_probs = torch.cat(refs) if refs else None


def update_policy(engine: Any, batch: RolloutBatch, cfg: Config, *, step: int) -> dict[str, float]:
    """``ppo_epochs`` × mini-batches (by group) × micro-batches; one optimizer step per mini-batch.

    Micro-batch losses use the mini-batch's global token / sequence counts, so their sum
    has exactly the gradient of the whole mini-batch (the token-level loss is exact under
    any micro-batch split).
    """
    algo, trainer = cfg.algorithm, cfg.trainer
    groups = list(dict.fromkeys(batch.group_ids.tolist()))
    gen = torch.Generator().manual_seed(derive_seed(trainer.seed, "minibatch", step))
    sums: dict[str, float] = {}
    tokens_seen = 0.0
    grad_norms: list[float] = []  # one per optimizer step taken
    skipped = 0  # mini-batches whose loss or gradient was not finite: no update
    for _epoch in range(trainer.ppo_epochs):
        order = [groups[i] for i in torch.randperm(len(groups), generator=gen).tolist()]
        for start in range(0, len(order), trainer.ppo_mini_batch_size):
            chosen = torch.tensor(order[start : start + trainer.ppo_mini_batch_size])
            mini = batch.select(torch.isin(batch.group_ids, chosen).nonzero().squeeze(1))
            counts = {**global_counts(mini.loss_mask, algo.loss_agg_mode), "norm_length": cfg.rollout.max_response_length}
            finite = True
            for idx in micro_slices(len(mini), trainer.ppo_micro_batch_size):
                micro = mini.select(idx)
                logp, ent = engine.log_probs(micro, temperature=cfg.rollout.temperature, with_entropy=algo.entropy_coeff > 0)
                mask = micro.loss_mask.to(logp.device)
                loss, m = policy_loss(
                    logp, micro.old_log_probs.to(logp.device), micro.advantages.to(logp.device), mask,
                    clip_ratio_low=algo.clip_ratio_low, clip_ratio_high=algo.clip_ratio_high,
                    clip_ratio_c=algo.clip_ratio_c, loss_agg_mode=algo.loss_agg_mode, **counts,
                )
                if algo.entropy_coeff > 0:
                    loss = loss - algo.entropy_coeff * aggregate_loss(ent, mask, algo.loss_agg_mode, **counts)
                if algo.use_kl_loss and micro.ref_log_probs is not None:
                    kl = kl_penalty(logp, micro.ref_log_probs.to(logp.device), kind=algo.kl_loss_type)
                    loss = loss + algo.kl_loss_coef * aggregate_loss(kl, mask, algo.loss_agg_mode, **counts)
                    m["actor/kl_loss"] = masked_mean(kl.detach(), mask)
                if not torch.isfinite(loss):
                    finite = False
                    break
                engine.backward(loss)
                weight = float(mask.sum())
                tokens_seen += weight
                for key, value in m.items():
                    sums[key] = sums.get(key, 0.0) + value * weight
            if not finite:
                engine.optimizer.zero_grad(set_to_none=True)
                skipped += 1
                continue
            norm, applied = engine.step()
            if applied:
                grad_norms.append(norm)
            else:
                skipped += 1
    metrics = {k: v / tokens_seen for k, v in sums.items()} if tokens_seen else {}
    metrics["actor/grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else float("nan")
    metrics["actor/num_updates"] = float(len(grad_norms))
    metrics["actor/skipped_updates"] = float(skipped)
    metrics["actor/lr"] = engine.lr
    return metrics


def step_metrics(collected: Collected, batch: RolloutBatch | None, cfg: Config) -> dict[str, float]:
    """The paper's monitors on the trained batch, plus accuracy over everything generated."""
    gen = collected.generated
    lengths = gen.lengths.float()
    out = {
        "rollout/acc": float(gen.acc.float().mean()),
        "rollout/score_mean": float(gen.scores.mean()),
        "overlong/truncated_frac": float(gen.truncated.float().mean()),
        "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()),
        "response_length/min": float(lengths.min()),
        "response_length/clip_ratio": float((gen.lengths >= cfg.rollout.max_response_length).float().mean()),
        **collected.metrics,
    }
    if batch is not None:
        mask = batch.loss_mask
        out.update(
            {
                "reward/score_mean": float(batch.scores.mean()),
                "reward/acc_mean": float(batch.acc.float().mean()),
                "reward/shaped_mean": float(batch.rewards.mean()),
                "reward/advantage_abs_mean": float(batch.advantages.abs().mean()),
                "actor/entropy": masked_mean(batch.entropy, mask),
                "actor/mean_prob": mean_token_prob(batch.old_log_probs, mask),
                "overlong/filtered_frac": float((batch.loss_mask.sum(-1) == 0).float().mean()),
                "train/batch_responses": float(len(batch)),
                "train/loss_tokens": float(mask.sum()),
            }
        )
    return out


# ---------------------------------------------------------------- small helpers


def rollout_params(cfg: Config, *, seed: int) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_tokens=r.max_response_length, seed=seed)


def micro_slices(n: int, size: int) -> list[torch.Tensor]:
    return [torch.arange(i, min(i + size, n)) for i in range(0, n, size)]


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
) -> dict[str, Any]:
    """Run (or resume) one training run; returns its summary (run dir, MLflow run id, metrics)."""
    s = TrainingSession.open(cfg, resume=resume, quiet=quiet)
    trainer = cfg.trainer
    with start_run(
        cfg.tracking, s.run_name, tags=s.tags(command, extra_tags), parent_run_id=parent_run_id, resume_run_id=s.mlflow_run_id
    ) as tracker:
        s.record_start(tracker)
        if s.start_step == 0:
            s.log_validation(tracker, step=0)
        with s.reporter:
            for step in range(s.start_step + 1, trainer.total_steps + 1):
                t0 = time.perf_counter()
                s.reporter.phase(step, "generate + score")
                collected = collect_batch(s.rollout, s.stream, cfg, step=step, pad_id=s.pad_id)
                t_gen = elapsed(t0)
                batch, update = collected.batch, {}
                if batch is not None:
                    compute_advantages(batch, cfg)
                    s.reporter.phase(step, "old log-probs")
                    fill_old_log_probs(s.engine, batch, cfg, s.ref_model)
                    t_old = elapsed(t0) - t_gen
                    s.reporter.phase(step, "update")
                    update = update_policy(s.engine, batch, cfg, step=step)
                    s.rollout.sync_weights()
                    update["timing/old_log_prob"] = t_old
                informative = batch is not None and bool(batch.advantages.abs().max() > 0)
                s.barren_steps = 0 if informative else s.barren_steps + 1
                metrics = {**step_metrics(collected, batch, cfg), **update}
                metrics["timing/gen_and_score"] = t_gen
                metrics["timing/step"] = elapsed(t0)
                metrics["perf/gen_tokens_per_s"] = float(collected.generated.lengths.sum()) / max(t_gen, 1e-9)
                tracker.log_metrics(metrics, step=step)
                s.reporter.step_done(step, metrics)
                if trainer.log_samples_freq > 0 and step % trainer.log_samples_freq == 0:
                    tracker.log_table(sample_rows(collected.generated), f"samples/step_{step:06d}.json")
                collapsed = 0 < trainer.collapse_patience <= s.barren_steps
                last = trainer.total_steps if not collapsed else step
                if due(step, trainer.test_freq, last):
                    s.log_validation(tracker, step=step)
                if due(step, trainer.save_freq, last):
                    s.save(step)
                if collapsed:
                    s.stop_collapsed(tracker, step)
                    break
        return s.finish(tracker)


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
