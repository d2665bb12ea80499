"""The summary tables of docs/real-model-ladder.md ("The answer"), printed from the committed report.json.

Every number is read from the report `dapo report dapo-smollm2-ladder -o docs/real-model-ladder --effect 5` wrote
(itself recomputed from MLflow); nothing here computes a statistic. Usage, from the repo root:

    python docs/real-model-ladder/tables.py [docs/real-model-ladder/report.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SHORT = {
    "grpo": "GRPO", "grpo+overlong_filtering": "+OF", "grpo+overlong_filtering+clip_higher": "+CH",
    "grpo+overlong_filtering+clip_higher+overlong_shaping": "+SOP",
    "grpo+overlong_filtering+clip_higher+overlong_shaping+token_level_loss": "+TLL", "dapo": "DAPO",
}


def short(variant: str) -> str:
    """`dapo@adv_estimator=dr_grpo` -> `DAPO (Dr. GRPO)`; the `grpo` setting is the ladder's own and unmarked."""
    name, _, axis = variant.partition("@")
    return SHORT.get(name, name) + (" (Dr. GRPO)" if axis == "adv_estimator=dr_grpo" else "")


def table(columns: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
                     + ["| " + " | ".join(r) + " |" for r in rows])


def by_name(report: dict, key: str) -> list[dict]:
    spec = report["fit_tables"][f"tables/{key}.json"]
    return [dict(zip(spec["columns"], row)) for row in spec["data"]]


def ladder(report: dict) -> str:
    fits = {f["variant"]: f for f in by_name(report, "curve-fits")}
    rows = []
    for r in report["rows"]:
        f = fits[r["name"]]
        rows.append([short(r["name"]), r["label"], f"{100 * r['mean']:.1f}", f"±{100 * r['seed_half']:.1f}",
                     f"±{100 * r['problem_half']:.1f}", f["A %"], f["B"], f["C_mid (samples)"], f["verdict"],
                     f"{r['samples']:.0f}", str(len(r["seeds"]))])
    return table(["variant", "paper row", "avg@1 % at step 8", "95% CI seeds (t)", "95% CI problems", "A %", "B",
                  "C_mid (samples)", "fit", "samples", "seeds"], rows)


def at_budget(row: dict | None) -> str:
    return f"{row['Δ %']} {row['95% CI (t)']}" if row else "—"


def comparisons(report: dict) -> str:
    power = {(p["variant"], p["vs"]): p for p in by_name(report, "power")}
    budget = {(b["variant"], b["vs"], b["axis"]): b for b in by_name(report, "delta-at-equal-budget-interpolated")}
    rows = []
    for d in by_name(report, "decisions-sequential-seeds"):
        key = (d["variant"], d["vs"])
        p, s, f = power[key], budget.get((*key, "samples")), budget.get((*key, "FLOPs"))
        rows.append([f"{short(d['variant'])} vs {short(d['vs'])}",
                     f"{d['decision']} (look {d['wave']}, {d['seeds']} seeds)", d["Δ points"],
                     p["paired sd"], p["seeds for Δ"], p["seeds for 5"], at_budget(s), at_budget(f)])
    return table(["comparison", "decision", "Δ by seed ± the look's half-width", "paired sd", "seeds for Δ",
                  "seeds for 5 points", "Δ at equal samples (t)", "Δ at equal FLOPs (t)"], rows)


def mechanisms(report: dict) -> str:
    keys = ["entropy start→end (nats/token)", "clip high %", "clip low %", "truncated % early→late",
            "length spread early→late (tokens)", "length (tokens)", "informative groups % early→late", "samples"]
    rows = [[short(m["variant"])] + [m[k] for k in keys] for m in report["mechanisms_table"]]
    return table(["variant", *keys], rows)


def main() -> None:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).with_name("report.json"))
    report = json.loads(path.read_text(encoding="utf-8"))
    for title, make in (("The ladder", ladder), ("The comparisons", comparisons), ("Mechanisms", mechanisms)):
        print(f"#### {title}\n\n{make(report)}\n")


if __name__ == "__main__":
    main()
