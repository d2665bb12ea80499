"""What a training step records: the paper's monitors on what it generated and trained, its compute, its clock
and the sample table, logged in one tracker call (:func:`record_step`), so that :func:`dapo_cli.train.loop.run_train`
reads as the algorithm. Every value is exact under any micro-batch or rank split (sums and gathers over ranks).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from dapo_cli.algo.sampling import informative_groups
from dapo_cli.algo.staleness import version_lag
from dapo_cli.batch import RolloutBatch
from dapo_cli.config import Config
from dapo_cli.diagnostics import contains_answer, group_length_spread, loops, on_correct_path
from dapo_cli.engine.dist import Collective, SingleProcess, gather_cat, reduce_sums
from dapo_cli.models.flops import model_matmul_params
from dapo_cli.progress import StepReporter
from dapo_cli.tracking.base import Tracker
from dapo_cli.train.update import rollout_mismatch

if TYPE_CHECKING:
    from dapo_cli.train.session import TrainingSession


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
    """Dynamic sampling's counts (:meth:`~dapo_cli.algo.sampling.GroupBatchAssembler.metrics`) and, with the worker
    process, the stale groups dropped."""
    filtered: bool = False
    """Dynamic sampling chose the trained groups (``algorithm.filter_groups.enable``)."""


def generation_stats(generated: RolloutBatch, dist: Collective) -> dict[str, torch.Tensor]:
    """Per-response ``lengths``, ``truncated``, ``acc``, ``scores``, ``group_ids`` and what truncation cut
    (``has_answer``, ``loops``, ``on_path``: :mod:`dapo_cli.diagnostics`) of every rank's generations of the step,
    gathered in rank order."""
    return gather_cat(dist, {
        "lengths": generated.lengths, "truncated": generated.truncated, "acc": generated.acc,
        "scores": generated.scores, "group_ids": generated.group_ids,
        "has_answer": contains_answer(generated.texts, generated.ground_truths), "loops": loops(generated.texts),
        "on_path": on_correct_path(generated.texts, generated.acc.bool(), generated.group_ids),  # groups are rank-local
    })


def step_metrics(
    collected: Collected, batch: RolloutBatch | None, cfg: Config, dist: Collective | None = None, *, policy_version: int = 0,
    worker: bool = False, gen: dict[str, torch.Tensor] | None = None,
) -> dict[str, float]:
    """The paper's monitors on the trained batch, plus accuracy over everything generated (all ranks, ``gen``:
    :func:`generation_stats`, gathered here when not given); dynamic sampling's counts, or without it the share of
    groups that carry signal (comparable with the kept share); with the worker process (``worker``), the trained
    responses' version lag behind ``policy_version`` (mean, max)."""
    dist = dist or SingleProcess()
    gen = generation_stats(collected.generated, dist) if gen is None else gen
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
    if not collected.filtered:  # no filter: the share of groups that carry signal, comparable with the kept share
        informative = informative_groups(gen["acc"].float(), gen["group_ids"])
        out["train/num_gen_batches"] = 1.0
        out["train/kept_group_frac"] = len(set(gen["group_ids"][informative].tolist())) / len(set(gen["group_ids"].tolist()))
        out["train/samples_generated"] = float(len(gen["lengths"]))
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


class StepClock:
    """Wall-clock time of one step: :meth:`lap` records the seconds since the previous lap (or the step's start);
    :meth:`phase` says which phase runs (the progress line) and records its seconds."""

    def __init__(self, reporter: StepReporter | None = None, step: int = 0) -> None:
        self.t0 = time.perf_counter()
        self.laps: dict[str, float] = {}
        self._last = 0.0
        self.reporter, self.step = reporter, step

    def lap(self, name: str) -> float:
        now = elapsed(self.t0)
        self.laps[name], self._last = now - self._last, now
        return self.laps[name]

    @contextlib.contextmanager
    def phase(self, label: str | None, timing: str | None = None) -> Iterator[None]:
        """Announce ``label`` on the progress line (None: say nothing) and, with ``timing``, record the seconds from
        the previous lap to the block's end under that key."""
        if label is not None and self.reporter is not None:
            self.reporter.phase(self.step, label)
        yield
        if timing is not None:
            self.lap(timing)


def record_step(
    s: TrainingSession, tracker: Tracker, step: int, collected: Collected, metrics: dict[str, float], synced: dict[str, float],
    clock: StepClock,
) -> dict[str, float]:
    """Everything step ``step`` logs, in one tracker call: the monitors (:func:`step_metrics`, on the generation's
    :func:`generation_stats`), the update's ``metrics`` and the rollout engine's mismatch with the trainer
    (:func:`~dapo_cli.train.update.rollout_mismatch`, when a batch was trained), the round source's ``synced``
    timings and the step's clock; the progress line, a note when updates were skipped, and the sample table when
    due. Returns what was logged."""
    if metrics.get("actor/skipped_updates"):
        s.reporter.note(f"step {step}: {int(metrics['actor/skipped_updates'])} update(s) skipped: the loss or gradient was not finite")
    batch = collected.batch
    mismatch = rollout_mismatch(batch, s.objective, s.cfg.algorithm.rollout_is, s.dist) if batch is not None else {}
    gen = generation_stats(collected.generated, s.dist)
    laps = dict(clock.laps)
    t_gen = laps.pop("timing/gen_and_score")
    logged = {  # laps: timing/old_log_prob, when a batch was trained
        **step_metrics(collected, batch, s.cfg, s.dist, policy_version=step - 1, worker=s.worker, gen=gen),
        **metrics, **mismatch, **laps, **synced,
    }
    logged["timing/gen_and_score"] = t_gen
    logged["timing/step"] = elapsed(clock.t0)
    generated_tokens = float(gen["lengths"].sum())
    logged["perf/gen_tokens_per_s"] = generated_tokens / max(t_gen, 1e-9)
    logged.update(compute_metrics(generated_tokens, logged.get("train/loss_tokens", 0.0),
                                  model_matmul_params(s.model_path) if s.model_path else None))
    tracker.log_metrics(logged, step=step)
    s.reporter.step_done(step, logged)
    freq = s.cfg.trainer.log_samples_freq
    if freq > 0 and step % freq == 0:
        tracker.log_table(sample_rows(collected.generated), f"samples/step_{step:06d}.json")
    return logged


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
