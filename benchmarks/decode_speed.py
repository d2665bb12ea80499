"""The fast sampler's decode on SmolLM2-135M against its FLOP floor, each decode idea switched alone.

    .venv/bin/python benchmarks/decode_speed.py [--real] [--length 64] [--repeats 2] [--threads 2]

One ``FastRolloutEngine.generate`` of 8 chat-templated synthetic prompts x 8 samples, at most ``--length``
new tokens, T = 1, a fixed seed, float32, ``--threads`` threads (``--real``: SmolLM2-135M-Instruct from
``make smollm2``; else the 1 M random-init Qwen2), for each variant, round robin, median of ``--repeats``
after one warm-up:

- ``before``: the decode projections as ``x Wᵀ`` (``NativeLlama.transposed_decode = False``);
- ``W xᵀ``: the projections as ``W xᵀ``, each output copied back to [rows, out]
  (``NativeLlama.feature_major_decode = False``);
- ``+ feature-major MLP``: the o-projection and the MLP kept as [out, rows] (``NativeLlama.finish_decode``):
  the default, both ideas on;
- ``2 rounds in one``: the default on 16 prompts x 8 (two rounds' rows decoded together, as a
  dynamic-sampling round and the next would be), its seconds per 64 rows.

The floor is ``benchmarks/flops.generation_flops`` (2 N per token per row, attention included, at the rows'
real lengths) over the float32 rate of a 4096^3 matmul measured in the same run. ``same samples``: the
responses equal to the ``before`` variant's (the draw is keyed per sample; logits differ only by rounding).
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
from flops import Shape, generation_flops, matmul_rate


def prompts(tokenizer, count: int) -> list[str]:
    from dapo_cli.data.loader import load_rows
    from dapo_cli.models import format_prompt

    rows = load_rows("synthetic:add-3digit", split="train", synthetic_size=count)
    return [format_prompt(tokenizer, r["prompt"]) for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", action="store_true")
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from dapo_cli.models import load_policy
    from dapo_cli.models.native import NativeLlama
    from dapo_cli.rollout.base import SamplingParams
    from dapo_cli.rollout.fast import FastRolloutEngine

    if args.real:
        from rl_step_vs_trl import real_model

        path, name = real_model(), "SmolLM2-135M-Instruct"
    else:
        path, name = build_policy_dir(Path(tempfile.mkdtemp(prefix="decode-bench-")) / "model"), "Qwen2-1M"
    started = time.perf_counter()
    rate = matmul_rate(torch.float32)
    model, tokenizer = load_policy(path)
    engine = FastRolloutEngine(model, tokenizer)
    params = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=args.length, seed=0, logprobs=True)
    eight, sixteen = prompts(tokenizer, 8), prompts(tokenizer, 16)
    variants = {  # (W xT, feature-major MLP), prompts
        "before": ((False, False), eight),
        "W xT": ((True, False), eight),
        "+ feature-major MLP": ((True, True), eight),
        "2 rounds in one": ((True, True), sixteen),
    }
    seconds: dict[str, list[float]] = {v: [] for v in variants}
    outs: dict[str, object] = {}
    for i in range(args.repeats + 1):
        for v, (switches, batch) in variants.items():
            NativeLlama.transposed_decode, NativeLlama.feature_major_decode = switches
            t0 = time.perf_counter()
            out = engine.generate(batch, 8, params)
            if i:
                seconds[v].append((time.perf_counter() - t0) * 64 / (len(batch) * 8))
            outs[v] = out
            print(f"  {'warm-up' if not i else f'repeat {i}'} {v}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    NativeLlama.transposed_decode = NativeLlama.feature_major_decode = True
    rate = max(rate, matmul_rate(torch.float32))
    shape = Shape.read(path)
    enc = tokenizer(eight, add_special_tokens=False)["input_ids"]
    rows = []
    base = outs["before"]
    for v in variants:
        out = outs[v]
        lengths = out.lengths[:64].tolist()
        floor = generation_flops(shape, [len(e) for e in enc], lengths) / rate
        same = sum(a == b for a, b in zip(out.texts[:64], base.texts)) if v != "before" else 64
        sec = median(seconds[v])
        rows.append([v, sec, f"{sum(lengths) / sec:.0f}", floor, f"{sec / floor:.2f}x", f"{median(seconds['before']) / sec:.2f}x", f"{same}/64"])
    print(f"decode: {name}, 8 prompts x 8 samples, <= {args.length} new tokens, T=1, float32, {args.threads} threads, "
          f"median of {args.repeats} after 1 warm-up, variants round robin ({time.perf_counter() - started:.0f} s in all)")
    for line in machine():
        print(line)
    print(f"floor: counted FLOPs / {rate / 1e9:.1f} GFLOP/s (float32 4096^3 matmul, this run); seconds per 64 rows")
    print()
    print(table(["variant", "s / 64 rows", "tokens/s", "floor s", "x floor", "x before", "same samples"], rows))


if __name__ == "__main__":
    main()
