"""Plumbing of one training run, kept out of the loop in ``loop.py``.

``TrainingSession.open`` builds (or restores from the last checkpoint) everything a
run needs: policy, training engine, rollout engine, prompt stream, validation set,
run directory and progress display. Its methods record the run's start, validate,
checkpoint, and summarise the end.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import os
from pathlib import Path
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from dapo_cli.checkpoint import (
    resume_blockers,
    ENGINE_DIR,
    LOCK_FILE,
    CheckpointManager,
    RunLock,
    claim_run_dir,
    latest_run_name,
    run_dir_for,
    set_rng_state,
)
from dapo_cli.config import Config, ConfigError, dump_saved, flatten, technique_state, to_dict
from dapo_cli.config.load import read_yaml
from dapo_cli.config.schema import round_sequences, thread_split, uses_worker
from dapo_cli.config.techniques import variant_name
from dapo_cli.config.validate import check_world_size
from dapo_cli.data.loader import PromptStream, dropped_note, keep_fitting
from dapo_cli.engine.base import TrainingEngine
from dapo_cli.engine.dist import Collective, SingleProcess, shutdown_process_group
from dapo_cli.errors import NON_FINITE, RunStopped, UserError
from dapo_cli.fileio import write_text_atomic
from dapo_cli.progress import QUIET, StepReporter
from dapo_cli.redact import escape_controls
from dapo_cli.rollout.base import RolloutEngine
from dapo_cli.runs import derive_seed, read_model_info, read_run_data, run_tags, upload_model
from dapo_cli.resume_state import TrainerState
from dapo_cli.tracking.base import Tracker
from dapo_cli.train.objective import Objective, build_objective
from dapo_cli.train.rounds import sampling_params


T = TypeVar("T")


def agreed(dist: Collective, decide: Callable[[], T]) -> T:
    """``decide()`` on rank 0, its result (or its one-line error) on every rank.

    For choices that must not differ between ranks (the run directory, the model path)
    and errors that every rank must raise instead of leaving the others waiting.
    """
    result: Any = None
    error: str | None = None
    if dist.is_main:
        try:
            result = decide()
        except UserError as exc:
            error = str(exc)
        except BaseException as exc:
            dist.broadcast_object((None, f"rank 0 failed: {type(exc).__name__}: {exc}"))
            raise
    result, error = dist.broadcast_object((result, error))
    if error is not None:
        raise UserError(error)
    return result


@dataclasses.dataclass
class RunClaim:
    """The run directory this process trains in, held by its lock until :meth:`release`."""

    name: str
    run_dir: Path
    resume_from: Path | None
    notes: list[str]
    lock: RunLock | None = None
    created: bool = False

    def release(self, *, failed: bool) -> None:
        """Drop the lock; after a failed start, remove a directory this process created and left empty."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None
        if failed and self.created and all(p.name == LOCK_FILE for p in self.run_dir.iterdir()):
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def __getstate__(self) -> dict[str, Any]:  # what other ranks receive: everything but the lock
        return {**self.__dict__, "lock": None}


def pick_run(cfg: Config, *, resume: bool) -> RunClaim:
    """Claim the directory of a new run, or of the run ``--resume`` continues (rank 0 only).

    A new run's directory is created exclusively, so concurrent runs never share one; a
    resumed run's lock must be free (nobody is still training it). Leftovers of a killed
    checkpoint write are removed, and resume takes the newest *complete* checkpoint, saying
    which newer ones it passed over and why.
    """
    out, experiment = cfg.trainer.output_dir, cfg.tracking.experiment
    stem = cfg.trainer.run_name or f"{variant_name(technique_state(cfg))}-s{cfg.trainer.seed}"
    if resume:
        found = cfg.trainer.run_name or latest_run_name(out, experiment, stem)
        if found is None or not run_dir_for(out, experiment, found).is_dir():
            raise UserError(f"--resume: no checkpoint of a run named '{stem}' under {out}/{experiment}")
        stem = found
    name, run_dir, lock, created = claim_run_dir(out, experiment, stem, exact=resume or bool(cfg.trainer.run_name))
    claim = RunClaim(name, run_dir, None, [], lock, created)
    try:
        ckpt = CheckpointManager(run_dir)
        removed = ckpt.clean_stale()
        if removed:
            claim.notes.append(f"removed {len(removed)} unfinished checkpoint write(s): {', '.join(removed)}")
        latest, skipped = ckpt.newest_complete()
        if not resume:
            if cfg.trainer.run_name and latest is not None:
                raise UserError(f"run {run_dir} already has checkpoints; add --resume, or pick another trainer.run_name")
            return claim
        if latest is None:
            why = f" ({'; '.join(skipped)})" if skipped else ""
            raise UserError(f"--resume: {run_dir} has no complete checkpoint{why}; start it again without --resume")
        if skipped:
            claim.notes.append(f"resuming from {latest.name}; passed over {'; '.join(skipped)}")
        diffs = resume_blockers(read_saved_config(run_dir / "config.yaml"), to_dict(cfg))
        if diffs:
            raise UserError(f"--resume: the config differs from the run's config.yaml in {escape_controls(', '.join(diffs))}; "
                            "resume with the same settings")
        claim.resume_from = latest
        return claim
    except BaseException:
        claim.release(failed=True)
        raise


