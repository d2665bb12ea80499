"""How far bf16 autocast moves the trainer's log-probs from the float32 sampler's, the importance ratio that makes, and its speed.

    .venv/bin/python benchmarks/bf16_logprob_gap.py [--real] [--prompts 4] [--samples 4] [--tokens 32] [--threads 2] [--plain-forward] [--repeats N]

The policy: the random-init Qwen2 of the other benchmarks (hidden 128, 4 layers, ~1.06 M parameters,
the character vocabulary; the default) or, with ``--real``, SmolLM2-135M-Instruct (``gguf:smollm2-135m-instruct``,
``make smollm2``). The fast rollout engine samples ``--prompts`` x ``--samples`` responses of at most
``--tokens`` tokens to ``synthetic:add-3digit`` prompts (the model's chat template), in float32 as in
training, and records its log-probs of the tokens it drew (``rollout.logprobs``: log π_rollout). The
trainer then computes its log-probs of the same responses the way ``dapo train`` does (``TorchEngine.log_probs``:
``engine/forward.PolicyLogProbs``, the shared-prompt forward, no grad as in the old-log-prob pass), once
with ``engine.autocast=none`` and once with ``engine.autocast=bfloat16`` (with ``--plain-forward`` also with
``engine.shared_prompt_forward=false``), each over the whole batch in one forward and again in two
micro-batches (the first half of the groups, then the rest).

The gap table, over the real response tokens (``|Δ|`` = |log p_a − log p_b|; ``r`` = exp(log p_a − log p_b)):

* ``sampler vs trainer fp32``: what ``rollout/logprob_diff_*`` reads in a float32 run (the conformance
  tests hold it below 1e-5 on the tiny test policy, ``algo.importance.SAMPLER_LOGPROB_TOL``);
* ``sampler vs trainer bf16``: the same under bf16 autocast. ``r`` here is π_old / π_rollout, the weight of
  ``algorithm.rollout_is`` and of the decoupled objective of ``rollout.max_staleness > 0`` (before the cap);
* ``trainer fp32 vs trainer bf16``: bf16 autocast's own rounding;
* ``trainer fp32: 1 pass vs 2 micro-batches`` (and bf16): the same weights and rows, forwarded with other rows:
  a separate old-log-prob pass (``train.update.fill_old_log_probs``) and the update's micro-batches group the rows
  differently, so ``r`` is the PPO ratio π_θ / π_old at θ = θ_old there; it is exactly 1 when the old
  log-probs come from the update's own forward (``config.schema.old_log_probs_from_update``).

Columns ``>0.2`` / ``>1e-3`` / ``>tol``: the share of tokens with |r − 1| above the PPO clip ε = 0.2, above 1e-3,
and above the conformance tolerance. The timing table: each trainer forward over the whole batch, no grad
(one warm-up forward of one row first; the fastest of ``--repeats``), FLOPs ``2 N_b t + 2 V h p`` (N_b the parameters of the blocks, t the
tokens the forward runs, V h the output projection, p the logit positions; attention scores not counted). The
bf16 line says whether this CPU has native bf16 matmuls (``dapo_cli.hardware``): without them the bf16 timings
are of emulated matmuls.
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

PPO_CLIP = 0.2
"""ε of the PPO clip (``algorithm.clip_ratio_low``): the ratio's deviation the clip starts to act at."""


def policy_path(real: bool, tmp: Path) -> Path:
    if not real:
        return build_policy_dir(tmp / "policy")
    from dapo_cli.config.tiny import TinyModelConfig
    from dapo_cli.models.loading import resolve_model

    path = resolve_model("gguf:smollm2-135m-instruct", TinyModelConfig())
    if not (path / "config.json").is_file():
        sys.exit(f"{path} is missing: import SmolLM2-135M first (make smollm2)")
    return path


