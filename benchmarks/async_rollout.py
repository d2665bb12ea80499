"""Step time of asynchronous rollouts (``rollout.max_staleness`` 0, 1, 2) against the synchronous loop.

    .venv/bin/python benchmarks/async_rollout.py [--real] [--steps 8] [--repeats 1]

Workload: ``experiments/tiny.yaml`` (the built-in tiny policy, 16 prompts × 8 samples, 64 tokens,
dynamic sampling on), or with ``--real`` ``experiments/smollm2-135m.yaml`` cut to 4 prompts × 4
samples × 32 tokens (SmolLM2-135M-Instruct, ``make smollm2``). No validation, no checkpoints.

Rows, each one ``dapo train`` run (in turn, repeated ``--repeats`` times in alternated order):

* ``inline, 1 thread`` / ``inline, 2 threads``: the synchronous loop, generation and update in turn on
  one process with that many torch threads (what ``max_staleness: 0`` runs);
* ``worker k=0``: the same loop with generation in the worker process (1 + 1 threads), never ahead;
* ``worker k=1`` / ``k=2``: the worker generates the next steps' rounds while the trainer updates.

Per run, medians over steps 2 .. ``--steps`` from MLflow (step 1 has nothing to overlap): the whole step
(``timing/step``), the trainer's wait for rollouts (``timing/gen_and_score``: generation it waited for
plus scoring), the update (``step − gen_and_score``), the worker's generation time and its idle time, the
samples generated and the mean version lag. The last lines give the speed-up of each row over the best
synchronous row, and what perfect overlap would give on separate devices: ``(G + U) / max(G, U)`` from
the synchronous run's generation G and update U.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, SMOLLM2_SMALL, WORKLOADS, machine, median, step_medians, table, thread_env, timed_run_settings

KEYS = ["timing/step", "timing/gen_and_score", "timing/worker_generate", "timing/worker_wait_weights",
        "train/samples_generated", "train/num_gen_batches", "async/version_lag_mean", "async/stale_groups_dropped"]

ROWS = {  # name: (settings, OMP threads of the process)
    "inline, 1 thread": ({"engine.num_threads": 1}, 1),
    "inline, 2 threads": ({"engine.num_threads": 2}, 2),
    "worker k=0 (1+1)": ({"rollout.worker": "process", "engine.num_threads": 1, "rollout.worker_threads": 1}, 1),
    "worker k=1 (1+1)": ({"rollout.max_staleness": 1, "engine.num_threads": 1, "rollout.worker_threads": 1}, 1),
    "worker k=2 (1+1)": ({"rollout.max_staleness": 2, "engine.num_threads": 1, "rollout.worker_threads": 1}, 1),
}

def run(name: str, steps: int, real: bool) -> tuple[dict[str, float], float]:
    settings, threads = ROWS[name]
    config = REPO / "experiments" / ("smollm2-135m.yaml" if real else "tiny.yaml")
    with tempfile.TemporaryDirectory(prefix="async-bench-") as tmp:
        work = Path(tmp)
        sets = {**timed_run_settings(work, steps), **(SMOLLM2_SMALL if real else {}), **settings}
        words = [sys.executable, "-m", "dapo_cli", "train", str(config)]
        for key, value in sets.items():
            words += ["--set", f"{key}={value}"]
        t0 = time.perf_counter()
        proc = subprocess.run(words, env=thread_env(threads), capture_output=True, text=True, cwd=work)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            sys.exit(f"dapo train ({name}) failed:\n{proc.stderr[-3000:]}")
        return step_medians(work, KEYS, 2), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real", action="store_true", help="SmolLM2-135M (make smollm2) instead of the tiny policy")
    parser.add_argument("--steps", type=int, default=0, help="steps per run (default 12 tiny, 5 real)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per row, in alternated order")
    args = parser.parse_args()
    steps = args.steps or (5 if args.real else 12)
    names = list(ROWS)
    results: dict[str, list[tuple[dict[str, float], float]]] = {n: [] for n in names}
    for r in range(args.repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            results[name].append(run(name, steps, args.real))
            print(f"  ran {name} ({r + 1}/{args.repeats})", file=sys.stderr, flush=True)
    print(f"\nAsynchronous rollouts: step time at max_staleness 0, 1, 2 ({WORKLOADS[args.real]}; medians of steps 2-{steps}, "
          f"{args.repeats} run(s) per row)")
    for line in machine():
        print(line)
    rows, step_of = [], {}
    for name in names:
        m = {k: median([r[0][k] for r in results[name]]) for k in KEYS}
        wall = median([r[1] for r in results[name]])
        step_of[name] = m["timing/step"]
        worker = "process" in str(ROWS[name][0]) or "staleness" in str(ROWS[name][0])
        rows.append([
            name, m["timing/step"], m["timing/gen_and_score"], m["timing/step"] - m["timing/gen_and_score"],
            m["timing/worker_generate"] if worker else "-", m["timing/worker_wait_weights"] if worker else "-",
            f"{m['train/samples_generated']:.0f}", f"{m['async/version_lag_mean']:.2f}" if worker else "-",
            f"{m['async/stale_groups_dropped']:.0f}" if worker else "-", f"{wall:.0f}",
        ])
    print(table(["setting", "step s", "wait+score s", "update s", "worker gen s", "worker idle s", "samples",
                 "lag", "stale grp", "run s"], rows))
    best_sync = min(("inline, 1 thread", "inline, 2 threads"), key=lambda n: step_of[n])
    for name in names:
        print(f"async step ratio ({name} vs {best_sync}): {step_of[best_sync] / step_of[name]:.2f}x")
    sync = {k: median([r[0][k] for r in results[best_sync]]) for k in KEYS}
    gen, update = sync["timing/gen_and_score"], sync["timing/step"] - sync["timing/gen_and_score"]
    print(f"perfect overlap on separate devices ({best_sync}: generate {gen:.2f} s, update {update:.2f} s): "
          f"(G + U) / max(G, U) = {(gen + update) / max(gen, update):.2f}x")


if __name__ == "__main__":
    main()