def read_saved_config(path: Path) -> dict[str, Any]:
    """The config a resumed run was started with (its ``config.yaml``), read as any config is
    (:func:`~dapo_cli.config.load.read_yaml`: bounded, so a binary file, bad YAML, values nested past the
    recursion limit or a number of 5,000 digits are one line). Its error ends with the fix for a config the user
    passes; that for the run's own copy replaces it."""
    try:
        return read_yaml(path)
    except ConfigError as exc:
        what = str(exc).split("; ")[0]  # read_yaml's message, without its fix
        raise UserError(f"--resume: cannot use the run's saved config: {what}; put back the config.yaml the run "
                        "wrote, or start a fresh run without --resume") from None


@dataclasses.dataclass
class RunState:
    """What changes as a run goes and what its checkpoints keep: :meth:`TrainingSession.save` writes exactly these
    (with the prompt stream's position and the world size), :meth:`TrainingSession.restore` reads them back."""

    start_step: int = 0
    """The step this process starts after (the checkpoint's step after a resume, else 0)."""
    barren_steps: int = 0
    """Steps in a row without an informative group (:meth:`TrainingSession.count_barren`): a resume continues it."""
    mlflow_run_id: str | None = None
    base_val: float | None = None
    """The step-0 validation's avg@k."""
    last_val: float | None = None
    """The latest validation's avg@k."""

    def saved(self) -> dict[str, Any]:
        """The trainer-state entries a checkpoint writes for it (beside ``stream`` and ``world_size``)."""
        return {"barren_steps": self.barren_steps, "mlflow_run_id": self.mlflow_run_id or "", "base_val": self.base_val,
                "last_val": self.last_val}

    @classmethod
    def from_saved(cls, saved: TrainerState) -> RunState:
        """A checkpoint's checked trainer state (:mod:`dapo_cli.resume_state`) as the state to continue from."""
        return cls(start_step=saved.step, barren_steps=saved.barren_steps, mlflow_run_id=saved.mlflow_run_id,
                   base_val=saved.base_val, last_val=saved.last_val)


