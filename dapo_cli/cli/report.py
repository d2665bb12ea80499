"""`dapo report`: the ablation table, curves and report.md, recomputed from what MLflow holds."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from dapo_cli.cli.common import Panel, console

if TYPE_CHECKING:
    from dapo_cli.ablate.results import AblationReport

EXAMPLES = [
    ("dapo report dapo-tiny-ladder", "The newest ablation of the MLflow experiment dapo-tiny-ladder: table, curves, report.md."),
    ("dapo report PARENT_RUN_ID --html --attach", "One ablation by its parent run id; also report.html, logged to the parent run."),
]


def report(
    target: Annotated[
        str, typer.Argument(help="Ablation parent run id, ablation name, or MLflow experiment (its newest ablation).")
    ],
    tracking_uri: Annotated[
        str | None, typer.Option(help="MLflow store.", show_default="$MLFLOW_TRACKING_URI, else sqlite:///mlflow.db",
                                  rich_help_panel=Panel.TRACKING)
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Report folder.", show_default="the ablation's report dir",
                                  rich_help_panel=Panel.OUTPUT)
    ] = None,
    html: Annotated[bool, typer.Option("--html", help="Also write report.html.", rich_help_panel=Panel.OUTPUT)] = False,
    attach: Annotated[bool, typer.Option("--attach", help="Log the report files to the parent run as artifacts.",
                                                     rich_help_panel=Panel.TRACKING)] = False,
    effect: Annotated[float | None, typer.Option(
        "--effect", help="A Δ in points to size: the power table adds the seeds each comparison needs to detect it.",
        rich_help_panel=Panel.OUTPUT)] = None,
) -> None:
    """Report an ablation from MLflow: avg@K per variant with CIs, paired Δ, curves, report.md."""
    from dapo_cli.ablate.report import build_report, write_report
    from dapo_cli.ablate.store import mlflow_client, resolve_parent
    from dapo_cli.cli.common import check_tracking_uri, check_writable_dir
    from dapo_cli.errors import UserError

    if effect is not None and not effect > 0:
        raise UserError(f"--effect must be a positive Δ in points, got {effect}")
    from dapo_cli.tracking.credentials import move_credentials

    tracking_uri = move_credentials(tracking_uri or "", "--tracking-uri")
    uri = check_tracking_uri(tracking_uri, create=False)
    if output is not None:
        check_writable_dir(output, "--output")
    try:
        client = mlflow_client(tracking_uri or "")
        parent = resolve_parent(client, target)
        result = build_report(client, parent)
    except mlflow_errors() as exc:  # a store that opens but cannot answer (wrong server, bad database)
        raise UserError(f"MLflow store {uri} failed: {(str(exc).strip().splitlines() or [type(exc).__name__])[0]}") from None
    default = parent.data.tags.get("ablate.report_dir") or str(Path("reports") / result.name)
    out_dir = output or Path(default)
    check_writable_dir(out_dir, "--output" if output is not None else "the report folder (ablate.report_dir; --output)")
    files = write_report(result, out_dir, html_too=html, effect=effect)
    if attach:
        client.log_artifacts(parent.info.run_id, str(out_dir), "report")
    print_report(result, effect=effect)
    for name, path in files.items():
        console.print(f"{name}: {path}", highlight=False, markup=False)


def mlflow_errors() -> tuple[type[BaseException], ...]:
    """MLflow's exception base (the store's own errors), when MLflow is installed."""
    try:
        from mlflow.exceptions import MlflowException
    except ImportError:  # pragma: no cover - mlflow is a dependency
        return ()
    return (MlflowException,)


SHORT_HEADS = {
    "paper AIME24 avg@32": "paper",
    "95% CI seeds (t)": "±CI seeds",
    "95% CI problems": "±CI probs",
    "Δ 95% CI (paired)": "Δ CI (paired)",
    "truncated %": "trunc %",
    "truncated % early→late": "trunc % early→late",
    "kept groups %": "kept %",
    "Δ equal samples %": "Δ %",
    "Δ equal samples 95% CI": "Δ CI (paired)",
    "equal-samples steps": "steps (this vs ref)",
    "equal-samples budget": "budget",
    "entropy start→end (nats/token)": "entropy (nats/tok)",
    "clip high %": "clip hi %",
    "clip low %": "clip lo %",
    "masked %": "masked %",
    "truncated on a correct path %": "trunc correct %",
    "truncated looping %": "trunc loop %",
    "length spread early→late (tokens)": "len sd (tokens)",
    "length (tokens)": "len (tokens)",
    "informative groups % early→late": "informative % (early→late)",
}
"""Terminal headers of a wide terminal (report.md spells them out)."""

NARROW_HEADS = {
    "rung": ("#", "rung"),
    "paper row": ("row", "the paper's Table 1 row"),
    "paper AIME24 avg@32": ("ppr", "the paper's AIME24 avg@32 (Table 1, Qwen2.5-32B)"),
    "95% CI seeds (t)": ("±t", "95% CI over seeds (Student t)"),
    "95% CI problems": ("±p", "95% CI over problems (±1.96 × val stderr)"),
    "Δ %": ("Δ", "paired Δ in points"),
    "Δ 95% CI (paired)": ("ΔCI", "its 95% CI (paired bootstrap over problems)"),
    "P(Δ>0)": ("P>0", "share of resamples with Δ > 0"),
    "truncated %": ("tr%", "truncated responses %"),
    "truncated % early→late": ("tr%", "truncated responses %, first → last 10 steps (at most half the steps each)"),
    "kept groups %": ("kp%", "kept groups %"),
    "samples": ("smp", "generated samples per seed"),
    "seeds": ("n", "seeds"),
    "Δ by seed %": ("Δseed", "paired Δ by seed in points"),
    "Δ by seed 95% CI (t)": ("±t", "its 95% CI (Student t over the seed pairs)"),
    "seed pairs": ("n", "seed pairs"),
    "Δ problems %": ("Δ", "paired Δ in points"),
    "Δ problems 95% CI (paired)": ("ΔCI", "its 95% CI (paired bootstrap over problems)"),
    "Δ at equal samples %": ("Δs", "paired Δ in points at equal generated samples"),
    "Δ at equal samples 95% CI": ("ΔsCI", "its 95% CI"),
    "Δ equal samples %": ("Δs", "paired Δ in points at equal generated samples"),
    "Δ equal samples 95% CI": ("ΔsCI", "its 95% CI"),
    "equal-samples steps": ("steps", "validation step used, this rung vs its reference, per seed"),
    "equal-samples budget": ("budget", "generated samples per seed both are held to (+5% slack)"),
    "entropy start→end (nats/token)": ("ent", "entropy, first → last 5 steps (at most half the steps each; nats/token)"),
    "clip high %": ("cl+", "tokens clipped at the upper bound %"),
    "clip low %": ("cl-", "tokens clipped at the lower bound %"),
    "masked %": ("msk", "responses a rollout correction dropped or masked %"),
    "truncated on a correct path %": ("trP", "truncated on a correct path %"),
    "truncated looping %": ("trL", "truncated looping %"),
    "length spread early→late (tokens)": ("sd", "within-group length std (tokens), first → last 10 steps (at most half the steps each)"),
    "length (tokens)": ("len", "mean response length (tokens)"),
    "informative groups % early→late": ("inf", "informative groups %, first → last 10 steps (at most half the steps each)"),
}
"""Abbreviated headers (and their legend lines) for terminals too narrow for :data:`SHORT_HEADS`."""

TEXT_COLUMNS = ("variant", "paper row", "vs")
"""Columns of names: they wrap; numbers never do."""

EQUAL_SAMPLES_HEADS = ("Δ equal samples %", "Δ equal samples 95% CI", "equal-samples steps", "equal-samples budget")
"""report.md's Δ-at-equal-samples columns: the terminal shows them in a table of their own."""

