"""Step time and peak memory of LoRA (rank 16 on all linear layers) against full fine-tuning.

    .venv-vllm/bin/python benchmarks/lora_vs_full.py [--real] [--steps N] [--repeats 1]

(LoRA needs the [lora] extra, PEFT, which ``make venv-vllm`` installs into ``.venv-vllm``.)

Workload: ``experiments/tiny.yaml`` (the built-in tiny policy, ``dapo init-model``; 16 prompts x 8
samples, 64 tokens), or with ``--real`` ``experiments/smollm2-135m.yaml`` cut to 4 prompts x 4 samples
x 32 tokens (SmolLM2-135M-Instruct, ``make smollm2``). No validation; one checkpoint at the end.

Rows, each one ``dapo train`` run (alternated order when repeated):

* ``full``: every weight trained, AdamW over all of them (the experiment's ``trainer.lr``);
* ``LoRA r=16``: ``model.lora.rank=16``, ``alpha=32``, all linear layers of the blocks, 10x the
  learning rate (TRL's "LoRA without regret" recommendation); AdamW over the adapters only. The
  rollout engine samples with a merged copy synced after every optimizer step.

Per run: medians over steps 2 .. N from MLflow of the step (``timing/step``), generation and scoring
(``timing/gen_and_score``) and the rest (old log-probs + update + weight sync); the peak resident
memory of the ``dapo train`` process (``os.wait4``'s ``ru_maxrss``: the whole process, model load,
rollout copy and all); the size of the final checkpoint's optimizer state and adapters.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dapo_cli.engine.torch import OPTIMIZER_FILE

from common import REPO, SMOLLM2_SMALL, WORKLOADS, machine, median, step_medians, table, thread_env, timed_run_settings

KEYS = ["timing/step", "timing/gen_and_score", "train/samples_generated"]

LORA = {"model.lora.rank": 16, "model.lora.alpha": 32}
"""The LoRA row's settings (target_modules: the default, all-linear); its lr is 10x the experiment's."""

EXPERIMENT_LR = {False: 1e-4, True: 1e-5}
"""trainer.lr of tiny.yaml / smollm2-135m.yaml (by ``--real``), which the full rows keep; LoRA rows take 10x."""


def run(lora: bool, steps: int, real: bool, threads: int) -> dict[str, float]:
    config = REPO / "experiments" / ("smollm2-135m.yaml" if real else "tiny.yaml")
    with tempfile.TemporaryDirectory(prefix="lora-bench-") as tmp:
        work = Path(tmp)
        sets = {
            **timed_run_settings(work, steps), "engine.num_threads": threads, "tracking.log_checkpoint": "none",
            **(SMOLLM2_SMALL if real else {}), **({**LORA, "trainer.lr": 10 * EXPERIMENT_LR[real]} if lora else {}),
        }
        words = [sys.executable, "-m", "dapo_cli", "train", str(config)]
        for key, value in sets.items():
            words += ["--set", f"{key}={value}"]
        t0 = time.perf_counter()
        with open(work / "stdout", "wb") as out, open(work / "stderr", "wb") as err:
            proc = subprocess.Popen(words, env=thread_env(threads), stdout=out, stderr=err, cwd=work)
            _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage (RUSAGE_CHILDREN would be every child's max)
            proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            sys.exit(f"dapo train ({'LoRA' if lora else 'full'}) failed:\n{(work / 'stderr').read_text()[-3000:]}")
        result = step_medians(work, KEYS, 2)
        engine = next((work / "runs").rglob("checkpoints/step_*/engine"))
        adapter = sum(f.stat().st_size for f in (engine / "adapter").glob("*.safetensors")) if lora else 0
        result.update(peak_mib=usage.ru_maxrss / 1024, optimizer_mib=(engine / OPTIMIZER_FILE).stat().st_size / 2**20,
                      adapter_mib=adapter / 2**20, wall=wall)
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real", action="store_true", help="SmolLM2-135M (make smollm2) instead of the tiny policy")
    parser.add_argument("--steps", type=int, default=0, help="steps per run (default 6 tiny, 4 real)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per row, in alternated order")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each run")
    args = parser.parse_args()
    steps = args.steps or (4 if args.real else 6)
    if not args.real:  # the built-in tiny policy (cached after the first build)
        subprocess.run([sys.executable, "-m", "dapo_cli", "init-model"], env=thread_env(args.threads), check=True, capture_output=True)
    results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for r in range(args.repeats):
        for lora in (False, True) if r % 2 == 0 else (True, False):
            results[lora].append(run(lora, steps, args.real, args.threads))
            print(f"  ran {'LoRA' if lora else 'full'} ({r + 1}/{args.repeats})", file=sys.stderr, flush=True)
    print(f"\nLoRA (rank 16, all-linear) vs full fine-tuning ({WORKLOADS[args.real]}; medians of steps 2-{steps}, "
          f"{args.repeats} run(s) per row, {args.threads} thread(s))")
    print("\n".join(machine()))
    rows, m = [], {}
    for lora in (False, True):
        m[lora] = {k: median([r[k] for r in results[lora]]) for k in results[lora][0]}
        x = m[lora]
        rows.append(["LoRA r=16" if lora else "full", x["timing/step"], x["timing/gen_and_score"],
                     x["timing/step"] - x["timing/gen_and_score"], f"{x['peak_mib']:.0f}", f"{x['optimizer_mib']:.2f}",
                     f"{x['adapter_mib']:.2f}" if lora else "-", f"{x['wall']:.0f}"])
    print(table(["setting", "step s", "gen+score s", "rest s", "peak RSS MiB", "optimizer MiB", "adapter MiB", "run s"], rows))
    full, lora = m[False], m[True]
    print(f"LoRA / full: step {lora['timing/step'] / full['timing/step']:.2f}x, rest (update + sync) "
          f"{(lora['timing/step'] - lora['timing/gen_and_score']) / (full['timing/step'] - full['timing/gen_and_score']):.2f}x, "
          f"peak RSS {lora['peak_mib'] / full['peak_mib']:.2f}x, optimizer state {lora['optimizer_mib'] / full['optimizer_mib']:.3f}x")


if __name__ == "__main__":
    main()