def sample(model, tokenizer, prompts: int, samples: int, tokens: int):
    """The fast engine's float32 samples of ``prompts`` x ``samples`` responses, as a RolloutBatch with
    the engine's own log-probs (``rollout_log_probs``)."""
    from dapo_cli.batch import RolloutBatch
    from dapo_cli.data.loader import load_rows
    from dapo_cli.models import format_prompt
    from dapo_cli.rollout.base import SamplingParams
    from dapo_cli.rollout.fast import FastRolloutEngine

    rows = load_rows("synthetic:add-3digit", split="train", synthetic_size=prompts)
    texts = [format_prompt(tokenizer, r["prompt"]) for r in rows]
    params = SamplingParams(temperature=1.0, max_tokens=tokens, seed=0, logprobs=True)
    out = FastRolloutEngine(model, tokenizer).generate(texts, samples, params)
    batch = RolloutBatch(
        prompt_ids=out.prompt_ids, prompt_mask=out.prompt_mask, response_ids=out.response_ids,
        response_mask=out.response_mask, lengths=out.lengths, truncated=out.truncated, group_ids=out.prompt_index,
        texts=out.texts, ground_truths=[""] * len(out.texts), prompts=[""] * len(out.texts), pad_id=tokenizer.pad_token_id,
    )
    batch.rollout_log_probs = out.logprobs
    return batch


@torch.no_grad()
def trainer_log_probs(engine, batch, micro: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, float]:
    """The engine's log-probs of the batch's responses [N, T] and the seconds it took: one forward over the
    whole batch, or one per micro-batch (``micro``: row indices, in order)."""
    t0 = time.perf_counter()
    if micro is None:
        logp, _ = engine.log_probs(batch, temperature=1.0)
    else:
        logp = torch.cat([engine.log_probs(batch.select(rows), temperature=1.0)[0] for rows in micro])
    return logp.float().cpu(), time.perf_counter() - t0


