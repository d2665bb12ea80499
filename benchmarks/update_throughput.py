"""Tokens/s and achieved FLOP/s of the policy update, as a fraction of a large matmul's, in one run.

    .venv/bin/python benchmarks/update_throughput.py [--repeats 6] [--threads 2] [--length 64] [--ragged]

The update is ``train.update.update_policy`` as ``dapo train`` runs it with one optimizer step per batch
(the old log-probs and entropy from the update's own forward): forward over ``[prompt ; response]``,
log-probs and entropy of the response tokens, the DAPO loss, backward, gradient clipping and an
AdamW step, on 64 rows (8 prompts x 8) of synthetic prompts plus ``--length`` response tokens
(every row full length, mixed advantages, nothing masked; ``--ragged``: a quarter of the rows at
the limit and the rest at lengths in [limit / 2, limit), right-padded, as sampled batches are), in
float32 parameters. A second row per model
adds the separate no-grad old-log-prob pass (what a run with several mini-batches or epochs does).
Each is measured with the shared-prompt forward (``engine.shared_prompt_forward``, the default:
each of the 8 prompts computed once, logits only at response positions) and with the plain one
(every row's whole sequence), engines round robin on the same batches; ``x plain`` = the plain
forward's seconds / these (float32). A last row per model runs the shared-prompt update under
``engine.autocast=bfloat16`` (matmuls in bf16, parameters and optimizer float32).

Models: the random-init Qwen2 of the RL benchmark (hidden 128, 4 layers, ~1.06 M parameters) and a
larger one of the same family (hidden 256, 8 layers, ~8.4 M). Model FLOPs per update, as executed:
``6 N t`` (N parameters, the tied embedding counted once as the output projection; t = tokens the
forward runs: plain, every row's padded prompt + response; shared, each distinct prompt once + the
response inputs it feeds, ``engine.forward.needed_inputs``: every row's real response tokens but its
last) plus ``12 L h`` per query-key pair for attention scores and values (L layers, width h; plain
``s^2`` per row of length s; shared ``S^2`` per distinct prompt + ``(T-1)(S+T-1)`` per row, attention
running on the padded layout); for the separate pass add a third of that. ``tokens/s`` counts the
batch's tokens (padded prompts + real response tokens) for both forwards.

Reference: the FLOP/s of a 4096 x 4096 x 4096 matmul on the same threads, float32 and (where the CPU
has avx512_bf16 or AMX) bfloat16, measured before and after the updates (the better of the two).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import LARGE, SMALL, build_policy_dir, machine, median, table
from flops import matmul_rate

from dapo_cli.hardware import cpu_bf16


def make_batch(tokenizer, length: int, *, seed: int = 0, ragged: bool = False):
    """64 rows (8 prompts x 8) with ``length`` response tokens each, or with ``ragged`` a quarter of
    the rows at ``length`` and the rest at uniform lengths in [length / 2, length) (right-padded)."""
    from dapo_cli.batch import RolloutBatch
    from dapo_cli.data.loader import load_rows
    from dapo_cli.models import format_prompt

    rows = load_rows("synthetic:add-3digit", split="train", synthetic_size=8)
    prompts = [format_prompt(tokenizer, r["prompt"]) for r in rows]
    enc = tokenizer(prompts, padding=True, padding_side="left", add_special_tokens=False, return_tensors="pt")
    n = 64
    gen = torch.Generator().manual_seed(seed)
    response = torch.randint(4, len(tokenizer), (n, length), generator=gen)
    mask = torch.ones(n, length, dtype=torch.bool)
    if ragged:
        full = torch.rand(n, generator=gen) < 0.25
        lengths = torch.where(full, length, torch.randint(length // 2, length, (n,), generator=gen))
        mask = torch.arange(length)[None, :] < lengths[:, None]
        response = response.masked_fill(~mask, tokenizer.pad_token_id)
    batch = RolloutBatch(
        prompt_ids=enc["input_ids"].repeat_interleave(8, 0), prompt_mask=enc["attention_mask"].bool().repeat_interleave(8, 0),
        response_ids=response, response_mask=mask, lengths=mask.sum(-1), truncated=torch.zeros(n, dtype=torch.bool),
        group_ids=torch.arange(8).repeat_interleave(8), texts=[""] * n, ground_truths=[""] * n, prompts=[""] * n,
        pad_id=tokenizer.pad_token_id,
    )
    batch.loss_mask = mask.clone()
    batch.advantages = torch.randn(n, generator=gen)
    batch.rewards = batch.advantages.sign()
    return batch


VARIANTS = (
    ("shared prompt", False, "none"), ("plain", False, "none"), ("shared prompt", True, "none"), ("plain", True, "none"),
    ("shared prompt", False, "bfloat16"),
)
"""(forward, separate old-lp pass, ``engine.autocast``): each an engine of its own, timed round robin."""


def time_updates(path: Path, length: int, repeats: int, ragged: bool) -> dict[tuple[str, bool, str], float]:
    """Median seconds of one update per variant (engines round robin on the same batches)."""
    from dapo_cli.config import apply_techniques, load_config
    from dapo_cli.engine.torch import TorchEngine
    from dapo_cli.models import load_policy
    from dapo_cli.train.update import fill_old_log_probs, update_policy
    from dapo_cli.train.objective import build_objective

    cfg = apply_techniques(load_config(None, [
        "rollout.n=8", "data.train_batch_size=8", "trainer.ppo_mini_batch_size=8", "trainer.ppo_micro_batch_size=64",
        f"rollout.max_response_length={length}", "trainer.lr=1e-5", "trainer.lr_warmup_steps=0",
    ]), dynamic_sampling=False)
    engines, tokenizer = {}, None
    for forward, separate, autocast in VARIANTS:
        model, tokenizer = load_policy(path)
        engines[forward, separate, autocast] = TorchEngine(
            model, lr=1e-5, weight_decay=0.0, warmup_steps=0, grad_clip=1.0, shared_prompt_forward=forward == "shared prompt",
            logprob_chunk=cfg.engine.logprob_chunk, autocast=autocast,
        )
        assert engines[forward, separate, autocast].forward_module.uses_shared_prompt() == (forward == "shared prompt")
    times: dict[tuple[str, bool, str], list[float]] = {v: [] for v in VARIANTS}
    for i in range(repeats + 1):
        for (forward, separate, autocast), engine in engines.items():
            batch = make_batch(tokenizer, length, seed=i, ragged=ragged)
            t0 = time.perf_counter()
            if separate:
                fill_old_log_probs(engine, batch, build_objective(cfg), cfg.trainer.ppo_micro_batch_size)
                update_policy(engine, batch, build_objective(cfg), cfg.trainer, step=i + 1)
            else:
                update_policy(engine, batch, build_objective(cfg), cfg.trainer, step=i + 1, old_from_update=True)
            if i:  # the first is warm-up
                times[forward, separate, autocast].append(time.perf_counter() - t0)
    return {v: median(t) for v, t in times.items()}


def work(path: Path, length: int, forward: str, ragged: bool) -> tuple[int, int, int]:
    """The batch's tokens (prompts as padded, real response tokens), the tokens the forward runs, and
    its query-key pairs (see the module doc; the seed-0 batch stands for all when ``ragged``)."""
    from dapo_cli.engine.forward import distinct_prompts, needed_inputs
    from dapo_cli.models import load_policy

    batch = make_batch(load_policy(path)[1], length, ragged=ragged)
    n, s = batch.prompt_ids.shape
    t = batch.response_ids.shape[1]
    tokens = n * s + int(batch.response_mask.sum())
    if forward == "plain":
        return tokens, n * (s + t), n * (s + t) ** 2
    p, width = distinct_prompts(batch.prompt_ids, batch.prompt_mask)[0].shape
    fed = int(needed_inputs(batch.response_mask).sum())  # packed: the response inputs actually run
    return tokens, p * width + fed, p * width**2 + n * (t - 1) * (width + t - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--ragged", action="store_true",
                        help="a quarter of the rows at --length, the rest at lengths in [length/2, length)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    header = machine()
    started = time.perf_counter()
    peak32 = matmul_rate(torch.float32)
    peak16 = matmul_rate(torch.bfloat16) if cpu_bf16().native else None
    measured = []
    with tempfile.TemporaryDirectory(prefix="update-bench-") as tmp:
        for name, shape in (("1M", SMALL), ("8M", LARGE)):
            path = build_policy_dir(Path(tmp) / name, shape)
            from dapo_cli.models import load_policy

            n_params = sum(p.numel() for p in load_policy(path)[0].parameters())
            seconds = time_updates(path, args.length, args.repeats, args.ragged)
            for forward, separate, autocast in VARIANTS:
                tokens, run, pairs = work(path, args.length, forward, args.ragged)
                flops = 6 * n_params * run + 12 * shape["num_layers"] * shape["hidden_size"] * pairs
                if separate:
                    flops += (2 * n_params * run + 4 * shape["num_layers"] * shape["hidden_size"] * pairs)
                sec = seconds[forward, separate, autocast]
                label = forward + (", bf16 autocast" if autocast != "none" else "")
                measured.append((f"{name} ({n_params / 1e6:.2f} M)", label, separate, sec, tokens, flops / sec,
                                 seconds["plain", separate, "none"] / sec))
    peak32 = max(peak32, matmul_rate(torch.float32))
    if peak16:
        peak16 = max(peak16, matmul_rate(torch.bfloat16))
    rows = [[model, forward, "+ separate old-lp pass" if separate else "update (one step)", sec, f"{tokens / sec:,.0f}",
             f"{rate / 1e9:.1f}", f"{rate / peak32:.0%}", f"{rate / peak16:.0%}" if peak16 else "-", f"{speedup:.2f}x"]
            for model, forward, separate, sec, tokens, rate, speedup in measured]
    shape = f"(prompt + {args.length // 2}..{args.length}, a quarter at {args.length})" if args.ragged else f"(prompt + {args.length})"
    print(f"update throughput: 64 rows x {shape} tokens, float32 parameters, {args.threads} threads, "
          f"median of {args.repeats} after 1 warm-up ({time.perf_counter() - started:.0f} s in all)")
    for line in header:
        print(line)
    print(f"matmul 4096^3: float32 {peak32 / 1e9:.1f} GFLOP/s" + (f", bfloat16 {peak16 / 1e9:.1f} GFLOP/s" if peak16 else ""))
    print()
    print(table(["model", "forward", "what", "s", "tokens/s", "GFLOP/s", "of fp32 mm", "of bf16 mm", "x plain"], rows))


if __name__ == "__main__":
    main()
