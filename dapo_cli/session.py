"""Plumbing of one training run, kept out of the loop in ``train.py``.

``TrainingSession.open`` builds (or restores from the last checkpoint) everything a
run needs: policy, training engine, rollout engine, prompt stream, validation set,
run directory and progress display. Its methods record the run's start, validate,
checkpoint, and summarise the end.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import torch
import yaml

from dapo_cli.checkpoint import CheckpointManager, fresh_run_name, latest_run_name, run_dir_for, set_rng_state
from dapo_cli.config import Config, dump_yaml, flatten, technique_state, to_dict
from dapo_cli.config.techniques import variant_name
from dapo_cli.data.loader import PromptStream, build_prompts, dataset_manifest, load_rows
from dapo_cli.errors import UserError
from dapo_cli.fileio import write_text_atomic
from dapo_cli.progress import StepReporter
from dapo_cli.rollout.base import SamplingParams
from dapo_cli.tracking.base import Tracker

MAX_MODEL_ARTIFACT_BYTES = 64 * 2**20
"""Final checkpoints up to this size are uploaded to MLflow; larger ones are logged by path."""


def derive_seed(seed: int, *parts: Any) -> int:
    """A 31-bit seed from the run seed and a purpose/step path, stable across processes and resumes."""
    text = ":".join(str(p) for p in (seed, *parts))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") & 0x7FFFFFFF


def clone_reference(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of the initial policy for the optional KL penalty."""
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def git_commit() -> str:
    """HEAD of the working directory's repository, or ``unknown``."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def config_differences(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested config dicts."""
    keys = sorted(set(saved) | set(current))
    diffs: list[str] = []
    for k in keys:
        a, b = saved.get(k), current.get(k)
        dotted = f"{prefix}.{k}" if prefix else k
        if isinstance(a, dict) and isinstance(b, dict):
            diffs.extend(config_differences(a, b, dotted))
        elif a != b:
            diffs.append(dotted)
    return diffs


RESUMABLE_CHANGES = {"trainer.total_steps"}
"""Config keys a resumed run may change (extend a finished run)."""


