"""The update with the chunked output head (``engine.logprob_chunk``) against the full logits: time and peak memory.

    .venv/bin/python benchmarks/logprob_chunk.py [--real] [--chunks 0 256 1024 4096] [--lengths 64] [--micro 64] [--repeats 2] [--threads 2]

One policy update as ``dapo train`` runs it (``train.update.update_policy``: the shared-prompt forward, log-probs
and entropy of the response tokens, the DAPO loss, backward, clipping, AdamW; old log-probs from the
update's own forward) on 64 rows (8 prompts x 8) of synthetic prompts plus ``--lengths`` response tokens
(``update_throughput.make_batch``; every row full length: the worst case of a length limit) in micro-batches of
``--micro`` rows (``trainer.ppo_micro_batch_size``; 64: all at once), float32, for each ``engine.logprob_chunk`` in
``--chunks`` (0: the full ``[tokens, vocabulary]`` logits, as before the chunked head). Model: the 1 M
random-init Qwen2 of the RL benchmark, or with ``--real`` SmolLM2-135M-Instruct (``make smollm2``).

Each (length, chunk) runs in a fresh process, so its peak resident memory (``VmHWM``: weights, AdamW
state, activations and logits, whatever the update held at its worst) is its own; seconds are the
median of ``--repeats`` updates after one warm-up. A first row per length, ``0, matmul attention``, is the
update as dapo ran it before the chunked head and the fused attention (``NativeLlama.fused_attention =
False``: two matmuls and a softmax, keeping each layer's [rows, heads, queries, keys] weights for the
backward); the other rows use ``scaled_dot_product_attention``. ``x before`` is that row's seconds / this one's.
The logits line prints what one float32 copy of the full logits takes at that length.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import build_policy_dir, machine, median, table, thread_env


def worker(spec: dict) -> None:
    import torch

    from dapo_cli.config import apply_techniques, load_config
    from dapo_cli.engine.torch import TorchEngine
    from dapo_cli.models import load_policy
    from dapo_cli.train.update import update_policy
    from dapo_cli.train.objective import build_objective
    from update_throughput import make_batch

    from dapo_cli.models.native import NativeLlama

    torch.set_num_threads(spec["threads"])
    NativeLlama.fused_attention = spec["fused"]
    length = spec["length"]
    cfg = apply_techniques(load_config(None, [
        "rollout.n=8", "data.train_batch_size=8", "trainer.ppo_mini_batch_size=8", f"trainer.ppo_micro_batch_size={spec['micro']}",
        f"rollout.max_response_length={length}", "trainer.lr=1e-5", "trainer.lr_warmup_steps=0",
    ]), dynamic_sampling=False)
    model, tokenizer = load_policy(Path(spec["model"]))
    engine = TorchEngine(model, lr=1e-5, weight_decay=0.0, warmup_steps=0, grad_clip=1.0, logprob_chunk=spec["chunk"])
    times = []
    for i in range(spec["repeats"] + 1):
        batch = make_batch(tokenizer, length, seed=i)
        t0 = time.perf_counter()
        update_policy(engine, batch, build_objective(cfg), cfg.trainer, step=i + 1, old_from_update=True)
        if i:
            times.append(time.perf_counter() - t0)
    peak = next(int(line.split()[1]) * 1024 for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("VmHWM:"))
    tokens = int(make_batch(tokenizer, length).response_mask.sum())
    print(json.dumps({"seconds": median(times), "peak": peak, "tokens": tokens, "vocab": len(tokenizer)}))


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(json.loads(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", action="store_true", help="SmolLM2-135M-Instruct (make smollm2) instead of the 1 M model")
    parser.add_argument("--chunks", type=int, nargs="+", default=[0, 256, 1024, 4096])
    parser.add_argument("--lengths", type=int, nargs="+", default=[64])
    parser.add_argument("--micro", type=int, default=64, help="rows per micro-batch (trainer.ppo_micro_batch_size)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    started = time.perf_counter()
    if args.real:
        from rl_step_vs_trl import real_model

        model, name = real_model(), "SmolLM2-135M-Instruct"
    else:
        import tempfile

        model, name = build_policy_dir(Path(tempfile.mkdtemp(prefix="chunk-bench-")) / "model"), "Qwen2-1M"
    rows = []
    for length in args.lengths:
        full = None
        for chunk, fused in [(0, False), *[(c, True) for c in args.chunks]]:
            spec = {"model": str(model), "chunk": chunk, "length": length, "repeats": args.repeats, "threads": args.threads,
                    "micro": args.micro, "fused": fused}
            label = "0, matmul attention" if not fused else (chunk or "0 (full logits)")
            proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True,
                                  env=thread_env(args.threads))
            if proc.returncode != 0:
                rows.append([f"L={length}", label, "failed" if proc.returncode > 0 else f"killed ({-proc.returncode})", "", "", ""])
                print(proc.stderr[-2000:], file=sys.stderr)
                continue
            out = json.loads(proc.stdout.strip().splitlines()[-1])
            full = out if not fused else full
            ratio = f"{full['seconds'] / out['seconds']:.2f}x" if full else "-"
            rows.append([f"L={length}", label, out["seconds"], f"{out['peak'] / 1e9:.2f}", ratio,
                         f"{out['tokens'] * out['vocab'] * 4 / 1e9:.2f}"])
            print(f"  L={length} {label}: {out['seconds']:.2f} s, peak {out['peak'] / 1e9:.2f} GB", file=sys.stderr, flush=True)
    print(f"update with the chunked head: {name}, 64 rows (8 prompts x 8) x L response tokens, micro-batches of {args.micro} rows, "
          f"float32, {args.threads} threads, "
          f"median of {args.repeats} after 1 warm-up, one process per row ({time.perf_counter() - started:.0f} s in all)")
    for line in machine():
        print(line)
    print()
    print(table(["length", "logprob_chunk", "update s", "peak GB", "x before", "one fp32 logits GB"], rows))


if __name__ == "__main__":
    main()
