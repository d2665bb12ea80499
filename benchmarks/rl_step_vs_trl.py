"""One RL step of dapo vs TRL's GRPOTrainer on the same model and work, alternated in one run.

    .venv/bin/python benchmarks/rl_step_vs_trl.py [--lengths 16 64] [--pairs 2] [--steps 20] [--threads 2] [--plain-forward] [--bf16]

The work (the issue's setting): a random-init Qwen2 directory (hidden 128, 4 layers, the character
vocabulary, ~1.06 M parameters) built once for both; 8 prompts x 8 samples of synthetic 1-3-digit
additions per step; temperature 1.0, no top-k/top-p; no KL; clip 0.2 / 0.28; token-level loss;
truncated completions masked; one optimizer step per generation batch; AdamW lr 1e-4; float32;
``--threads`` torch threads each. dapo runs ``dapo train`` (its default fast rollout engine, no
dynamic sampling, no soft overlong punishment since TRL has none, no validation); TRL runs
``benchmarks/_trl_worker.py`` under ``.venv-trl`` (created here on first use: ``trl==1.16.0``
with torch held at constraints.txt's version; TRL is a benchmark-only dependency).

Runs alternate TRL, dapo, TRL, dapo ... (``--pairs`` pairs per length). A step's time is the
wall time between the ends of consecutive optimizer steps (TRL: a ``TrainerCallback``; dapo: its
step reporter, after MLflow logging), so both include everything a step does. Per run: the
median of steps 5-19 (steps 1-4 are warm-up). Per pair: TRL's median / dapo's median. The
``TRL step ratio (L=…)`` line is the median of the pairs' ratios (> 1: dapo is faster).
``--plain-forward``: each pair also runs dapo with ``engine.shared_prompt_forward=false`` (every
row's whole sequence in the update, as before the shared-prompt forward) right after the default
dapo run, for the columns ``dapo plain s`` and ``TRL/dapo plain``. ``--bf16``: each pair also runs
TRL with ``bf16=True`` (its default: accelerate's bf16 autocast) and dapo with
``engine.autocast=bfloat16`` (the update's forward and backward in bf16 autocast; the sampler stays
float32), compared with each other (``TRL bf16/dapo bf16``) and dapo bf16 with float32 TRL.

dapo's split (median over its runs, from its MLflow ``timing/*`` metrics and a timer around
scoring): generation, scoring, old log-probs (0 when they come from the update's own forward:
``train.old_log_probs_from_update``), update (forward + backward + optimizer + metrics), and
"other" (the rest of the wall step: MLflow logging, reporting).
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    REPO,
    build_policy_dir,
    count_parameters,
    machine,
    median,
    run_dapo_in_process,
    table,
    thread_env,
)

TRL_VERSION = "1.16.0"
TRL_VENV = REPO / ".venv-trl"
PROMPTS = 2000
SKIP = 4  # warm-up steps
LAST = 19  # median of steps SKIP+1 .. LAST (the steps 5-19)


# ---------------------------------------------------------------- TRL's venv


def trl_python() -> Path:
    """``.venv-trl/bin/python`` with trl==1.16.0 next to constraints.txt's torch (created when missing)."""
    python = TRL_VENV / "bin" / "python"
    if python.exists() and _trl_version(python) == TRL_VERSION:
        return python
    print(f"setting up {TRL_VENV.name} (trl=={TRL_VERSION}, torch from constraints.txt) ...", file=sys.stderr, flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(TRL_VENV)], check=True)
        (TRL_VENV / ".gitignore").write_text("*\n")  # keep the venv out of git status
    install = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
               "-c", str(REPO / "constraints.txt"), f"trl=={TRL_VERSION}"]
    proc = subprocess.run(install, capture_output=True, text=True)
    if proc.returncode != 0 or _trl_version(python) != TRL_VERSION:
        sys.exit(f"TRL {TRL_VERSION} could not be installed into {TRL_VENV} (the TRL comparison is skipped):\n"
                 f"{proc.stderr[-2000:]}")
    return python


