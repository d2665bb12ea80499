"""The ablation report, recomputed from MLflow every time: table, training curves, Markdown/HTML.

Nothing here is typed in: every number comes from the parent run's tags and its
children's metrics and tables (the paper's Table 1 column is the only constant), read through
:mod:`dapo_cli.ablate.store` into the types of :mod:`dapo_cli.ablate.results`; the statistics are
:mod:`dapo_cli.ablate.stats`.

Per variant ``v`` with finished seeds :math:`s = 1..n` (each child's final validation is
avg@K over ``P`` held-out problems, logged as ``val/avg_at_K`` with ``val/avg_at_K_stderr``):

* mean over seeds :math:`\\bar a_v = \\frac1n \\sum_s a_{v,s}`, and its 95% interval over seeds,
  **Student t**: :math:`\\bar a_v \\pm t_{0.975,\\,n-1}\\, s_a / \\sqrt n` (none for ``n = 1``);
* the 95% interval over problems, **normal**: :math:`\\pm 1.96\\, \\overline{\\mathrm{se}}_v`, the
  children's logged standard errors averaged over seeds (the seeds share the problems,
  so averaging seeds does not shrink the problem-sampling error);
* Δ to the previous rung (``--ladder``) or to the first, fewest-techniques variant
  (``--grid``), paired over problems: per-problem accuracy
  :math:`p_{v,i} = \\frac1n \\sum_s c_{v,s,i} / K` from the trainer's table
  ``val/per_problem_step_<step>.json`` at the final step, then
  :func:`~dapo_cli.eval.metrics.paired_bootstrap` of :math:`p_{v,i} - p_{u,i}` (percentile 95%
  interval, share of resamples > 0);
* Δ at equal generated samples, to the same reference: each child's table at its latest
  validation step within the budget :math:`B = \\min(\\text{samples}_u, \\text{samples}_v)` (+5% slack),
  same bootstrap (the definition in :mod:`dapo_cli.ablate.mechanisms`; equal to Δ when the two
  rungs generated the same samples); the steps used are shown per seed (``@50``, ``@50/50/100``);
* a ladder of 3+ rungs also compares its last rung with its first (naive GRPO → DAPO), the same
  two ways (:class:`~dapo_cli.ablate.results.Overall`, :func:`compare_variants`), under the table and in the parent's description;
* a ladder also compares every rung with the first (:func:`first_deltas`, its own section): paired by seed,
  :math:`d_s = a_{v,s} - a_{u,s}` over the seeds both finished, mean ± Student t, and paired over problems and
  at equal samples as above (:func:`paired_delta`, shared with the axis comparisons below);
* with ``--axis``, each Δ above compares rows with the same axis settings (``dapo@max_staleness=1`` to
  the previous rung at ``max_staleness=1``), and each variant is also compared with its twin at the
  first value of each axis (:class:`~dapo_cli.ablate.results.AxisDelta`, :func:`axis_deltas`), the same
  three ways;
* shares over the training steps (mean over steps and seeds): ``overlong/truncated_frac``
  and ``train/kept_group_frac`` (kept / generated groups with dynamic sampling, the
  informative share without it);
* generated samples per seed: mean over seeds of :math:`\\sum_t` ``train/samples_generated``;
* the mechanisms table, per variant (each technique's diagnostic: entropy start → end, clip
  fractions, truncation causes, length spread, informative groups early → late): defined in
  :mod:`dapo_cli.ablate.mechanisms`.

Curves (:mod:`dapo_cli.ablate.plots`): one PNG per metric of :data:`~dapo_cli.ablate.results.CURVE_METRICS`, one line per
variant (mean over seeds), against the step and against cumulative generated samples
(:math:`\\sum_{t \\le \\text{step}}` ``train/samples_generated``).
"""

from __future__ import annotations

import base64
import html
import math
import re
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dapo_cli.ablate.mechanisms import (
    equal_samples_delta,
    mechanism_row,
    mechanism_table_rows,
    mechanisms_markdown,
    steps_text,
)
from dapo_cli.ablate.axes import axis_twins, split_axes
from dapo_cli.ablate.variants import LADDER_LABELS, LADDER_NAMES, PAPER_AIME24_AVG32, short_variant
from dapo_cli.ablate.plots import plot_curves
from dapo_cli.ablate.results import (
    SAMPLES_METRIC,
    AblationReport,
    AxisDelta,
    PairedDelta,
    ChildResult,
    EqualSamples,
    Overall,
    VariantRow,
)
from dapo_cli.ablate.fit_report import (child_fit_rows, fit_html, fit_markdown, fit_markdown_sections, plot_fits,
                                        section_tables, within_limit)
