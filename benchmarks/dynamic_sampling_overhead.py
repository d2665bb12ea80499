"""Dynamic sampling's cost per step beyond the extra samples it generates, alternated in one run.

    .venv/bin/python benchmarks/dynamic_sampling_overhead.py [--pairs 2] [--steps 8] [--threads 1]

Workload: ``experiments/tiny.yaml`` (the warm-started built-in tiny policy, ``dapo init-model``;
16 prompts x 8 samples, 64-token limit, 2 mini-batches) for ``--steps`` steps, without validation
or checkpoints, with dynamic sampling on (``algorithm.filter_groups``: keep groups with mixed
accuracy, generate rounds of 16 prompts until 16 are kept) and off (one round, all 16 groups
trained). Both train 16 groups a step (the table shows ``train/batch_responses``), so the update
does the same work; dynamic sampling adds generation rounds and its own bookkeeping (the group
filter, batch selection and concatenation, extra scoring calls).

Per step, from MLflow: ``timing/step`` (T) and ``timing/gen_and_score`` (G: every round's
generation and scoring). The time of the extra samples is G_on - G_off; the overhead beyond it is
``(T_on - T_off) - (G_on - G_off)`` = the difference of the non-generation time, reported against
T_off. Runs alternate off, on, off, on ...; medians over steps 3 .. ``--steps``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, machine, median, step_medians, table, thread_env, timed_run_settings

KEYS = ["timing/step", "timing/gen_and_score", "timing/old_log_prob", "train/num_gen_batches",
        "train/samples_generated", "train/batch_responses"]
SKIP = 2


def run(dynamic: bool, steps: int, threads: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="ds-bench-") as tmp:
        work = Path(tmp)
        sets = {**timed_run_settings(work, steps), "engine.num_threads": threads}
        words = [sys.executable, "-m", "dapo_cli", "train", str(REPO / "experiments" / "tiny.yaml"),
                 "--dynamic-sampling" if dynamic else "--no-dynamic-sampling"]
        for key, value in sets.items():
            words += ["--set", f"{key}={value}"]
        proc = subprocess.run(words, env=thread_env(threads), capture_output=True, text=True, cwd=work)
        if proc.returncode != 0:
            sys.exit(f"dapo train failed:\n{proc.stderr[-3000:]}")
        return step_medians(work, KEYS, SKIP + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (tiny.yaml's own setting: 1)")
    args = parser.parse_args()
    header = machine()
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dapo_cli", "init-model"], env=thread_env(args.threads), check=True,
                   capture_output=True)  # the built-in tiny policy (cached after the first build)
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for _ in range(args.pairs):
        for dynamic in (False, True):
            runs[dynamic].append(run(dynamic, args.steps, args.threads))
    rows, overheads = [], []
    for pair in range(args.pairs):
        off, on = runs[False][pair], runs[True][pair]
        extra = on["timing/gen_and_score"] - off["timing/gen_and_score"]
        beyond = (on["timing/step"] - off["timing/step"]) - extra
        overheads.append(beyond / off["timing/step"])
        for name, r in (("off", off), ("on", on)):
            rows.append([f"pair {pair + 1}: {name}", r["timing/step"], r["timing/gen_and_score"],
                         r["timing/step"] - r["timing/gen_and_score"], r["train/num_gen_batches"],
                         f"{r['train/samples_generated']:.0f}", f"{r['train/batch_responses']:.0f}",
                         "" if name == "off" else f"{extra:.3f}", "" if name == "off" else f"{beyond:+.3f} ({beyond / off['timing/step']:+.1%})"])
    print(f"dynamic sampling overhead: experiments/tiny.yaml (warm-started tiny policy), {args.steps} steps, median of "
          f"steps {SKIP + 1}-{args.steps}, {args.threads} thread(s), runs alternated off/on ({time.perf_counter() - started:.0f} s in all)")
    for line in header:
        print(line)
    print()
    print(table(["run", "step s", "gen+score s", "rest s", "rounds", "samples", "trained rows",
                 "extra samples s", "beyond them s (of off step)"], rows))
    print()
    print(f"dynamic sampling overhead beyond the extra samples: {median(overheads):+.1%} of a step "
          f"(pairs: {', '.join(f'{o:+.1%}' for o in overheads)})")


if __name__ == "__main__":
    main()
