"""The base policy's regime on a candidate ladder task: does each DAPO technique get something to act on?

    .venv/bin/python benchmarks/ladder_regime.py [--tasks fewshot-chain-add fewshot-add-2digit] [--limits 24 32 40 48 64]
                                                 [--prompts 32] [--n 8] [--threads 2]

SmolLM2-135M-Instruct (``make smollm2``) samples ``--n`` responses to each of ``--prompts`` train problems of each
synthetic task, at T = 1.0 with no top-k/top-p (the rollout's sampling in the ladder), up to the largest of
``--limits`` new tokens, in one ``FastRolloutEngine.generate`` per task. Its draws are keyed per sample and
token, so a smaller limit's responses are the same tokens cut at that limit: each limit is read from the one
generation (a response is truncated at ``L`` when it had not ended by token ``L``; it is scored on its first
``L`` tokens with the training verifier, ``math_dapo``).

Per (task, limit), the preconditions of issue 36 (docs/real-model-ladder.md):

- ``trunc %``: responses truncated at the limit (overlong filtering and the soft punishment act on them; >= 5%);
- ``spread>=3x %`` and ``spread med``: groups whose longest response is at least 3x their shortest, and the
  median of that ratio over groups (the token-level loss weighs such groups differently from the sample mean);
- ``all-equal %``: groups whose responses all score the same (dynamic sampling drops them; >= 30%);
- ``acc %``: the share of right responses (room above and below: neither near 0 nor near 100);
- ``answer %``: responses with an ``Answer:`` line the verifier reads, right or wrong.

The GRPO rung's clip fractions need training: ``dapo train`` with all five techniques off logs them
(``actor/clipfrac_high``); this script measures what the base policy does before any update.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine, table


def regime(lengths: list[int], ended: list[bool], right: list[bool], limit: int, n: int) -> list[object]:
    """The row of one limit: ``lengths``/``ended``/``right`` per response at that limit, groups of ``n``."""
    groups = range(0, len(lengths), n)
    spreads = [max(lengths[g : g + n]) / max(1, min(lengths[g : g + n])) for g in groups]
    equal = [len(set(right[g : g + n])) == 1 for g in groups]
    trunc = sum(not e for e in ended) / len(ended)
    return [
        limit, f"{100 * trunc:.1f}", f"{100 * sum(s >= 3 for s in spreads) / len(spreads):.0f}",
        f"{statistics.median(spreads):.1f}", f"{100 * sum(equal) / len(equal):.0f}",
        f"{100 * sum(right) / len(right):.1f}", f"{statistics.mean(lengths):.1f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["fewshot-chain-add", "fewshot-add-2digit"])
    parser.add_argument("--limits", type=int, nargs="+", default=[24, 32, 40, 48, 64])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from rl_step_vs_trl import real_model

    from dapo_cli.data.loader import load_rows
    from dapo_cli.models import format_prompt, load_policy
    from dapo_cli.rewards.math_dapo import compute_score
    from dapo_cli.rollout.base import SamplingParams
    from dapo_cli.rollout.fast import FastRolloutEngine

    started = time.perf_counter()
    model, tokenizer = load_policy(real_model())
    engine = FastRolloutEngine(model, tokenizer)
    top = max(args.limits)
    rows_out = []
    for task in args.tasks:
        rows = load_rows(f"synthetic:{task}", split="train", synthetic_size=args.prompts)
        prompts = [format_prompt(tokenizer, r["prompt"]) for r in rows]
        truths = [r["reward_model"]["ground_truth"] for r in rows for _ in range(args.n)]
        t0 = time.perf_counter()
        out = engine.generate(prompts, args.n, SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=top, seed=0))
        print(f"  {task}: {len(truths)} samples up to {top} tokens in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        full_len, full_end = out.lengths.tolist(), (~out.truncated).tolist()
        for limit in sorted(args.limits):
            lengths = [min(length, limit) for length in full_len]
            ended = [e and length <= limit for e, length in zip(full_end, full_len)]
            texts = tokenizer.batch_decode([ids[:n].tolist() for ids, n in zip(out.response_ids, lengths)], skip_special_tokens=True)
            scores = [compute_score(t, g) for t, g in zip(texts, truths)]
            right = [s["acc"] for s in scores]
            answered = f"{100 * sum(s['pred'] != '[INVALID]' for s in scores) / len(scores):.0f}"
            rows_out.append([task, *regime(lengths, ended, right, limit, args.n), answered])
    print(f"ladder regime of the base policy: SmolLM2-135M-Instruct, {args.prompts} train problems x {args.n} samples per task, "
          f"T=1.0, float32, {args.threads} threads, one generation per task up to {top} tokens ({time.perf_counter() - started:.0f} s in all)")
    for line in machine():
        print(line)
    print()
    print(table(["task", "limit", "trunc %", "spread>=3x %", "spread med", "all-equal %", "acc %", "mean len", "answer %"], rows_out))


if __name__ == "__main__":
    main()