FOLD_MIN = {"equal-samples steps": 30, "why not": 24, "trained": 24, "budget per seed": 24,
            "steps read (variant; vs)": 24}
"""Narrow terminal: a list (a step or a reason per seed, the variants a wave trained) wraps beyond this many
characters, so it never squeezes the other columns out."""

TECHNIQUE_LINE = ("each technique at work: clip-higher → entropy, clip %; overlong filtering → truncated on a "
                  "correct path; overlong shaping → truncated looping; token-level loss → length spread, "
                  "length; dynamic sampling → informative groups (and samples, in the table above)")


def terminal_columns(rows: list[dict[str, str]], *, ladder: bool) -> list[str]:
    """The columns that fit a terminal: report.md keeps them all.

    A ladder names its rungs by the paper's row (the variant name repeats it); columns
    that are "—" in every row (seed intervals with one seed) and the seed count go.
    """
    drop = {"seeds", "P(Δ>0)", *EQUAL_SAMPLES_HEADS} | ({"variant"} if ladder else set())
    return [h for h in rows[0] if h not in drop and any(r[h] != "—" for r in rows)]


def wide_width(rows: list[dict[str, str]], heads: list[str]) -> int:
    """Columns the bordered table with :data:`SHORT_HEADS` needs for every cell on one line."""
    cells = sum(max(len(SHORT_HEADS.get(h, h)), 14 if h in TEXT_COLUMNS else 0, *(len(r[h]) for r in rows)) for h in heads)
    return cells + 3 * len(heads) + 1  # "│ " + cell + " " per column, and the closing "│"


