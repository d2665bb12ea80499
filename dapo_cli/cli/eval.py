"""`dapo eval`: avg@K / pass@k / maj@K of a checkpoint with the DAPO paper's protocol.

Every option defaults to ``None`` and falls back to :class:`~dapo_cli.config.schema.EvalConfig`
(AIME 2024, 32 samples, T 1.0, top-p 0.7, 20,480 new tokens, math_dapo), so the
numbers live in one place. The work happens in :func:`dapo_cli.eval.run.run_eval`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from dapo_cli.cli.common import console, err_console
from dapo_cli.config.schema import EvalConfig, TrackingConfig
from dapo_cli.errors import UserError

if TYPE_CHECKING:
    from dapo_cli.eval.compare import ComparisonReport
    from dapo_cli.eval.run import EvalOptions, EvalReport

PER_PROBLEM_ROWS = 50
"""Longest per-problem table printed in the terminal (the full one is in summary.json and MLflow)."""


def _choices(name: str) -> tuple[str, ...]:
    return next(f.metadata["choices"] for f in dataclasses.fields(EvalConfig) if f.name == name)


Engine = Enum("Engine", {c: c for c in _choices("engine")}, type=str)  # type: ignore[misc]


class SamplesPerSecond(ProgressColumn):
    """Completed samples per second of this session (resumed samples not counted)."""

    def render(self, task: Task) -> Text:
        speed = task.speed
        return Text("? samples/s" if speed is None else f"{speed:.2f} samples/s", style="progress.data.speed")


class RichProgress:
    """A :class:`~dapo_cli.eval.run.ProgressSink` drawing a rich bar on stderr."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task: int | None = None

    def start(self, total: int, completed: int) -> None:
        self.task = self.progress.add_task("sampling", total=total, completed=completed)

    def advance(self, samples: int) -> None:
        if self.task is not None:
            self.progress.advance(self.task, samples)


def eval_command(
    checkpoint: Annotated[
        str | None,
        typer.Argument(help="A save_pretrained dir, a checkpoint dir containing model/, or builtin:tiny."),
    ] = None,
    dataset: Annotated[str | None, typer.Option(help="Registered name (aime24, ...) or a parquet/JSONL path.")] = None,
    avg: Annotated[int | None, typer.Option("--avg", help="Samples per distinct problem (K of avg@K).")] = None,
    pass_k: Annotated[list[int] | None, typer.Option("--pass-k", help="k of pass@k (repeatable; each <= K).")] = None,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature.")] = None,
    top_p: Annotated[float | None, typer.Option(help="Nucleus sampling.")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="Maximum new tokens per response.")] = None,
    engine: Annotated[Engine | None, typer.Option(help="Rollout engine.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Sequences per generate call (0: one problem's K).")] = None,
    seed: Annotated[int | None, typer.Option(help="Sampling seed.")] = None,
    verifier: Annotated[str | None, typer.Option(help="Answer checker (math_dapo, strict_box, math_equiv).")] = None,
    output: Annotated[
        Path | None, typer.Option(help="Write generations.parquet + summary.json here; reruns resume.")
    ] = None,
    limit: Annotated[int | None, typer.Option(help="Evaluate only the first N problems.")] = None,
    tracking_uri: Annotated[str | None, typer.Option(help="MLflow store (default $MLFLOW_TRACKING_URI or sqlite:///mlflow.db).")] = None,
    experiment: Annotated[str | None, typer.Option(help="MLflow experiment name.")] = None,
    no_track: Annotated[bool, typer.Option("--no-track", help="Do not record an MLflow run.")] = False,
    compare: Annotated[
        tuple[str, str] | None,
        typer.Option(help="Paired comparison of two results (result dirs or generations parquets) instead."),
    ] = None,
) -> None:
    """Evaluate avg@K / pass@k / maj@K of a checkpoint (DAPO protocol: AIME 2024, avg@32)."""
    if compare is not None:
        from dapo_cli.eval.compare import compare_results

        print_comparison(compare_results(*compare), *compare)
        return
    if checkpoint is None:
        raise UserError("give a CHECKPOINT to evaluate (or --compare A B)")
    from dapo_cli.eval.run import EvalOptions, run_eval

    defaults, tracking = EvalConfig(), TrackingConfig()
    k = defaults.avg_k if avg is None else avg
    opts = EvalOptions(
        checkpoint=checkpoint,
        dataset=defaults.dataset if dataset is None else dataset,
        k=k,
        # default pass@k values above K are dropped; explicit ones are checked (and rejected) by run_eval
        pass_k=tuple(sorted(set(pass_k))) if pass_k else tuple(j for j in defaults.pass_k if j <= k),
        temperature=defaults.temperature if temperature is None else temperature,
        top_p=defaults.top_p if top_p is None else top_p,
        max_tokens=defaults.max_tokens if max_tokens is None else max_tokens,
        verifier=defaults.verifier if verifier is None else verifier,
        engine=defaults.engine if engine is None else engine.value,
        batch_size=defaults.batch_size if batch_size is None else batch_size,
        seed=defaults.seed if seed is None else seed,
        output=output,
        limit=limit,
        tracking_backend="null" if no_track else tracking.backend,
        tracking_uri=tracking.tracking_uri if tracking_uri is None else tracking_uri,
        experiment=tracking.experiment if experiment is None else experiment,
    )
    check_options(opts)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), SamplesPerSecond(), TimeElapsedColumn())
    with Progress(*columns, console=err_console) as bar, removing_new_output(opts.output):
        report = run_eval(opts, progress=RichProgress(bar), log=lambda m: err_console.print(m, highlight=False, markup=False))
    print_report(report, opts.k)


