"""vLLM's CPU build against the fast and hf engines on the same batches, side by side in one process.

    .venv-vllm/bin/python benchmarks/rollout_engines.py [--repeats 6] [--threads 2]
    .venv-vllm/bin/python benchmarks/rollout_engines.py --real [--repeats 3]

(``make bench`` runs both in ``.venv-vllm``, the venv ``make venv-vllm`` builds.)

Model: the random-init Qwen2 directory of the RL benchmark (hidden 128, 4 layers of 4 heads, head_dim 32,
character vocabulary, ~1.06 M parameters), float32, ``--threads`` torch threads. Batch: 8 prompts x 8
samples, at most 48 new tokens, each engine sampling with the model's own EOS (so the cell is new tokens
per second: each engine draws its own responses). ``--real``: SmolLM2-135M-Instruct (``make smollm2``),
4 chat-templated prompts x 4 samples, at most 32 new tokens.

- ``start-up``: seconds from nothing to an engine ready to generate (vLLM: ``LLM(...)`` with
  ``enforce_eager``, its CPU default here; fast/hf: loading the policy).
- ``sync``: one ``sync_weights`` from a training engine on the same weights (vLLM: the in-place reload;
  the fast/hf engines built on the trainer's module share its weights and do nothing).
- tokens/s: the median over repeats 2..N (the first is warm-up), engines in turn (round robin).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import build_policy_dir, machine, median, table

from dapo_cli.engine.torch import TorchEngine
from dapo_cli.models import load_policy
from dapo_cli.rollout.base import SamplingParams

PAIRS = [(12, 7), (35, 48), (101, 9), (6, 66), (250, 250), (3, 4), (77, 23), (19, 81)]


def build(name: str, path: Path):
    """(engine, trainer it syncs from, start-up seconds)."""
    t0 = time.perf_counter()
    model, tokenizer = load_policy(path)
    if name == "vllm":
        from dapo_cli.rollout.vllm import VLLMRolloutEngine

        engine = VLLMRolloutEngine(path, tokenizer, gpu_memory_utilization=0.1, sleep_level=0, dtype="float32", max_model_len=256)
    elif name == "fast":
        from dapo_cli.rollout.fast import FastRolloutEngine

        engine = FastRolloutEngine(model, tokenizer)
    else:
        from dapo_cli.rollout.hf import HFRolloutEngine

        engine = HFRolloutEngine(model, tokenizer)
    started = time.perf_counter() - t0
    return engine, TorchEngine(model, lr=1e-4, weight_decay=0.0, warmup_steps=0, grad_clip=1.0), started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--real", action="store_true", help="SmolLM2-135M-Instruct instead of the 1 M-parameter policy")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    names = ("vllm", "fast", "hf")
    with tempfile.TemporaryDirectory() as tmp:
        if args.real:
            from dapo_cli.models.gguf import import_gguf, named_gguf_file
            from dapo_cli.models.loading import default_cache_dir
            from dapo_cli.models.tokenizer import format_prompt

            path = import_gguf(named_gguf_file("smollm2-135m-instruct", default_cache_dir()), default_cache_dir())
            _, tokenizer = load_policy(path)
            prompts = [format_prompt(tokenizer, [{"role": "user", "content": f"What is {a} + {b}?"}]) for a, b in PAIRS[:4]]
            n, max_tokens, label = 4, 32, "SmolLM2-135M-Instruct, 16 x <=32 tokens"
        else:
            path = build_policy_dir(Path(tmp) / "policy")
            prompts = [f"What is {a}+{b}?\n" for a, b in PAIRS]
            n, max_tokens, label = 8, 48, "1.06 M-param Qwen2, 64 x <=48 tokens"
        built = {name: build(name, path) for name in names}
        syncs = {}
        for name, (engine, trainer, _) in built.items():
            t0 = time.perf_counter()
            engine.sync_weights(trainer)
            syncs[name] = time.perf_counter() - t0
        rates: dict[str, list[float]] = {name: [] for name in names}
        for repeat in range(args.repeats):
            for name, (engine, _, _) in built.items():
                params = SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=repeat)
                t0 = time.perf_counter()
                out = engine.generate(prompts, n, params)
                seconds = time.perf_counter() - t0
                if repeat > 0:
                    rates[name].append(float(out.lengths.sum()) / seconds)
        for engine, _, _ in built.values():
            engine.close()
    print(f"## Rollout engines: vLLM's CPU build vs fast vs hf ({label}, float32)")
    for line in machine():
        print(line)
    print(f"threads {args.threads}, repeats {args.repeats} (first discarded)")
    rows = [
        (name, f"{median(rates[name]):.1f}", f"{median(rates[name]) / median(rates['hf']):.2f}x",
         f"{built[name][2]:.1f}", f"{syncs[name] * 1e3:.1f}")
        for name in names
    ]
    print(table(["engine", "tokens/s", "x hf", "start-up s", "sync ms"], rows))
    print(f"fast / vLLM tokens/s: {median(rates['fast']) / median(rates['vllm']):.2f}x")


if __name__ == "__main__":
    main()
