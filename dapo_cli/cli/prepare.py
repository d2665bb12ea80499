"""`dapo prepare-data`: raw math problems → DAPO parquet with integer answers (+ manifest, MLflow run)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from dapo_cli.cli.common import Panel, console
from dapo_cli.data.convert import CONVERSIONS, DROP_REASONS
from dapo_cli.data.layouts import FieldOptions
from dapo_cli.data.manifest import OpenRun
from dapo_cli.data.prepare import DEFAULT_SYNTHETIC_N, PrepareOptions, PrepareResult, run_prepare
from dapo_cli.errors import UserError

DEFAULT_EXPERIMENT = "dapo-data"
"""MLflow experiment of prepare-data runs."""

EXAMPLES = [
    ("dapo prepare-data ../shared/data/raw-gaokao2023en.jsonl -o gaokao.parquet",
     "Raw problems with \\boxed{} answers → DAPO parquet with integer targets, a manifest and an MLflow run."),
    ("dapo prepare-data --synthetic add-3digit --n 2000 --val-fraction 0.1 -o add3.parquet",
     "2,000 synthetic problems (the tiny model's task); 10% of them to add3.val.parquet."),
    ("dapo prepare-data ../shared/data/aime-2024.parquet --repeat 32 -o aime32.parquet --no-track",
     "Each AIME problem 32 times (the avg@32 layout), recorded nowhere."),
    ("dapo prepare-data olympiad/ --problem-field question --context-field context --answer-field final_answer -o olympiad.parquet",
     "A save_to_disk folder (its train split), fields named instead of detected: context prepended, answers from a list."),
]


def prepare_data(
    inputs: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Raw parquet/JSONL/JSON/.arrow files or Hugging Face save_to_disk folders (fields detected: "
            "problem/question/prompt/input/query + answer or a worked solution), or prepared DAPO parquet."
        ),
    ] = None,
    problem_field: Annotated[
        str | None,
        typer.Option("--problem-field", help="Read problems from this field (a string or chat messages) instead of detecting it.",
                     rich_help_panel=Panel.DATA),
    ] = None,
    answer_field: Annotated[
        str | None,
        typer.Option("--answer-field", help="Read answers from this field (text, number or one-element list); "
                     "with --solution-field, it is tried first. Replaces answer detection.", rich_help_panel=Panel.DATA),
    ] = None,
    solution_field: Annotated[
        str | None,
        typer.Option("--solution-field", help="Read the final answer of the worked solution in this field "
                     "(\\boxed{}, '#### N', 'The answer is N'). Replaces answer detection.", rich_help_panel=Panel.DATA),
    ] = None,
    context_field: Annotated[
        list[str] | None,
        typer.Option("--context-field", help="Prepend this field (a context or preamble) to each problem (repeatable, in order).",
                     rich_help_panel=Panel.DATA),
    ] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Output parquet (required).", rich_help_panel=Panel.OUTPUT)] = None,
    synthetic: Annotated[
        str | None, typer.Option("--synthetic", help="Generate a synthetic integer-answer task instead of reading files.", rich_help_panel=Panel.DATA)
    ] = None,
    n: Annotated[int, typer.Option("--n", help="Problems to generate with --synthetic.", rich_help_panel=Panel.DATA)] = DEFAULT_SYNTHETIC_N,
    template: Annotated[
        str | None, typer.Option("--template", help="Prompt template containing {problem} (default: the DAPO instruction).", rich_help_panel=Panel.DATA)
    ] = None,
    data_source: Annotated[
        str | None, typer.Option("--data-source", help="data_source column (default: math_dapo; prepared rows keep theirs).", rich_help_panel=Panel.DATA)
    ] = None,
    val_fraction: Annotated[
        float, typer.Option("--val-fraction", help="Fraction of problems written to <out stem>.val.parquet.", rich_help_panel=Panel.OUTPUT)
    ] = 0.0,
    val_output: Annotated[Path | None, typer.Option("--val-output", help="Where the validation split goes.", rich_help_panel=Panel.OUTPUT)] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the train/val split and of --synthetic.", rich_help_panel=Panel.DATA)] = 0,
    repeat: Annotated[int, typer.Option("--repeat", help="Write each problem K times (the avg@K layout).", rich_help_panel=Panel.OUTPUT)] = 1,
    limit: Annotated[int | None, typer.Option("--limit", help="Keep at most N problems (in input order).", rich_help_panel=Panel.DATA)] = None,
    keep_duplicates: Annotated[
        bool,
        typer.Option(
            "--keep-duplicates",
            help="Write every valid row as read. Default: one row per distinct problem (same text and answer), "
            "the first; problems whose text has two answers are dropped.",
            rich_help_panel=Panel.OUTPUT,
        ),
    ] = False,
    no_track: Annotated[bool, typer.Option("--no-track", help="Do not record the run in MLflow.", rich_help_panel=Panel.TRACKING)] = False,
    tracking_uri: Annotated[
        str, typer.Option("--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db).", rich_help_panel=Panel.TRACKING)
    ] = "",
    experiment: Annotated[str, typer.Option("--experiment", help="MLflow experiment.", rich_help_panel=Panel.TRACKING)] = DEFAULT_EXPERIMENT,
) -> None:
    """Turn raw math problems into DAPO parquet with integer answers (like DAPO-Math-17K)."""
    if output is None:
        raise UserError("missing -o/--output: where to write the parquet file")
    from dapo_cli.cli.common import check_output_file

    for flag, path in (("-o/--output", output), ("--val-output", val_output)):
        if path is not None:
            check_output_file(Path(path), flag)  # before the MLflow run opens: a failed write leaves no run behind
    if not no_track:
        from dapo_cli.cli.common import check_tracking_uri
        from dapo_cli.tracking.credentials import move_credentials

        tracking_uri = move_credentials(tracking_uri, "--tracking-uri")
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
        fields=FieldOptions(problem_field, answer_field, solution_field, tuple(context_field or ())),
    )
    result = run_prepare(options, open_run=mlflow_run(track=not no_track, tracking_uri=tracking_uri, experiment=experiment))
    for line in detection_lines(result):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    console.print(summary_table(result, console.width))
    if result.dropped:
        console.print(drop_table(result))
    console.print(dedup_line(result), highlight=False, markup=False, soft_wrap=True)
    for written in result.manifest["outputs"]:
        console.print(f"{written['split']}: {written['path']} ({written['rows']} rows)", highlight=False, markup=False)
    console.print(f"manifest: {result.manifest_path}", highlight=False, markup=False)
    if result.run_id:
        console.print(f"MLflow run: {result.run_id} (experiment {experiment})", highlight=False, markup=False)


def mlflow_run(*, track: bool, tracking_uri: str, experiment: str) -> OpenRun:
    """Opens the preparation's MLflow run (a null one without ``track``), named ``prepare-data-<out stem>``."""
    from dapo_cli.config.schema import TrackingConfig
    from dapo_cli.tracking import start_run

    config = TrackingConfig(backend="mlflow" if track else "null", tracking_uri=tracking_uri, experiment=experiment)
    return lambda options: start_run(config, f"prepare-data-{options.output.stem}", tags={"command": "prepare-data"})


