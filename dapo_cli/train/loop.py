"""`dapo train`: the DAPO RL loop, readable top to bottom.

One step (DAPO Algorithm 1; Yu et al. 2025, arXiv:2503.14476)::

    prompts ─rounds.next_round──────► responses, lengths, truncated, weight version (rounds.py: inline, or a worker process)
            ─verifier───────────────► score ±1, acc
            ─algo.overlong──────────► shaped reward (soft punishment, Eq. 13) / loss mask (filtering)
            ─algo.sampling──────────► keep groups with 0 < #correct < G; generate more rounds until full (Eq. 11)
            ─algo.advantages────────► Â per response (group-normalised)
            ─engine (no grad)───────► old log-probs, entropy
            ─epochs × mini-batches × micro-batches: policy_loss (decoupled clip Eq. 10, token-level Eq. 12)
            ─engine.step────────────► rounds.after_update: the rollout engine (or the worker) gets the new weights
            ─tracker.log_metrics (one batched call) / checkpoint / validate

Departures from the paper, each deliberate: (1) no KL term unless ``algorithm.use_kl_loss``
(the paper removes it too); (2) when dynamic sampling runs out of generation rounds
the step trains on the groups it has (``filter_groups.on_exhausted: train``) instead of
stalling; (3) a collapse guard stops the run after ``trainer.collapse_patience`` steps
without any informative group (every group all-right or all-wrong gives no gradient).

Asynchronous rollouts (``rollout.max_staleness = k > 0``, ``worker.py``): a worker process
generates the next steps' rounds while the trainer updates; a round sampled more than ``k`` versions
before the policy being updated is dropped, and the loss is the decoupled objective
(``algo/staleness.py``: clip around the recomputed π_old, behaviour weight min(π_old / π_rollout, C)).

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
from dapo_cli.algo.overlong import mask_responses, overlong_filter_mask, overlong_penalty
from dapo_cli.algo.sampling import GroupBatchAssembler, informative_groups
from dapo_cli.algo.staleness import version_lag
from dapo_cli.batch import RolloutBatch
from dapo_cli.models.flops import model_matmul_params
from dapo_cli.components import open_tracker
from dapo_cli.config import Config
from dapo_cli.config.schema import old_log_probs_from_update, rank_share
from dapo_cli.diagnostics import contains_answer, group_length_spread, loops, on_correct_path
from dapo_cli.engine.dist import Collective, SingleProcess, gather_cat, reduce_sums
from dapo_cli.errors import UserError
from dapo_cli.rewards import score_batch
from dapo_cli.signals import StopRequest, sigint_deferred, stop_requests
from dapo_cli.tracking.base import Tracker
from dapo_cli.train.rounds import Round, RoundSource, open_rounds
from dapo_cli.train.session import TrainingSession
from dapo_cli.train.update import (
    fill_old_log_probs,
    rollout_mismatch,
    update_policy,
)


# ---------------------------------------------------------------- the step's phases


def to_batch(rnd: Round, *, first_group: int, pad_id: int) -> RolloutBatch:
    """A round as the step's batch type; group ids ``first_group + prompt index``, every response's version."""
    out, index = rnd.rollouts, rnd.rollouts.prompt_index.tolist()
    return RolloutBatch.from_rollouts(
        out,
        group_ids=out.prompt_index + first_group,
        ground_truths=[rnd.prompts[i].ground_truth for i in index],
        prompts=[rnd.prompts[i].text for i in index],
        pad_id=pad_id,
        versions=torch.full((len(out.lengths),), rnd.version, dtype=torch.long),
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
            batch.lengths, max_length=cfg.rollout.max_response_length, buffer_length=algo.overlong_buffer.len, penalty_factor=algo.overlong_buffer.penalty_factor
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
    rounds_used: int
    """Rounds scored for this step (stale rounds dropped unscored are not counted): how many rounds a step asks
    for, what the worker queues per step ahead (logged as ``train/num_gen_batches``)."""
    metrics: dict[str, float] = field(default_factory=dict)
    generated_stats: dict[str, torch.Tensor] = field(default_factory=dict)
    """Per-response ``lengths``, ``truncated``, ``acc``, ``scores``, ``group_ids``, ``has_answer``, ``loops``, ``on_path`` of all ranks' generations."""


