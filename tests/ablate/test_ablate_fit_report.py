"""`dapo report`'s curve-fit and power sections on the committed real-model ladder (docs/real-model-ladder-36/report.json:
6 rungs x 3 seeds, validations at steps 0/4/8), printed in the terminal and written to Markdown."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from rich.console import Console

from dapo_cli.ablate.fit_report import child_fit, fit_markdown, power_table, samples_curve
from dapo_cli.ablate.results import AblationReport, ChildResult, VariantRow
from dapo_cli.ablate.stats import min_detectable_delta, sample_sd
from dapo_cli.cli.report import print_fits

REPORT = Path(__file__).resolve().parents[2] / "docs" / "real-model-ladder-36" / "report.json"


def committed_ladder() -> AblationReport:
    """The report.json `dapo ablate` wrote, read back into the report's types (curves keyed by int step)."""
    d = json.loads(REPORT.read_text())
    children = [ChildResult(**{**c, "curves": {m: {int(s): v for s, v in h.items()} for m, h in c["curves"].items()},
                               "tables": {}}) for c in d["children"]]
    rows = [VariantRow(**{**r, "delta": None, "equal_samples": None}) for r in d["rows"]]
    return AblationReport(d["parent_run_id"], d["name"], d["mode"], d["tags"], d["k"], rows, children)


def test_samples_curve_of_a_child() -> None:
    report = committed_ladder()
    c, r = samples_curve(report.children[0])
    # validations at steps 0, 4, 8; 64 samples a step → budgets 0, 256, 512; grpo seed 0's avg@2 .06, .51, .485
    assert c == [0.0, 256.0, 512.0] and r == [0.06, 0.51, 0.485]


def test_every_rung_of_the_committed_ladder_is_not_identified_with_three_points() -> None:
    report = committed_ladder()
    fits = [child_fit(ch) for ch in report.children]
    assert len(fits) == 18 and all(f.verdict == "not identified" for f in fits)
    assert {f.reason for f in fits} == {"too few points (3 validations, a fit needs 5)"}


def test_power_of_dapo_against_grpo_by_hand() -> None:
    report = committed_ladder()
    power = {(p.variant, p.vs): p for p in power_table(report, effect=5)}
    p = power["dapo", "grpo"]
    # DAPO − GRPO by seed: +9.5, +2.0, +32.5 (docs/real-model-ladder-36.md); mean 14.67, sd 15.9 (the closing note)
    assert p.pairs == 3 and p.delta == pytest.approx(44.0 / 3, abs=1e-9)
    assert p.sd == pytest.approx(sample_sd([9.5, 2.0, 32.5]), abs=1e-9) and p.sd == pytest.approx(15.9, abs=0.05)
    assert p.detectable == pytest.approx(min_detectable_delta(p.sd, 3), abs=1e-9) and p.detectable > p.delta
    assert p.needed > 3 and p.needed_effect > p.needed  # 5 points need more seeds than 14.7
    # a ladder compares each rung with the previous and with the first: 5 + 4 comparisons
    assert len(power) == 9 and ("grpo+overlong_filtering", "grpo") in power


@pytest.mark.slow
def test_the_sections_are_printed_and_written() -> None:
    report = committed_ladder()
    out = Console(width=200, record=True)
    print_fits(report, out, effect=5)
    text = out.export_text()
    assert "Curve fits (validation over generated samples)" in text and "Power (paired t over seeds)" in text
    # each rung's reasons counted over its seeds (each fit's numbers stay in report.json): a cell, not a paragraph
    assert "too few points (3 of 3 seeds)" in text and "3/3/3" in text
    assert "seeds for 5" in text and "detectable Δ (80%)" in text
    dapo_line = next(line for line in text.splitlines() if "DAPO" in line and "GRPO" in line and "+14.7" in line)
    assert "15.9" in dapo_line
    md = "\n".join(fit_markdown(report, effect=5))
    assert "## Curve fits" in md and "## Power" in md and "| dapo | grpo | 3 | +14.7 | 15.9 |" in md
    assert not math.isnan(power_table(report)[0].sd)
    # Δ at equal samples, interpolated: DAPO (seeds 0-2) against GRPO at GRPO's 512 samples, never step 0
    assert "Δ at equal budget (interpolated)" in text and "## Δ at equal budget (interpolated)" in md
    dapo_budget = next(line for line in md.splitlines() if line.startswith("| dapo | grpo | samples |"))
    assert "; 0" not in dapo_budget and "0; " not in dapo_budget


@pytest.mark.slow
def test_the_sections_are_in_the_html_and_the_parent_runs_description() -> None:
    from dapo_cli.ablate.report import summary_markdown, to_html

    report = committed_ladder()
    page = to_html(report, {"step": [], "samples": []}, Path("."), effect=5)
    assert "<h2>Curve fits</h2>" in page and "<h2>Power</h2>" in page and "<th>seeds for 5</th>" in page
    assert "<td>too few points (3 of 3 seeds)</td>" in page
    note = summary_markdown(report)  # the MLflow parent's description
    assert "## Curve fits" in note and "## Power" in note and "| dapo | grpo | 3 | +14.7 | 15.9 |" in note
    assert len(note) <= 8000  # MLflow's tag limit: a longer description is cut mid-table


