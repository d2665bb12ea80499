"""The fast rollout engine vs plain ``generate`` (the hf engine) on the same batches, side by side.

    .venv/bin/python benchmarks/rollout_vs_generate.py [--repeats 6] [--threads 2]

Model: the random-init Qwen2 directory of the RL benchmark (hidden 128, 4 layers, character
vocabulary, ~1.06 M parameters), float32, ``--threads`` torch threads. Batches:

- ``64 x 48``: 8 prompts x 8 samples, 48 new tokens each. EOS is suppressed (a forward hook
  on ``lm_head`` sets its logit to -inf, for every engine alike), so every engine generates
  exactly 64 x 48 = 3,072 tokens: the same work, whatever each one samples.
- ``64 x 48, model's EOS``: the same without the hook (the random model ends ~35% of rows early).
- ``long tail``: 64 prompts x 1 sample, limit 128, where 63 rows end early and one runs to the
  limit. Forced by two hooks (the same for every engine): the embedding hook notes each
  row's last input token, the ``lm_head`` hook rewrites that row's next-token logits. A row
  whose last token is ``#`` or ``~`` must emit ``~`` (probability 1); every other row has
  ``#`` and ``~`` removed and its EOS logit raised by 4 (it ends after ~5 tokens on average). One prompt
  ends in ``#`` (the runaway), the other 63 in a newline. ``generate`` keeps all 64 rows in
  the batch until the last one ends; the fast engine drops rows as they finish.

Engines, one idea at a time (each row differs from the one above it by one change):

- ``hf``: ``HFRolloutEngine`` (transformers' ``generate``; what ``rollout.engine: hf`` runs);
- ``fast: model forward``: the fast engine's loop on the model's own ``forward`` with a
  ``DynamicCache`` (prefill once per prompt, one draw per token, rows dropped as they end);
- ``fast: native, never drop``: its own Llama/Qwen2 decoder (fused projections, one key/value
  buffer, two-matmul attention), finished rows kept in the batch;
- ``fast`` (the default): native decoder, finished rows dropped once a quarter has ended;
- ``fast: no prefill sharing``: as ``fast`` but each row prefills its own copy of the prompt
  (the prompts repeated n times with n = 1), to show what sharing the prompt saves.

Each repeat runs every engine once, in turn (round robin); the first repeat is warm-up and
discarded; each cell is the median over the rest. ``x hf`` = hf's time / the engine's time on
the same batch (for the batch with the model's EOS: the ratio of new tokens per second, since
each engine samples its own responses).
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


def hooks_for(case: str, model, tokenizer):
    """Forward hooks that shape the next-token logits for ``case`` (removed by the caller)."""
    eos = tokenizer.eos_token_id
    if case == "no-eos":
        def head(module, args, output):
            output[..., eos] = float("-inf")
            return output
        return [model.lm_head.register_forward_hook(head)]
    if case == "long-tail":
        runaway = {tokenizer.convert_tokens_to_ids("#"), tokenizer.convert_tokens_to_ids("~")}
        tilde = tokenizer.convert_tokens_to_ids("~")
        last: list = []

        def embed(module, args, output):
            last[:] = [args[0][:, -1]]

        def head(module, args, output):
            rows = output.view(output.shape[0], -1, output.shape[-1])[:, -1]  # [B, V], a view
            forced = torch.isin(last[0], torch.tensor(sorted(runaway)))
            rows[:, eos] += 4.0
            rows[:, sorted(runaway)] = float("-inf")  # no other row can turn into the runaway
            rows[forced] = float("-inf")
            rows[forced, tilde] = 0.0
            return output
        return [model.model.embed_tokens.register_forward_hook(embed), model.lm_head.register_forward_hook(head)]
    return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    from dapo_cli.data.loader import load_rows
    from dapo_cli.models import format_prompt, load_policy
    from dapo_cli.rollout.base import SamplingParams
    from dapo_cli.rollout.fast import FastRolloutEngine
    from dapo_cli.rollout.hf import HFRolloutEngine

    torch.set_num_threads(args.threads)
    header = machine()
    with tempfile.TemporaryDirectory(prefix="rollout-bench-") as tmp:
        model, tokenizer = load_policy(build_policy_dir(Path(tmp) / "model"))
    model.eval()
    rows = load_rows("synthetic:add-3digit", split="train", synthetic_size=64)
    prompts = [format_prompt(tokenizer, r["prompt"]) for r in rows]
    engines = {
        "hf": HFRolloutEngine(model, tokenizer),
        "fast: model forward": FastRolloutEngine(model, tokenizer, native=False),
        "fast: native, never drop": FastRolloutEngine(model, tokenizer, compact_at=2.0),
        "fast": FastRolloutEngine(model, tokenizer),
        "fast: no prefill sharing": FastRolloutEngine(model, tokenizer),
    }
    long_tail = [*prompts[:63], prompts[63].rstrip("\n") + "#"]
    cases = [  # (name, hook case, prompts, n, max tokens)
        ("64 x 48", "no-eos", prompts[:8], 8, 48),
        ("64 x 48, model's EOS", "none", prompts[:8], 8, 48),
        ("long tail (1 of 64 to 128)", "long-tail", long_tail, 1, 128),
    ]
    results: dict[tuple[str, str], tuple[float, float]] = {}
    started = time.perf_counter()
    for case, hook, case_prompts, n, limit in cases:
        handles = hooks_for(hook, model, tokenizer)
        times: dict[str, list[float]] = {name: [] for name in engines}
        tokens: dict[str, list[int]] = {name: [] for name in engines}
        for repeat in range(args.repeats):
            for name, engine in engines.items():
                params = SamplingParams(temperature=1.0, max_tokens=limit, seed=repeat, logprobs=True)
                call_prompts, call_n = case_prompts, n
                if name == "fast: no prefill sharing":
                    call_prompts, call_n = [p for p in case_prompts for _ in range(n)], 1
                t0 = time.perf_counter()
                out = engine.generate(call_prompts, call_n, params)
                elapsed = time.perf_counter() - t0
                if repeat:  # the first repeat is warm-up
                    times[name].append(elapsed)
                    tokens[name].append(int(out.lengths.sum()))
                if hook == "no-eos":
                    assert int(out.lengths.sum()) == 64 * limit
                if hook == "long-tail":
                    assert int(out.lengths.max()) == limit and int((out.lengths == limit).sum()) == 1, out.lengths.tolist()
        for h in handles:
            h.remove()
        for name in engines:
            results[(case, name)] = (median(times[name]), median([k / t for k, t in zip(tokens[name], times[name])]))
    params_count = sum(p.numel() for p in model.parameters())
    print(f"rollout: fast engine vs generate, random-init Qwen2 ({params_count:,} parameters), float32, "
          f"{args.threads} threads, median of {args.repeats - 1} repeats after 1 warm-up, engines round robin "
          f"({time.perf_counter() - started:.0f} s in all)")
    for line in header:
        print(line)
    print()
    out_rows = []
    for case, *_ in cases:
        base_t, base_tps = results[(case, "hf")]
        for name in engines:
            t, tps = results[(case, name)]
            ratio = tps / base_tps if "model's EOS" in case else base_t / t
            out_rows.append([case, name, t, f"{tps:,.0f}", f"{ratio:.2f}x"])
    print(table(["batch", "engine", "s / call", "new tokens/s", "x hf"], out_rows))
    print()
    for case, *_ in cases:
        base_t, base_tps = results[(case, "hf")]
        t, tps = results[(case, "fast")]
        print(f"rollout ratio ({case}): {tps / base_tps if 'model' in case else base_t / t:.2f}x")


if __name__ == "__main__":
    main()