def _trl_version(python: Path) -> str | None:
    proc = subprocess.run([str(python), "-c", "import trl, torch; print(trl.__version__)"], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


# ---------------------------------------------------------------- the two sides


def write_prompts(path: Path) -> None:
    """The synthetic training prompts as dapo renders them (chat template applied) with their answers."""
    from dapo_cli.data.loader import load_rows
    from dapo_cli.models import build_char_tokenizer, format_prompt

    tokenizer = build_char_tokenizer()
    rows = load_rows("synthetic:add-3digit", split="train", synthetic_size=PROMPTS)
    with path.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({"prompt": format_prompt(tokenizer, r["prompt"]), "answer": r["reward_model"]["ground_truth"]}) + "\n")


def dapo_words(
    model: Path, work: Path, length: int, steps: int, threads: int, engine: str, shared: bool = True, autocast: str = "none"
) -> list[str]:
    sets = {
        "model.path": model, "data.train_files": "[synthetic:add-3digit]", "data.val_files": "[]",
        "data.synthetic_train_size": PROMPTS, "data.train_batch_size": 8, "data.max_prompt_length": 64,
        "rollout.engine": engine, "rollout.n": 8, "rollout.max_response_length": length, "rollout.temperature": 1.0,
        "rollout.top_p": 1.0, "rollout.top_k": 0,
        "algorithm.clip_ratio_low": 0.2, "algorithm.clip_ratio_high": 0.28, "algorithm.loss_agg_mode": "token-mean",
        "algorithm.overlong_buffer.enable": "false", "algorithm.overlong_filter": "true", "algorithm.use_kl_loss": "false",
        "trainer.total_steps": steps, "trainer.ppo_mini_batch_size": 8, "trainer.ppo_micro_batch_size": 64,
        "trainer.ppo_epochs": 1, "trainer.lr": 1e-4, "trainer.lr_warmup_steps": 0, "trainer.weight_decay": 0.0,
        "trainer.grad_clip": 1.0, "trainer.save_freq": 0, "trainer.test_freq": 0, "trainer.log_samples_freq": 0,
        "trainer.collapse_patience": 0, "trainer.output_dir": work / "runs", "engine.device": "cpu",
        "engine.num_threads": threads, "engine.shared_prompt_forward": str(shared).lower(),
        "engine.autocast": autocast, "tracking.tracking_uri": f"sqlite:///{work / 'mlflow.db'}",
        "tracking.experiment": "bench",
    }
    words = ["train", "--no-dynamic-sampling"]
    for key, value in sets.items():
        words += ["--set", f"{key}={value}"]
    return words


def dapo_worker(spec: dict) -> None:
    """Run ``dapo train`` in this process, recording each step's end and its scoring time."""
    from dapo_cli import progress, train

    ends: list[float] = []
    scoring: list[float] = []
    done = progress.StepReporter.step_done

    def step_done(self, step, metrics):
        ends.append(time.perf_counter())
        return done(self, step, metrics)

    score = train.score_and_shape

    def timed_score(batch, cfg):
        t0 = time.perf_counter()
        score(batch, cfg)
        scoring.append(time.perf_counter() - t0)

    progress.StepReporter.step_done = step_done
    train.score_and_shape = timed_score
    run_dapo_in_process(spec["words"])
    Path(spec["out"]).write_text(json.dumps({"step_ends": ends, "scoring": scoring}))


def run_dapo(
    model: Path, length: int, steps: int, threads: int, engine: str = "fast", shared: bool = True, autocast: str = "none"
) -> dict:
    with tempfile.TemporaryDirectory(prefix="dapo-rl-bench-") as tmp:
        work = Path(tmp)
        words = dapo_words(model, work, length, steps, threads, engine, shared, autocast)
        spec = {"words": [str(w) for w in words], "out": str(work / "out.json")}
        proc = subprocess.run([sys.executable, __file__, "--dapo-worker", json.dumps(spec)], env=thread_env(threads),
                              capture_output=True, text=True, cwd=work)
        if proc.returncode != 0:
            sys.exit(f"dapo run failed:\n{proc.stderr[-3000:]}")
        out = json.loads((work / "out.json").read_text())
        out["timing"] = mlflow_timing(work)
    return out


