"""`dapo prepare-data`: raw math problems → DAPO parquet with integer answers (+ manifest, MLflow run)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from dapo_cli.cli.common import console
from dapo_cli.data.convert import CONVERSIONS, DROP_REASONS
from dapo_cli.data.prepare import (
    DEFAULT_EXPERIMENT,
    DEFAULT_SYNTHETIC_N,
    PrepareOptions,
    PrepareResult,
    run_prepare,
)
from dapo_cli.errors import UserError


def prepare_data(
    inputs: Annotated[
        list[Path] | None,
        typer.Argument(help="Raw parquet/JSONL files (problem/question + answer or \\boxed{} solution), or prepared DAPO parquet."),
    ] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Output parquet (required).")] = None,
    synthetic: Annotated[
        str | None, typer.Option("--synthetic", help="Generate a synthetic integer-answer task instead of reading files.")
    ] = None,
    n: Annotated[int, typer.Option("--n", help="Problems to generate with --synthetic.")] = DEFAULT_SYNTHETIC_N,
    template: Annotated[
        str | None, typer.Option("--template", help="Prompt template containing {problem} (default: the DAPO instruction).")
    ] = None,
    data_source: Annotated[
        str | None, typer.Option("--data-source", help="data_source column (default: math_dapo; prepared rows keep theirs).")
    ] = None,
    val_fraction: Annotated[
        float, typer.Option("--val-fraction", help="Fraction of problems written to <out stem>.val.parquet.")
    ] = 0.0,
    val_output: Annotated[Path | None, typer.Option("--val-output", help="Where the validation split goes.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the train/val split and of --synthetic.")] = 0,
    repeat: Annotated[int, typer.Option("--repeat", help="Write each problem K times (the avg@K layout).")] = 1,
    limit: Annotated[int | None, typer.Option("--limit", help="Keep at most N problems (in input order).")] = None,
    keep_duplicates: Annotated[
        bool,
        typer.Option(
            "--keep-duplicates",
            help="Write every valid row as read. Default: one row per distinct problem (same text and answer), "
            "the first; problems whose text has two answers are dropped.",
        ),
    ] = False,
    no_track: Annotated[bool, typer.Option("--no-track", help="Do not record the run in MLflow.")] = False,
    tracking_uri: Annotated[
        str, typer.Option("--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db).")
    ] = "",
    experiment: Annotated[str, typer.Option("--experiment", help="MLflow experiment.")] = DEFAULT_EXPERIMENT,
) -> None:
    """Turn raw math problems into DAPO parquet with integer answers (like DAPO-Math-17K)."""
    if output is None:
        raise UserError("missing -o/--output: where to write the parquet file")
    for path in inputs or ():
        if path.is_dir():
            raise UserError(f"input {path} is a directory; give parquet or JSONL files (e.g. {path}/*.parquet)")
    if not no_track:
        from dapo_cli.cli.common import check_tracking_uri

        check_tracking_uri(tracking_uri, create=True)
    options = PrepareOptions(
        output=output,
        inputs=tuple(inputs or ()),
        synthetic=synthetic,
        n=n,
        template=template,
        data_source=data_source,
        val_fraction=val_fraction,
        val_output=val_output,
        seed=seed,
        repeat=repeat,
        limit=limit,
        keep_duplicates=keep_duplicates,
        track=not no_track,
        tracking_uri=tracking_uri,
        experiment=experiment,
    )
    result = run_prepare(options)
    console.print(summary_table(result))
    if result.dropped:
        console.print(drop_table(result))
    console.print(dedup_line(result), highlight=False, markup=False, soft_wrap=True)
    for written in result.manifest["outputs"]:
        console.print(f"{written['split']}: {written['path']} ({written['rows']} rows)", highlight=False, markup=False)
    console.print(f"manifest: {result.manifest_path}", highlight=False, markup=False)
    if result.run_id:
        console.print(f"MLflow run: {result.run_id} (experiment {experiment})", highlight=False, markup=False)


def summary_table(result: PrepareResult) -> Table:
    """Rows read, kept per conversion and dropped per input (rows, not problems)."""
    table = Table(title=Text("prepare-data"))
    table.add_column("input", overflow="fold")
    table.add_column("layout", overflow="fold")
    for column in ("read", *CONVERSIONS, "kept", "dropped"):
        table.add_column(column, justify="right")
    for report in result.files:
        table.add_row(
            Text(Path(report.path).name),
            Text(report.layout),
            str(report.rows_read),
            *(str(report.kept[c]) for c in CONVERSIONS),
            str(sum(report.kept.values())),
            str(sum(report.dropped.values())),
        )
    kept = result.kept
    table.add_row(
        "total", "", str(result.rows_read), *(str(kept[c]) for c in CONVERSIONS), str(sum(kept.values())), str(sum(result.dropped.values()))
    )
    return table


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def dedup_line(result: PrepareResult) -> str:
    """One line on deduplication, e.g. ``duplicates removed: 930 rows (first copy kept); 30 distinct problems; ...``."""
    counts = result.manifest["counts"]
    conflicting = _count(counts["conflicting_problems"], "problem")
    if not counts["deduplicated"]:
        return (
            f"duplicates kept (--keep-duplicates): {_count(counts['duplicates_kept'], 'row')} repeat an earlier "
            f"problem; {conflicting} with conflicting answers kept"
        )
    return (
        f"duplicates removed: {_count(counts['duplicates_removed'], 'row')} (first copy kept); "
        f"{_count(counts['distinct_problems'], 'distinct problem')}; conflicting answers: "
        f"{_count(counts['conflicting_duplicates_removed'], 'row')} of {conflicting} dropped"
    )


def drop_table(result: PrepareResult) -> Table:
    """Dropped rows per reason, with what the reason means."""
    table = Table(title=Text("dropped"))
    table.add_column("reason")
    table.add_column("rows", justify="right")
    table.add_column("meaning")
    for reason, count in result.dropped.most_common():
        table.add_row(reason, str(count), Text(DROP_REASONS.get(reason, "")))
    return table