from dapo_cli.ablate.stats import Z_95, mean_or_nan, mean_per_problem, seed_interval
from dapo_cli.ablate.store import child_runs, child_table, read_child, variant_of
from dapo_cli.eval.compare import compare_accuracies
from dapo_cli.eval.metrics import PairedComparison
from dapo_cli.fileio import write_json_atomic, write_text_atomic

SHARE_METRICS = {"truncated": "overlong/truncated_frac", "kept_groups": "train/kept_group_frac"}


# ---------------------------------------------------------------- the report


def label_of(name: str) -> tuple[str, float | None]:
    """The paper's Table 1 row and AIME 2024 avg@32 for a ladder variant name (axis settings aside), else ``("", None)``."""
    name = split_axes(name)[0]
    if name in LADDER_NAMES:
        i = LADDER_NAMES.index(name)
        return LADDER_LABELS[i], PAPER_AIME24_AVG32[i]
    return "", None


def variant_row(position: int, name: str, results: Sequence[ChildResult]) -> VariantRow:
    """Aggregate the seeds of one variant (see the module docstring for the intervals)."""
    label, paper = label_of(name)
    avgs = [r.avg for r in results]
    mean, half = seed_interval(avgs)
    shares = {
        short: mean_or_nan([v for r in results for s, v in r.curves[key].items() if s >= 1]) for short, key in SHARE_METRICS.items()
    }
    return VariantRow(
        position=position,
        name=name,
        label=label,
        paper=paper,
        seeds=[r.seed for r in results],
        avgs=avgs,
        mean=mean,
        seed_half=half,
        problem_half=Z_95 * mean_or_nan([r.stderr for r in results]),
        shares=shares,
        samples=mean_or_nan([sum(r.curves[SAMPLES_METRIC].values()) for r in results]),
        final_steps=[r.final_step for r in results],
    )


def compare_variants(
    results: Sequence[ChildResult], ref: Sequence[ChildResult], ref_name: str, client: Any = None
) -> tuple[PairedComparison | None, EqualSamples | None]:
    """Paired Δ of ``results`` − ``ref`` over their common problems at the final step, and at equal
    generated samples (earlier validation tables read through ``client``)."""
    a = mean_per_problem([r.per_problem for r in results])
    b = mean_per_problem([r.per_problem for r in ref])
    delta = compare_accuracies(a, b).comparison if a and b and set(a) & set(b) else None
    return delta, equal_samples_delta(results, ref, ref_name, lambda c, s: child_table(client, c, s))


def same_axes(rows: Sequence[VariantRow], name: str) -> list[VariantRow]:
    """The rows with the axis settings of variant ``name`` (all rows when the ablation has no axes), in order."""
    settings = split_axes(name)[1]
    return [r for r in rows if split_axes(r.name)[1] == settings]


def add_deltas(rows: list[VariantRow], results: dict[str, list[ChildResult]], mode: str, client: Any = None) -> None:
    """Δ of each row to the previous row (ladder) or to the first row (grid) with its axis settings:
    :func:`compare_variants`."""
    for i, row in enumerate(rows):
        before = same_axes(rows[:i], row.name)
        if not before:
            continue
        ref = before[-1] if mode == "ladder" else before[0]
        row.delta_vs = ref.name
        row.delta, row.equal_samples = compare_variants(results[row.name], results[ref.name], ref.name, client)


def paired_delta(variant: str, vs: str, results: dict[str, list[ChildResult]], client: Any = None) -> PairedDelta | None:
    """``variant`` − ``vs`` by seed over the seeds both finished (Student t), and :func:`compare_variants` on those
    seeds; None when they share no seed."""
    mine = {r.seed: r for r in results[variant]}
    ref = {r.seed: r for r in results.get(vs, [])}
    seeds = sorted(set(mine) & set(ref))
    if not seeds:
        return None
    diffs = [mine[s].avg - ref[s].avg for s in seeds]
    delta, equal = compare_variants([mine[s] for s in seeds], [ref[s] for s in seeds], vs, client)
    return PairedDelta(variant, vs, seeds, diffs, *seed_interval(diffs), delta, equal)