def test_the_description_keeps_whole_sections_within_the_limit_and_names_the_rest() -> None:
    from dapo_cli.ablate.fit_report import within_limit

    head = ["**Ablation x**", "", "| a |", "|---|", "| 1 |"]
    sections = [("Big", ["", "## Big", "x" * 500]), ("Small", ["", "## Small", "y" * 50])]
    # 5 head lines (32 chars) + Small fits in 400 (with the 200 kept for the last line); Big does not
    lines = within_limit(head, sections, 400)
    text = "\n".join(lines)
    assert "## Small" in text and "## Big" not in text and len(text) <= 400
    assert lines[-1].startswith("Left out here for MLflow's 400-character limit: Big;")
    assert within_limit(head, sections, 10_000) == head + sections[0][1] + sections[1][1]  # everything fits


@pytest.mark.slow
def test_the_fitted_curves_are_drawn_over_the_points(tmp_path: Path) -> None:
    import numpy as np

    from dapo_cli.ablate.curves import saturating
    from dapo_cli.ablate.fit_report import plot_fits

    report = committed_ladder()
    # one more child of grpo with 9 validations on a known curve (64 samples a step): its fit is identified
    val = {s: float(saturating(64.0 * s, 0.1, 0.7, 1.5, 120.0)) for s in range(0, 17, 2)}
    report.children.append(ChildResult("x", "grpo", 9, 2, 16, val[16], 0.0, {f"p{i}": 0.5 for i in range(100)},
                                       {"val/avg_at_k": val, "train/samples_generated": {s: 64.0 for s in range(1, 17)}}))
    assert child_fit(report.children[-1]).fitted
    from dapo_cli.ablate.fit_report import fit_comparison_rows

    assert fit_comparison_rows(report) == []  # no other variant has a fit: nothing to compare
    # a dapo child on a higher curve (A = .8) for the same seed: ΔA = +10 by one pair (no interval)
    val2 = {s: float(saturating(64.0 * s, 0.1, 0.8, 1.5, 120.0)) for s in range(0, 17, 2)}
    report.children.append(ChildResult("y", "dapo", 9, 2, 16, val2[16], 0.0, {f"p{i}": 0.5 for i in range(100)},
                                       {"val/avg_at_k": val2, "train/samples_generated": {s: 64.0 for s in range(1, 17)}}))
    row = next(r for r in fit_comparison_rows(report) if (r["variant"], r["vs"]) == ("dapo", "grpo"))
    assert row["seed pairs fitted"] == "1" and row["ΔA %"] == "10.0" and row["ΔB"] == "—"
    path = plot_fits(report, tmp_path)
    assert path == tmp_path / "curves_samples" / "fits.png" and path.read_bytes()[:4] == b"\x89PNG"
    assert np.isfinite(child_fit(report.children[-1]).a)


@pytest.mark.slow
def test_a_narrow_terminal_gets_every_fit_column_named_by_its_rung() -> None:
    # 60 columns: the fit table does not fit; it is split in groups, each led by the rung, no column cut
    report = committed_ladder()
    out = Console(width=60, record=True)
    print_fits(report, out)
    text = out.export_text()
    assert all(len(line) <= 60 for line in text.splitlines())
    fits = text.split("Curve fits (validation over generated samples)")
    assert len(fits) >= 3  # the title once per group: at least two groups
    for group in fits[1:]:
        # a row begins with its rung ("3 …" narrow, "│    3 │ …" bordered)
        rungs = [m.group(1) for m in (re.match(r"^[│ ]*(\d)[ │]", line) for line in group.splitlines()) if m]
        assert rungs[:6] == ["0", "1", "2", "3", "4", "5"]
    assert "too few points (3 of 3 seeds)" in text and "at 10x budget" in text


def test_the_fits_legend_tells_axis_twins_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 49's fits.png showed "+ Soft Overlong Punishment" and "+ Dynamic Sampling (DAPO)" twice each: the
    # adv_estimator=grpo and =dr_grpo twins share a rung label; the curve plots already added the axis settings
    from matplotlib.figure import Figure

    from dapo_cli.ablate.fit_report import plot_fits

    report = committed_ladder()
    dapo = next(r for r in report.rows if r.name == "dapo")
    for row in report.rows:
        row.name += "@adv_estimator=grpo"
    for child in report.children:
        child.variant += "@adv_estimator=grpo"
    twin = VariantRow(**{**dapo.__dict__, "position": len(report.rows), "name": "dapo@adv_estimator=dr_grpo"})
    report.rows.append(twin)
    report.children += [ChildResult(**{**c.__dict__, "variant": twin.name, "run_id": c.run_id + "-dr"})
                        for c in report.children if c.variant == "dapo@adv_estimator=grpo"]
    drawn: list[Figure] = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **kw: (drawn.append(fig), save(fig, *a, **kw))[1])
    plot_fits(report, tmp_path)
    labels = [t.get_text() for t in drawn[0].axes[0].get_legend().get_texts()]
    assert labels[-2:] == ["+ Dynamic Sampling (DAPO)@adv_estimator=grpo", "+ Dynamic Sampling (DAPO)@adv_estimator=dr_grpo"]
    assert len(set(labels)) == len(labels) == len(report.rows)
