"""``dapo eval``'s tokens/s against the fast rollout engine's own ``generate``, on the same prompts.

    .venv-vllm/bin/python benchmarks/eval_speed.py [--problems 16] [--avg 4] [--max-tokens 48] [--old-problems 4] [--threads 2]
    .venv-vllm/bin/python benchmarks/eval_speed.py --real [--hf]

Model: the random-init Qwen2 directory of the RL benchmark (~1.06 M parameters, character vocabulary,
1,024 positions here for the DAPO instruction prompt), or with ``--real`` SmolLM2-135M-Instruct
(``make smollm2``), float32, ``--threads`` torch threads. Problems: ``--problems`` sums ``What is a+b?``
in the DAPO instruction template (~180 SmolLM2 tokens each, as ``dapo prepare-data`` writes them), K =
``--avg`` samples each, T 1.0, top-p 0.7 (``dapo eval``'s defaults), at most ``--max-tokens`` new tokens.

Rows, one after another in this process:

- ``engine.generate``: a ``FastRolloutEngine`` on the loaded policy, one ``generate`` call on every
  prompt × K (after a 4-token warm-up call of the same shape); start-up is the model load.
- ``dapo eval``: :func:`~dapo_cli.eval.run.run_eval` with the defaults (``--engine fast``,
  ``--batch-size 0``: whole problems up to 64 sequences per call), no tracking. Its generation time is
  the seconds inside ``generate`` (``eval/gen_seconds``); wall includes loading the model, scoring and
  writing the files. With at most 64 sequences in all it draws exactly the engine row's samples.
- ``dapo eval --batch-size K``: one problem's K per generate call, what ``--batch-size 0`` meant
  before, on the first ``--old-problems`` problems (a call per problem: its rate does not depend on
  how many); ``--hf`` adds the old defaults, ``--engine hf`` one problem per call, on the same problems.

tokens/s counts the new tokens of every sample (EOS included) over generation seconds; samples/s likewise.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import build_policy_dir, machine, table

from dapo_cli.data.schema import make_row, write_dapo_parquet
from dapo_cli.eval.run import EvalOptions, run_eval
from dapo_cli.rollout.base import SamplingParams


def write_problems(path: Path, count: int) -> Path:
    """``count`` sums as a DAPO parquet (the instruction template ``dapo prepare-data`` writes)."""
    rows = [make_row(f"What is {a}+{b}?", str(a + b), index=i) for i, (a, b) in
            enumerate((17 * i % 89 + 10, 31 * i % 97 + 3) for i in range(count))]
    write_dapo_parquet(rows, path)
    return path


def engine_row(model_dir: Path, data: Path, k: int, params: SamplingParams) -> dict[str, float]:
    """The fast engine's ``generate`` on every problem's templated prompt × ``k``, in one call."""
    from dapo_cli.data.registry import load_dataset_rows
    from dapo_cli.eval.problems import group_problems
    from dapo_cli.models import load_policy
    from dapo_cli.models.tokenizer import format_prompt
    from dapo_cli.rollout.fast import FastRolloutEngine

    t0 = time.perf_counter()
    model, tokenizer = load_policy(model_dir)
    engine = FastRolloutEngine(model, tokenizer)
    start_up = time.perf_counter() - t0
    prompts = [format_prompt(tokenizer, p.messages) for p in group_problems(load_dataset_rows(str(data)).rows)]
    engine.generate(prompts, k, SamplingParams(temperature=1.0, max_tokens=4, seed=99))  # warm-up at the same shapes
    t0 = time.perf_counter()
    out = engine.generate(prompts, k, params)
    seconds = time.perf_counter() - t0
    return {"samples": float(len(out.texts)), "tokens": float(out.lengths.sum()), "seconds": seconds, "wall": start_up + seconds}


def eval_row(model_dir: Path, data: Path, k: int, max_tokens: int, *, engine: str, batch_size: int,
             limit: int | None = None) -> dict[str, float]:
    """``dapo eval`` in this process (no tracking, files in a temporary folder)."""
    opts = EvalOptions(checkpoint=str(model_dir), dataset=str(data), k=k, pass_k=(), temperature=1.0, top_p=0.7,
                       max_tokens=max_tokens, verifier="math_dapo", engine=engine, batch_size=batch_size, seed=0,
                       limit=limit, tracking_backend="null")
    t0 = time.perf_counter()
    speed = run_eval(opts).speed
    wall = time.perf_counter() - t0
    return {"samples": speed["eval/gen_samples"], "tokens": speed["eval/gen_tokens"], "seconds": speed["eval/gen_seconds"], "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", action="store_true", help="SmolLM2-135M-Instruct instead of the 1 M-parameter policy")
    parser.add_argument("--problems", type=int, default=16)
    parser.add_argument("--avg", type=int, default=4, help="samples per problem (K)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--old-problems", type=int, default=4, help="problems of the one-problem-per-call rows")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--hf", action="store_true", help="also the old defaults: --engine hf, one problem per call")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        if args.real:
            from dapo_cli.models.gguf import import_gguf, named_gguf_file
            from dapo_cli.models.loading import default_cache_dir

            model_dir, name = import_gguf(named_gguf_file("smollm2-135m-instruct", default_cache_dir()), default_cache_dir()), "SmolLM2-135M"
        else:
            model_dir, name = build_policy_dir(Path(tmp) / "policy", max_positions=1024), "1.06 M-param Qwen2"
        data = write_problems(Path(tmp) / "sums.parquet", args.problems)
        params = SamplingParams(temperature=1.0, top_p=0.7, max_tokens=args.max_tokens, seed=0)
        k, mt, old = args.avg, args.max_tokens, min(args.old_problems, args.problems)
        runs = {
            "engine.generate (one call)": lambda: engine_row(model_dir, data, k, params),
            "dapo eval (defaults: fast, auto batch)": lambda: eval_row(model_dir, data, k, mt, engine="fast", batch_size=0),
            f"dapo eval --batch-size {k} (fast)": lambda: eval_row(model_dir, data, k, mt, engine="fast", batch_size=k, limit=old),
        }
        if args.hf:
            runs[f"dapo eval --engine hf --batch-size {k}"] = lambda: eval_row(model_dir, data, k, mt, engine="hf", batch_size=k, limit=old)
        rows = {}
        for label, run in runs.items():
            rows[label] = run()
            print(f"{label}: {rows[label]['wall']:.1f} s", file=sys.stderr, flush=True)
    print(f"## dapo eval vs the fast engine's generate ({name}, {args.problems} problems x {k} samples, <= {mt} tokens, float32)")
    for line in machine():
        print(line)
    print(f"threads {args.threads}; generation s: inside generate only; wall s: with the model load, scoring and files")
    print(table(["row", "samples", "tokens", "generation s", "tokens/s", "samples/s", "wall s", "tokens/s (wall)"], [
        (label, int(r["samples"]), int(r["tokens"]), f"{r['seconds']:.1f}", f"{r['tokens'] / r['seconds']:.1f}",
         f"{r['samples'] / r['seconds']:.2f}", f"{r['wall']:.1f}", f"{r['tokens'] / r['wall']:.1f}")
        for label, r in rows.items()
    ]))
    engine, evaluated = rows["engine.generate (one call)"], rows["dapo eval (defaults: fast, auto batch)"]
    ratio = (evaluated["tokens"] / evaluated["seconds"]) / (engine["tokens"] / engine["seconds"])
    print(f"eval / rollout engine tokens/s ({name}): {ratio:.2f}x")


if __name__ == "__main__":
    main()