def axis_deltas(
    order: Sequence[str], rows: Sequence[VariantRow], results: dict[str, list[ChildResult]], client: Any = None
) -> list[AxisDelta]:
    """Each row against its twin at the first value of each axis (the value the planned ``order`` shows first,
    :func:`~dapo_cli.ablate.axes.axis_twins`): :func:`paired_delta`."""
    reported = {row.name for row in rows}
    return [AxisDelta(**vars(d), axis=axis) for name, twin, axis in axis_twins(order)
            if name in reported and (d := paired_delta(name, twin, results, client)) is not None]


def first_deltas(rows: Sequence[VariantRow], results: dict[str, list[ChildResult]], client: Any = None) -> list[PairedDelta]:
    """A ladder's rungs after the first, each against the first rung with its axis settings (naive GRPO): :func:`paired_delta`."""
    out = []
    for row in rows:
        first = same_axes(rows, row.name)[0]
        if first.name != row.name and (d := paired_delta(row.name, first.name, results, client)) is not None:
            out.append(d)
    return out


def interval(d: PairedComparison) -> str:
    """``[+1.2, +3.4]``: a paired Δ's 95% interval in points."""
    return f"[{pct(d.ci_low, signed=True)}, {pct(d.ci_high, signed=True)}]"


def overall_text(report: AblationReport) -> str:
    """``Naive GRPO → DAPO: Δ +7.6 [+5.0, +10.3] at equal steps; +4.1 [+1.8, +6.5] at equal samples (…)``, or ""."""
    o = report.overall
    if o is None or o.delta is None:
        return ""
    names = [r.label or r.name for r in report.rows if r.name in (o.first, o.last)]
    settings = " ".join(f"{k}={v}" for k, v in split_axes(o.first)[1])

    def ci(d: PairedComparison) -> str:
        return f"{pct(d.diff, signed=True)} {interval(d)}"

    text = (f"{' → '.join(names)}{f' at {settings}' if settings else ''} (last rung − first, paired over problems): "
            f"Δ {ci(o.delta)} points at equal steps")
    eq = o.equal_samples
    if eq is not None and eq.delta is not None:
        text += f"; {ci(eq.delta)} at equal generated samples ({steps_text(eq.steps)} vs {steps_text(eq.ref_steps)})"
    return text


def build_report(client: Any, parent: Any) -> AblationReport:
    """Read the parent and its (non-superseded) children from MLflow and recompute every number."""
    tags = dict(parent.data.tags)
    planned = [n for n in tags.get("ablate.variants", "").split(",") if n]
    results: dict[str, list[ChildResult]] = {}
    unfinished = []
    for run in child_runs(client, parent):
        res = read_child(client, run)
        if res is None:
            unfinished.append(f"{variant_of(run.data.tags)} seed {run.data.tags.get('dapo.seed', '?')} "
                              f"({run.info.status}, run {run.info.run_id})")
            continue
        results.setdefault(res.variant, []).append(res)
    order = planned + sorted(set(results) - set(planned))
    rows = [variant_row(i, n, sorted(results[n], key=lambda r: r.seed)) for i, n in enumerate(order) if n in results]
    mode = tags.get("ablate.mode", "grid")
    add_deltas(rows, results, mode, client)
    overall = None
    rungs = same_axes(rows, rows[0].name) if rows else []
    if mode == "ladder" and len(rungs) > 2:
        first, last = rungs[0].name, rungs[-1].name
        overall = Overall(first, last, *compare_variants(results[last], results[first], first, client))
    ks = {r.k for rs in results.values() for r in rs}
    return AblationReport(
        parent_run_id=parent.info.run_id,
        name=tags.get("ablate.name", parent.info.run_name),
        mode=mode,
        tags=tags,
        k=max(ks) if ks else 0,
        rows=rows,
        children=[r for n in order for r in sorted(results.get(n, []), key=lambda r: r.seed)],
        missing=[n for n in planned if n not in results],
        unfinished=unfinished,
        mechanisms=[mechanism_row(row, results[row.name]) for row in rows],
        overall=overall,
        axis_deltas=axis_deltas(order, rows, results, client),
        first_deltas=first_deltas(rows, results, client) if mode == "ladder" else [],
    )


# ---------------------------------------------------------------- rendering


def pct(x: float | None, *, signed: bool = False, half: bool = False) -> str:
    """A fraction as percentage points with one decimal (``—`` when missing)."""
    if x is None or not math.isfinite(x):
        return "—"
    text = f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}"
    return f"±{text}" if half else text


def seeds_text(report: AblationReport) -> str:
    """The seeds of the finished children (``0,1,2``): what the table averages, whichever run trained them."""
    return ",".join(str(s) for s in sorted({c.seed for c in report.children})) or "none finished"


