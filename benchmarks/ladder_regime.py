"""The base policy's regime on a candidate ladder task: does each DAPO technique get something to act on?

    .venv/bin/python benchmarks/ladder_regime.py [--tasks fewshot-chain-add fewshot-add-2digit] [--limits 24 32 40 48 64]
                                                 [--prompts 32] [--n 8] [--threads 2]
    .venv/bin/python benchmarks/ladder_regime.py --tasks candidates --prompts 48 --limits 24 32 40 48   # issue 49's search

SmolLM2-135M-Instruct (``make smollm2``) samples ``--n`` responses to each of ``--prompts`` train problems of each
synthetic task, at T = 1.0 with no top-k/top-p (the rollout's sampling in the ladder), up to the largest of
``--limits`` new tokens, in one ``FastRolloutEngine.generate`` per task. Its draws are keyed per sample and
token, so a smaller limit's responses are the same tokens cut at that limit: each limit is read from the one
generation (a response is truncated at ``L`` when it had not ended by token ``L``; it is scored on its first
``L`` tokens with the training verifier, ``math_dapo``).

Per (task, limit), the preconditions of issue 36 (``dapo_cli.ablate.regime``, docs/real-model-ladder.md):
``trunc %`` (>= 5%), ``spread>=3x %`` and ``spread med`` (a median >= 3x), ``all-equal %`` (>= 30%), ``acc %``
(room above and below), ``mean len`` and ``answer %`` (responses with an ``Answer:`` line the verifier reads).

``--tasks candidates`` measures the example-turn variants of issue 49's search (:data:`CANDIDATES`): the same a+b
problems (1-2 digit operands, except ``mix-3worked``: 1, 2 or 3 digits, both operands alike) after different worked
(``W``: ``25 + 13 = 38`` / ``Answer: 38``) and direct (``D``: ``Answer: 7``) example turns, each turn's problem in
the DAPO instruction unless the name says ``bare``. They are registered for this run only, and every task with 1-2 digit operands asks the same problems (the
first ``--prompts`` train problems of ``fewshot-add-2digit``), so the example turns are compared on equal terms;
the one kept is the
registered task ``fewshot3-add-2digit`` (``W D W``). ``prompt tok`` is the prompt's length in SmolLM2's template,
which the update pays for on every response.

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

from dapo_cli.data import synthetic
from dapo_cli.data.schema import DAPO_INSTRUCTION

_W1, _D1 = ("What is 3+4?", "3 + 4 = 7\nAnswer: 7"), ("What is 3+4?", "Answer: 7")
_W2, _D2 = ("What is 25+13?", "25 + 13 = 38\nAnswer: 38"), ("What is 25+13?", "Answer: 38")
_W3, _W4 = ("What is 8+56?", "8 + 56 = 64\nAnswer: 64"), ("What is 47+29?", "47 + 29 = 76\nAnswer: 76")


def _same_length_operands(rng):
    """a+b with both operands of 1, 2 or 3 digits (a third each): a mix of difficulties."""
    k = rng.choice((1, 2, 3))
    a, b = synthetic._random_number(rng, k, k), synthetic._random_number(rng, k, k)
    return f"What is {a}+{b}?", a + b, lambda: []


class _BareExamples(synthetic.SyntheticTask):
    """The example turns as bare problems; only the asked problem in the DAPO instruction (a shorter prompt)."""

    def messages(self, problem):
        out = []
        for shot, response in self.shots:
            out += [{"role": "user", "content": shot}, {"role": "assistant", "content": response}]
        return out + [{"role": "user", "content": self.template.replace("{problem}", problem)}]


CANDIDATES = {
    name: kind(name, name, sample, template=DAPO_INSTRUCTION, shots=shots)
    for name, kind, sample, shots in (
        ("2worked", synthetic.SyntheticTask, synthetic._sample_add2, (_W1, _W2)),
        ("3worked", synthetic.SyntheticTask, synthetic._sample_add2, (_W1, _W2, _W3)),
        ("direct-worked", synthetic.SyntheticTask, synthetic._sample_add2, (_D1, _W2)),
        ("worked-direct", synthetic.SyntheticTask, synthetic._sample_add2, (_W1, _D2)),
        ("worked-direct-worked-3+4", synthetic.SyntheticTask, synthetic._sample_add2, (_W1, _D2, _W3)),
        ("worked-direct-worked-8+56", synthetic.SyntheticTask, synthetic._sample_add2, (_W2, _D1, _W3)),
        ("4turns", synthetic.SyntheticTask, synthetic._sample_add2, (_W2, _D1, _W3, _W4)),
        ("mix-3worked", synthetic.SyntheticTask, _same_length_operands, (_W1, _W2, _W3)),
        ("bare-worked-direct-worked", _BareExamples, synthetic._sample_add2, (_W2, _D1, _W4)),
    )
}
"""Issue 49's example-turn variants (see the module docstring); ``fewshot3-add-2digit`` is registered."""
REGISTERED = ["fewshot-add-2digit", "fewshot3-add-2digit"]