def two_micro_batches(batch) -> list[torch.Tensor]:
    """The rows of the first half of the groups, then the rest (rows of a group are contiguous)."""
    groups = batch.group_ids.unique_consecutive()
    first = torch.isin(batch.group_ids, groups[: max(1, len(groups) // 2)])
    return [first.nonzero().squeeze(1), (~first).nonzero().squeeze(1)]


def gap_row(label: str, a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor, tol: float) -> list[object]:
    """|Δ| mean/max and |r − 1| mean/max and shares above ε, 1e-3 and ``tol``, over ``mask``; r = exp(a − b)."""
    delta = (a - b)[mask.bool()].double()
    dev = (delta.exp() - 1).abs()
    return [label, f"{delta.abs().mean():.2e}", f"{delta.abs().max():.2e}", f"{dev.mean():.2e}", f"{dev.max():.2e}",
            f"{(dev > PPO_CLIP).double().mean():.2%}", f"{(dev > 1e-3).double().mean():.1%}", f"{(dev > tol).double().mean():.1%}"]


def forward_flops(model, batch, shared: bool) -> float:
    """``2 N_b t + 2 V h p`` of the shared-prompt (or plain) forward over ``batch`` (see the module doc)."""
    from dapo_cli.engine.forward import distinct_prompts, needed_inputs

    out = model.get_output_embeddings().weight
    n_blocks = sum(p.numel() for p in model.parameters()) - out.numel()  # tied or not, the embedding is a lookup
    n, s = batch.prompt_ids.shape
    t = batch.response_ids.shape[1]
    if not shared:
        return 2 * n_blocks * n * (s + t) + 2 * out.numel() * n * (t + 1)
    prompts, width = distinct_prompts(batch.prompt_ids, batch.prompt_mask)[0].shape
    fed = prompts * width + int(needed_inputs(batch.response_mask).sum())
    return 2 * n_blocks * fed + 2 * out.numel() * int(batch.response_mask.sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", action="store_true", help="SmolLM2-135M-Instruct instead of the random ~1 M Qwen2")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4, help="responses per prompt")
    parser.add_argument("--tokens", type=int, default=32, help="longest response")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--plain-forward", action="store_true", help="also the plain forward (engine.shared_prompt_forward=false)")
    parser.add_argument("--repeats", type=int, default=0, help="timed whole-batch forwards, the fastest kept (0: 1 with --real, else 3)")
    args = parser.parse_args()
    repeats = args.repeats or (1 if args.real else 3)
    torch.set_num_threads(args.threads)
    from dapo_cli.algo.importance import SAMPLER_LOGPROB_TOL as tol
    from dapo_cli.engine.torch import TorchEngine
    from dapo_cli.hardware import cpu_bf16
    from dapo_cli.models import load_policy

    started = time.perf_counter()
    header, bf16 = machine(), cpu_bf16()
    with tempfile.TemporaryDirectory(prefix="bf16-gap-") as tmp:
        model, tokenizer = load_policy(policy_path(args.real, Path(tmp)))
    model.eval()
    batch = sample(model, tokenizer, args.prompts, args.samples, args.tokens)
    mask, rollout, micro, warm = batch.response_mask, batch.rollout_log_probs, two_micro_batches(batch), torch.tensor([0])
    gaps, timing = [], []
    for shared in (True, False) if args.plain_forward else (True,):
        logp, split, seconds = {}, {}, {}  # by engine.autocast
        for autocast in ("none", "bfloat16"):
            engine = TorchEngine(model, lr=1e-6, weight_decay=0.0, warmup_steps=0, grad_clip=1.0, autocast=autocast,
                                 shared_prompt_forward=shared)
            assert engine.forward_module.uses_shared_prompt() == shared
            trainer_log_probs(engine, batch.select(warm))
            logp[autocast], seconds[autocast] = trainer_log_probs(engine, batch)
            seconds[autocast] = min([seconds[autocast]] + [trainer_log_probs(engine, batch)[1] for _ in range(repeats - 1)])
            split[autocast], _ = trainer_log_probs(engine, batch, micro)
        how = "" if shared else ", plain forward"
        gaps += [
            gap_row(f"sampler vs trainer fp32{how}", logp["none"], rollout, mask, tol),
            gap_row(f"sampler vs trainer bf16{how}", logp["bfloat16"], rollout, mask, tol),
            gap_row(f"trainer fp32 vs trainer bf16{how}", logp["bfloat16"], logp["none"], mask, tol),
            gap_row(f"trainer fp32{how}: 1 pass vs 2 micro-batches", logp["none"], split["none"], mask, tol),
            gap_row(f"trainer bf16{how}: 1 pass vs 2 micro-batches", logp["bfloat16"], split["bfloat16"], mask, tol),
        ]
        flops = forward_flops(model, batch, shared)
        n_tokens = int(batch.prompt_mask.sum() + mask.sum())
        timing += [[("float32" if autocast == "none" else "bf16 autocast") + ("" if shared else ", plain forward"), sec,
                    f"{n_tokens / sec:,.0f}", f"{flops / sec / 1e9:.2f}", f"{seconds['none'] / sec:.2f}x"]
                   for autocast, sec in seconds.items()]
    n_params = sum(p.numel() for p in model.parameters())
    which = "SmolLM2-135M-Instruct" if args.real else "random-init Qwen2 (hidden 128, 4 layers)"
    print(f"bf16 log-prob gap: {which} ({n_params:,} parameters), {args.prompts} prompts x {args.samples} samples, "
          f"<= {args.tokens} tokens ({int(mask.sum())} response tokens), synthetic:add-3digit, sampler: fast engine "
          f"float32, temperature 1, {args.threads} threads ({time.perf_counter() - started:.0f} s in all)")
    for line in header:
        print(line)
    print(bf16.line())
    if bf16.native is False:
        print("  measured on a CPU without native bf16: the bf16 timings below are of emulated bf16 matmuls; the gaps "
              "are of bf16 rounding (float32 accumulation of bf16-rounded inputs, as native kernels do)")
    print()
    print(table(["log p_a vs log p_b", "mean |Δ|", "max |Δ|", "mean |r-1|", "max |r-1|", ">0.2", ">1e-3", f">{tol:g}"], gaps))
    print()
    print(table([f"trainer forward, whole batch, no grad (best of {repeats})", "s", "tokens/s", "GFLOP/s", "x float32"], timing))


if __name__ == "__main__":
    main()
