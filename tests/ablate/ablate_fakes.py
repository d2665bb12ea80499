"""A stand-in for ``run_train`` that records in MLflow what the real trainer records, without training.

It logs, like ``dapo_cli.train.run_train``: the run tags (``dapo.variant``, ``dapo.seed``,
``dapo.run_dir``, ``technique.*`` plus the caller's extra tags), ``validation.k``, ``val/avg_at_K``
and its stderr at step 0 and at the last step, the per-problem table of each validation, one
step of training metrics per step, a checkpoint marker that ``CheckpointManager.latest`` accepts,
and ``summary.json`` at the end. Accuracies come from a script: (variant, seed) -> correct
counts per problem, the variant being the ablation's (``ablate.variant``, which names axis settings
too: ``dapo@max_staleness=1``) when the caller tags it, else the technique state's. With ``val_every = n`` it also validates every ``n`` steps in between, with
the counts of ``mid_correct`` (default: the final ones), as ``trainer.test_freq`` makes the trainer do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dapo_cli.config import technique_state
from dapo_cli.config.techniques import variant_name
from dapo_cli.eval.metrics import standard_error
from dapo_cli.tracking import start_run

Key = tuple[str, int]


class Died(RuntimeError):
    """Raised by the fake where a scripted crash happens."""


class FakeTrain:
    def __init__(
        self,
        correct: dict[Key, list[int]] | None = None,
        *,
        crash_before_checkpoint: set[Key] | None = None,
        crash_after_checkpoint: set[Key] | None = None,
        val_every: int = 0,
        mid_correct: dict[Key, list[int]] | None = None,
    ) -> None:
        self.correct = correct or {}
        self.val_every = val_every
        self.mid_correct = mid_correct or {}
        self.crash_before = crash_before_checkpoint or set()
        self.crash_after = crash_after_checkpoint or set()
        self.calls: list[tuple[str, int, bool]] = []
        self.commands: list[str] = []

    def __call__(self, cfg: Any, *, resume: bool, command: str, parent_run_id: str | None,
                 extra_tags: dict[str, str] | None, quiet: bool) -> dict[str, Any]:
        state = technique_state(cfg)
        key = ((extra_tags or {}).get("ablate.variant") or variant_name(state), cfg.trainer.seed)
        self.calls.append((*key, resume))
        self.commands.append(command)
        run_dir = Path(cfg.trainer.output_dir) / cfg.tracking.experiment / cfg.trainer.run_name
        ckpt = run_dir / "checkpoints"
        resume_id = (run_dir / "fake_run_id").read_text() if resume else None
        tags = {"dapo.variant": variant_name(state), "dapo.seed": str(key[1]), "dapo.run_dir": str(run_dir.resolve()),
                "dapo.command": command, **{f"technique.{k}": str(v).lower() for k, v in state.items()}, **(extra_tags or {})}
        k, steps = cfg.validation.k, cfg.trainer.total_steps
        counts = self.correct.get(key, [1] * 3)
        with start_run(cfg.tracking, cfg.trainer.run_name, tags=tags, parent_run_id=parent_run_id,
                       resume_run_id=resume_id) as tracker:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "fake_run_id").write_text(tracker.run_id)
            if resume:
                tracker.set_tags({"dapo.resumed_from_step": "1"})
            else:
                tracker.log_params({"validation.k": k, "trainer.total_steps": steps})
                self.validate(tracker, step=0, counts=[0] * len(counts), k=k)
                if key in self.crash_before:
                    raise Died(f"{key} died before its first checkpoint")
                self.train_step(tracker, 1, state["dynamic_sampling"])
                self.mid_validate(tracker, 1, steps, key, counts, k)
                write_complete_checkpoint(ckpt / "step_000001")
                (ckpt / "latest").write_text("step_000001\n")
                if key in self.crash_after:
                    raise Died(f"{key} died after its first checkpoint")
            for step in range(2, steps + 1):
                self.train_step(tracker, step, state["dynamic_sampling"])
                self.mid_validate(tracker, step, steps, key, counts, k)
            self.validate(tracker, step=steps, counts=counts, k=k)
        summary = {"run_name": cfg.trainer.run_name, "run_dir": str(run_dir), "mlflow_run_id": tracker.run_id}
        (run_dir / "summary.json").write_text(json.dumps(summary))
        return summary

    @staticmethod
    def validate(tracker: Any, *, step: int, counts: list[int], k: int) -> None:
        accs = [c / k for c in counts]
        tracker.log_metrics({f"val/avg_at_{k}": sum(accs) / len(accs), f"val/avg_at_{k}_stderr": standard_error(accs)}, step=step)
        rows = [{"problem_id": str(i), "correct": c, "samples": k, "majority": "1", "ground_truth": "1"} for i, c in enumerate(counts)]
        tracker.log_table(rows, f"val/per_problem_step_{step:06d}.json")

    def mid_validate(self, tracker: Any, step: int, steps: int, key: Key, counts: list[int], k: int) -> None:
        """A validation between step 0 and the last one, every ``val_every`` steps (none by default)."""
        if self.val_every and step % self.val_every == 0 and step < steps:
            self.validate(tracker, step=step, counts=self.mid_correct.get(key, counts), k=k)

    @staticmethod
    def train_step(tracker: Any, step: int, dynamic: bool) -> None:
        """Per-step metrics that encode the step: rollout/acc = step / 10, 16 samples per step (32 with dynamic sampling)."""
        tracker.log_metrics({
            "rollout/acc": step / 10, "actor/entropy": 1.0 / step, "response_length/mean": 10.0 + step,
            "actor/clipfrac_high": 0.01, "actor/clipfrac_low": 0.02, "train/kept_group_frac": 0.5 if dynamic else 0.25,
            "overlong/truncated_frac": 0.1 * step, "train/samples_generated": 32.0 if dynamic else 16.0,
        }, step=step)


def write_complete_checkpoint(path: Path) -> None:
    """The smallest directory ``checkpoint_problem`` accepts: state, config, engine dir, intact weights."""
    import torch
    from safetensors.torch import save_file

    (path / "model").mkdir(parents=True, exist_ok=True)
    (path / "engine").mkdir(exist_ok=True)
    torch.save({"step": 1}, path / "trainer_state.pt")
    (path / "model" / "config.json").write_text("{}")
    save_file({"w": torch.zeros(2)}, str(path / "model" / "model.safetensors"))