def same_problems(task: str, n: int) -> list[dict]:
    """``n`` train rows of ``task``; a task with 1-2 digit operands asks the problems of ``fewshot-add-2digit`` (a
    task's problems are drawn by its name), so the example turns are compared on the same problems."""
    from dapo_cli.data.loader import load_rows

    if synthetic.get_task(task).sample is not synthetic._sample_add2:
        return load_rows(f"synthetic:{task}", split="train", synthetic_size=n)
    rows = load_rows("synthetic:fewshot-add-2digit", split="train", synthetic_size=n)
    messages = synthetic.get_task(task).messages
    return [{**row, "prompt": messages(row["extra_info"]["raw_problem"])} for row in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["fewshot-chain-add", "fewshot-add-2digit"])
    parser.add_argument("--limits", type=int, nargs="+", default=[24, 32, 40, 48, 64])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    synthetic.SYNTHETIC_TASKS.update(CANDIDATES)  # this run only
    if args.tasks == ["candidates"]:
        args.tasks = REGISTERED + list(CANDIDATES)
    torch.set_num_threads(args.threads)
    from rl_step_vs_trl import real_model

    from dapo_cli.ablate.regime import math_dapo_score as score
    from dapo_cli.ablate.regime import sample_regimes
    from dapo_cli.models import format_prompt, load_policy
    from dapo_cli.rollout.fast import FastRolloutEngine

    started = time.perf_counter()
    model, tokenizer = load_policy(real_model())
    engine = FastRolloutEngine(model, tokenizer)
    rows_out = []
    for task in args.tasks:
        rows = same_problems(task, args.prompts)
        prompts = [format_prompt(tokenizer, r["prompt"]) for r in rows]
        truths = [r["reward_model"]["ground_truth"] for r in rows]
        prompt_tokens = round(sum(len(tokenizer(p)["input_ids"]) for p in prompts) / len(prompts))
        t0 = time.perf_counter()
        regimes = sample_regimes(engine, prompts, truths, score, n=args.n, limits=args.limits)
        print(f"  {task}: {len(truths) * args.n} samples up to {max(args.limits)} tokens in {time.perf_counter() - t0:.0f} s",
              file=sys.stderr, flush=True)
        for r in regimes:
            rows_out.append([task, prompt_tokens, r.limit, f"{100 * r.truncated:.1f}", f"{100 * r.spread_3x:.0f}", f"{r.spread_median:.1f}",
                             f"{100 * r.all_equal:.0f}", f"{100 * r.accuracy:.1f}", f"{r.mean_length:.1f}", f"{100 * r.answered:.0f}",
                             "; ".join(r.unmet()) or "all met"])
    top = max(args.limits)
    print(f"ladder regime of the base policy: SmolLM2-135M-Instruct, {args.prompts} train problems x {args.n} samples per task, "
          f"T=1.0, float32, {args.threads} threads, one generation per task up to {top} tokens ({time.perf_counter() - started:.0f} s in all)")
    for line in machine():
        print(line)
    print()
    print(table(["task", "prompt tok", "limit", "trunc %", "spread>=3x %", "spread med", "all-equal %", "acc %", "mean len", "answer %", "unmet"],
                rows_out))


if __name__ == "__main__":
    main()