def collect_batch(
    rounds: RoundSource, cfg: Config, *, step: int, pad_id: int, dist: Collective | None = None, policy_version: int | None = None,
    worker: bool = False,
) -> Collected:
    """Take rounds, score and shape them; with dynamic sampling, take more until enough informative groups.

    ``policy_version`` (default ``step − 1``) is the version of the weights being updated; with the worker
    process (``worker``: the session's ``uses_worker(cfg.rollout)``) a round sampled more than
    ``rollout.max_staleness`` versions before it is dropped whole, before anything is scored, and counted
    (``async/stale_groups_dropped``).

    Data parallel: every rank takes the same round (its own share of the same prompts); the staleness
    test and the group filter run on the whole round (lag maximum, gathered accuracies, rank order), so
    every rank agrees when the batch is full and the ranks together train exactly ``train_batch_size``
    groups. Group ids are global.
    """
    dist = dist or SingleProcess()
    version = step - 1 if policy_version is None else policy_version
    target = cfg.data.train_batch_size
    per_round = cfg.data.prompts_per_round
    share = rank_share(cfg.data, dist.world_size)
    fg = cfg.algorithm.filter_groups
    assembler = GroupBatchAssembler(target, fg.max_num_gen_batches) if fg.enable else None
    kept: list[RolloutBatch] = []
    generated: list[RolloutBatch] = []
    round_idx = stale_groups = 0
    while True:
        rnd = rounds.next_round(step)
        if worker and round_lag(rnd, version, dist) > cfg.rollout.max_staleness:
            stale_groups += per_round
            continue
        batch = to_batch(rnd, first_group=round_idx * per_round + dist.rank * share, pad_id=pad_id)
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
    if worker:
        metrics["async/stale_groups_dropped"] = float(stale_groups)
    trained = None if nothing else RolloutBatch.concat(kept)
    return Collected(batch=trained, generated=everything, rounds_used=round_idx, metrics=metrics, generated_stats=stats)


def round_lag(rnd: Round, policy_version: int, dist: Collective) -> int:
    """Version lag of a round (``algo.staleness.version_lag``), the largest over ranks so every rank agrees."""
    lag = int(version_lag(policy_version, torch.tensor([rnd.version]))[0])
    if dist.world_size == 1:
        return lag
    return int(dist.all_reduce(torch.tensor([float(lag)]), "max").item())


def compute_advantages(batch: RolloutBatch, cfg: Config) -> None:
    """Â_i = (R_i − mean(R_group)) / std(R_group) for GRPO (DAPO Eq. 9), on shaped rewards.

    A group lives on one rank, so advantages need no communication."""
    batch.advantages = group_advantages(batch.rewards, batch.group_ids, estimator=cfg.algorithm.adv_estimator)


def step_metrics(
    collected: Collected, batch: RolloutBatch | None, cfg: Config, dist: Collective | None = None, *, policy_version: int = 0,
    worker: bool = False,
) -> dict[str, float]:
    """The paper's monitors on the trained batch, plus accuracy over everything generated (all ranks);
    with the worker process (``worker``), the trained responses' version lag behind ``policy_version`` (mean, max)."""
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
            "lag": float(version_lag(policy_version, batch.versions).sum()) if batch.versions is not None else 0.0,
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
        if worker:
            out["async/version_lag_mean"] = s["lag"] / rows
            lag_max = version_lag(policy_version, batch.versions).max() if len(batch) else torch.tensor(0)
            out["async/version_lag_max"] = float(dist.all_reduce(lag_max.double().reshape(1), "max").item())
    return out


def compute_metrics(generated_tokens: float, trained_tokens: float, n: int | None) -> dict[str, float]:
    """The step's compute, the report's budget axes (summed over steps by ``dapo report``, like the samples):
    tokens generated (every rank's responses, gathered), tokens trained (the loss tokens, summed over ranks) and the
    counted FLOPs ``2 N · generated + 6 N · trained`` (``N``: :func:`dapo_cli.models.flops.matmul_params`; left out
    when the model's shape is unknown)."""
    out = {"compute/generated_tokens": generated_tokens, "compute/trained_tokens": trained_tokens}
    if n:
        out["compute/flops"] = 2.0 * n * generated_tokens + 6.0 * n * trained_tokens
    return out


def informative_step(batch: RolloutBatch | None, dist: Collective) -> bool:
    """True when some rank trained a response with a non-zero advantage (same answer on every rank)."""
    local = batch is not None and len(batch) > 0 and bool(batch.advantages.abs().max() > 0)
    return bool(dist.all_reduce(torch.tensor([float(local)]), "max").item())


