"""The report's curve fits and power (issue 48): per variant A, B, C_mid with intervals and verdicts, and per
comparison the paired sd over seeds, the minimum detectable Δ at the seeds run and the seeds needed.

Reads an :class:`~dapo_cli.ablate.results.AblationReport` (its rows for the order, its children for the curves
and the final avg@K); renders Markdown lines and plain table rows that ``dapo report`` prints in the terminal.
Formulas: ``docs/ablation-statistics.md``.
"""

from __future__ import annotations

import html
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from dapo_cli.ablate.curves import CurveFit, SeedFits, compare_fits, fit_curve, over_seeds
from dapo_cli.ablate.budget import AXES, EqualBudget, budget_curve, budget_rows, equal_budget
from dapo_cli.ablate.results import AblationReport, ChildResult
from dapo_cli.ablate.sequential import (DECISIONS_LEGEND, SETUP_TAG, WAVES_LEGEND, Setup, comparison_pairs, decision_rows,
                                       replay, stop_line, wave_rows)
from dapo_cli.ablate.stats import min_detectable_delta, sample_sd, seeds_needed
from dapo_cli.fileio import atomic_path


def samples_curve(child: ChildResult) -> tuple[list[float], list[float]]:
    """``(C, R)``: the child's validations over cumulative generated samples (``C = 0`` at step 0)."""
    _, c, r = budget_curve(child, "samples")
    return c, r


def child_fit(child: ChildResult) -> CurveFit:
    """The child's validation curve over generated samples, fitted (``not identified`` without a step-0 point)."""
    c, r = samples_curve(child)
    if not c or c[0] != 0:
        return CurveFit(math.nan, math.nan, math.nan, math.nan, c[-1] if c else 0.0, len(c), "not identified",
                        "no step-0 validation (R0)")  # no numbers behind it: the reason is the words
    samples = len(child.per_problem) * child.k
    return fit_curve(c, r, samples=samples)


def variant_fits(report: AblationReport) -> dict[str, SeedFits]:
    """Each variant's fits over its seeds (seed order)."""
    by = {row.name: [ch for ch in report.children if ch.variant == row.name] for row in report.rows}
    return {name: over_seeds([child_fit(ch) for ch in sorted(kids, key=lambda ch: ch.seed)]) for name, kids in by.items()}


def fit_rows(report: AblationReport) -> list[dict[str, str]]:
    """One row per variant: A and B (mean ± t 95% over the identified seeds), C_mid, the predictions at 2x and 10x
    the budget, and the verdict with each unidentified seed's reason."""
    rows = []
    fits = variant_fits(report)
    for row in report.rows:
        sf = fits[row.name]
        ok = [f for f in sf.fits if f.fitted]
        why = Counter(f.why for f in sf.fits if not f.fitted)  # each fit's numbers: report.json's child_fits
        rows.append({
            "rung": str(row.position), "variant": row.name,
            "points": "/".join(str(f.points) for f in sf.fits) or "—",
            "A %": interval(sf.a_mean, sf.a_half, 100), "B": interval(sf.b_mean, sf.b_half, 1),
            "C_mid (samples)": f"{sf.c_mid_mean:.0f}" if math.isfinite(sf.c_mid_mean) else "—",
            "at 2x budget %": pct(sum(f.predict(2 * f.budget) for f in ok) / len(ok)) if ok else "—",
            "at 10x budget %": pct(sum(f.predict(10 * f.budget) for f in ok) / len(ok)) if ok else "—",
            "verdict": f"fitted ({len(ok)}/{len(sf.fits)} seeds)" if ok else "not identified",
            "why not": "; ".join(f"{w} ({n} of {len(sf.fits)} seeds)" for w, n in sorted(why.items())) if why else "—",
        })
    return rows


