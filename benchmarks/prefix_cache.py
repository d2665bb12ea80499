"""The fast engine with its prefix cache and refill against without them, side by side in one run.

    .venv/bin/python benchmarks/prefix_cache.py [--problems 100] [--k 2] [--max-tokens 40] [--threads 1] [--repeats 1]

Model: SmolLM2-135M-Instruct (``make smollm2``), float32, ``--threads`` torch threads (1: a ladder child's).
Prompts: the ladder's testbed (``experiments/smollm2-ladder.yaml``): ``fewshot-add-2digit``'s held-out split,
``--problems`` problems in SmolLM2's chat template (~182 tokens, the first ~170 shared), ``--k`` samples each,
T 1.0, top-p 0.7 (``validation``'s defaults), at most ``--max-tokens`` new tokens.

Two engines, one after another on the same prompts (each fresh, so the cache starts cold, as it does after
the weight change before every validation):

- ``before``: ``FastRolloutEngine(prefix_cache=False, refill=False)``: the chunked loop, every prompt prefilled whole,
  top-p by sorting every row's whole vocabulary (``rollout.sampling.TOP_P_CANDIDATES`` emptied for its calls):
  the engine as it was before issue 47;
- ``after``: the defaults: shared prefixes prefilled once (``rollout/prefix_cache.py``), finished rows refilled
  (``rollout/continuous.py``), the nucleus found among each row's most probable tokens (``rollout/sampling.py``).

Two workloads, each timed around the engine calls only (model load excluded):

- **T1, one validation** (``TrainingSession.sync_and_validate``): one ``generate`` of every problem x k;
- **T5, ``dapo eval``** (``eval.run.generate_records`` with ``dapo eval``'s defaults: whole problems, up to 64
  sequences a call, a seed per call): the same calls ``dapo eval --avg k`` makes, so later calls find the prefix
  cached by the first.

Then the tail of one training round (8 prompts x 8 at ``--max-tokens``, the ladder's round: every row fits one
batch, so none waits and nothing refills): each decode step's running rows and seconds, and how many steps and
seconds the last quarter of the rows decoded alone.

Each workload prints seconds, samples/s, the prefill tokens run against the prompt tokens read, and whether every
sample (its tokens) is the same in both; then the two target lines.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine, median, table


def load_testbed(problems: int):
    """SmolLM2 (float32), its tokenizer, and the ladder's held-out problems with their templated prompts."""
    from dapo_cli.data.loader import SYNTHETIC_DATA_SEED
    from dapo_cli.data.synthetic import generate_rows
    from dapo_cli.eval.problems import group_problems
    from dapo_cli.models import load_policy
    from dapo_cli.models.gguf import import_gguf, named_gguf_file
    from dapo_cli.models.loading import default_cache_dir
    from dapo_cli.models.tokenizer import format_prompt

    folder = import_gguf(named_gguf_file("smollm2-135m-instruct", default_cache_dir()), default_cache_dir())
    model, tokenizer = load_policy(folder)
    found = group_problems(generate_rows("fewshot-add-2digit", problems, SYNTHETIC_DATA_SEED, "val"))
    return model, tokenizer, found, [format_prompt(tokenizer, p.messages) for p in found]


@contextlib.contextmanager
def candidates(counts: tuple[int, ...] | None):
    """``rollout.sampling.TOP_P_CANDIDATES`` set to ``counts`` inside (``()``: the full sort); None: unchanged."""
    from dapo_cli.rollout import sampling

    kept = sampling.TOP_P_CANDIDATES
    sampling.TOP_P_CANDIDATES = kept if counts is None else counts
    try:
        yield
    finally:
        sampling.TOP_P_CANDIDATES = kept


def run_case(engine, workload: str, problems, prompts, k: int, params) -> dict:
    """Seconds inside the engine, the samples (token lists) and the prefill counts of one workload."""
    from dapo_cli.eval.limits import sequences_per_call
    from dapo_cli.eval.run import generate_records
    from dapo_cli.eval.speed import Stopwatch

    before = dict(engine.prefill_stats)
    samples: list[tuple[str, int]] = []
    if workload == "validation":
        t0 = time.perf_counter()
        out = engine.generate(prompts, k, params)
        seconds = time.perf_counter() - t0
        samples = [(text, int(length)) for text, length in zip(out.texts, out.lengths)]
    else:
        watch = Stopwatch()
        records = generate_records(engine, problems, prompts, k=k, params=params, verifier="math_dapo",
                                   max_sequences=sequences_per_call(k, 0), stopwatch=watch)
        seconds = watch.seconds
        samples = [(r.response, r.length) for r in records]
    stats = {key: engine.prefill_stats[key] - before[key] for key in before}
    return {"seconds": seconds, "samples": samples, **stats}