@dataclasses.dataclass
class TrainingSession:
    cfg: Config
    run_name: str
    run_dir: Path
    tokenizer: Any
    engine: Any
    rollout: Any
    stream: PromptStream
    val_problems: list[Any]
    val_prompts: list[str]
    manifest: dict[str, Any]
    model_info: dict[str, Any]
    reporter: StepReporter
    ckpt: CheckpointManager
    ref_model: torch.nn.Module | None = None
    start_step: int = 0
    barren_steps: int = 0
    mlflow_run_id: str | None = None
    base_val: float | None = None
    last_val: float | None = None

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id)

    # ------------------------------------------------------------ building

    @classmethod
    def open(cls, cfg: Config, *, resume: bool, quiet: bool = False) -> TrainingSession:
        from dapo_cli.engine.torch import TorchEngine
        from dapo_cli.models import format_prompt, load_policy, resolve_model
        from dapo_cli.rollout.hf import HFRolloutEngine

        if cfg.engine.num_threads > 0:
            torch.set_num_threads(cfg.engine.num_threads)
        if cfg.engine.name != "torch" or cfg.rollout.engine != "hf":
            raise UserError(
                f"engine.name={cfg.engine.name} / rollout.engine={cfg.rollout.engine}: only the torch + hf engines are "
                "built so far; use engine.name=torch rollout.engine=hf"
            )
        experiment = cfg.tracking.experiment
        stem = cfg.trainer.run_name or f"{variant_name(technique_state(cfg))}-s{cfg.trainer.seed}"
        state: dict[str, Any] | None = None
        if resume:
            name = cfg.trainer.run_name or latest_run_name(cfg.trainer.output_dir, experiment, stem)
            if name is None:
                raise UserError(f"--resume: no checkpoint of a run named '{stem}' under {cfg.trainer.output_dir}/{experiment}")
            run_dir = run_dir_for(cfg.trainer.output_dir, experiment, name)
            ckpt = CheckpointManager(run_dir)
            latest = ckpt.latest()
            if latest is None:
                raise UserError(f"--resume: {run_dir} has no complete checkpoint; start it again without --resume")
            saved = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
            diffs = [d for d in config_differences(saved, to_dict(cfg)) if d not in RESUMABLE_CHANGES]
            if diffs:
                raise UserError(f"--resume: the config differs from the run's config.yaml in {', '.join(diffs)}; resume with the same settings")
            state = ckpt.load_state(latest)
            model_path = latest / "model"
        else:
            name = cfg.trainer.run_name or fresh_run_name(cfg.trainer.output_dir, experiment, stem)
            run_dir = run_dir_for(cfg.trainer.output_dir, experiment, name)
            if cfg.trainer.run_name and CheckpointManager(run_dir).latest() is not None:
                raise UserError(f"run {run_dir} already has checkpoints; add --resume, or pick another trainer.run_name")
            ckpt = CheckpointManager(run_dir)
            model_path = resolve_model(cfg.model.path, cfg.model.tiny)
        torch.manual_seed(cfg.trainer.seed)
        dtype = getattr(torch, cfg.model.dtype)
        model, tokenizer = load_policy(model_path, device="cpu", dtype=dtype)
        model_info = read_model_info(Path(model_path))
        engine = TorchEngine(
            model,
            lr=cfg.trainer.lr,
            weight_decay=cfg.trainer.weight_decay,
            warmup_steps=cfg.trainer.lr_warmup_steps,
            grad_clip=cfg.trainer.grad_clip,
            device=cfg.engine.device,
        )
        if cfg.engine.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        rollout = HFRolloutEngine(engine.model, tokenizer, batch_size=cfg.rollout.batch_size or None)

        def fmt(messages: Any) -> str:
            return format_prompt(tokenizer, messages)

        def count(text: str) -> int:
            return len(tokenizer(text, add_special_tokens=False)["input_ids"])

        train_rows_by_spec = [load_rows(s, split="train", synthetic_size=cfg.data.synthetic_train_size) for s in cfg.data.train_files]
        train_prompts, dropped = build_prompts(
            [r for rows in train_rows_by_spec for r in rows], fmt, count, cfg.data.max_prompt_length
        )
        stream = PromptStream(train_prompts, seed=cfg.trainer.seed, shuffle=cfg.data.shuffle)
        val_rows_by_spec = [load_rows(s, split="val", synthetic_size=cfg.data.synthetic_val_size) for s in cfg.data.val_files]
        from dapo_cli.eval.problems import group_problems

        val_problems = [
            dataclasses.replace(p, problem_id=f"{i}:{p.problem_id}") if len(val_rows_by_spec) > 1 else p
            for i, rows in enumerate(val_rows_by_spec)
            for p in group_problems(rows)
        ]
        val_prompts = [fmt(p.messages) for p in val_problems]
        manifest = {
            "train": dataset_manifest(cfg.data.train_files, [len(r) for r in train_rows_by_spec], cfg.data.synthetic_train_size),
            "val": dataset_manifest(cfg.data.val_files, [len(r) for r in val_rows_by_spec], cfg.data.synthetic_val_size),
            "train_prompts": len(train_prompts),
            "train_prompts_dropped_too_long": dropped,
            "val_problems": len(val_problems),
        }
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
            reporter=StepReporter(cfg.trainer.total_steps, quiet=quiet),
            ckpt=ckpt,
            ref_model=clone_reference(engine.model) if cfg.algorithm.use_kl_loss else None,
        )
        if state is not None:
            session.restore(state)
        return session

    def restore(self, state: dict[str, Any]) -> None:
        self.engine.load_state_dict(state["engine"])
        self.stream.load_state_dict(state["stream"])
        set_rng_state(state["rng"])
        self.start_step = int(state["step"])
        self.barren_steps = int(state["barren_steps"])
        self.mlflow_run_id = state.get("mlflow_run_id") or None
        self.base_val = state.get("base_val")
        self.last_val = state.get("last_val")
        if self.cfg.algorithm.use_kl_loss:
            self.ref_model = clone_reference(self.engine.model)
            self.ref_model.load_state_dict(state["ref_model"])

    # ------------------------------------------------------------ recording

    def tags(self, command: str, extra: dict[str, str] | None) -> dict[str, str]:
        techniques = technique_state(self.cfg)
        return {
            "dapo.command": command,
            "dapo.git_commit": git_commit(),
            "dapo.seed": str(self.cfg.trainer.seed),
            "dapo.variant": variant_name(techniques),
            "dapo.run_dir": str(self.run_dir.resolve()),
            **{f"technique.{k}": str(v).lower() for k, v in techniques.items()},
            **(extra or {}),
        }

    def record_start(self, tracker: Tracker) -> None:
        self.mlflow_run_id = tracker.run_id or None
        if self.start_step > 0:
            tracker.set_tags({"dapo.resumed_from_step": str(self.start_step)})
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        text = dump_yaml(self.cfg)
        write_text_atomic(self.run_dir / "config.yaml", text)
        tracker.log_params(flatten(self.cfg))
        tracker.log_text(text, "config.yaml")
        tracker.log_dict(self.manifest, "dataset_manifest.json")
        if self.model_info:
            tracker.log_dict(self.model_info, "model_info.json")
            for key in ("base_accuracy_t1", "base_accuracy_greedy"):
                if isinstance(self.model_info.get(key), (int, float)):
                    tracker.log_metrics({f"model/{key}": float(self.model_info[key])}, step=0)

    def log_validation(self, tracker: Tracker, *, step: int) -> dict[str, float]:
        from dapo_cli.eval.metrics import tracking_metrics
        from dapo_cli.eval.run import evaluate_problems

        if not self.val_problems:
            return {}
        v = self.cfg.validation
        params = SamplingParams(
            temperature=v.temperature,
            top_p=v.top_p,
            top_k=0,
            max_tokens=v.max_tokens or self.cfg.rollout.max_response_length,
            seed=derive_seed(self.cfg.trainer.seed, "validation", step),
        )
        self.reporter.phase(step, f"validate avg@{v.k}")
        result = evaluate_problems(
            self.rollout, self.val_problems, self.val_prompts, k=v.k, params=params, verifier=self.cfg.reward.verifier
        )
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
                self.base_val = float(acc)
            self.last_val = float(acc)
        self.reporter.note(f"step {step}: val avg@{v.k} = {acc:.3f} on {len(self.val_problems)} problems")
        return metrics

    def save(self, step: int) -> Path:
        if not self.engine.params_finite():
            self.reporter.note(f"step {step}: parameters are not finite; checkpoint skipped")
            return self.ckpt.root
        self.reporter.phase(step, "checkpoint")
        state = {
            "engine": self.engine.state_dict(),
            "stream": self.stream.state_dict(),
            "barren_steps": self.barren_steps,
            "mlflow_run_id": self.mlflow_run_id or "",
            "base_val": self.base_val,
            "last_val": self.last_val,
        }
        if self.ref_model is not None:
            state["ref_model"] = self.ref_model.state_dict()
        return self.ckpt.save(step, save_model=self._save_model, trainer_state=state)

    def _save_model(self, directory: Path) -> None:
        """The policy + tokenizer (+ the tiny model's dapo_model.json, which marks our own tokenizer)."""
        self.engine.save_model(directory, self.tokenizer)
        if self.model_info:
            write_text_atomic(directory / "dapo_model.json", json.dumps(self.model_info, indent=2) + "\n")

    def stop_collapsed(self, tracker: Tracker, step: int) -> None:
        msg = (
            f"stopped at step {step}: {self.barren_steps} steps in a row without an informative group "
            "(every group all-correct or all-wrong); lower trainer.lr or check the reward"
        )
        tracker.set_tags({"dapo.stopped": "collapse"})
        self.reporter.note(msg)

    def finish(self, tracker: Tracker) -> dict[str, Any]:
        latest = self.ckpt.latest()
        summary: dict[str, Any] = {
            "run_name": self.run_name,
            "run_dir": str(self.run_dir),
            "mlflow_run_id": self.mlflow_run_id,
            "checkpoint": str(latest / "model") if latest else None,
            "base_val": self.base_val,
            "final_val": self.last_val,
        }
        if self.base_val is not None and self.last_val is not None:
            tracker.log_metrics(
                {"final/val_acc": self.last_val, "final/base_val_acc": self.base_val, "final/val_gain": self.last_val - self.base_val},
                step=self.cfg.trainer.total_steps,
            )
        if latest is not None:
            tracker.set_tags({"dapo.checkpoint": str((latest / "model").resolve())})
            size = sum(f.stat().st_size for f in (latest / "model").rglob("*") if f.is_file())
            if size <= MAX_MODEL_ARTIFACT_BYTES:
                tracker.log_artifact(latest / "model", "checkpoint")
        write_text_atomic(self.run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
        self.reporter.finish(summary, tracking_uri=getattr(tracker, "tracking_uri", ""))
        return summary


def read_model_info(model_dir: Path) -> dict[str, Any]:
    """The tiny model's ``dapo_model.json`` (base accuracy, warm-start recipe), when present."""
    path = model_dir / "dapo_model.json"
    if path.is_file():
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            return {}
    return {}


