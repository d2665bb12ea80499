"""``dapo prepare-data`` throughput on a synthetic 17k-problem input with a realistic answer mix.

    .venv/bin/python benchmarks/prepare_data_speed.py [--problems 17000] [--repeats 3]

The input is a raw JSONL file (``problem`` + ``answer``, or a ``solution`` ending in
``\\boxed{}``) written here with a fixed seed: problems of 150-600 characters of English and
LaTeX, and answers drawn from a mix modelled on public competition sets (MATH / DAPO-Math-17k):

==========================  =====  =====================================================
answer kind                 share  examples
==========================  =====  =====================================================
integer                      52%   ``42``, ``-7``, ``1,000``, ``$27$``, ``27^\\circ``
fraction                     14%   ``\\frac{3}{4}``, ``-\\dfrac{5}{12}``, ``7/9``
surd                          8%   ``2\\sqrt{3}``, ``\\frac{1+\\sqrt{5}}{2}``
multiple of pi                4%   ``3\\pi``, ``\\frac{\\pi}{6}``
decimal                       4%   ``0.25``, ``3.75``, ``1.6``
interval / tuple / set        5%   ``(2, 3)``, ``[0, 1)``, ``\\{1, 2\\}``
expression with variables     4%   ``x^2+1``, ``2a-b``
text / choice                 4%   ``\\text{yes}``, ``(B)``
boxed in a solution           5%   ``... so the answer is \\boxed{12}`` (no answer field)
==========================  =====  =====================================================

and 3% of the problems repeat an earlier one (the deduplication path). Each run is the
function the CLI calls (``dapo_cli.data.prepare.run_prepare``, MLflow off) in this process;
one more row runs the CLI itself (``python -m dapo_cli prepare-data``, MLflow to a SQLite
store in a temporary folder), start-up included. problems/s = input rows / seconds.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine, median, table, thread_env

WORDS = ("Let", "the", "triangle", "sequence", "function", "integer", "positive", "real", "number", "points",
         "circle", "radius", "area", "sum", "product", "digits", "probability", "chosen", "random", "value",
         "find", "compute", "determine", "such", "that", "each", "of", "and", "is", "are", "with", "if")
MATH = ("$x^2 + {a}x + {b} = 0$", "$\\frac{{{a}}}{{{b}}}$", "$\\sqrt{{{a}}}$", "$a_n = {a}n + {b}$",
        "$\\triangle ABC$", "$AB = {a}$", "$f(x) = x^{a} - {b}$", "$\\binom{{{a}}}{{{b}}}$", "${a} \\times {b}$")


def problem_text(rng: random.Random, i: int) -> str:
    parts = []
    while sum(len(p) + 1 for p in parts) < rng.randint(150, 600):
        if rng.random() < 0.25:
            parts.append(rng.choice(MATH).format(a=rng.randint(2, 99), b=rng.randint(2, 99)))
        else:
            parts.append(rng.choice(WORDS))
    return f"Problem {i}: " + " ".join(parts) + "?"


def answer(rng: random.Random) -> tuple[str, dict[str, str]]:
    """(kind, fields) for one row: ``answer`` (or a ``solution`` with a box) in a realistic form."""
    u = rng.random()
    a, b = rng.randint(1, 99), rng.randint(2, 99)
    if u < 0.52:
        form = rng.choice(["{n}", "{n}", "{n}", "-{n}", "{n:,}", "${n}$", "{n}^\\circ", "{n}\\text{{ cm}}"])
        return "integer", {"answer": form.format(n=rng.randint(0, 5000))}
    if u < 0.66:
        form = rng.choice(["\\frac{{{a}}}{{{b}}}", "-\\dfrac{{{a}}}{{{b}}}", "{a}/{b}", "\\tfrac{{{a}}}{{{b}}}"])
        return "fraction", {"answer": form.format(a=a, b=b)}
    if u < 0.74:
        form = rng.choice(["{a}\\sqrt{{{c}}}", "\\frac{{{a}+\\sqrt{{{c}}}}}{{{b}}}", "\\sqrt{{{c}}}", "{a}-\\sqrt{{{c}}}"])
        return "surd", {"answer": form.format(a=a, b=b, c=rng.choice([2, 3, 5, 6, 7, 10, 11, 13, 15]))}
    if u < 0.78:
        form = rng.choice(["{a}\\pi", "\\frac{{\\pi}}{{{b}}}", "\\frac{{{a}\\pi}}{{{b}}}"])
        return "pi", {"answer": form.format(a=a, b=b)}
    if u < 0.82:
        return "decimal", {"answer": rng.choice(["0.25", "3.75", "1.6", "12.5", "0.125", "2.0"])}
    if u < 0.87:
        return "interval/tuple", {"answer": rng.choice([f"({a}, {b})", f"[0, {a})", f"\\{{{a}, {b}\\}}", f"(-\\infty, {a}]"])}
    if u < 0.91:
        return "variables", {"answer": rng.choice([f"x^2+{a}", f"{a}a-b", f"\\frac{{x}}{{{b}}}", "2n+1"])}
    if u < 0.95:
        return "text/choice", {"answer": rng.choice(["\\text{yes}", "(B)", "\\text{Monday}", "E"])}
    return "boxed", {"solution": f"We compute step by step and find that the result is $\\boxed{{{rng.randint(0, 999)}}}$."}


def write_input(path: Path, problems: int, seed: int = 0) -> dict[str, int]:
    rng = random.Random(seed)
    kinds: dict[str, int] = {}
    seen: list[dict[str, str]] = []
    with path.open("w", encoding="utf-8") as f:
        for i in range(problems):
            if seen and rng.random() < 0.03:
                row = rng.choice(seen)  # a repeated problem
                kinds["duplicate"] = kinds.get("duplicate", 0) + 1
            else:
                kind, fields = answer(rng)
                row = {"problem": problem_text(rng, i), **fields}
                kinds[kind] = kinds.get(kind, 0) + 1
                if len(seen) < 2000:
                    seen.append(row)
            f.write(json.dumps(row) + "\n")
    return kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=17_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from dapo_cli.data.prepare import PrepareOptions, run_prepare

    header = machine()
    started = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="prepare-bench-") as tmp:
        raw = Path(tmp) / "raw.jsonl"
        kinds = write_input(raw, args.problems)
        times, result = [], None
        for i in range(args.repeats):
            t0 = time.perf_counter()
            result = run_prepare(PrepareOptions(output=Path(tmp) / f"out{i}.parquet", inputs=(raw,), track=False))
            times.append(time.perf_counter() - t0)
        seconds = median(times)
        rows.append(["run_prepare (in process, MLflow off)", seconds, f"{args.problems / seconds:,.0f}", result.train_rows])
        cli = [sys.executable, "-m", "dapo_cli", "prepare-data", str(raw), "-o", str(Path(tmp) / "cli.parquet")]
        env = {**thread_env(1), "MLFLOW_TRACKING_URI": f"sqlite:///{Path(tmp) / 'mlflow.db'}"}
        t0 = time.perf_counter()
        proc = subprocess.run(cli, env=env, capture_output=True, text=True, cwd=tmp)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            sys.exit(f"dapo prepare-data failed:\n{proc.stderr[-3000:]}")
        rows.append(["dapo prepare-data (CLI, MLflow SQLite, start-up included)", wall, f"{args.problems / wall:,.0f}", result.train_rows])
        dropped = {}
        for report in result.files:
            for reason, n in report.dropped.items():
                dropped[reason] = dropped.get(reason, 0) + n
    print(f"prepare-data speed: {args.problems:,} raw problems (JSONL), median of {args.repeats} in-process runs "
          f"({time.perf_counter() - started:.0f} s in all)")
    for line in header:
        print(line)
    print("input mix: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])))
    print("dropped: " + (", ".join(f"{k} {v}" for k, v in sorted(dropped.items(), key=lambda kv: -kv[1])) or "none"))
    print()
    print(table(["how", "s", "problems/s", "rows kept"], rows))
    print()
    print(f"prepare-data speed: {args.problems / seconds:,.0f} problems/s (in process)")


if __name__ == "__main__":
    main()