def table_rows(report: AblationReport) -> list[dict[str, str]]:
    """The table as strings, one dict per variant (shared by Markdown, HTML and the terminal)."""
    k = report.k
    out = []
    for row in report.rows:
        d, eq = row.delta, row.equal_samples
        e = eq.delta if eq is not None else None
        out.append({
            "rung": str(row.position),
            "variant": row.name,
            "paper row": row.label or "—",
            "paper AIME24 avg@32": "—" if row.paper is None else f"{row.paper:.0f}",
            f"avg@{k} %": pct(row.mean),
            "95% CI seeds (t)": pct(row.seed_half, half=True),
            "95% CI problems": pct(row.problem_half, half=True),
            "Δ %": "—" if d is None else pct(d.diff, signed=True),
            "Δ 95% CI (paired)": "—" if d is None else interval(d),
            "P(Δ>0)": "—" if d is None else f"{d.share_positive:.2f}",
            "Δ equal samples %": "—" if e is None else pct(e.diff, signed=True),
            "Δ equal samples 95% CI": "—" if e is None else interval(e),
            "equal-samples steps": "—" if eq is None else f"{steps_text(eq.steps)} vs {steps_text(eq.ref_steps)}",
            "equal-samples budget": "—" if eq is None else f"{eq.budget:.0f}",
            "truncated %": pct(row.shares["truncated"]),
            "kept groups %": pct(row.shares["kept_groups"]),
            "samples": f"{row.samples:.0f}",
            "seeds": str(len(row.seeds)),
        })
    return out


def paired_table_rows(deltas: Sequence[PairedDelta]) -> list[dict[str, str]]:
    """Paired comparisons as strings, one dict per pair (Markdown, HTML, the terminal)."""
    out = []
    for a in deltas:
        d, e = a.delta, a.equal_samples.delta if a.equal_samples is not None else None
        out.append({
            "variant": a.variant,
            "vs": a.vs,
            "Δ by seed %": pct(a.seed_mean, signed=True),
            "Δ by seed 95% CI (t)": pct(a.seed_half, half=True),
            "seed pairs": str(len(a.seeds)),
            "Δ problems %": "—" if d is None else pct(d.diff, signed=True),
            "Δ problems 95% CI (paired)": "—" if d is None else interval(d),
            "P(Δ>0)": "—" if d is None else f"{d.share_positive:.2f}",
            "Δ at equal samples %": "—" if e is None else pct(e.diff, signed=True),
            "Δ at equal samples 95% CI": "—" if e is None else interval(e),
        })
    return out


def axis_table_rows(report: AblationReport) -> list[dict[str, str]]:
    """The axis comparisons as strings (:func:`paired_table_rows`)."""
    return paired_table_rows(report.axis_deltas)


PAIRED_LEGEND = ("Δ by seed = mean over the seeds both finished of avg@K(variant) − avg@K(vs), 95% CI Student t; "
                 "Δ problems and Δ at equal samples as Δ and Δ equal samples in the table above (paired over problems), "
                 "on those seeds.")
SECTIONS = (
    ("first_deltas", "Each rung against the first",
     "Each rung against the first rung with its axis settings (naive GRPO), not the previous one. "),
    ("axis_deltas", "Axis comparisons",
     "Each variant against its twin at the first value of an axis (same techniques, same other settings): "),
)
"""The paired-comparison sections of report.md and report.html: (report field, title, lead)."""


def paired_markdown(report: AblationReport) -> list[str]:
    """report.md's sections of paired comparisons (none without them)."""
    lines: list[str] = []
    for attr, title, lead in SECTIONS:
        rows = paired_table_rows(getattr(report, attr))
        if rows:
            head = list(rows[0])
            lines += ["", f"## {title}", "", lead + PAIRED_LEGEND, "",
                      "| " + " | ".join(head) + " |", "|" + "---|" * len(head),
                      *("| " + " | ".join(r[h] for h in head) + " |" for r in rows)]
    return lines


