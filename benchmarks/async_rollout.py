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
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, machine, median, table, train_medians

KEYS = ["timing/step", "timing/gen_and_score", "timing/worker_generate", "timing/worker_wait_weights",
        "train/samples_generated", "train/num_gen_batches", "async/version_lag_mean", "async/stale_groups_dropped"]

ROWS = {  # name: (settings, OMP threads of the process)
    "inline, 1 thread": ({"engine.num_threads": 1}, 1),
    "inline, 2 threads": ({"engine.num_threads": 2}, 2),
    "worker k=0 (1+1)": ({"rollout.worker": "process", "engine.num_threads": 1, "rollout.worker_threads": 1}, 1),
    "worker k=1 (1+1)": ({"rollout.max_staleness": 1, "engine.num_threads": 1, "rollout.worker_threads": 1}, 1),
    "worker k=2 (1+1)": ({"rollout.max_staleness": 2, "engine.num_threads": 1, "rollout.worker_threads": 1}, 1),
}

REAL = {"data.train_batch_size": 4, "rollout.n": 4, "rollout.max_response_length": 32, "algorithm.overlong_buffer.len": 8,
        "trainer.ppo_mini_batch_size": 2, "trainer.ppo_micro_batch_size": 8}
"""``--real``: SmolLM2-135M at a size where a step takes seconds, not minutes, on 2 cores."""


def run(name: str, steps: int, real: bool) -> tuple[dict[str, float], float]:
    settings, threads = ROWS[name]
    config = REPO / "experiments" / ("smollm2-135m.yaml" if real else "tiny.yaml")
    sets = {"trainer.total_steps": steps, **(REAL if real else {}), **settings}
    return train_medians(config, sets, KEYS, threads=threads, first_step=2)


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
    model = "SmolLM2-135M, 4 prompts x 4 samples, <= 32 tokens" if args.real else "tiny policy, 16 prompts x 8 samples, <= 64 tokens"
    print(f"\nAsynchronous rollouts: step time at max_staleness 0, 1, 2 ({model}; medians of steps 2-{steps}, "
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