def check_options(opts: EvalOptions) -> None:
    """Refuse bad options before anything is loaded or written: K and pass@k, sampling settings, the
    batch size, verifier, engine, the --output folder, the MLflow store, and a local checkpoint's
    files (its weights' headers: a truncated or corrupt model is found before the store opens)."""
    from dapo_cli.cli.common import check_tracking_uri, check_writable_dir
    from dapo_cli.config.validate import eval_problem, sampling_problem
    from dapo_cli.eval.run import check_k

    check_k(opts.k, opts.pass_k)
    problem = sampling_problem(
        temperature=opts.temperature, top_p=opts.top_p, max_tokens=opts.max_tokens,
        names=("--temperature", "--top-p", "--max-tokens"),
    ) or eval_problem(k=opts.k, batch_size=opts.batch_size, names=("--avg", "--batch-size"))
    if problem:
        raise UserError(problem)
    from dapo_cli.rewards import VERIFIERS

    if opts.verifier not in VERIFIERS:
        raise UserError(f"unknown verifier '{opts.verifier}'; valid names: {', '.join(VERIFIERS)}")
    if opts.limit is not None and opts.limit < 1:
        raise UserError(f"--limit must be at least 1 (got {opts.limit})")
    if opts.engine == "vllm":  # before the MLflow run opens (the engine is built inside it)
        from dapo_cli.components import check_vllm

        check_vllm("--engine vllm")
    if opts.output is not None:
        check_writable_dir(opts.output, "--output")
    if opts.tracking_backend != "null":
        check_tracking_uri(opts.tracking_uri, create=True)
    if not opts.checkpoint.startswith("builtin:") and Path(opts.checkpoint).expanduser().exists():
        from dapo_cli.eval.run import resolve_checkpoint
        from dapo_cli.models.loading import check_model_dir

        check_model_dir(Path(resolve_checkpoint(opts.checkpoint)))


def removing_new_output(output: Path | None) -> contextlib.AbstractContextManager[None]:
    """On failure, remove an ``--output`` folder this command created that holds no finished batch
    (an eval that failed while the model loaded leaves no folder behind; a resumable one stays)."""
    if output is None:
        return contextlib.nullcontext()
    from dapo_cli.cli.preflight import removing_new_dirs
    from dapo_cli.eval.run import CHECKPOINT_FILE

    def no_finished_batch(file: Path) -> bool:
        try:
            return file.name == CHECKPOINT_FILE and len(file.read_text(encoding="utf-8").splitlines()) <= 1
        except (OSError, UnicodeDecodeError):
            return False

    return removing_new_dirs(output, depth=0, disposable=no_finished_batch)


def _fmt(value: float) -> str:
    return "n/a" if not math.isfinite(value) else f"{value:.4f}"


def print_report(report: EvalReport, k: int) -> None:
    """The metrics and per-problem tables, and where the results went."""
    console.print(report.layout, highlight=False, markup=False)
    if report.resumed_problems:
        console.print(f"resumed: {report.resumed_problems} problems were already done", highlight=False, markup=False)
    metrics = Table(title=Text(f"{Path(report.settings['dataset']).name} · {report.settings['checkpoint']}"))
    metrics.add_column("metric", no_wrap=True)
    metrics.add_column("value", justify="right", no_wrap=True)
    for key, value in report.result.metrics.items():
        metrics.add_row(key, str(int(value)) if key.startswith("num_") else _fmt(value))
    console.print(metrics)
    rows = report.result.per_problem
    shown = f" (first {PER_PROBLEM_ROWS} of {len(rows)})" if len(rows) > PER_PROBLEM_ROWS else ""
    table = Table(title=f"per problem{shown}")
    table.add_column("id", no_wrap=True, min_width=2)
    table.add_column("correct", justify="right", no_wrap=True, min_width=7)
    table.add_column("majority", no_wrap=True, min_width=8, max_width=16, overflow="ellipsis")
    table.add_column("truth", no_wrap=True, min_width=5, max_width=16, overflow="ellipsis")
    table.add_column("problem", no_wrap=True)
    room = max(20, console.width - 50)  # what the other columns and borders leave
    for row in rows[:PER_PROBLEM_ROWS]:
        mark = "✓" if row["majority_correct"] else "✗"
        text = " ".join(row["problem"].split())
        text = text if len(text) <= room else text[: room - 1] + "…"
        # model output and dataset text are untrusted: Text() cells are never parsed as rich markup
        cells = (row["problem_id"], f"{row['correct']}/{k}", f"{mark} {row['majority']}", row["ground_truth"], text)
        table.add_row(*(Text(c) for c in cells))
    console.print(table)
    for name, path in report.outputs.items():
        console.print(f"{name}: {path}", highlight=False, markup=False)
    if report.run_id:
        console.print(f"MLflow run: {report.run_id}", highlight=False, markup=False)


def print_comparison(report: ComparisonReport, label_a: str, label_b: str) -> None:
    """The paired difference A − B with its 95% interval and the share of resamples > 0."""
    c = report.comparison
    table = Table(title=f"A − B on {c.num_problems} common problems (paired bootstrap over problems)")
    for name in ("A", "B", "A − B", "95% CI", "share of resamples > 0"):
        table.add_column(name, justify="right")
    table.add_row(_fmt(c.mean_a), _fmt(c.mean_b), f"{c.diff:+.4f}", f"[{c.ci_low:+.4f}, {c.ci_high:+.4f}]", f"{c.share_positive:.3f}")
    console.print(f"A: {label_a}\nB: {label_b}", highlight=False, markup=False)
    console.print(table)
    if report.only_a or report.only_b:
        console.print(
            f"dropped {len(report.only_a)} problems only in A and {len(report.only_b)} only in B",
            highlight=False,
        )