def child_fit_rows(report: AblationReport) -> list[dict[str, object]]:
    """Every child's own fit (``report.json``'s ``child_fits``): A, B, C_mid, the budget, the verdict and, when
    not identified, why with this fit's numbers, which the "Curve fits" table only counts over seeds."""
    out: list[dict[str, object]] = []
    for ch in report.children:
        f = child_fit(ch)
        out.append({"variant": ch.variant, "seed": ch.seed, "points": f.points, "budget": f.budget, "r0": f.r0,
                    "a": f.a, "b": f.b, "c_mid": f.c_mid, "verdict": f.verdict, "why": f.why, "detail": f.detail})
    return out


def fit_comparison_rows(report: AblationReport) -> list[dict[str, str]]:
    """Per comparison with identified fits on both sides: ΔA paired by seed (t 95%), and ΔB when the ceilings lie
    within :data:`~dapo_cli.ablate.curves.MARGIN_A`; '—' where no seed has both fits identified."""
    by_seed = {(ch.variant, ch.seed): ch for ch in report.children}
    rows = []
    for variant, vs in comparisons(report):
        seeds = sorted(s for v, s in by_seed if v == variant and (vs, s) in by_seed)  # paired by seed, not position
        cmp = compare_fits(variant, [child_fit(by_seed[variant, s]) for s in seeds],
                           vs, [child_fit(by_seed[vs, s]) for s in seeds])
        rows.append({
            "variant": variant, "vs": vs, "seed pairs fitted": str(cmp.pairs) if cmp else "0",
            "ΔA %": interval(cmp.delta_a, cmp.delta_a_half, 100) if cmp else "—",
            "ΔB": interval(cmp.delta_b, cmp.delta_b_half or math.nan, 1) if cmp and cmp.delta_b is not None else "—",
        })
    return rows if any(r["ΔA %"] != "—" for r in rows) else []


@dataclass
class Power:
    """One comparison's power over seeds (Δ in points)."""

    variant: str
    vs: str
    pairs: int
    delta: float
    sd: float
    detectable: float
    needed: int | None
    needed_effect: int | None


def comparisons(report: AblationReport) -> list[tuple[str, str]]:
    """The report's comparisons: a ladder's rungs against the previous and against the first (the last against the
    first once), otherwise each variant against the first."""
    return comparison_pairs([row.name for row in report.rows], report.mode == "ladder")


def power_table(report: AblationReport, effect: float | None = None) -> list[Power]:
    """Per comparison: the by-seed Δ and its paired sd, the minimum detectable Δ at those pairs (80% power,
    two-sided 5%), the seeds needed for the observed Δ and for ``effect`` (points)."""
    avg = {(ch.variant, ch.seed): 100 * ch.avg for ch in report.children}
    out = []
    for variant, vs in comparisons(report):
        seeds = sorted(s for v, s in avg if v == variant and (vs, s) in avg)
        diffs = [avg[variant, s] - avg[vs, s] for s in seeds]
        if not diffs:
            continue
        delta, sd = sum(diffs) / len(diffs), sample_sd(diffs)
        out.append(Power(variant, vs, len(diffs), delta, sd, min_detectable_delta(sd, len(diffs)),
                         seeds_needed(delta, sd), seeds_needed(effect, sd) if effect else None))
    return out


def power_rows(report: AblationReport, effect: float | None = None) -> list[dict[str, str]]:
    """:func:`power_table` as text cells."""
    rows = []
    for p in power_table(report, effect):
        row = {"variant": p.variant, "vs": p.vs, "seed pairs": str(p.pairs), "Δ by seed": f"{p.delta:+.1f}",
               "paired sd": num(p.sd), "detectable Δ (80%)": num(p.detectable),
               "seeds for Δ": str(p.needed) if p.needed else "—"}
        if effect:
            row[f"seeds for {effect:g}"] = str(p.needed_effect) if p.needed_effect else "—"
        rows.append(row)
    return rows


