"""The base policy's regime on a candidate ladder task: does each DAPO technique get something to act on?

    .venv/bin/python benchmarks/ladder_regime.py [--tasks fewshot-chain-add fewshot-add-2digit] [--limits 24 32 40 48 64]
                                                 [--prompts 32] [--n 8] [--threads 2]

SmolLM2-135M-Instruct (``make smollm2``) samples ``--n`` responses to each of ``--prompts`` train problems of each
synthetic task, at T = 1.0 with no top-k/top-p (the rollout's sampling in the ladder), up to the largest of
``--limits`` new tokens, in one ``FastRolloutEngine.generate`` per task. Its draws are keyed per sample and
token, so a smaller limit's responses are the same tokens cut at that limit: each limit is read from the one
generation (a response is truncated at ``L`` when it had not ended by token ``L``; it is scored on its first
``L`` tokens with the training verifier, ``math_dapo``).

Per (task, limit), the preconditions of issue 36 (``dapo_cli.ablate.regime``, docs/real-model-ladder.md):
``trunc %`` (>= 5%), ``spread>=3x %`` and ``spread med`` (a median >= 3x), ``all-equal %`` (>= 30%), ``acc %``
(room above and below), ``mean len`` and ``answer %`` (responses with an ``Answer:`` line the verifier reads).

The GRPO rung's clip fractions need training: ``dapo train`` with all five techniques off logs them
(``actor/clipfrac_high``); this script measures what the base policy does before any update.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine, table


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

    from dapo_cli.ablate.regime import math_dapo_score as score
    from dapo_cli.ablate.regime import sample_regimes
    from dapo_cli.data.loader import load_rows
    from dapo_cli.models import format_prompt, load_policy
    from dapo_cli.rollout.fast import FastRolloutEngine

    started = time.perf_counter()
    model, tokenizer = load_policy(real_model())
    engine = FastRolloutEngine(model, tokenizer)
    rows_out = []
    for task in args.tasks:
        rows = load_rows(f"synthetic:{task}", split="train", synthetic_size=args.prompts)
        prompts = [format_prompt(tokenizer, r["prompt"]) for r in rows]
        truths = [r["reward_model"]["ground_truth"] for r in rows]
        t0 = time.perf_counter()
        regimes = sample_regimes(engine, prompts, truths, score, n=args.n, limits=args.limits)
        print(f"  {task}: {len(truths) * args.n} samples up to {max(args.limits)} tokens in {time.perf_counter() - t0:.0f} s",
              file=sys.stderr, flush=True)
        for r in regimes:
            rows_out.append([task, r.limit, f"{100 * r.truncated:.1f}", f"{100 * r.spread_3x:.0f}", f"{r.spread_median:.1f}",
                             f"{100 * r.all_equal:.0f}", f"{100 * r.accuracy:.1f}", f"{r.mean_length:.1f}", f"{100 * r.answered:.0f}",
                             "; ".join(r.unmet()) or "all met"])
    top = max(args.limits)
    print(f"ladder regime of the base policy: SmolLM2-135M-Instruct, {args.prompts} train problems x {args.n} samples per task, "
          f"T=1.0, float32, {args.threads} threads, one generation per task up to {top} tokens ({time.perf_counter() - started:.0f} s in all)")
    for line in machine():
        print(line)
    print()
    print(table(["task", "limit", "trunc %", "spread>=3x %", "spread med", "all-equal %", "acc %", "mean len", "answer %", "unmet"],
                rows_out))


if __name__ == "__main__":
    main()
