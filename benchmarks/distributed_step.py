"""Step time of the tiny experiment under each training engine and world size, side by side.

    .venv/bin/python benchmarks/distributed_step.py [--steps 10] [--skip 2]

Runs ``experiments/tiny.yaml`` (the built-in tiny policy, dynamic sampling off so every
case does the same amount of work per step: 16 prompts x 8 samples, one round) for a few
steps in each case below, one after another in this process's machine, and prints the
median of ``timing/*`` over the steps after the first ``--skip`` (warm-up), read back from
each run's MLflow store, with the ratio to one torch process:

    torch x1 (1 and 2 threads), torch DDP x2, deepspeed ZeRO-0/1/2/3 x2 (1 thread per process)

``update`` is ``timing/step - timing/gen_and_score - timing/old_log_prob - timing/weight_sync``
(it includes the step's bookkeeping). The tiny experiment runs one torch thread per process,
so one process leaves a core idle; the 2-thread single process is the fair baseline for two
processes on two cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASES = [  # (engine, processes, ZeRO stage, torch threads per process)
    ("torch", 1, 0, 1),
    ("torch", 1, 0, 2),
    ("torch", 2, 0, 1),
    ("deepspeed", 2, 0, 1),
    ("deepspeed", 2, 1, 1),
    ("deepspeed", 2, 2, 1),
    ("deepspeed", 2, 3, 1),
]
PHASES = ["timing/step", "timing/gen_and_score", "timing/old_log_prob", "timing/weight_sync"]


def command(engine: str, nproc: int, stage: int, threads: int, work: Path, steps: int) -> list[str]:
    launch = [sys.executable, "-m", "dapo_cli"] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m", "dapo_cli",
    ]
    sets = {
        "trainer.total_steps": steps, "trainer.test_freq": 0, "trainer.save_freq": 0, "trainer.log_samples_freq": 0,
        "data.val_files": "[]", "engine.name": engine, "engine.zero_stage": stage, "engine.num_threads": threads,
        "trainer.output_dir": str(work / "runs"), "tracking.tracking_uri": f"sqlite:///{work / 'mlflow.db'}",
        "tracking.experiment": "bench",
    }
    words = [*launch, "train", str(REPO / "experiments" / "tiny.yaml"), "--no-dynamic-sampling"]
    for key, value in sets.items():
        words += ["--set", f"{key}={value}"]
    return words


def medians(work: Path, skip: int) -> dict[str, float]:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("bench").experiment_id])
    out = {}
    for key in PHASES:
        values = [m.value for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step) if m.step > skip]
        out[key] = statistics.median(values) if values else 0.0
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--skip", type=int, default=2)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update({"PYTHONWARNINGS": "ignore"})
    rows = []
    for engine, nproc, stage, threads in CASES:
        if engine == "deepspeed" and __import__("importlib.util").util.find_spec("deepspeed") is None:
            print(f"skipping {engine}: not installed", file=sys.stderr)
            continue
        with tempfile.TemporaryDirectory(prefix="dapo-bench-") as tmp:
            t0 = time.perf_counter()
            proc = subprocess.run(command(engine, nproc, stage, threads, Path(tmp), args.steps), env=env, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            if proc.returncode != 0:
                sys.exit(f"{engine} x{nproc} failed:\n{proc.stderr[-3000:]}")
            rows.append((engine, nproc, stage, threads, wall, medians(Path(tmp), args.skip)))
    base = rows[0][5]["timing/step"]
    print(f"tiny experiment (no dynamic sampling), {args.steps} steps, median of steps {args.skip + 1}-{args.steps}, "
          f"{os.cpu_count()} CPUs; last column: step time / step time of torch x1 (1 thread)")
    print(f"{'engine':<22}{'procs':>6}{'threads':>8}{'step s':>9}{'gen s':>8}{'old-lp s':>10}{'update s':>10}{'sync s':>8}{'ratio':>8}{'wall s':>8}")
    for engine, nproc, stage, threads, wall, m in rows:
        name = engine if engine == "torch" else f"deepspeed ZeRO-{stage}"
        update = m["timing/step"] - m["timing/gen_and_score"] - m["timing/old_log_prob"] - m["timing/weight_sync"]
        print(f"{name:<22}{nproc:>6}{threads:>8}{m['timing/step']:>9.3f}{m['timing/gen_and_score']:>8.3f}{m['timing/old_log_prob']:>10.3f}"
              f"{update:>10.3f}{m['timing/weight_sync']:>8.3f}{m['timing/step'] / base:>7.2f}x{wall:>8.1f}")


if __name__ == "__main__":
    main()
