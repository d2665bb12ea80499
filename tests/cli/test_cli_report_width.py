"""`dapo report`'s terminal tables fit 80 columns: every column (abbreviated, with a legend) and
every cell whole, at the widest values a full ladder and a grid produce, in the results table,
the mechanisms table and the Δ-at-equal-samples table; wider terminals keep the bordered tables."""

from __future__ import annotations

import os
import re

import pytest
from rich.console import Console

from dapo_cli.ablate.mechanisms import mechanism_table_rows
from dapo_cli.ablate.variants import LADDER_LABELS, LADDER_NAMES
from dapo_cli.ablate.report import table_rows
from dapo_cli.ablate.results import AblationReport, EqualSamples, MechanismRow, VariantRow
from dapo_cli.cli.report import (
    EQUAL_SAMPLES_HEADS,
    NARROW_HEADS,
    SHORT_HEADS,
    TECHNIQUE_LINE,
    print_report,
    terminal_columns,
)
from dapo_cli.eval.metrics import PairedComparison


def row(position: int, name: str, label: str, paper: float | None, *, delta: bool) -> VariantRow:
    """A variant with the widest cells: three-digit percentages, signed intervals, 6-digit samples."""
    return VariantRow(
        position=position, name=name, label=label, paper=paper, seeds=[0, 1, 2], avgs=[0.1, 0.2, 0.3],
        mean=1.0 if position == 5 else 0.123, seed_half=0.4567, problem_half=0.1234,
        shares={"truncated": 0.999, "kept_groups": 1.0}, samples=123456.0, final_steps=[100, 100, 100],
        delta_vs="x" if delta else None,
        delta=PairedComparison(mean_a=0.0, mean_b=0.999, diff=-0.999, ci_low=-1.0, ci_high=1.0, share_positive=0.5, num_problems=30) if delta else None,
        equal_samples=EqualSamples(  # seeds at different steps: the longest steps cell
            vs="x", budget=123456.0, steps=[100, 50, 100], ref_steps=[100, 100, 100],
            delta=PairedComparison(mean_a=0.0, mean_b=1.0, diff=-1.0, ci_low=-1.0, ci_high=0.999, share_positive=0.0, num_problems=30),
        ) if delta else None,
    )


def mech(r: VariantRow) -> MechanismRow:
    """The widest mechanism cells: entropy ≥ 10 nats, 100% shares, 5-digit token counts."""
    return MechanismRow(
        position=r.position, name=r.name, label=r.label, seeds=3, entropy_start=11.932, entropy_end=0.079,
        clip_high=0.1234, clip_low=1.0, masked=1.0, truncated_early=1.0, truncated_late=0.999, truncated_on_path=1.0,
        truncated_looping=0.999, spread_early=10240.0, spread_late=10239.9, length_mean=20480.0, informative_early=1.0, informative_late=0.999, samples=r.samples,
    )


def ladder() -> AblationReport:
    rows = [row(i, n, lab, p, delta=i > 0) for i, (n, lab, p) in enumerate(zip(LADDER_NAMES, LADDER_LABELS, (30, 36, 38, 41, 42, 50)))]
    return AblationReport(parent_run_id="0123456789abcdef0123456789abcdef", name="dapo-tiny-ladder-abcdef", mode="ladder",
                          tags={}, k=32, rows=rows, children=[], mechanisms=[mech(r) for r in rows])


def grid() -> AblationReport:
    names = ["grpo+overlong_filtering+overlong_shaping+token_level_loss+dynamic_sampling", "dapo"]
    rows = [row(0, names[0], "", None, delta=False), row(1, names[1], LADDER_LABELS[-1], 50, delta=True)]
    return AblationReport(parent_run_id="f" * 32, name="g", mode="grid", tags={}, k=4, rows=rows, children=[],
                          mechanisms=[mech(r) for r in rows])


def render(report: AblationReport, width: int) -> str:
    out = Console(width=width, record=True, file=open("/dev/null", "w"), color_system=None)
    print_report(report, out)
    return out.export_text()


