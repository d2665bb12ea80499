"""`dapo eval`: avg@K / pass@k / maj@K of a checkpoint with the DAPO paper's protocol.

Every sampling option's default is read from :class:`~dapo_cli.config.schema.EvalConfig`
(AIME 2024, 32 samples, T 1.0, top-p 0.7, 20,480 new tokens, math_dapo), so the numbers live
in one place and ``--help`` shows them. The work happens in :func:`dapo_cli.eval.run.run_eval`.
Results (tables, where the files went, the MLflow run; ``--json``: one object) go to stdout,
progress (ETA; a plain line every 10% when stderr is not a terminal) and logs to stderr.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from dapo_cli.cli.common import Panel, QuietOption, VerboseOption, console, err_console, verbosity
from dapo_cli.config.schema import EvalConfig, TrackingConfig
from dapo_cli.errors import LISTED_AS_NAMES, UserError, unknown_name
from dapo_cli.redact import escape_controls

if TYPE_CHECKING:
    from dapo_cli.eval.compare import ComparisonReport
    from dapo_cli.eval.run import EvalOptions, EvalReport

PER_PROBLEM_ROWS = 50
"""Longest per-problem table printed in the terminal (the full one is in summary.json and MLflow)."""

DEFAULTS, TRACKING = EvalConfig(), TrackingConfig()
"""Where every default of this command comes from."""

EXAMPLES = [
    ("dapo eval runs/dapo-tiny/dapo-s0/checkpoints/step_000060/model",
     "The paper's protocol on a trained checkpoint: AIME 2024, avg@32, T 1.0, top-p 0.7."),
    ("dapo eval builtin:tiny --dataset add3.val.parquet --limit 8 --avg 4 --max-tokens 64 --output out/ --json",
     "The tiny policy on 8 problems made by dapo prepare-data --synthetic: results as JSON, files in out/ (reruns resume)."),
    ("dapo eval --compare out_a/ out_b/", "Paired bootstrap over problems: A − B with its 95% interval."),
]


def _choices(name: str) -> tuple[str, ...]:
    return next(f.metadata["choices"] for f in dataclasses.fields(EvalConfig) if f.name == name)


Engine = Enum("Engine", {c: c for c in _choices("engine")}, type=str)  # type: ignore[misc]


def eval_command(
    checkpoint: Annotated[
        str | None,
        typer.Argument(help="A save_pretrained dir, a checkpoint dir containing model/, builtin:tiny, or gguf:smollm2-135m-instruct.", show_default=False),
    ] = None,
    dataset: Annotated[str, typer.Option(help="Registered name (aime24, ...) or a parquet/JSONL path.", rich_help_panel=Panel.DATA)] = DEFAULTS.dataset,
    limit: Annotated[int | None, typer.Option(help="Evaluate only the first N problems.", show_default="all problems", rich_help_panel=Panel.DATA)] = None,
    verifier: Annotated[str, typer.Option(help="Answer checker (math_dapo, strict_box, math_equiv).", rich_help_panel=Panel.DATA)] = DEFAULTS.verifier,
    avg: Annotated[int, typer.Option("--avg", help="Samples per distinct problem (K of avg@K).", rich_help_panel=Panel.SAMPLING)] = DEFAULTS.avg_k,
    pass_k: Annotated[
        list[int] | None,
        typer.Option("--pass-k", help="k of pass@k (repeatable; each <= K).", rich_help_panel=Panel.SAMPLING,
                     show_default=", ".join(map(str, DEFAULTS.pass_k)) + ", those <= K"),
    ] = None,
    temperature: Annotated[float, typer.Option(help="Sampling temperature.", rich_help_panel=Panel.SAMPLING)] = DEFAULTS.temperature,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling.", rich_help_panel=Panel.SAMPLING)] = DEFAULTS.top_p,
    max_tokens: Annotated[int, typer.Option(help="Maximum new tokens per response.", rich_help_panel=Panel.SAMPLING)] = DEFAULTS.max_tokens,
    seed: Annotated[int, typer.Option(help="Sampling seed.", rich_help_panel=Panel.SAMPLING)] = DEFAULTS.seed,
    engine: Annotated[
        Engine, typer.Option(help="Rollout engine (fast: own decode loop; hf: transformers generate; vllm: CUDA or vLLM's CPU build).",
                             rich_help_panel=Panel.RUN),
    ] = Engine(DEFAULTS.engine),
    batch_size: Annotated[
        int, typer.Option(help="Sequences per generate call, whole problems (0: auto, up to 64; one problem's K when more).",
                          rich_help_panel=Panel.RUN),
    ] = DEFAULTS.batch_size,
    tensor_parallel_size: Annotated[
        int, typer.Option(help="vLLM only: GPUs the engine spans (tensor parallelism; vLLM starts a worker process per GPU).",
                          rich_help_panel=Panel.RUN),
    ] = 1,
    output: Annotated[
        Path | None,
        typer.Option(help="Write generations.parquet + summary.json here; reruns resume.", rich_help_panel=Panel.OUTPUT,
                     show_default="none: files only in MLflow"),
    ] = None,
    table_rows: Annotated[
        int, typer.Option(help="Most samples in the MLflow generations table (0: none).", rich_help_panel=Panel.OUTPUT)
    ] = DEFAULTS.table_rows,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as one JSON object on stdout.", rich_help_panel=Panel.OUTPUT)] = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = False,
    tracking_uri: Annotated[
        str | None,
        typer.Option(help="MLflow store.", show_default="$MLFLOW_TRACKING_URI, else sqlite:///mlflow.db", rich_help_panel=Panel.TRACKING),
    ] = None,
    experiment: Annotated[
        str | None,
        typer.Option(help="MLflow experiment name.", show_default=f"the checkpoint's training run's, else {TRACKING.experiment}",
                     rich_help_panel=Panel.TRACKING),
    ] = None,
    no_track: Annotated[bool, typer.Option("--no-track", help="Do not record an MLflow run.", rich_help_panel=Panel.TRACKING)] = False,
    compare: Annotated[
        tuple[str, str] | None,
        typer.Option(help="Paired comparison of two results (result dirs or generations parquets) instead.",
                     show_default="none", rich_help_panel=Panel.OUTPUT),
    ] = None,
) -> None:
    """Evaluate avg@K / pass@k / maj@K of a checkpoint (DAPO protocol: AIME 2024, avg@32)."""
    level = verbosity(quiet, verbose)
    if compare is not None:
        from dapo_cli.eval.compare import compare_results

        print_comparison(compare_results(*compare), *compare)
        return
    if checkpoint is None:
        raise UserError("give a CHECKPOINT to evaluate (or --compare A B)")
    from dapo_cli.eval.run import EvalOptions, run_eval
    from dapo_cli.progress import CountProgress

    opts = EvalOptions(
        checkpoint=checkpoint,
        dataset=dataset,
        k=avg,
        # default pass@k values above K are dropped; explicit ones are checked (and rejected) by run_eval
        pass_k=tuple(sorted(set(pass_k))) if pass_k else tuple(j for j in DEFAULTS.pass_k if j <= avg),
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_tokens,
        verifier=verifier,
        engine=engine.value,
        batch_size=batch_size,
        tensor_parallel_size=tensor_parallel_size,
        seed=seed,
        output=output,
        limit=limit,
        tracking_backend="null" if no_track else TRACKING.backend,
        tracking_uri=TRACKING.tracking_uri if tracking_uri is None else tracking_uri,
        experiment=experiment,  # None: the training run's experiment, else TRACKING's (eval/links.py)
        table_rows=table_rows,
    )
    if opts.tracking_backend != "null":  # a password in the URI would be recorded with the eval run
        from dapo_cli.tracking.credentials import move_credentials

        opts = dataclasses.replace(opts, tracking_uri=move_credentials(opts.tracking_uri, "--tracking-uri"))
    check_options(opts)

    def log(message: str) -> None:
        if level >= 0:
            err_console.print(message, highlight=False, markup=False, soft_wrap=True)

    progress = CountProgress("sampling", unit="samples", enabled=level >= 0, console=err_console, every=0 if level > 0 else 0.1)
    with progress, removing_new_output(opts.output):
        report = run_eval(opts, progress=progress, log=log)
    if as_json:
        typer.echo(json.dumps(report_json(report), sort_keys=True, default=str))
    else:
        print_report(report, opts.k, show_speed=level >= 0)


def report_json(report: EvalReport) -> dict[str, Any]:
    """``--json``: the metrics, the settings, where the files went, the MLflow run and ``speed`` (what
    this invocation generated and how fast, keyed as in MLflow: ``eval/samples_per_s``, ...), as one
    object (a non-finite value is null)."""

    def finite(values: dict[str, float]) -> dict[str, float | None]:
        return {k: (v if math.isfinite(v) else None) for k, v in values.items()}

    return {
        "metrics": finite(report.result.metrics),
        "speed": finite(report.speed),
        "settings": report.settings,
        "layout": report.layout,
        "resumed_problems": report.resumed_problems,
        "outputs": {name: str(path) for name, path in report.outputs.items()},
        "mlflow_run_id": report.run_id or None,
    }


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
        raise unknown_name("verifier", opts.verifier, VERIFIERS, listed=LISTED_AS_NAMES)
    if opts.limit is not None and opts.limit < 1:
        raise UserError(f"--limit must be at least 1 (got {opts.limit})")
    if opts.engine == "vllm":  # before the MLflow run opens (the engine is built inside it)
        from dapo_cli.cli.preflight import check_vllm

        check_vllm("--engine vllm")
    if opts.output is not None:
        check_writable_dir(opts.output, "--output")
    if opts.tracking_backend != "null":
        check_tracking_uri(opts.tracking_uri, create=True, experiment=opts.experiment)  # a server's refusal too
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
    from dapo_cli.eval.generations import CHECKPOINT_FILE

    def no_finished_batch(file: Path) -> bool:
        try:
            return file.name == CHECKPOINT_FILE and len(file.read_text(encoding="utf-8").splitlines()) <= 1
        except (OSError, UnicodeDecodeError):
            return False

    return removing_new_dirs(output, depth=0, disposable=no_finished_batch)


def _fmt(value: float) -> str:
    return "n/a" if not math.isfinite(value) else f"{value:.4f}"


def print_report(report: EvalReport, k: int, *, show_speed: bool = True) -> None:
    """The metrics and per-problem tables, the generation speed (``show_speed``; not with --quiet),
    and where the results went."""
    from dapo_cli.eval.speed import speed_line

    console.print(report.layout, highlight=False, markup=False)
    if report.resumed_problems:
        console.print(f"resumed: {report.resumed_problems} problems were already done", highlight=False, markup=False)
    metrics = Table(title=Text(escape_controls(f"{Path(report.settings['dataset']).name} · {report.settings['checkpoint']}")))
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
        # model output and dataset text are untrusted: Text() cells are never parsed as rich markup, and their
        # control characters (escape sequences) are shown escaped, never sent to the terminal
        cells = (row["problem_id"], f"{row['correct']}/{k}", f"{mark} {row['majority']}", row["ground_truth"], text)
        table.add_row(*(Text(escape_controls(str(c))) for c in cells))
    console.print(table)
    line = speed_line(report.speed) if show_speed and report.speed else None
    if line:
        console.print(line, highlight=False, markup=False, soft_wrap=True)
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