def round_tail(model, tokenizer, prompts, params) -> str:
    """Decode steps of one 8 x 8 round with the default engine: (running rows, seconds) each, summarised."""
    from dapo_cli.rollout.continuous import SlotDecoder
    from dapo_cli.rollout.fast import FastRolloutEngine

    steps: list[tuple[int, float]] = []
    forward = SlotDecoder._forward

    def timed(self) -> None:
        t0 = time.perf_counter()
        running = int(self.alive.sum())
        forward(self)
        steps.append((running, time.perf_counter() - t0))

    SlotDecoder._forward = timed
    try:
        t0 = time.perf_counter()
        out = FastRolloutEngine(model, tokenizer).generate(prompts[:8], 8, params)
        total = time.perf_counter() - t0
    finally:
        SlotDecoder._forward = forward
    tail = [(r, s) for r, s in steps if r <= 16]
    lengths = sorted(out.lengths.tolist())
    return (f"round tail (8 prompts x 8, <= {params.max_tokens} tokens): {total:.1f} s, {len(steps)} decode steps "
            f"({sum(s for _, s in steps):.1f} s); rows' lengths median {lengths[32]}, 90th percentile {lengths[57]}, "
            f"max {lengths[-1]}, {int(out.truncated.sum())} truncated; steps with <= 16 of 64 rows running: {len(tail)} "
            f"({sum(s for _, s in tail):.1f} s, {sum(s for _, s in tail) / total:.0%} of the round)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=100)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each case (median), variants alternated")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from dapo_cli.rollout.base import SamplingParams
    from dapo_cli.rollout.fast import FastRolloutEngine

    started = time.perf_counter()
    model, tokenizer, problems, prompts = load_testbed(args.problems)
    params = SamplingParams(temperature=1.0, top_p=0.7, max_tokens=args.max_tokens, seed=0)
    variants = {"before": ({"prefix_cache": False, "refill": False}, ()), "after": ({}, None)}
    FastRolloutEngine(model, tokenizer).generate(prompts[:2], 1, SamplingParams(max_tokens=2, seed=1))  # warm-up
    results: dict[tuple[str, str], list[dict]] = {}
    for workload in ("validation", "eval"):
        for _ in range(args.repeats):
            for name, (kw, counts) in variants.items():
                with candidates(counts):
                    r = run_case(FastRolloutEngine(model, tokenizer, **kw), workload, problems, prompts, args.k, params)
                results.setdefault((workload, name), []).append(r)
                print(f"{workload} {name}: {r['seconds']:.1f} s", file=sys.stderr, flush=True)
    tail = round_tail(model, tokenizer, prompts, params)
    lengths = [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    print(f"## prefix cache and refill: SmolLM2-135M-Instruct, {args.problems} problems x {args.k} of fewshot-add-2digit "
          f"(val split), <= {args.max_tokens} tokens, T=1 top-p 0.7, float32, {args.threads} thread(s), median of "
          f"{args.repeats} ({time.perf_counter() - started:.0f} s in all)")
    for line in machine():
        print(line)
    print(f"prompts: {min(lengths)}-{max(lengths)} tokens (mean {sum(lengths) / len(lengths):.1f})")
    rows, summary = [], {}
    for (workload, name), runs in results.items():
        seconds = median([r["seconds"] for r in runs])
        n = len(runs[0]["samples"])
        same = "-" if name == "before" else f"{sum(a == b for a, b in zip(runs[0]['samples'], results[(workload, 'before')][0]['samples']))}/{n}"
        summary[(workload, name)] = (seconds, n / seconds, same)
        rows.append((workload, name, n, f"{seconds:.1f}", f"{n / seconds:.2f}", runs[0]["computed_tokens"], runs[0]["prompt_tokens"], same))
    print(table(["workload", "engine", "samples", "seconds", "samples/s", "prefill tokens run", "prompt tokens", "same samples"], rows))
    v_before, v_after = summary[("validation", "before")], summary[("validation", "after")]
    e_before, e_after = summary[("eval", "before")], summary[("eval", "after")]
    print(f"T1 one validation ({args.problems} x {args.k}, {args.max_tokens} tokens, {args.threads} thread): "
          f"{v_after[0]:.1f} s (before {v_before[0]:.1f} s; target <= 25 s); same samples {v_after[2]}")
    print(f"T5 dapo eval ({args.problems} x {args.k}, {args.max_tokens} tokens): {e_after[1]:.2f} samples/s, "
          f"{e_after[1] / e_before[1]:.2f}x before ({e_before[1]:.2f}; target >= 2.5x); same samples {e_after[2]}")
    print(tail)


if __name__ == "__main__":
    main()