def to_markdown(report: AblationReport, plots: dict[str, list[Path]], out_dir: Path, effect: float | None = None) -> str:
    """``report.md``: header, the table, shares, per-child results, embedded figures."""
    rows = table_rows(report)
    head = list(rows[0]) if rows else []
    lines = [
        f"# Ablation {report.name}",
        "",
        f"- parent MLflow run: `{report.parent_run_id}`; mode: {report.mode}; seeds: {seeds_text(report)}",
        f"- ablation id `{report.tags.get('ablate.id', '?')}`, config hash `{report.tags.get('ablate.config_hash', '?')}`",
        f"- every number below is recomputed from MLflow; final avg@{report.k} = `val/avg_at_{report.k}` at each child's last step",
        "- 95% CI seeds: Student t over seeds (— for one seed); 95% CI problems: normal, ±1.96 × the children's val stderr",
        "- Δ: paired over problems (bootstrap of per-problem accuracy differences, 2000 resamples) to the "
        + ("previous rung" if report.mode == "ladder" else "first variant")
        + (" with the same axis settings" if "ablate.axes" in report.tags else "")
        + " at the final step (equal steps)",
        ("- Δ equal samples: the same Δ, each child taken at its latest validation step whose cumulative generated "
         "samples are at most the budget (the smaller of the two variants' samples per seed) + 5% slack; steps "
         "used: this variant's vs the reference's, per seed"),
        "- the paper column is the DAPO paper's Table 1 (AIME 2024 avg@32, Qwen2.5-32B), a reference, not this experiment",
        "",
    ]
    if rows:
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r[h] for h in head) + " |" for r in rows]
    else:
        lines.append("No finished child run yet.")
    lines += paired_markdown(report)
    lines += fit_markdown(report, effect)
    lines += mechanisms_markdown(report)
    if overall_text(report):
        lines += ["", f"**{overall_text(report)}.**"]
    if report.missing:
        lines += ["", f"Not finished yet: {', '.join(report.missing)}."]
    if report.unfinished:
        lines += ["", "Unfinished child runs: " + "; ".join(report.unfinished) + "."]
    lines += ["", "## Child runs", "", f"| variant | seed | final step | avg@{report.k} % | stderr % | run id |", "|---|---|---|---|---|---|"]
    lines += [f"| {c.variant} | {c.seed} | {c.final_step} | {pct(c.avg)} | {pct(c.stderr)} | `{c.run_id}` |" for c in report.children]
    for axis, title in (("step", "Training curves by step"), ("samples", "Training curves by generated samples")):
        lines += ["", f"## {title}", ""]
        lines += [f"![{p.stem}]({p.relative_to(out_dir).as_posix()})" for p in plots[axis]]
    return "\n".join(lines) + "\n"