@dataclasses.dataclass
class TrainingSession:
    """One training run's parts, built (or restored) once by :meth:`open`, and its :class:`RunState`.

    The run: its config, name, directory (held by ``claim``), the policy it loaded (``model_path``,
    ``model_info``) and its data (``stream``, the validation set, ``manifest``). Its parts: the tokenizer, the
    training ``engine``, the ``rollout`` engine, the ``objective``, the checkpoint manager, the progress
    ``reporter`` and the process group ``dist``; ``worker`` / ``worker_threads`` are decided once here. What
    changes is in ``state`` (checkpointed) and ``stopped`` (why the run stopped early, for its summary). Methods
    named ``record_*`` record and return; ``raise_*`` raise."""

    cfg: Config
    run_name: str
    run_dir: Path
    tokenizer: Any
    engine: TrainingEngine
    rollout: RolloutEngine
    stream: PromptStream
    val_problems: list[Any]
    val_prompts: list[str]
    manifest: dict[str, Any]
    model_info: dict[str, Any]
    reporter: StepReporter
    ckpt: CheckpointManager
    objective: Objective
    """What the update minimises, every setting bound once (:func:`~dapo_cli.train.objective.build_objective`)."""
    dist: Collective = dataclasses.field(default_factory=SingleProcess)
    claim: RunClaim | None = None
    model_path: str = ""
    """The weights the run's policy was loaded from (the checkpoint's ``model/`` after a resume)."""
    worker: bool = False
    """Training rollouts come from the worker process (``config.schema.uses_worker``), decided once here."""
    worker_threads: int = 1
    """The worker process's torch threads (``config.schema.thread_split``; the trainer has the rest)."""
    state: RunState = dataclasses.field(default_factory=RunState)
    stopped: str | None = None

    @property
    def display_name(self) -> str:
        """The MLflow run name: ``tracking.run_label``, else the run directory's name."""
        return self.cfg.tracking.run_label or self.run_name

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id)

    # ------------------------------------------------------------ building

    @classmethod
    def open(cls, cfg: Config, *, resume: bool, verbosity: int = 0) -> TrainingSession:
        from dapo_cli import components
        from dapo_cli.models import load_policy
        from dapo_cli.models.loading import load_tokenizer
        from dapo_cli.warmstart import ensure_model

        worker = uses_worker(cfg.rollout)
        trainer_threads, worker_threads = thread_split(cfg.rollout, cfg.engine.num_threads, os.cpu_count() or 1)
        if worker:  # the rollout worker process takes its share of the cores
            torch.set_num_threads(trainer_threads)
        elif cfg.engine.num_threads > 0:
            torch.set_num_threads(cfg.engine.num_threads)
        dist = components.build_collective(cfg.engine)
        held: list[RunClaim] = []  # rank 0's claim, with its lock
        engine_notes: list[str] = []  # what the engines say about how they run here, printed once

        def claim_on_main() -> RunClaim:
            held.append(pick_run(cfg, resume=resume))
            return held[0]

        try:
            check_world_size(cfg.data, dist.world_size)
            claim = agreed(dist, claim_on_main)
            name, run_dir, latest = claim.name, claim.run_dir, claim.resume_from
            ckpt = CheckpointManager(run_dir)
            state = ckpt.load_state(latest) if latest is not None else None
            # the initial policy, resolved on rank 0 (builtin:tiny is built once, not once per rank)
            base_path = agreed(dist, lambda: ensure_model(cfg.model.path, cfg.model.tiny))
            model_path = latest / "model" if latest is not None else base_path
            torch.manual_seed(cfg.trainer.seed)
            dtype = getattr(torch, cfg.model.dtype)
            # LoRA adapts the original base: a resume loads it too (model/ is merged), the adapters come from engine/
            policy_path = base_path if cfg.model.lora.rank > 0 else model_path
            bf16 = cfg.model.dtype == "bfloat16"
            # ZeRO-3 builds the policy (and reference) partitioned: each rank holds a shard, never the whole model
            sharded = components.sharded_model_loader(cfg.engine, policy_path, dtype, bf16=bf16)
            if sharded is not None:
                model, tokenizer = sharded(), load_tokenizer(policy_path)
            else:
                model, tokenizer = load_policy(policy_path, device="cpu", dtype=dtype)
            load_ref = components.sharded_model_loader(cfg.engine, base_path, dtype, bf16=bf16, reference=True)
            t = cfg.trainer
            engine = components.build_training_engine(
                cfg.engine, model, dist, lr=t.lr, weight_decay=t.weight_decay, warmup_steps=t.lr_warmup_steps,
                grad_clip=t.grad_clip, bf16=bf16,
                load_reference=(load_ref or components.model_loader(base_path, dtype)) if cfg.algorithm.use_kl_loss else None,
                lora=cfg.model.lora,
            )
            rollout = components.build_train_rollout(
                cfg.rollout, engine, tokenizer, components.model_loader(model_path, dtype), model_path,
                max_model_len=cfg.data.max_prompt_length + cfg.rollout.max_response_length,
                max_sequences=round_sequences(cfg.data, cfg.rollout, dist.world_size), dtype=cfg.model.dtype, seed=t.seed, note=engine_notes.append,
            )
            stream, val_problems, val_prompts, manifest = load_run_data(cfg, tokenizer, dist.world_size)
            model_info = read_model_info(Path(model_path))
            session = cls(
                cfg=cfg,
                run_name=name,
                run_dir=run_dir,
                tokenizer=tokenizer,
                engine=engine,
                rollout=rollout,
                stream=stream,
                val_problems=val_problems,
                val_prompts=val_prompts,
                manifest=manifest,
                model_info=model_info,
                reporter=StepReporter(cfg.trainer.total_steps, verbosity=verbosity if dist.is_main else QUIET),
                ckpt=ckpt,
                objective=build_objective(cfg),
                dist=dist,
                claim=held[0] if held else claim,
                model_path=str(model_path),
                worker=worker,
                worker_threads=worker_threads,
            )
            for note in (*claim.notes, *manifest["notes"], *engine_notes):
                session.reporter.note(note)
            if state is not None and latest is not None:
                session.restore(state, latest)
        except BaseException:  # the claim is released (an empty new run dir removed) whatever failed, the restore too
            for c in held:
                c.release(failed=True)
            dist.close()
            raise
        return session

    def restore(self, state: dict[str, Any], checkpoint: Path) -> None:
        """Continue from ``checkpoint``, whose trainer state is ``state``. Every saved field is checked first
        (:mod:`dapo_cli.resume_state`: the trainer state against the config and the training prompts, this
        rank's RNG state, the optimizer's against the model inside ``load_checkpoint``), so a damaged or
        foreign state is one error line before the MLflow run opens and before anything is written."""
        saved = self.ckpt.checked_state(checkpoint, state, total_steps=self.cfg.trainer.total_steps,
                                        num_prompts=len(self.stream.prompts))
        rng = self.ckpt.rank_rng_state(checkpoint, self.dist.rank, state)
        self.engine.load_checkpoint(checkpoint / ENGINE_DIR)
        if self.cfg.model.lora.rank > 0:  # the rollout copy was synced from the base before the adapters came back
            self.rollout.sync_weights(self.engine)
        self.stream.load_state_dict(saved.stream)
        set_rng_state(rng)
        self.state = RunState.from_saved(saved)

    def close(self) -> None:
        """Release the run directory and the rollout engine; leave the process group (and any DeepSpeed
        created), so a later run in this process starts clean."""
        if self.claim is not None:
            self.claim.release(failed=False)
        self.rollout.close()  # vLLM's engine core goes before the process groups it shares with the trainer
        self.dist.close()
        shutdown_process_group()

    # ------------------------------------------------------------ recording

    def tags(self, command: str, extra: dict[str, str] | None) -> dict[str, str]:
        techniques = technique_state(self.cfg)
        return {
            **run_tags(command, seed=self.cfg.trainer.seed, variant=variant_name(techniques), run_dir=self.run_dir),
            "dapo.run_name": self.run_name,
            **{f"technique.{k}": str(v).lower() for k, v in techniques.items()},
            **(extra or {}),
        }

    def record_start(self, tracker: Tracker) -> None:
        self.state.mlflow_run_id = tracker.run_id or None
        if self.state.start_step > 0:
            tracker.set_tags({"dapo.resumed_from_step": str(self.state.start_step)})
            return
        if not self.dist.is_main:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        text = dump_saved(self.cfg)
        write_text_atomic(self.run_dir / "config.yaml", text)
        tracker.log_params(flatten(self.cfg))
        tracker.log_text(text, "config.yaml")
        tracker.log_dict(self.manifest, "dataset_manifest.json")
        for context, key in (("training", "train"), ("validation", "val")):
            for entry in self.manifest[key]:
                tracker.log_input(entry["spec"], digest=dataset_digest(entry), rows=int(entry["rows"]),
                                  source=entry.get("path", entry["spec"]), context=context)
        if self.model_info:
            tracker.log_dict(self.model_info, "model_info.json")
            for key in ("base_accuracy_t1", "base_accuracy_greedy"):
                if isinstance(self.model_info.get(key), (int, float)):
                    tracker.log_metrics({f"model/{key}": float(self.model_info[key])}, step=0)

    def sync_and_validate(self, tracker: Tracker, *, step: int) -> dict[str, float]:
        """Validate at ``step`` and record it (avg@k and the per-problem table; the base and latest accuracies in
        :attr:`state`). With the worker process the trainer's own rollout engine only validates: its private copy
        of the weights is synced first."""
        from dapo_cli.eval.metrics import tracking_metrics
        from dapo_cli.eval.run import evaluate_problems

        if self.worker:  # this engine only validates: a private copy (LoRA) is synced here, every rank
            self.rollout.sync_weights(self.engine)  # a no-op when it samples with the trainer's own module
        # rank 0 validates and the others wait at the next collective; an engine whose ranks generate in
        # lockstep (vLLM under torchrun) has every rank sample the same validation, and rank 0 alone records it
        if not self.val_problems or not (self.dist.is_main or self.rollout.lockstep):
            return {}
        v = self.cfg.validation
        params = sampling_params(self.cfg, seed=derive_seed(self.cfg.trainer.seed, "validation", step), validation=True)
        self.reporter.phase(step, f"validate avg@{v.k}")
        result = evaluate_problems(
            self.rollout, self.val_problems, self.val_prompts, k=v.k, params=params, verifier=self.cfg.reward.verifier
        )
        self.rollout.forget_prefixes()  # the next rollouts read nothing validation cached (the protocol says why)
        metrics = tracking_metrics(result.metrics, "val/")
        tracker.log_metrics(metrics, step=step)
        # per-problem correct counts: what paired comparisons between runs (dapo ablate/report) need
        tracker.log_table(
            [{k: row[k] for k in ("problem_id", "correct", "samples", "majority", "ground_truth")} for row in result.per_problem],
            f"val/per_problem_step_{step:06d}.json",
        )
        acc = result.metrics.get(f"avg@{v.k}")
        if acc is not None:
            if step == 0:
                self.state.base_val = float(acc)
            self.state.last_val = float(acc)
        self.reporter.note(f"step {step}: val avg@{v.k} = {acc:.3f} on {len(self.val_problems)} problems")
        return metrics

    def count_barren(self, informative: bool) -> None:
        """Step done: the count of steps in a row without an informative group goes up by one, or back to 0."""
        self.state.barren_steps = 0 if informative else self.state.barren_steps + 1

    @property
    def collapsed(self) -> bool:
        """``trainer.collapse_patience`` (> 0) steps in a row without an informative group: the run stops."""
        return 0 < self.cfg.trainer.collapse_patience <= self.state.barren_steps

    def save(self, step: int, tracker: Tracker | None, *, stream_state: dict[str, int] | None = None) -> Path:
        """Checkpoint step ``step``; ``tracker``: the run's, flushed first and given the checkpoint's run info (None:
        none); ``stream_state``: where the prompt stream resumes (default: its state now; a round source that drew
        prompts ahead gives the position of the first prompt no trained round used)."""
        if not self.engine.params_finite():
            self.reporter.note(f"step {step}: parameters are not finite; checkpoint skipped")
            return self.ckpt.root
        self.reporter.phase(step, "checkpoint")
        state = {
            "stream": stream_state if stream_state is not None else self.stream.state_dict(),
            **self.state.saved(),
            "world_size": self.dist.world_size,
        }
        if tracker is not None:  # the step's metrics are in the store before its checkpoint exists: a resume from it
            # never finds a recorded step missing; while the tracking server does not answer the checkpoint does not
            # wait for it (the records stay queued, written when it is back; lost only if this process dies first)
            tracker.flush(unless_down=True)
        run_info = {  # model/dapo_run.json: `dapo eval` of these weights links its run to this one
            "mlflow_run_id": self.state.mlflow_run_id or "", "experiment": self.cfg.tracking.experiment,
            "tracking_uri": tracker.tracking_uri if tracker is not None else "", "run_name": self.display_name,
            "run_dir": str(self.run_dir.resolve()),
        }
        saved = self.ckpt.save(step, dist=self.dist, write=self._write_checkpoint, trainer_state=state, run_info=run_info)
        if self.cfg.tracking.log_checkpoint == "every" and self.dist.is_main and tracker is not None:
            self.upload_checkpoint(tracker, saved, f"checkpoints/{saved.name}")
        return saved

    def upload_checkpoint(self, tracker: Tracker, checkpoint: Path, artifact_path: str) -> None:
        """Copy a checkpoint's ``model/`` into MLflow's artifacts when it is at most 64 MiB (else its path is the tag)."""
        upload_model(tracker, checkpoint / "model", artifact_path)

    def _write_checkpoint(self, directory: Path) -> None:
        """Every rank: the engine's training state (its shards), then the policy + tokenizer export
        (+ the tiny model's dapo_model.json, which marks our own tokenizer) written by rank 0."""
        self.engine.save_checkpoint(directory / ENGINE_DIR)
        self.engine.save_model(directory / "model", self.tokenizer)
        if self.model_info and self.dist.is_main:
            write_text_atomic(directory / "model" / "dapo_model.json", json.dumps(self.model_info, indent=2) + "\n")

    def record_collapse(self, tracker: Tracker, step: int) -> None:
        """The run collapsed (:attr:`collapsed`) at ``step``: tag it, keep the reason for the summary, say it; the loop stops."""
        msg = (
            f"stopped at step {step}: {self.state.barren_steps} steps in a row without an informative group "
            "(every group all-correct or all-wrong); lower trainer.lr or check the reward"
        )
        tracker.set_tags({"dapo.stopped": "collapse"})
        self.stopped = msg
        self.reporter.note(msg)

    def raise_non_finite(self, tracker: Tracker, step: int) -> None:
        """Parameters went NaN/Inf in step ``step``'s update: tag the run and raise :class:`RunStopped`, before
        anything generates with them."""
        good = self.ckpt.latest()
        where = f"the last good checkpoint is {good}" if good else "no checkpoint was written"
        tracker.set_tags({"dapo.stopped": "non_finite"})
        raise RunStopped(
            f"parameters became non-finite in the update of step {step}; {where}; lower trainer.lr or "
            "trainer.grad_clip, or use float32",
            NON_FINITE,
        )

    def close_orphans(self, tracker: Tracker) -> None:
        """Runs of this experiment still RUNNING whose run directory no process holds were killed:
        mark them so (KILLED, tag ``dapo.orphaned``)."""
        if not self.dist.is_main:
            return

        def alive(run: Any) -> bool:
            run_dir = run.data.tags.get("dapo.run_dir")
            return not run_dir or RunLock.is_held(Path(run_dir))  # unknown owners are left alone

        closed = tracker.mark_orphans(alive)
        if closed:
            self.reporter.note(f"marked {len(closed)} run(s) left RUNNING by a killed process as KILLED")

    def finish(self, tracker: Tracker, last_metrics: dict[str, float] | None = None) -> dict[str, Any]:
        """Final validation metrics, checkpoint tag/upload, ``summary.json``; returns the summary
        (what ``dapo train`` prints on stdout; ``last_metrics``: the last step's, this process)."""
        self.dist.barrier()  # the last checkpoint is complete on every rank
        latest = self.ckpt.latest()
        summary: dict[str, Any] = {
            "run_name": self.run_name,
            "run_dir": str(self.run_dir),
            "mlflow_run_id": self.state.mlflow_run_id,
            "tracking_uri": tracker.tracking_uri or None,
            "checkpoint": str(latest / "model") if latest else None,
            "base_val": self.state.base_val,
            "final_val": self.state.last_val,
            "stopped": self.stopped,
            "last_step_metrics": dict(last_metrics or {}),
        }
        if self.state.base_val is not None and self.state.last_val is not None:
            tracker.log_metrics(
                {"final/val_acc": self.state.last_val, "final/base_val_acc": self.state.base_val, "final/val_gain": self.state.last_val - self.state.base_val},
                step=self.cfg.trainer.total_steps,
            )
        if latest is not None:
            tracker.set_tags({"dapo.checkpoint": str((latest / "model").resolve())})
            if self.cfg.tracking.log_checkpoint != "none":
                self.upload_checkpoint(tracker, latest, "checkpoint")
        if self.dist.is_main:
            write_text_atomic(self.run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
        return summary  # the CLI prints it (held-out accuracy base → final, run dir, checkpoint) once, on stdout


def load_run_data(cfg: Config, tokenizer: Any, world_size: int) -> tuple[PromptStream, list[Any], list[str], dict[str, Any]]:
    """The training prompt stream, the validation problems and prompts, and the dataset manifest."""
    run_data = read_run_data(cfg.data, tokenizer)
    train_prompts, dropped = run_data.train_prompts, run_data.train_dropped
    stream = PromptStream(train_prompts, seed=cfg.trainer.seed, shuffle=cfg.data.shuffle)
    val_total = len(run_data.val_problems)
    val_problems, val_prompts, val_dropped = keep_fitting(
        run_data.val_problems, [run_data.format(p.messages) for p in run_data.val_problems], run_data.count,
        cfg.data.max_prompt_length,
    )
    manifest = {
        **run_data.manifest(cfg.data),
        "val_problems": len(val_problems),
        "val_problems_dropped_too_long": val_dropped,
        "world_size": world_size,
        "notes": [note for note in (
            dropped_note("training prompts", dropped, len(train_prompts) + dropped, cfg.data.max_prompt_length),
            dropped_note("validation problems", val_dropped, val_total, cfg.data.max_prompt_length),
        ) if note],
    }
    return stream, val_problems, val_prompts, manifest


def dataset_digest(entry: dict[str, Any]) -> str:
    """A manifest entry's identity: the file's sha256, or a hash of the synthetic generator's recipe."""
    if entry.get("sha256"):
        return str(entry["sha256"])
    recipe = json.dumps({k: entry.get(k) for k in ("spec", "generator", "size", "seed", "rows")}, sort_keys=True)
    return hashlib.sha256(recipe.encode()).hexdigest()
