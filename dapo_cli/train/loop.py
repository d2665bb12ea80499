"""`dapo train`: the DAPO RL loop, readable top to bottom.

One step (DAPO Algorithm 1; Yu et al. 2025, arXiv:2503.14476)::

    prompts ─rounds.next_round──────► responses, lengths, truncated, weight version (rounds.py: inline, or a worker process)
            ─verifier───────────────► score ±1, acc
            ─algo.overlong──────────► shaped reward (soft punishment, Eq. 13) / loss mask (filtering)
            ─algo.sampling──────────► keep groups with 0 < #correct < G; generate more rounds until full (Eq. 11)
            ─algo.advantages────────► Â per response (group-normalised)
            ─engine (no grad)───────► old log-probs, entropy
            ─epochs × mini-batches × micro-batches: the run's Objective (objective.py; DAPO's: decoupled clip Eq. 10,
                                                     token-level Eq. 12)
            ─engine.step────────────► rounds.after_update: the rollout engine (or the worker) gets the new weights
            ─records.record_step: tracker.log_metrics (one batched call) / checkpoint / validate

Departures from the paper, each deliberate: (1) no KL term unless ``algorithm.use_kl_loss``
(the paper removes it too); (2) when dynamic sampling runs out of generation rounds
the step trains on the groups it has (``filter_groups.on_exhausted: train``) instead of
stalling; (3) a collapse guard stops the run after ``trainer.collapse_patience`` steps
without any informative group (every group all-right or all-wrong gives no gradient).

Asynchronous rollouts (``rollout.max_staleness = k > 0``, ``worker.py``): a worker process
generates the next steps' rounds while the trainer updates; a round sampled more than ``k`` versions
before the policy being updated is dropped, and the loss is the decoupled objective
(``algo/staleness.py``: clip around the recomputed π_old, each token weighted by ``algorithm.rollout_is.mode``'s
correction, by default min(π_old / π_rollout, C)).

Data parallel (``torchrun``): every rank runs this loop on its share of each round's
prompts; the few places where ranks must agree go through ``engine.dist`` — the dynamic
sampling filter over the whole round, the global loss counts, lockstep micro-batch counts,
and metric sums — so the update and every logged value equal the one-process ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from dapo_cli.algo.advantages import group_advantages
from dapo_cli.algo.overlong import mask_responses, overlong_filter_mask, overlong_penalty
from dapo_cli.algo.sampling import GroupBatchAssembler
from dapo_cli.algo.staleness import version_lag
from dapo_cli.batch import RolloutBatch
from dapo_cli.components import open_tracker
from dapo_cli.config import Config
from dapo_cli.config.schema import old_log_probs_from_update, rank_share
from dapo_cli.engine.dist import Collective, SingleProcess
from dapo_cli.errors import UserError
from dapo_cli.rewards import score_batch
from dapo_cli.signals import StopRequest, sigint_deferred, stop_requests
from dapo_cli.tracking.base import Tracker
from dapo_cli.train.records import Collected, StepClock, record_step
from dapo_cli.train.rounds import Round, RoundSource, open_rounds
from dapo_cli.train.session import TrainingSession
from dapo_cli.train.update import fill_old_log_probs, update_policy


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
    metrics = assembler.metrics() if assembler is not None else {}
    if worker:
        metrics["async/stale_groups_dropped"] = float(stale_groups)
    nothing = assembler is not None and assembler.num_kept_groups == 0  # the same on every rank
    trained = None if nothing else RolloutBatch.concat(kept)
    return Collected(batch=trained, generated=RolloutBatch.concat(generated), rounds_used=round_idx, metrics=metrics,
                     filtered=assembler is not None)


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
    step, logged = s.state.start_step, {}
    rounds: RoundSource | None = None
    try:
        with open_tracker(
            cfg.tracking, dist, s.display_name, tags=s.tags(command, extra_tags), parent_run_id=parent_run_id,
            resume_run_id=s.state.mlflow_run_id,
        ) as tracker:
            s.record_start(tracker)
            s.close_orphans(tracker)
            # inline, or a worker process generating ahead (rollout.worker / max_staleness); versions count steps
            rounds = open_rounds(cfg, s.rollout, s.stream, dist, s.engine, model_path=s.model_path, version=s.state.start_step,
                                 worker=s.worker, worker_threads=s.worker_threads, pad_id=s.pad_id)
            if s.state.start_step == 0:
                s.sync_and_validate(tracker, step=0)
            with s.reporter, stop_requests() as stop:
                for step in range(s.state.start_step + 1, trainer.total_steps + 1):
                    clock = StepClock(s.reporter, step)
                    # ---- the DAPO step (Algorithm 1): collect → advantages → old log-probs → update
                    with clock.phase("generate + score", "timing/gen_and_score"):
                        collected = collect_batch(rounds, cfg, step=step, pad_id=s.pad_id, dist=dist, worker=s.worker)
                    rounds.before_update(step, collected.rounds_used)  # the worker generates on while the trainer updates
                    batch, metrics = collected.batch, {}
                    if batch is not None:  # None: no informative group in the rounds dynamic sampling may take
                        with clock.phase(None if old_from_update else "old log-probs", "timing/old_log_prob"):
                            compute_advantages(batch, cfg)
                            if not old_from_update:
                                fill_old_log_probs(s.engine, batch, s.objective, trainer.ppo_micro_batch_size)
                        with clock.phase("update"):
                            metrics = update_policy(s.engine, batch, s.objective, trainer, step=step, old_from_update=old_from_update)
                        if not s.engine.params_finite():
                            s.raise_non_finite(tracker, step)  # raises: nothing generates with NaN weights
                    synced = rounds.after_update(s.engine, step, updated=batch is not None)  # weights version `step`
                    s.count_barren(informative_step(batch, dist))
                    # ---- plumbing: record the step; validate and checkpoint when due; stop after a collapse
                    logged = record_step(s, tracker, step, collected, metrics, synced, clock)
                    saved = validate_and_save(s, tracker, rounds, step)
                    if s.collapsed:
                        s.record_collapse(tracker, step)
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


def validate_and_save(s: TrainingSession, tracker: Tracker, rounds: RoundSource, step: int) -> bool:
    """Validate and checkpoint when due: every ``test_freq`` / ``save_freq`` steps and at the last step (the
    collapsed step is the last). True when a checkpoint was saved at ``step``."""
    trainer = s.cfg.trainer
    last = step if s.collapsed else trainer.total_steps
    if due(step, trainer.test_freq, last):
        s.sync_and_validate(tracker, step=step)
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