def _printable(text: str) -> str:
    """File and field names are untrusted: control characters (a newline in a name) shown as ``?``."""
    return "".join(c if c.isprintable() else "?" for c in text)


def short_names(paths: list[str]) -> list[str]:
    """Each input's file (or folder) name without its directories; the last two parts where names collide."""
    names = [Path(p).name or p for p in paths]
    repeated = Counter(names)
    return [_printable(str(Path(*Path(p).parts[-2:])) if repeated[n] > 1 else n) for p, n in zip(paths, names, strict=True)]


def middle_ellipsis(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, its middle replaced by ``…`` (the extension stays visible)."""
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head) :]


def detection_lines(result: PrepareResult) -> list[str]:
    """One line per input file: what was detected (format, split, rows, fields), rows per problem, answers found."""
    lines = []
    for name, report in zip(short_names([r.path for r in result.files]), result.files, strict=True):
        if report.kind == "synthetic":
            continue
        line = f"{name}: {_printable(report.detected)}; {report.layout}"
        if report.answer_sources:
            found = ", ".join(f"{source} {n}" for source, n in sorted(report.answer_sources.items(), key=lambda kv: -kv[1]))
            line += f"; answers found: {_printable(found)}"
        lines.append(line)
    return lines


SHORT_HEADERS = {"integer": "int", "expression": "expr", "fraction": "frac"}
"""Column headers of the summary table that are abbreviated to keep it within 80 columns."""

MIN_NAME_WIDTH = 12
"""Narrowest the input column is squeezed to (names are abbreviated, never wrapped)."""


def summary_table(result: PrepareResult, width: int = 80) -> Table:
    """Rows read, kept per conversion and dropped per input (rows, not problems), within ``width`` columns.

    Names are never broken across lines: shown without directories, and when the table
    would still be wider than ``width``, shortened in the middle (``raw-gao…023en.jsonl``).
    """
    names = short_names([r.path for r in result.files])
    table = _summary_table(result, names)
    excess = console.measure(table, options=console.options.update(max_width=1 << 16)).maximum - width
    if excess > 0:
        longest = max(len(n) for n in names)
        names = [middle_ellipsis(n, max(MIN_NAME_WIDTH, longest - excess)) for n in names]
        table = _summary_table(result, names)
    return table


def _summary_table(result: PrepareResult, names: list[str]) -> Table:
    legend = f"{'/'.join(SHORT_HEADERS.values())}: {'/'.join(SHORT_HEADERS)}"
    table = Table(
        title=Text("prepare-data"), caption=Text(legend),
        box=box.SIMPLE_HEAD, padding=(0, 0, 0, 1), show_edge=False, pad_edge=False,
    )  # fmt: skip
    table.add_column("input", no_wrap=True, overflow="ellipsis")
    for column in ("read", *(SHORT_HEADERS.get(c, c) for c in CONVERSIONS), "kept", "dropped"):
        table.add_column(column, justify="right", no_wrap=True)
    for name, report in zip(names, result.files, strict=True):
        table.add_row(
            Text(name),
            str(report.rows_read),
            *(str(report.kept[c]) for c in CONVERSIONS),
            str(sum(report.kept.values())),
            str(sum(report.dropped.values())),
        )
    kept = result.kept
    table.add_row(
        "total", str(result.rows_read), *(str(kept[c]) for c in CONVERSIONS), str(sum(kept.values())), str(sum(result.dropped.values()))
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
