"""One ladder child with the fast engine as it was before issue 47 and as it is, side by side in one run (T2).

    .venv-vllm/bin/python benchmarks/ladder_child.py [--config experiments/smollm2-ladder.yaml] [--set KEY=VALUE ...]

(``.venv-vllm``: it holds the ``gguf`` extra the ladder's model spec ``gguf:smollm2-135m-instruct`` needs; ``make
smollm2`` fetches the model.) The child is the ladder's naive-GRPO rung (every technique off), seed 0, from
``--config`` with ``trainer.test_freq=4`` (steps 0, 4 and 8 validated: the 3 validations issue 47 measures) plus
any ``--set``. Two ``dapo train`` processes run it at the same time, one torch thread each (the config's
``engine.num_threads``), as ``dapo ablate --jobs 2`` runs two children:

- ``before``: the fast engine with ``prefix_cache=False, refill=False`` and top-p by sorting the whole vocabulary
  (``rollout.sampling.TOP_P_CANDIDATES`` emptied): the engine before issue 47;
- ``after``: the defaults.

Each process writes to its own temporary MLflow store and run folder. Printed: each child's wall time (process
start to exit, the model load included), the ratio, and whether every ``val/`` metric of every validation step is
the same number in both.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine

ROOT = Path(__file__).resolve().parent.parent
NAIVE = ["--no-clip-higher", "--no-dynamic-sampling", "--no-token-level-loss", "--no-overlong-shaping", "--no-overlong-filtering"]


def child(variant: str, out: Path, config: str, sets: list[str]) -> None:
    """Run ``dapo train`` in this process, with the engine of ``variant``."""
    if variant == "before":
        from dapo_cli.rollout import sampling
        from dapo_cli.rollout.fast import FastRolloutEngine

        init = FastRolloutEngine.__init__

        def old_engine(self, *args, **kwargs):
            init(self, *args, **{**kwargs, "prefix_cache": False, "refill": False})

        FastRolloutEngine.__init__ = old_engine
        sampling.TOP_P_CANDIDATES = ()
    from dapo_cli.cli import main

    sys.argv = ["dapo", "train", config, *NAIVE, "--set", "trainer.test_freq=4", "--set", "trainer.seed=0",
                "--set", f"trainer.output_dir={out / 'runs'}", "--set", f"tracking.tracking_uri=sqlite:///{out / 'mlflow.db'}",
                *[w for s in sets for w in ("--set", s)]]
    main()


def validations(out: Path) -> dict[tuple[str, int], float]:
    """Every val/ metric of the child's run by (key, step)."""
    from mlflow.tracking import MlflowClient

    summary = json.loads(next((out / "runs").rglob("summary.json")).read_text())
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    run = client.get_run(summary["mlflow_run_id"])
    values = {}
    for key in run.data.metrics:
        if key.startswith("val/"):
            for m in client.get_metric_history(run.info.run_id, key):
                values[(key, m.step)] = m.value
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "experiments" / "smollm2-ladder.yaml"))
    parser.add_argument("--set", dest="sets", action="append", default=[])
    parser.add_argument("--variant", choices=["before", "after"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        child(args.variant, Path(args.out), args.config, args.sets)
        return
    with tempfile.TemporaryDirectory(prefix="dapo-ladder-child-") as tmp:
        procs, started, seconds = {}, {}, {}
        for variant in ("before", "after"):
            out = Path(tmp) / variant
            out.mkdir()
            cmd = [sys.executable, __file__, "--variant", variant, "--out", str(out), "--config", args.config,
                   *[w for s in args.sets for w in ("--set", s)]]
            started[variant] = time.perf_counter()
            procs[variant] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(out / "stderr.txt", "w"))
        for variant, proc in procs.items():
            if proc.wait() != 0:
                sys.exit(f"the {variant} child failed:\n{(Path(tmp) / variant / 'stderr.txt').read_text()[-3000:]}")
            seconds[variant] = time.perf_counter() - started[variant]
        results = {v: validations(Path(tmp) / v) for v in procs}
    before, after = results["before"], results["after"]
    same = sum(before.get(key) == value for key, value in after.items())
    steps = sorted({step for _, step in after})
    print(f"## one ladder child (naive GRPO rung, seed 0, validations at steps {steps}), before and after, "
          f"side by side, 1 thread each; {args.config}{''.join(' --set ' + s for s in args.sets)}")
    for line in machine():
        print(line)
    for v in ("before", "after"):
        print(f"{v}: {seconds[v]:.0f} s wall; {len(results[v])} val metrics logged")
    print(f"T2 ladder child: {seconds['after']:.0f} s after against {seconds['before']:.0f} s before, "
          f"{seconds['after'] / seconds['before']:.2f}x (target <= 0.6x); validation metrics the same: "
          f"{same}/{len(after)}{'' if len(after) == len(before) else f' (before logged {len(before)})'}")


if __name__ == "__main__":
    main()