@pytest.mark.parametrize("make", [ladder, grid])
def test_at_80_columns_every_column_and_every_cell_is_there(make) -> None:
    report = make()
    text = render(report, 80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, "\n".join(line for line in lines if len(line) > 80)
    rows = table_rows(report)
    heads = terminal_columns(rows, ladder=report.mode == "ladder")
    assert {"samples", "kept groups %", "truncated %", "Δ 95% CI (paired)"} <= set(heads)
    header_line = next(line for line in lines if line.lstrip().startswith("#"))
    legend = text[text.index("#"):]
    for head in heads:
        short = NARROW_HEADS.get(head, (head.replace(" %", ""), ""))[0]
        assert short in header_line, (head, header_line)
        if head in NARROW_HEADS:
            assert f"{short} = {NARROW_HEADS[head][1]}" in " ".join(legend.split()), head  # explained below the table
    body = lines[lines.index(header_line) + 2 : next(i for i, line in enumerate(lines) if line.startswith("# = "))]
    shorts = [NARROW_HEADS.get(h, (h, ""))[0] for h in heads]
    for r in rows:
        for head in heads:
            if head not in ("variant", "paper row"):  # numbers stay whole, on one line, as report.md shows them
                assert re.search(rf"(^|\s){re.escape(r[head])}(\s|$)", "\n".join(body), re.MULTILINE), (head, r[head])
    for head in ("variant", "paper row"):  # names may wrap within their column, never lose a character
        if head in heads:
            i = heads.index(head)
            start, end = header_line.index(shorts[i]), header_line.index(shorts[i + 1], header_line.index(shorts[i]) + 1)
            column = "".join("".join(line[start:end].split()) for line in body)
            for r in rows:
                assert "".join(r[head].split()) in column, (head, r[head], column)


def section(text: str, title: str, end: str) -> str:
    """The lines of ``text`` from the one holding ``title`` to the one starting with ``end`` (excluded)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if title in line)
    stop = next(i for i, line in enumerate(lines[start:], start) if line.startswith(end))
    return "\n".join(lines[start:stop])


@pytest.mark.parametrize("make", [ladder, grid])
def test_at_80_columns_the_mechanisms_and_equal_samples_tables_show_every_value(make) -> None:
    report = make()
    text = render(report, 80)
    assert max(len(line) for line in text.splitlines()) <= 80
    flat = " ".join(text.split())
    # the table, in one part or (too wide for 80 columns) in parts, each with its header and legend
    mech = section(text, "Mechanisms (what each technique acts on)", "each technique at work")
    for r in mechanism_table_rows(report):  # every diagnostic but samples (the results table has it), whole
        for head in set(r) - {"rung", "variant", "paper row", "samples"}:
            assert re.search(rf"(^|\s){re.escape(r[head])}(\s|$)", mech, re.MULTILINE), (head, r[head])
            short, meaning = NARROW_HEADS[head]
            narrow = re.search(rf"(^|\s){re.escape(short)}(\s|$)", mech, re.MULTILINE) and f"{short} = {meaning}" in flat
            assert narrow or SHORT_HEADS[head] in mech, head  # a part that fits bordered has the longer headers
    assert " ".join(TECHNIQUE_LINE.split()) in flat
    eq = section(text, "Δ at equal generated samples", "each child at its latest validation step")
    rows = [r for r in table_rows(report) if r["Δ equal samples %"] != "—"]
    assert len(rows) == len(report.rows) - 1
    bordered = "┃ rung ┃" in eq  # it fits with the longer headers (and without the names) at 80 columns
    for r in rows:
        for head in EQUAL_SAMPLES_HEADS:
            assert re.search(rf"(^|\s){re.escape(r[head])}(\s|$)", eq, re.MULTILINE), (head, r[head])
            short, meaning = NARROW_HEADS[head]
            assert SHORT_HEADS[head] in eq if bordered else f"{short} = {meaning}" in flat, head
    assert "@100/50/100 vs @100" in eq and "[-100.0, +99.9]" in eq


def test_a_wide_terminal_keeps_the_bordered_table_without_a_legend() -> None:
    text = render(ladder(), 200)
    assert "┃ rung ┃" in text and "│    5 │ + Dynamic Sampling (DAPO)  │" in text
    assert all(h in text for h in ("±CI seeds", "Δ CI (paired)", "kept %", "samples")) and "ppr =" not in text
    assert "clip hi %" in text and "informative %" in text and "11.932→0.079" in text and "ent =" not in text
    assert "steps (this vs ref)" in text and "@100/50/100 vs @100" in text and "│    5 │ + Dynamic Sampling (DAPO)  │ " in text
    assert max(len(line) for line in text.splitlines()) <= 200
    assert set(SHORT_HEADS) <= set(NARROW_HEADS)


def test_at_80_columns_a_long_steps_list_takes_the_narrow_equal_samples_table() -> None:
    report = ladder()
    for r in report.rows[1:]:  # six seeds at 4-digit steps: 38 characters, too wide for the bordered table
        r.equal_samples.steps, r.equal_samples.ref_steps = [1000, 500, 1000, 1000, 1000, 1000], [1000] * 6
    text = render(report, 80)
    assert max(len(line) for line in text.splitlines()) <= 80
    eq = section(text, "Δ at equal generated samples", "each child at its latest validation step")
    assert "┃" not in eq and eq.splitlines()[1].split() == ["#", "Δs", "ΔsCI", "steps", "budget"]
    assert eq.count(" @1000/500/1000/1000/1000/1000 vs @1000 ") == 5 and eq.count(" 123456") == 5
    flat = " ".join(text.split())
    assert all(f"{NARROW_HEADS[h][0]} = {NARROW_HEADS[h][1]}" in flat for h in EQUAL_SAMPLES_HEADS)
