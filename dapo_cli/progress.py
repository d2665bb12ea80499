"""What a user sees during training: a progress bar with the current phase and one line per step."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

SUMMARY_KEYS = (
    ("rollout/acc", "acc", "{:.3f}"),
    ("reward/score_mean", "score", "{:+.3f}"),
    ("actor/entropy", "ent", "{:.3f}"),
    ("response_length/mean", "len", "{:.1f}"),
    ("overlong/truncated_frac", "trunc", "{:.2f}"),
    ("train/kept_group_frac", "kept", "{:.2f}"),
    ("train/num_gen_batches", "rounds", "{:.0f}"),
    ("timing/step", "s", "{:.2f}"),
)


def summary_line(step: int, total: int, metrics: dict[str, float]) -> str:
    """``step 3/60  acc 0.412  score -0.176  ent 0.121 ...`` from a step's metrics."""
    parts = [f"step {step}/{total}"]
    for key, label, fmt in SUMMARY_KEYS:
        if key in metrics:
            parts.append(f"{label} {fmt.format(metrics[key])}")
    return "  ".join(parts)


class StepReporter:
    """Progress bar (stderr) with the running phase; per-step summary lines; quiet mode prints nothing."""

    def __init__(self, total_steps: int, *, quiet: bool = False, console: Console | None = None) -> None:
        self.total = total_steps
        self.quiet = quiet
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
            disable=quiet,
        )
        self.task = self.progress.add_task("train", total=total_steps)

    def __enter__(self) -> StepReporter:
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def phase(self, step: int, name: str) -> None:
        self.progress.update(self.task, description=f"step {step}: {name}")

    def step_done(self, step: int, metrics: dict[str, float]) -> None:
        self.progress.update(self.task, completed=step)
        self.note(summary_line(step, self.total, metrics))

    def note(self, text: str) -> None:
        if not self.quiet:
            self.progress.console.print(text, highlight=False, soft_wrap=True)

    def finish(self, summary: dict[str, Any], *, tracking_uri: str) -> None:
        if self.quiet:
            return
        base, final = summary.get("base_val"), summary.get("final_val")
        if base is not None and final is not None:
            self.note(f"held-out accuracy: {base:.3f} (base) → {final:.3f} (final), {final - base:+.3f}")
        self.note(f"run dir:    {summary['run_dir']}")
        if summary.get("checkpoint"):
            self.note(f"checkpoint: {summary['checkpoint']}")
        if summary.get("mlflow_run_id"):
            self.note(f"MLflow run: {summary['mlflow_run_id']}  (mlflow ui --backend-store-uri {tracking_uri})")