def results_table(rows: list[dict[str, str]], heads: list[str], *, width: int) -> tuple[Table, list[str]]:
    """The table for a terminal ``width`` columns wide, and the legend of its abbreviated headers.

    Wide enough: a bordered table with :data:`SHORT_HEADS` and no legend. Narrower: no
    vertical borders, one space between columns, the :data:`NARROW_HEADS` abbreviations (their
    meanings listed below the table); numeric cells are never cut or wrapped, names wrap.
    """
    if width >= wide_width(rows, heads):
        table = Table()
        for head in heads:
            short = SHORT_HEADS.get(head, head)
            if head in TEXT_COLUMNS:
                table.add_column(short, overflow="fold", min_width=14)
            else:
                table.add_column(short, justify="right", min_width=max(len(r[head]) for r in rows))
        legend: list[str] = []
    else:
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, padding=0, pad_edge=False)
        legend = []
        for head in heads:
            short, meaning = NARROW_HEADS.get(head, (head.replace(" %", ""), ""))
            if head in TEXT_COLUMNS:
                table.add_column(short, overflow="fold", ratio=1, min_width=4)
            elif head in FOLD_MIN:
                widest = max(len(short), *(len(r[head]) for r in rows))
                table.add_column(short, overflow="fold", min_width=min(widest, FOLD_MIN[head]), max_width=widest)
            else:
                widest = max(len(short), *(len(r[head]) for r in rows))
                table.add_column(short, justify="right", no_wrap=True, min_width=widest, max_width=widest)
            if meaning:
                legend.append(f"{short} = {meaning}")
            elif head.startswith("avg@"):
                legend.append(f"{short} = final held-out {short}")
    for row in rows:
        table.add_row(*(Text(row[h]) for h in heads))
    return table, legend


def print_report(result: AblationReport, out: Console | None = None, effect: float | None = None) -> None:
    """The report's table in the terminal (``out``: the command's console), plus what is still missing.

    Fits the terminal: at 80 columns every column is there, under abbreviated headers explained
    in a legend below; a wider terminal gets the bordered table with longer headers.
    """
    from dapo_cli.ablate.report import table_rows
    from dapo_cli.ablate.axes import split_axes

    out = out or console
    rows = table_rows(result)
    ladder = result.mode == "ladder"
    title = f"{result.name} · {result.mode} · parent run {result.parent_run_id}"
    if not rows:
        out.print(Text(f"{title}: no finished child run yet"))
    else:  # with axes, a paper row names several variants: the variant column stays
        heads = terminal_columns(rows, ladder=ladder and not any(split_axes(r.name)[1] for r in result.rows))
        print_table(out, rows, heads, title, legend_end="; numbers in % (points).")
        out.print(
            "CI seeds: Student t over seeds; CI problems: normal (±1.96 × val stderr); Δ: paired bootstrap over problems "
            + ("to the previous rung" if ladder else "to the first variant")
            + (" with the same axis settings" if "ablate.axes" in result.tags else "") + ", at the final step",
            highlight=False,
            markup=False,
        )
        from dapo_cli.ablate.report import overall_text

        if overall_text(result):
            out.print(Text(overall_text(result) + "."))
        print_mechanisms(result, out)
        print_equal_samples(rows, out, ladder=ladder)
        print_paired(result, out)
        print_fits(result, out, effect)
    if result.missing:
        out.print(f"not finished: {', '.join(result.missing)}", highlight=False, markup=False)


def print_table(out: Console, rows: list[dict[str, str]], heads: list[str], title: str, *, legend_end: str = ".") -> None:
    """One table fitted to ``out``'s width (:func:`results_table`), its title, and its legend when abbreviated."""
    table, legend = results_table(rows, heads, width=out.width)
    table.title = Text(title)
    out.print(table)
    if legend:
        out.print(Text("; ".join(legend) + legend_end))


def name_columns(rows: list[dict[str, str]], heads: list[str], width: int) -> list[str]:
    """``heads`` without the name columns when the bordered table would not fit: the rung number names the row."""
    return heads if width >= wide_width(rows, heads) else [h for h in heads if h not in TEXT_COLUMNS]