def equal_budget_table(report: AblationReport) -> list[EqualBudget]:
    """Each comparison at equal budget on every axis the children logged (samples; tokens and FLOPs from the
    trainer's ``compute/*``)."""
    by = {}
    for ch in report.children:
        by.setdefault(ch.variant, []).append(ch)
    out = []
    for variant, vs in comparisons(report):
        for axis in AXES:
            if axis == "steps":
                continue
            e = equal_budget(variant, by.get(variant, []), vs, by.get(vs, []), axis)
            if e is not None:
                out.append(e)
    return out


FIT_CMP_LEGEND = ("ΔA: the fitted ceilings' difference paired by seed (both fits identified), mean ± Student t 95%; "
                  "ΔB, the efficiencies' difference, when the ceilings lie within ±2 points (then the faster curve is "
                  "the better recipe).")
BUDGET_LEGEND = ("Δ at equal budget: each seed's pair read at the smaller of the two final budgets, each curve "
                 "interpolated linearly between the two validations around it (steps read: a–b; one step when the "
                 "budget falls on a validation); 95% CI Student t over the seeds.")
FIT_LEGEND = ("Fit of each child's validation curve over generated samples to R(C) = R0 + (A − R0)/(1 + (C_mid/C)^B) "
              "(ScaleRL); A: ceiling, B: efficiency, C_mid: samples at half the gain; A and B: mean ± Student t 95% "
              "over the seeds whose fit is identified; predictions are the mean fitted curve at 2x and 10x each "
              "child's budget; points: validations per seed, step 0 included (a fit needs 5).")
POWER_LEGEND = ("Paired two-sided t-test over seeds at 5%: paired sd of the by-seed Δ (points), the smallest Δ detected "
                "with 80% power at the seeds run (noncentral t), and the seeds needed to detect the observed Δ "
                "(— when Δ is 0 or more than 10,000 seeds would be needed).")


def fit_sections(report: AblationReport, effect: float | None = None) -> list[tuple[str, str, list[dict[str, str]]]]:
    """``(title, legend, rows)`` of the sections "Curve fits", "Power" and "Δ at equal budget (interpolated)"
    (those with rows): what report.md, report.html, the parent run's description and the terminal show."""
    sections = [("Curve fits", FIT_LEGEND, fit_rows(report)),
                ("Rungs compared on their fits", FIT_CMP_LEGEND, fit_comparison_rows(report)),
                ("Power", POWER_LEGEND, power_rows(report, effect)),
                ("Δ at equal budget (interpolated)", BUDGET_LEGEND, budget_rows(equal_budget_table(report)))]
    setup = Setup.from_tag(report.tags.get(SETUP_TAG, ""))
    if setup is not None:
        waves = replay(setup, [row.name for row in report.rows], {(ch.variant, ch.seed): 100 * ch.avg for ch in report.children})
        sections += [("Waves (sequential seeds)", WAVES_LEGEND, wave_rows(waves, setup, len(report.rows))),
                     ("Decisions (sequential seeds)", f"{DECISIONS_LEGEND} {upper_first(stop_line(waves, setup.equivalence))}.",
                      decision_rows(waves))]
    return [s for s in sections if s[2]]


def section_tables(report: AblationReport, effect: float | None = None) -> dict[str, dict[str, list]]:
    """The sections :func:`fit_sections` as MLflow tables (pandas' "split" form, ``{"columns", "data"}``, what
    ``mlflow.log_table`` writes), keyed ``tables/<title as a slug>.json``: the parent run's table artifacts."""
    return {f"tables/{slug(title)}.json": {"columns": list(rows[0]), "data": [list(r.values()) for r in rows]}
            for title, _legend, rows in fit_sections(report, effect)}


def slug(title: str) -> str:
    """``"Δ at equal budget (interpolated)"`` → ``"delta-at-equal-budget-interpolated"`` (ASCII, for a file name)."""
    words = re.findall(r"[a-z0-9]+", title.replace("Δ", "delta").lower())
    return "-".join(words)


def upper_first(text: str) -> str:
    """``text`` with its first letter upper-case (``str.capitalize`` would lower the rest: "Power" → "power")."""
    return text[:1].upper() + text[1:]