def mlflow_timing(work: Path) -> dict[str, list[float]]:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("bench").experiment_id])
    out = {}
    for key in ("timing/step", "timing/gen_and_score", "timing/old_log_prob", "timing/weight_sync", "response_length/mean"):
        history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
        out[key] = [m.value for m in history]
    return out


def run_trl(python: Path, model: Path, prompts: Path, length: int, steps: int, threads: int, bf16: bool = False) -> dict:
    with tempfile.TemporaryDirectory(prefix="trl-rl-bench-") as tmp:
        spec = {"model": str(model), "prompts": str(prompts), "length": length, "steps": steps, "threads": threads,
                "seed": 0, "bf16": bf16, "out": str(Path(tmp) / "out.json")}
        proc = subprocess.run([str(python), str(Path(__file__).with_name("_trl_worker.py")), json.dumps(spec)],
                              env=thread_env(threads), capture_output=True, text=True, cwd=tmp)
        if proc.returncode != 0:
            sys.exit(f"TRL run failed:\n{proc.stderr[-3000:]}")
        return json.loads((Path(tmp) / "out.json").read_text())


def step_times(ends: list[float]) -> list[float]:
    """Seconds of steps 2..n (step i = end_i - end_{i-1}); index k is step k + 2."""
    return [b - a for a, b in itertools.pairwise(ends)]


def steady(ends: list[float]) -> float:
    """Median seconds of steps SKIP+1 .. LAST."""
    times = step_times(ends)  # times[k] is step k + 2
    return median(times[SKIP - 1 : LAST - 1])


# ---------------------------------------------------------------- main


def check_vocabulary(model: Path, trl_out: dict) -> str:
    from dapo_cli.models import load_policy

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _trl_worker import PROBE

    _, tokenizer = load_policy(model)
    ours = tokenizer(PROBE, add_special_tokens=False)["input_ids"]
    if len(tokenizer) != trl_out["vocab_size"] or ours != trl_out["probe_ids"]:
        sys.exit(f"TRL sees another vocabulary: {trl_out['vocab_size']} tokens, probe {trl_out['probe_ids']} "
                 f"vs dapo's {len(tokenizer)}, {ours}")
    return f"vocabulary: the same for both ({len(tokenizer)} tokens; {PROBE!r} encodes to the same {len(ours)} ids)"


@dataclass(frozen=True)
class Variant:
    """One kind of run in every pair: TRL or dapo, and its settings."""

    name: str
    trl: bool
    bf16: bool = False  # TRL: bf16=True (accelerate's bf16 autocast); dapo: engine.autocast=bfloat16
    shared: bool = True  # dapo: engine.shared_prompt_forward

    def run(self, python: Path, model: Path, prompts: Path, length: int, steps: int, threads: int) -> dict:
        if self.trl:
            return run_trl(python, model, prompts, length, steps, threads, bf16=self.bf16)
        return run_dapo(model, length, steps, threads, shared=self.shared, autocast="bfloat16" if self.bf16 else "none")