def to_html(report: AblationReport, plots: dict[str, list[Path]], out_dir: Path, effect: float | None = None) -> str:
    """``report.html``: the same table and figures, every cell escaped."""
    rows = table_rows(report)
    head = list(rows[0]) if rows else []
    esc = html.escape
    parts = [
        "<!doctype html><meta charset='utf-8'>",
        f"<title>Ablation {esc(report.name)}</title><h1>Ablation {esc(report.name)}</h1>",
        f"<p>parent MLflow run <code>{esc(report.parent_run_id)}</code>, mode {esc(report.mode)}; "
        f"numbers recomputed from MLflow (see report.md for the interval definitions)</p>",
        "<table border='1' cellspacing='0' cellpadding='3'><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>",
        *("<tr>" + "".join(f"<td>{esc(r[h])}</td>" for h in head) + "</tr>" for r in rows),
        "</table>",
    ]
    for attr, title, _ in SECTIONS:
        paired = paired_table_rows(getattr(report, attr))
        if paired:
            parts += [f"<h2>{esc(title)}</h2>",
                      "<table border='1' cellspacing='0' cellpadding='3'><tr>" + "".join(f"<th>{esc(h)}</th>" for h in paired[0]) + "</tr>",
                      *("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in r.values()) + "</tr>" for r in paired), "</table>"]
    parts += fit_html(report, effect)
    mech = mechanism_table_rows(report)
    if mech:
        parts += ["<h2>Mechanisms (what each technique acts on)</h2>",
                  "<table border='1' cellspacing='0' cellpadding='3'><tr>" + "".join(f"<th>{esc(h)}</th>" for h in mech[0]) + "</tr>",
                  *("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in r.values()) + "</tr>" for r in mech), "</table>"]
    for axis in ("step", "samples"):  # images inline: the page is one self-contained file (MLflow's viewer shows it)
        parts += [f"<h2>by {axis}</h2>"] + [
            f"<img alt='{esc(p.stem)}' src='data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}'>"
            for p in plots[axis]
        ]
    return "\n".join(parts) + "\n"


NOTE_LIMIT = 8000
"""MLflow's limit on a tag value, so on the parent run's description (``mlflow.note.content``)."""


def summary_markdown(report: AblationReport) -> str:
    """The table alone, as Markdown: the parent run's description in MLflow (``mlflow.note.content``)."""
    rows = table_rows(report)
    if not rows:
        return f"Ablation {report.name}: no finished child run yet."
    head = ["rung", "variant", f"avg@{report.k} %", "95% CI seeds (t)", "Δ %", "Δ 95% CI (paired)", "samples", "seeds"]
    lines = [f"**Ablation {report.name}** ({report.mode}; seeds {seeds_text(report)}); "
             f"final held-out avg@{report.k}, recomputed from the child runs", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r[h] for h in head) + " |" for r in rows]
    pairs = [f"- {r['variant']} − {r['vs']}: Δ {r['Δ by seed %']} {r['Δ by seed 95% CI (t)']} points "
             f"(paired by seed, {r['seed pairs']} pairs)" for r in axis_table_rows(report)]
    lines += ["", *pairs] if pairs else []
    if overall_text(report):
        lines += ["", overall_text(report) + "."]
    return "\n".join(within_limit(lines, fit_markdown_sections(report), NOTE_LIMIT)) + "\n"


def summary_metrics(report: AblationReport) -> dict[str, float]:
    """Per-variant results as metrics of the parent run, keyed ``variants/<position>_<short name>.<stat>``
    (``variants/3_SoftPunish.avg_at_4``, ``variants/5_grpo.ch.ds.delta``: MLflow keys allow no ``+``).

    One ``/``, under one prefix: MLflow's chart view makes a section of each key's part before its
    last ``/``, so per-variant prefixes (``0_GRPO/avg_at_4``) gave one section of one-bar charts per
    variant; these all fall in one ``variants`` section."""
    out: dict[str, float] = {}
    keys = {row.name: f"variants/{row.position}_{re.sub(r'[^A-Za-z0-9_.-]', '.', short_variant(row.name)).strip('.')}"
            for row in report.rows}
    for f in report.first_deltas:
        out[f"{keys[f.variant]}.delta_vs_first_by_seed"] = f.seed_mean
        out[f"{keys[f.variant]}.delta_vs_first_by_seed_ci95"] = f.seed_half
        if f.delta is not None:
            out[f"{keys[f.variant]}.delta_vs_first"] = f.delta.diff
    for a in report.axis_deltas:
        out[f"{keys[a.variant]}.delta_by_seed_{a.axis}"] = a.seed_mean
        out[f"{keys[a.variant]}.delta_by_seed_{a.axis}_ci95"] = a.seed_half
        if a.delta is not None:
            out[f"{keys[a.variant]}.delta_{a.axis}"] = a.delta.diff
    for row in report.rows:
        key = keys[row.name]
        out[f"{key}.avg_at_{report.k}"] = row.mean
        out[f"{key}.ci95_seeds"] = row.seed_half
        out[f"{key}.samples"] = row.samples
        if row.delta is not None:
            out[f"{key}.delta"] = row.delta.diff
            out[f"{key}.delta_ci_low"] = row.delta.ci_low
            out[f"{key}.delta_ci_high"] = row.delta.ci_high
        if row.equal_samples is not None and row.equal_samples.delta is not None:
            out[f"{key}.delta_equal_samples"] = row.equal_samples.delta.diff
            out[f"{key}.delta_equal_samples_ci_low"] = row.equal_samples.delta.ci_low
            out[f"{key}.delta_equal_samples_ci_high"] = row.equal_samples.delta.ci_high
    return {k: v for k, v in out.items() if v is not None and math.isfinite(v)}


def write_report(report: AblationReport, out_dir: Path, *, html_too: bool = False,
                 effect: float | None = None) -> dict[str, Path]:
    """Write ``report.md``, ``report.json``, the PNGs (and ``report.html``) under ``out_dir``; returns the files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = plot_curves(report, out_dir)
    if report.children:
        plots["samples"].append(plot_fits(report, out_dir))
    files = {"markdown": out_dir / "report.md", "json": out_dir / "report.json"}
    write_text_atomic(files["markdown"], to_markdown(report, plots, out_dir, effect))
    write_json_atomic(files["json"], {**asdict(report), "table": table_rows(report),
                                        "mechanisms_table": mechanism_table_rows(report),
                                        "fit_tables": section_tables(report, effect),
                                        "child_fits": child_fit_rows(report)})
    if html_too:
        files["html"] = out_dir / "report.html"
        write_text_atomic(files["html"], to_html(report, plots, out_dir, effect))
    return files