def fit_markdown_sections(report: AblationReport, effect: float | None = None) -> list[tuple[str, list[str]]]:
    """Each of :func:`fit_sections` as ``(title, its Markdown lines)``."""
    out = []
    for title, legend, rows in fit_sections(report, effect):
        head = list(rows[0])
        out.append((title, ["", f"## {title}", "", legend, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head),
                            *("| " + " | ".join(r[h] for h in head) + " |" for r in rows)]))
    return out


def fit_markdown(report: AblationReport, effect: float | None = None) -> list[str]:
    """``report.md``'s sections :func:`fit_sections`."""
    return [line for _title, lines in fit_markdown_sections(report, effect) for line in lines]


def within_limit(head: list[str], sections: list[tuple[str, list[str]]], limit: int) -> list[str]:
    """``head`` and as many of ``sections``, in order, as fit in ``limit`` characters joined by newlines; the
    sections left out named on a last line (MLflow cuts a longer run description at its tag limit mid-table)."""
    lines, left_out = list(head), []
    for title, body in sections:
        if len("\n".join(lines + body)) + 200 <= limit:
            lines += body
        else:
            left_out.append(title)
    if left_out:
        lines += ["", f"Left out here for MLflow's {limit:,}-character limit: {', '.join(left_out)}; they are in the "
                      "report/report.md artifact and as tables under tables/."]
    return lines


def fit_html(report: AblationReport, effect: float | None = None) -> list[str]:
    """``report.html``'s sections :func:`fit_sections`, every cell escaped."""
    esc = html.escape
    parts: list[str] = []
    for title, legend, rows in fit_sections(report, effect):
        parts += [f"<h2>{esc(title)}</h2>", f"<p>{esc(legend)}</p>",
                  "<table border='1' cellspacing='0' cellpadding='3'><tr>" + "".join(f"<th>{esc(h)}</th>" for h in rows[0]) + "</tr>",
                  *("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in r.values()) + "</tr>" for r in rows), "</table>"]
    return parts


def interval(mean: float, half: float, scale: float) -> str:
    if not math.isfinite(mean):
        return "—"
    text = f"{scale * mean:.1f}" if scale == 100 else f"{mean:.2f}"
    if math.isfinite(half):
        text += f" ± {scale * half:.1f}" if scale == 100 else f" ± {half:.2f}"
    return text


def pct(v: float) -> str:
    return f"{100 * v:.1f}" if math.isfinite(v) else "—"


def num(v: float) -> str:
    return f"{v:.1f}" if math.isfinite(v) else "—"


def plot_fits(report: AblationReport, out_dir: Path) -> Path:
    """``curves_samples/fits.png``: each child's validations (points) over generated samples and, where its fit is
    identified, the fitted curve (dashed, to twice its budget), one colour per variant; written atomically."""
    import numpy as np
    from matplotlib.figure import Figure

    from dapo_cli.ablate.plots import legend_label

    fig = Figure(figsize=(6.4, 4.0))
    fig.subplots_adjust(left=0.12, right=0.97, top=0.92, bottom=0.12)
    ax = fig.add_subplot()
    for i, row in enumerate(report.rows):
        colour = f"C{i % 10}"
        for j, ch in enumerate(c for c in report.children if c.variant == row.name):
            c, r = samples_curve(ch)
            ax.plot(c, r, "o", color=colour, markersize=3, alpha=0.8, label=legend_label(row) if j == 0 else None)
            fit = child_fit(ch)
            if fit.fitted:
                xs = np.linspace(0.0, 2 * fit.budget, 100)
                ax.plot(xs, [fit.predict(x) for x in xs], "--", color=colour, linewidth=1)
    ax.set_xlabel("generated samples (cumulative)")
    ax.set_ylabel(f"val/avg_at_{report.k}")
    ax.set_title(f"validation and fitted R(C) — {report.name}", fontsize=9)
    if ax.lines:
        ax.legend(fontsize=7)
    path = out_dir / "curves_samples" / "fits.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    return path