# ---------------------------------------------------------------- small helpers


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
    unfinished checkpoint write is removed and the run directory's lock is released. A scheduler's stop
    request (SIGUSR2, :func:`~dapo_cli.signals.stop_requests`) ends the step under way, saves a checkpoint
    at it and raises :class:`TrainingPreempted` the same way: ``resume=True`` continues at the next step.
    """
    s = TrainingSession.open(cfg, resume=resume, verbosity=-1 if quiet else int(verbose))
    trainer, dist = cfg.trainer, s.dist
    old_from_update = old_log_probs_from_update(cfg)  # one optimizer step a batch: the update's forward is π_old's
    step, logged = s.start_step, {}
    rounds: RoundSource | None = None
    try:
        with open_tracker(
            cfg.tracking, dist, s.display_name, tags=s.tags(command, extra_tags), parent_run_id=parent_run_id,
            resume_run_id=s.mlflow_run_id,
        ) as tracker:
            s.record_start(tracker)
            s.close_orphans(tracker)
            # inline, or a worker process generating ahead (rollout.worker / max_staleness); versions count steps
            rounds = open_rounds(cfg, s.rollout, s.stream, dist, s.engine, model_path=s.model_path, version=s.start_step,
                                 worker=s.worker, worker_threads=s.worker_threads, pad_id=s.pad_id)
            if s.start_step == 0:
                s.log_validation(tracker, step=0)
            with s.reporter, stop_requests() as stop:
                for step in range(s.start_step + 1, trainer.total_steps + 1):
                    clock = StepClock()
                    # ---- the DAPO step (Algorithm 1): collect → advantages → old log-probs → update
                    s.reporter.phase(step, "generate + score")
                    collected = collect_batch(rounds, cfg, step=step, pad_id=s.pad_id, dist=dist, worker=s.worker)
                    clock.lap("timing/gen_and_score")
                    rounds.before_update(step, collected.rounds_used)  # the worker generates on while the trainer updates
                    batch, metrics = collected.batch, {}
                    if batch is not None:  # None: no informative group in the rounds dynamic sampling may take
                        compute_advantages(batch, cfg)
                        if not old_from_update:
                            s.reporter.phase(step, "old log-probs")
                            fill_old_log_probs(s.engine, batch, s.objective, trainer.ppo_micro_batch_size)
                        clock.lap("timing/old_log_prob")
                        s.reporter.phase(step, "update")
                        metrics = update_policy(s.engine, batch, s.objective, trainer, step=step, old_from_update=old_from_update)
                        metrics.update(rollout_mismatch(batch, s.objective, cfg.algorithm.rollout_is, dist))
                        if not s.engine.params_finite():
                            s.stop_non_finite(tracker, step)  # raises: nothing generates with NaN weights
                    synced = rounds.after_update(s.engine, step, updated=batch is not None)  # weights version `step`
                    s.count_barren(informative_step(batch, dist))
                    # ---- plumbing: record the step; validate and checkpoint when due; stop after a collapse
                    logged = record_step(s, tracker, step, collected, metrics, synced, clock)
                    saved = validate_and_save(s, tracker, rounds, step)
                    if s.collapsed:
                        s.stop_collapsed(tracker, step)
                        break
                    if step < trainer.total_steps and stop_agreed(stop, dist):
                        save_for_stop(s, tracker, rounds, step, saved=saved, signal_name=stop.name or "SIGUSR2")
            return s.finish(tracker, logged)
    except TrainingPreempted:  # the tracker has marked the run KILLED on its way out; the checkpoint is whole
        raise
    except KeyboardInterrupt as exc:  # the tracker has marked the run KILLED on its way out
        if dist.is_main:
            s.ckpt.clean_stale()  # a checkpoint write the interrupt cut short
        raise TrainingInterrupted(s.run_dir, step, s.ckpt.latest()) from exc
    except Exception:  # the tracker has marked the run FAILED; a checkpoint write that failed (a full disk)
        if dist.is_main:  # leaves no half-written .step_N.tmp behind, and frees what it took
            s.ckpt.clean_stale()
        raise
    finally:
        if rounds is not None:
            rounds.close()  # the worker process stops before the session lets go of the run
        s.close()


# ---------------------------------------------------------------- the step's plumbing


class StepClock:
    """Wall-clock time of one step: :meth:`lap` records the seconds since the previous lap (or the step's start)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.laps: dict[str, float] = {}
        self._last = 0.0

    def lap(self, name: str) -> float:
        now = elapsed(self.t0)
        self.laps[name], self._last = now - self._last, now
        return self.laps[name]


def record_step(
    s: TrainingSession, tracker: Tracker, step: int, collected: Collected, metrics: dict[str, float], synced: dict[str, float],
    clock: StepClock,
) -> dict[str, float]:
    """Everything step ``step`` logs, in one tracker call: the monitors (:func:`step_metrics`), the update's
    ``metrics``, the round source's ``synced`` timings and the step's clock; the progress line, a note when
    updates were skipped, and the sample table when due. Returns what was logged."""
    if metrics.get("actor/skipped_updates"):
        s.reporter.note(f"step {step}: {int(metrics['actor/skipped_updates'])} update(s) skipped: the loss or gradient was not finite")
    laps = dict(clock.laps)
    t_gen = laps.pop("timing/gen_and_score")
    logged = {  # laps: timing/old_log_prob, when a batch was trained
        **step_metrics(collected, collected.batch, s.cfg, s.dist, policy_version=step - 1, worker=s.worker),
        **metrics, **laps, **synced,
    }
    logged["timing/gen_and_score"] = t_gen
    logged["timing/step"] = elapsed(clock.t0)
    logged["perf/gen_tokens_per_s"] = float(collected.generated_stats["lengths"].sum()) / max(t_gen, 1e-9)
    logged.update(compute_metrics(float(collected.generated_stats["lengths"].sum()), logged.get("train/loss_tokens", 0.0),
                                  model_matmul_params(s.model_path) if s.model_path else None))
    tracker.log_metrics(logged, step=step)
    s.reporter.step_done(step, logged)
    freq = s.cfg.trainer.log_samples_freq
    if freq > 0 and step % freq == 0:
        tracker.log_table(sample_rows(collected.generated), f"samples/step_{step:06d}.json")
    return logged


def validate_and_save(s: TrainingSession, tracker: Tracker, rounds: RoundSource, step: int) -> bool:
    """Validate and checkpoint when due: every ``test_freq`` / ``save_freq`` steps and at the last step (the
    collapsed step is the last). True when a checkpoint was saved at ``step``."""
    trainer = s.cfg.trainer
    last = step if s.collapsed else trainer.total_steps
    if due(step, trainer.test_freq, last):
        s.log_validation(tracker, step=step)
    if not due(step, trainer.save_freq, last):
        return False
    with sigint_deferred():  # Ctrl-C stops the run after this checkpoint, not inside it
        s.save(step, tracker, stream_state=rounds.stream_state())  # rounds drawn ahead are drawn again
    return True


def stop_agreed(stop: StopRequest, dist: Collective) -> bool:
    """Whether any rank got the stop request (every rank must stop at the same step: the checkpoint is collective)."""
    if dist.world_size == 1:
        return stop.signum is not None
    asked = torch.tensor([1.0 if stop.signum is not None else 0.0])
    return bool(dist.all_reduce(asked, op="max").item() > 0)


def save_for_stop(s: TrainingSession, tracker: Tracker, rounds: RoundSource, step: int, *, saved: bool, signal_name: str) -> None:
    """A stop request came: checkpoint ``step`` (unless it just was) and raise :class:`TrainingPreempted`; the
    step's metrics are logged, so a resumed run logs from ``step + 1`` on, with no gap and no step twice."""
    if not saved:
        with sigint_deferred():
            s.save(step, tracker, stream_state=rounds.stream_state())
    raise TrainingPreempted(s.run_dir, step, s.ckpt.latest(), signal_name)


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`run_train`: the run directory, the step it was in, its newest checkpoint (or None)."""

    def __init__(self, run_dir: Path, step: int, checkpoint: Path | None) -> None:
        super().__init__(f"interrupted in step {step} of {run_dir}")
        self.run_dir, self.step, self.checkpoint = run_dir, step, checkpoint


class TrainingPreempted(TrainingInterrupted):
    """A stop request (``signal_name``, e.g. Slurm's time-limit warning) ended the run after step ``step``, whose
    checkpoint it saved: the MLflow run is marked KILLED and ``dapo train --resume`` continues it."""

    def __init__(self, run_dir: Path, step: int, checkpoint: Path | None, signal_name: str) -> None:
        super().__init__(run_dir, step, checkpoint)
        self.signal_name = signal_name


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