def variants(plain_forward: bool, bf16: bool) -> tuple[list[Variant], list[tuple[str, str, str]]]:
    """The runs of a pair, in order, and the comparisons (label, TRL variant, dapo variant) printed."""
    runs = [Variant("TRL", trl=True), Variant("dapo", trl=False)]
    compare = [("", "TRL", "dapo")]
    if plain_forward:
        runs.append(Variant("dapo plain", trl=False, shared=False))
        compare.append((", plain forward", "TRL", "dapo plain"))
    if bf16:
        runs += [Variant("TRL bf16", trl=True, bf16=True), Variant("dapo bf16", trl=False, bf16=True)]
        compare += [(", bf16 autocast in both", "TRL bf16", "dapo bf16"), (", dapo bf16 vs TRL float32", "TRL", "dapo bf16")]
    return runs, compare


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--dapo-worker":
        dapo_worker(json.loads(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--pairs", type=int, default=2, help="TRL/dapo pairs per length (alternated)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--plain-forward", action="store_true",
                        help="also run dapo with engine.shared_prompt_forward=false in every pair")
    parser.add_argument("--bf16", action="store_true",
                        help="also run TRL with bf16=True and dapo with engine.autocast=bfloat16 in every pair")
    args = parser.parse_args()
    if args.steps < LAST:
        parser.error(f"--steps must be >= {LAST} (the median is over steps {SKIP + 1}-{LAST})")
    python = trl_python()
    header = machine()
    started = time.perf_counter()
    runs, compare = variants(args.plain_forward, args.bf16)
    seconds: dict[tuple[int, str], list[float]] = {}
    splits: dict[tuple[int, str], list[dict[str, float]]] = {}
    lengths: dict[tuple[int, str], list[float]] = {}
    vocab = ""
    with tempfile.TemporaryDirectory(prefix="rl-step-bench-") as tmp:
        model = build_policy_dir(Path(tmp) / "model")
        params = count_parameters(model)
        prompts = Path(tmp) / "prompts.jsonl"
        write_prompts(prompts)
        for length in args.lengths:
            for _pair in range(args.pairs):
                for v in runs:
                    out = v.run(python, model, prompts, length, args.steps, args.threads)
                    seconds.setdefault((length, v.name), []).append(steady(out["step_ends"]))
                    if v.trl:
                        vocab = vocab or check_vocabulary(model, out)
                        mean_len = median([float(h["completions/mean_length"]) for h in out["history"] if "completions/mean_length" in h])
                    else:
                        splits.setdefault((length, v.name), []).append(split(out))
                        mean_len = median(out["timing"]["response_length/mean"])
                    lengths.setdefault((length, v.name), []).append(mean_len)
    order = " ".join(v.name for v in runs)
    print(f"RL step vs TRL {TRL_VERSION} GRPOTrainer: random-init Qwen2 ({params:,} parameters, hidden 128, 4 layers, "
          f"character vocabulary), 8 prompts x 8 samples, {args.threads} threads, median of steps {SKIP + 1}-{LAST} "
          f"per run, runs alternated {order}, {order}, ... ({time.perf_counter() - started:.0f} s in all)")
    for line in header:
        print(line)
    print(vocab)
    print()
    rows = []
    for length in args.lengths:
        for pair in range(args.pairs):
            cells = [seconds[length, v.name][pair] for v in runs]
            ratios = [f"{seconds[length, t][pair] / seconds[length, d][pair]:.2f}x" for _, t, d in compare]
            rows.append([f"L={length}", pair + 1, *cells, *ratios, *[lengths[length, v.name][pair] for v in runs]])
    print(table(["length", "pair", *[f"{v.name} s" for v in runs], *[f"{t}/{d}" for _, t, d in compare],
                 *[f"{v.name} len" for v in runs]], rows))
    print()
    print("dapo's step split (median over its runs; seconds):")
    keys = ["generation", "scoring", "old log-probs", "update", "other", "wall step"]
    print(table(["length", *keys], [[f"L={length}, {v.name}", *[median([s[k] for s in splits[length, v.name]]) for k in keys]]
                                    for length in args.lengths for v in runs if not v.trl]))
    print()
    for label, t, d in compare:
        for length in args.lengths:
            pairs = [a / b for a, b in zip(seconds[length, t], seconds[length, d])]
            print(f"TRL step ratio{label} (L={length}): {median(pairs):.2f}x  (pairs: " + ", ".join(f"{r:.2f}x" for r in pairs) + ")")


def split(out: dict) -> dict[str, float]:
    """dapo's median phase times over steps SKIP+1..LAST of one run (steps are 1-based in MLflow)."""
    t = out["timing"]
    window = slice(SKIP, LAST)  # steps SKIP+1 .. LAST
    step, gen = t["timing/step"][window], t["timing/gen_and_score"][window]
    old, sync = t["timing/old_log_prob"][window], t["timing/weight_sync"][window]
    score = out["scoring"][window]
    wall = step_times(out["step_ends"])[SKIP - 1 : LAST - 1]
    return {
        "generation": median([g - s for g, s in zip(gen, score)]),
        "scoring": median(score),
        "old log-probs": median(old),
        "update": median([a - b - c - d for a, b, c, d in zip(step, gen, old, sync)]),
        "other": median([w - s for w, s in zip(wall, step)]),
        "wall step": median(wall),
    }


if __name__ == "__main__":
    main()
