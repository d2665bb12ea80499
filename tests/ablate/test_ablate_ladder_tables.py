"""docs/real-model-ladder/tables.py, which prints the ladder page's summary tables from the committed report.json:
each number it prints is the report's own (so the page's tables are the report's, and a renamed report table fails
here, not silently on the page)."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "real-model-ladder" / "tables.py"
REPORT = ROOT / "docs" / "real-model-ladder" / "report.json"


def test_the_page_tables_carry_the_reports_numbers() -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), str(REPORT)], capture_output=True, text=True, check=True).stdout
    report = json.loads(REPORT.read_text())
    lines = out.splitlines()
    short = runpy.run_path(str(SCRIPT))["short"]
    for row in report["rows"]:  # the ladder table: the end point and both intervals, as dapo report rounds them
        name = short(row["name"])
        (line,) = [ln for ln in lines if ln.startswith(f"| {name} | {row['label']} |")]
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[2:5] == [f"{100 * row['mean']:.1f}", f"±{100 * row['seed_half']:.1f}",
                              f"±{100 * row['problem_half']:.1f}"]
        assert cells[-1] == str(len(row["seeds"]))
    decisions = report["fit_tables"]["tables/decisions-sequential-seeds.json"]["data"]
    assert sum(" vs " in ln and "(look " in ln for ln in lines) == len(decisions) > 0
    mechanism_rows = [ln for ln in lines if ln.startswith("| ") and not ln.startswith("| variant") and "→" in ln]
    assert len(mechanism_rows) == len(report["mechanisms_table"]) and all(ln.count("|") == 10 for ln in mechanism_rows)


def test_short_names_mark_the_dr_grpo_twins_only() -> None:
    short = runpy.run_path(str(SCRIPT))["short"]
    assert short("grpo@adv_estimator=grpo") == "GRPO"
    assert short("dapo@adv_estimator=dr_grpo") == "DAPO (Dr. GRPO)"
    assert short("grpo+overlong_filtering+clip_higher+overlong_shaping@adv_estimator=grpo") == "+SOP"
