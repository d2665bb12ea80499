"""Seconds per call of every verifier (response and ground-truth side) and of prepare-data's per-row steps, on hostile text.

    .venv/bin/python benchmarks/verifier_bounds.py [--repeat 3] [--sizes 1000,100000,1000000]

For each input kind (the hostile shapes of ``tests/rewards/test_hostile_corpus.py``:
unclosed ``\\text{``/``\\boxed{``, one ``$`` and a megabyte of digits, 100,000-level
nesting, ``Answer:`` repeated, towers, NUL bytes) and size, prints the best of
``--repeat`` wall times of one call, then the worst case per verifier and side. The
tests assert the bounds themselves (what each stage reads); this shows what they cost.

Rows:

* ``math_dapo`` / ``strict_box`` / ``math_equiv`` ``response``: ``verifier(text, "5")``;
* the same ``ground truth``: ``verifier("Answer: 5", text)`` (over 1,000 characters a
  ground truth is unscorable and not read; ``math_dapo.normalize_final_answer(text)``
  is timed too, uncapped, to show the normalisation itself is linear);
* ``prepare-data``: ``convert(problem, "1/2")`` (the fraction path scans the problem for
  letters; over 32,768 characters it is dropped unread) and ``convert("Compute.", answer)``
  (over 500 characters dropped unread), ``math_letters`` uncapped (the step that was
  quadratic), and ``json_nesting_excess`` of a JSON line holding the text.

Sizes of 400 characters reach the safe parser (it reads at most 500).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dapo_cli.data.convert import convert, math_letters  # noqa: E402
from dapo_cli.data.readers import json_nesting_excess  # noqa: E402
from dapo_cli.rewards import math_dapo, math_equiv  # noqa: E402
from dapo_cli.rewards.registry import VERIFIERS  # noqa: E402


def kinds(size: int) -> dict[str, str]:
    """Hostile text of about ``size`` characters, by kind."""

    def repeat(unit: str) -> str:
        return unit * max(1, size // len(unit))

    half = max(1, size // 2)
    return {
        "digits": "7" * size,
        "open \\text{": repeat("\\text{"),
        "open \\boxed{": repeat("\\boxed{"),
        "one $ + digits": "$" + "1" * (size - 1),
        "open \\(": repeat("\\("),
        "nested ()": "(" * half + "1" + ")" * half,
        "nested \\frac": repeat("\\frac{") + "1",
        "Answer: lines": repeat("Answer: 5\n"),
        "tower 9^9^…9": repeat("9^") + "9",
        "NUL": "\x00" * size,
        "spaces": "5" + " " * (size - 1),
    }


def best_of(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="timings per cell; the best is shown")
    parser.add_argument("--sizes", default="400,1000,32768,100000,1000000", help="comma-separated input sizes in characters")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]

    cases: dict[str, Callable[[str], object]] = {}
    for name, verify in VERIFIERS.items():
        cases[f"{name} response"] = lambda text, verify=verify: verify(text, "5")
        cases[f"{name} ground truth"] = lambda text, verify=verify: verify("Answer: 5", text)
    cases["math_dapo normalize (uncapped)"] = math_dapo.normalize_final_answer
    cases["prepare-data problem"] = lambda text: convert(text, "1/2")
    cases["prepare-data answer"] = lambda text: convert("Compute.", text)
    cases["prepare-data letters (uncapped)"] = math_letters
    cases["prepare-data JSON line"] = lambda text: json_nesting_excess('{"problem": "' + text + '"}')

    print(f"seconds per call, best of {args.repeat} (python {sys.version.split()[0]})\n")
    width = max(len(k) for k in kinds(10))
    worst: dict[str, tuple[float, str]] = {}
    for case, fn in cases.items():
        print(f"{case}")
        print(f"  {'input':<{width}}  " + "  ".join(f"{s:>10,}" for s in sizes))
        for kind in kinds(10):
            cells = []
            for size in sizes:
                text = kinds(size)[kind]
                math_equiv.parse_answer.cache_clear()
                seconds = best_of(lambda: fn(text), args.repeat)
                cells.append(seconds)
                if seconds > worst.get(case, (-1.0, ""))[0]:
                    worst[case] = (seconds, f"{kind} × {size:,}")
            print(f"  {kind:<{width}}  " + "  ".join(f"{c:>10.6f}" for c in cells))
        print()
    print("worst case per verifier and side")
    for case, (seconds, where) in worst.items():
        print(f"  {case:<34} {seconds:>10.6f} s   ({where})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
