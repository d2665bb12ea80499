"""`dapo report`'s terminal table fits 80 columns: every column (abbreviated, with a legend) and
every cell whole, at the widest values a full ladder and a grid produce; wider terminals keep
the bordered table."""

from __future__ import annotations

import os
import re

import pytest
from rich.console import Console

from dapo_cli.ablate.plan import LADDER_LABELS, LADDER_NAMES
from dapo_cli.ablate.report import AblationReport, VariantRow, table_rows
from dapo_cli.cli.report import (
    NARROW_HEADS,
    SHORT_HEADS,
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
    )


def ladder() -> AblationReport:
    rows = [row(i, n, lab, p, delta=i > 0) for i, (n, lab, p) in enumerate(zip(LADDER_NAMES, LADDER_LABELS, (30, 36, 38, 41, 42, 50)))]
    return AblationReport(parent_run_id="0123456789abcdef0123456789abcdef", name="dapo-tiny-ladder-abcdef", mode="ladder",
                          tags={}, k=32, rows=rows, children=[])


def grid() -> AblationReport:
    names = ["grpo+overlong_filtering+overlong_shaping+token_level_loss+dynamic_sampling", "dapo"]
    rows = [row(0, names[0], "", None, delta=False), row(1, names[1], LADDER_LABELS[-1], 50, delta=True)]
    return AblationReport(parent_run_id="f" * 32, name="g", mode="grid", tags={}, k=4, rows=rows, children=[])


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


def test_a_wide_terminal_keeps_the_bordered_table_without_a_legend() -> None:
    text = render(ladder(), 200)
    assert "┃ rung ┃" in text and "│    5 │ + Dynamic Sampling (DAPO)  │" in text
    assert all(h in text for h in ("±CI seeds", "Δ CI (paired)", "kept %", "samples")) and "ppr =" not in text
    assert max(len(line) for line in text.splitlines()) <= 200
    assert set(SHORT_HEADS) <= set(NARROW_HEADS)