def print_mechanisms(result: AblationReport, out: Console) -> None:
    """The mechanisms table (its samples column is the results table's): each technique's diagnostic per rung."""
    from dapo_cli.ablate.mechanisms import mechanism_table_rows

    rows = mechanism_table_rows(result)
    if not rows:
        return
    drop = {"samples"} | ({"variant"} if result.mode == "ladder" else {"paper row"})
    heads = [h for h in rows[0] if h not in drop and (h in ("rung", "variant", "paper row") or any(r[h] != "—" for r in rows))]
    title = "Mechanisms (what each technique acts on) · mean over seeds"
    for part in column_groups(rows, name_columns(rows, heads, out.width), out.width):
        print_table(out, rows, part, title)
        title = "Mechanisms, continued"
    out.print(Text(TECHNIQUE_LINE + "; — : never logged."))


def column_groups(rows: list[dict[str, str]], heads: list[str], width: int) -> list[list[str]]:
    """``heads`` as one table if its narrow form fits ``width``, else in consecutive groups that each fit,
    every group led by the ``rung`` column (numeric cells are never cut, so a wide row would not fit)."""

    def narrow(h: str) -> int:
        widest = max(len(NARROW_HEADS.get(h, (h.replace(" %", ""), ""))[0]), *(len(r[h]) for r in rows))
        if h in FOLD_MIN:  # a list that wraps
            return min(widest, FOLD_MIN[h])
        return min(widest, 14) if h in TEXT_COLUMNS else widest  # names wrap too

    if width >= wide_width(rows, heads) or sum(narrow(h) + 1 for h in heads) <= width:
        return [heads]
    lead = [h for h in heads if h == "rung"] or [h for h in heads if h in TEXT_COLUMNS]  # what names a row
    groups: list[list[str]] = []
    for h in (h for h in heads if h not in lead):
        if not groups or sum(narrow(x) + 1 for x in [*groups[-1], h]) > width:
            groups.append(list(lead))
        groups[-1].append(h)
    return groups


def print_equal_samples(rows: list[dict[str, str]], out: Console, *, ladder: bool) -> None:
    """Δ at equal generated samples (the rows that have a reference), in a table of its own."""
    rows = [r for r in rows if r["equal-samples steps"] != "—"]
    if not rows:
        return
    heads = ["rung", "paper row" if ladder else "variant", *EQUAL_SAMPLES_HEADS]
    print_table(out, rows, name_columns(rows, heads, out.width),
                "Δ at equal generated samples, " + ("to the previous rung" if ladder else "to the first variant"))
    out.print(Text("each child at its latest validation step with at most the budget of generated samples "
                   "(the smaller of the two rungs' samples per seed) + 5%; same paired bootstrap."))


def print_paired(result: AblationReport, out: Console) -> None:
    """A ladder's rungs against the first, and with ``--axis`` each variant against its twin at the first value of each
    axis: one table each (in a narrow terminal, the variants as their run labels: ``DAPO@ms=1``)."""
    from dapo_cli.ablate.report import paired_table_rows
    from dapo_cli.ablate.variants import short_variant

    sections = ((result.first_deltas, "Δ of each rung to the first"),
                (result.axis_deltas, "Δ between axis values, at the same techniques"))
    for deltas, title in sections:
        rows = paired_table_rows(deltas)
        if not rows:
            continue
        heads = [h for h in rows[0] if h in ("variant", "vs") or any(r[h] != "—" for r in rows)]
        if out.width < wide_width(rows, heads):
            rows = [{**r, "variant": short_variant(r["variant"]), "vs": short_variant(r["vs"])} for r in rows]
        print_table(out, rows, heads, title)
        out.print(Text("Δ by seed: mean over the seeds both finished of the paired avg@K differences, 95% CI Student t; "
                       "Δ problems: paired bootstrap over problems on those seeds."))


def print_fits(result: AblationReport, out: Console, effect: float | None = None) -> None:
    """The curve fits, the power and Δ at equal budget (``ablate.fit_report.fit_sections``), each with its legend;
    variants by their short names."""
    from dapo_cli.ablate.fit_report import fit_sections
    from dapo_cli.ablate.variants import short_variant

    for title, legend, rows in fit_sections(result, effect):
        short = [{k: short_variant(v) if k in ("variant", "vs") else ", ".join(map(short_variant, v.split(", ")))
                  if k == "trained" else v for k, v in r.items()} for r in rows]
        heads = list(rows[0])
        for part in column_groups(short, name_columns(short, heads, out.width) if "rung" in heads else heads, out.width):
            print_table(out, short, part, TITLES.get(title, title))
        out.print(Text(legend))


TITLES = {"Curve fits": "Curve fits (validation over generated samples)", "Power": "Power (paired t over seeds)"}
