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
the same number in both, and the first step at which any other logged metric (timings left out) differs.
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


TIMING = ("timing/", "perf/", "system/")
"""Metric prefixes that measure time or the machine, left out of the comparison (keys with ``per_s`` too)."""

SAMPLER_GAP = ("rollout/logprob_diff", "rollout/token_prob_ratio")
"""The sampler's log-probs against the trainer's: they carry each decode loop's last-bit rounding, so they differ
between the two engines by design; the first step at which they or the rest differ are printed apart."""


def metrics(out: Path) -> dict[tuple[str, int], float]:
    """Every metric of the child's run by (key, step), but those measuring time."""
    from mlflow.tracking import MlflowClient

    summary = json.loads(next((out / "runs").rglob("summary.json")).read_text())
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    run = client.get_run(summary["mlflow_run_id"])
    values = {}
    for key in run.data.metrics:
        if not key.startswith(TIMING) and "per_s" not in key and "seconds" not in key:
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
        while len(seconds) < len(procs):  # each child's own end, whichever ends first
            for variant, proc in procs.items():
                if variant not in seconds and proc.poll() is not None:
                    seconds[variant] = time.perf_counter() - started[variant]
                    if proc.returncode != 0:
                        sys.exit(f"the {variant} child failed:\n{(Path(tmp) / variant / 'stderr.txt').read_text()[-3000:]}")
            time.sleep(0.2)
        logged = {v: metrics(Path(tmp) / v) for v in procs}
    differing = [(k, step) for (k, step), x in logged["after"].items()
                 if not k.startswith(("val/", *SAMPLER_GAP)) and logged["before"].get((k, step)) != x]
    first = min((step for _, step in differing), default=None)
    gap = min((step for (k, step), x in logged["after"].items()
               if k.startswith(SAMPLER_GAP) and logged["before"].get((k, step)) != x), default=None)
    results = {v: {k: x for k, x in m.items() if k[0].startswith("val/")} for v, m in logged.items()}
    before, after = results["before"], results["after"]
    same = sum(before.get(key) == value for key, value in after.items())
    differ = sorted({key for (key, _), value in after.items() if before.get((key, _)) != value})
    steps = sorted({step for _, step in after})
    print(f"## one ladder child (naive GRPO rung, seed 0, validations at steps {steps}), before and after, "
          f"side by side, 1 thread each; {args.config}{''.join(' --set ' + s for s in args.sets)}")
    for line in machine():
        print(line)
    for v in ("before", "after"):
        print(f"{v}: {seconds[v]:.0f} s wall; {len(results[v])} val metrics logged")
    print(f"sampler-trainer gap metrics ({', '.join(SAMPLER_GAP)}*): "
          f"{'the same at every step' if gap is None else f'first differ at step {gap}'}")
    if first is None:
        print("training metrics (all but timings and the gap): the same at every step")
    else:
        keys = sorted(k for k, step in differing if step == first)
        print(f"training metrics (all but timings and the gap): first differ at step {first}: {', '.join(keys[:40])}"
              f"{' ...' if len(keys) > 40 else ''}")
    for (key, step), value in sorted(after.items(), key=lambda item: (item[0][1], item[0][0])):
        print(f"  step {step} {key}: before {before.get((key, step))!r}, after {value!r}")
    print(f"T2 ladder child: {seconds['after']:.0f} s after against {seconds['before']:.0f} s before, "
          f"{seconds['after'] / seconds['before']:.2f}x (target <= 0.6x); validation metrics the same: "
          f"{same}/{len(after)}{'' if len(after) == len(before) else f' (before logged {len(before)})'}"
          f"{'; differ: ' + ', '.join(differ) if differ else ''}")


if __name__ == "__main__":
    main()
