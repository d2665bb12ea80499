"""One optimizer update on a fixed batch, under any engine and world size (run by the tests).

    python dist_worker.py MODEL_DIR OUT.pt                       # one process, torch engine
    torchrun --standalone --nproc_per_node 2 dist_worker.py MODEL_DIR OUT.pt

Every process builds the same 8 scripted groups of 4 responses (ragged lengths, mixed
accuracy); ``collect_batch`` hands each rank its share. For each case (the torch engine,
then DeepSpeed ZeRO 0-3 when installed) the worker loads the same initial weights, runs
``update_policy`` once with one mini-batch (one optimizer step), and rank 0 records the
weights after the step and the logged metrics. It also records, for the torch engine,
the metrics of a 2-epoch update under micro-batch sizes 1, 2 and 4.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))

from fakes import ScriptedRollout  # noqa: E402

from dapo_cli.components import build_collective, build_training_engine  # noqa: E402
from dapo_cli.config import apply_techniques, load_config  # noqa: E402
from dapo_cli.data.loader import Prompt, PromptStream  # noqa: E402
from dapo_cli.engine.dist import shutdown_process_group  # noqa: E402
from dapo_cli.models import load_policy  # noqa: E402
from dapo_cli.train.rounds import InlineRounds
from dapo_cli.train import collect_batch, compute_advantages  # noqa: E402
from dapo_cli.train.update import fill_old_log_probs, rollout_mismatch, update_policy  # noqa: E402
from dapo_cli.train.objective import build_objective  # noqa: E402

GROUPS = 8
SAMPLES = 4


OBJECTIVE_CASES = {
    "gspo": ["algorithm.policy_loss=gspo", "algorithm.loss_agg_mode=seq-mean-token-mean",
             "algorithm.gspo.clip_ratio_low=0.01", "algorithm.gspo.clip_ratio_high=0.01"],
    "cispo": ["algorithm.policy_loss=cispo", "algorithm.cispo.clip_ratio_high=0.05"],
    "gmpo": ["algorithm.policy_loss=gmpo", "algorithm.loss_agg_mode=seq-mean-token-mean",
             "algorithm.gmpo.log_clip_low=0.05", "algorithm.gmpo.log_clip_high=0.05"],
    "opsm": ["algorithm.rollout_is.enable=true", "algorithm.rollout_is.mode=opsm", "algorithm.rollout_is.opsm_delta=0.01"],
    "geo_mask": ["algorithm.rollout_is.enable=true", "algorithm.rollout_is.mode=geo_mask", "algorithm.rollout_is.geo_bound=1.02"],
}
"""Settings of the cases recorded under their name, each a 2-epoch update under micro-batch sizes 1, 2 and 4."""


def script(prompt: str, j: int) -> tuple[str, int, bool]:
    k = int(prompt[1:])
    # lengths 2..12 vary within and across groups; samples 0 and 1 (and 2 for odd k) are right
    right = j < 2 + k % 2
    return (f"Answer: {k if right else -1}", 2 + (3 * j + 5 * k) % 11, False)


def lopsided(prompt: str, j: int) -> tuple[str, int, bool]:
    """Groups 0-3 as in ``script``; groups 4-7 (rank 1's half on 2 ranks) are all right: no signal."""
    k = int(prompt[1:])
    return script(prompt, j) if k < 4 else (f"Answer: {k}", 3 + j, False)


def config(engine: str, stage: int, micro: int, epochs: int, dynamic: bool = False, shared: bool = True, extra=()):
    cfg = load_config(None, [*extra,
        f"rollout.n={SAMPLES}", f"data.train_batch_size={GROUPS}", f"trainer.ppo_mini_batch_size={GROUPS}",
        f"trainer.ppo_micro_batch_size={micro}", f"trainer.ppo_epochs={epochs}", "rollout.max_response_length=12",
        "algorithm.overlong_buffer.len=4", "trainer.lr=5e-3", "trainer.lr_warmup_steps=0", "trainer.grad_clip=1.0",
        "trainer.weight_decay=0.0", f"engine.name={engine}", f"engine.zero_stage={stage}", "engine.device=cpu",
        f"engine.shared_prompt_forward={str(shared).lower()}",
    ])
    return apply_techniques(cfg, dynamic_sampling=dynamic)


def one_update(
    model_dir: str, dist, engine_name: str, stage: int, micro: int, epochs: int, *, uneven: bool = False, shared: bool = True,
    extra=(),
) -> dict:
    # uneven: dynamic sampling keeps only groups 0-3, twice over two rounds, so on 2 ranks
    # rank 0 trains all 8 kept groups and rank 1 none (it runs empty micro-batches in lockstep)
    # extra: settings (another policy loss, a rollout correction: then the rollout engine's log-probs are the old ones
    # minus a fixed per-token shift of up to ±0.3, the same on every rank for the same response)
    cfg = config(engine_name, stage, micro, epochs, dynamic=uneven, shared=shared, extra=extra)
    torch.manual_seed(0)
    model, _ = load_policy(model_dir)
    t = cfg.trainer
    engine = build_training_engine(
        cfg.engine, model, dist, lr=t.lr, weight_decay=t.weight_decay, warmup_steps=t.lr_warmup_steps,
        grad_clip=t.grad_clip, bf16=cfg.model.dtype == "bfloat16", load_reference=None,
    )
    prompts = [Prompt(text=f"p{k}", ground_truth=str(k), problem_id=str(k)) for k in range(GROUPS)]
    stream = PromptStream(prompts, seed=0, shuffle=False)
    rollout = ScriptedRollout(lopsided if uneven else script)
    batch = collect_batch(InlineRounds(rollout, stream, cfg, dist), cfg, step=1, pad_id=0, dist=dist).batch
    compute_advantages(batch, cfg)
    fill_old_log_probs(engine, batch, build_objective(cfg), cfg.trainer.ppo_micro_batch_size)
    if any(e.startswith("algorithm.rollout_is") for e in extra):
        gen = torch.Generator().manual_seed(4)
        width = cfg.rollout.max_response_length  # a rank's batch is padded to its own longest response: draw full rows
        shifts = (0.6 * torch.rand(GROUPS * SAMPLES, width, generator=gen) - 0.3)[:, : batch.old_log_probs.shape[1]]
        seen: dict[int, int] = {}
        within = []  # each response's place among its group's responses
        for g in batch.group_ids.tolist():
            within.append(seen.get(g, 0))
            seen[g] = within[-1] + 1
        rows = batch.group_ids * SAMPLES + torch.tensor(within, dtype=torch.long)
        batch.rollout_log_probs = batch.old_log_probs - shifts[rows] * batch.response_mask
    metrics = update_policy(engine, batch, build_objective(cfg), cfg.trainer, step=1)
    if batch.rollout_log_probs is not None:
        metrics.update(rollout_mismatch(batch, build_objective(cfg), cfg.algorithm.rollout_is, dist))
    weights = {name: t.detach().cpu().clone() for name, t in engine.export_weights()}
    return {"metrics": metrics, "weights": weights, "rows": len(batch)}


def main() -> None:
    model_dir, out = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    cfg = config("torch", 0, 4, 1)
    dist = build_collective(cfg.engine)
    initial, _ = load_policy(model_dir)
    results: dict = {"world_size": dist.world_size, "cases": {}, "micro": {}, "initial": initial.state_dict()}
    results["cases"]["torch"] = one_update(model_dir, dist, "torch", 0, 4, 1)
    results["cases"]["torch-uneven"] = one_update(model_dir, dist, "torch", 0, 4, 1, uneven=True)
    # DeepSpeed runs the plain forward: its reference is the torch engine on the plain forward too
    # (the shared-prompt forward's float32 rounding differs, and Adam's first step, lr * g / (|g| + eps),
    # turns a 2% difference on a 3e-9 gradient entry into 1.6e-5 of weight)
    results["cases"]["torch-plain"] = one_update(model_dir, dist, "torch", 0, 4, 1, shared=False)
    results["cases"]["torch-plain-uneven"] = one_update(model_dir, dist, "torch", 0, 4, 1, uneven=True, shared=False)
    for micro in (1, 2, 4):
        results["micro"][micro] = one_update(model_dir, dist, "torch", 0, micro, 2)["metrics"]
    # every registered loss, and the corrections' metrics (sequence means, ratio tails), under any split and rank count
    for name, extra in OBJECTIVE_CASES.items():
        results[name] = {micro: one_update(model_dir, dist, "torch", 0, micro, 2, extra=extra)["metrics"] for micro in (1, 2, 4)}
    if "--deepspeed" in sys.argv:
        for stage in (0, 1, 2, 3):
            results["cases"][f"deepspeed-zero{stage}"] = one_update(model_dir, dist, "deepspeed", stage, 4, 1)
        results["cases"]["deepspeed-zero3-uneven"] = one_update(model_dir, dist, "deepspeed", 3, 4, 1, uneven=True)
    finish(dist, results, out)


def finish(dist, results: dict, out: Path) -> None:
    """Rank 0 writes ``results`` to ``out``; every rank waits for it and leaves the process group."""
    if dist.is_main:
        torch.save(results, out)
    dist.barrier()
    dist.close()
    shutdown_process_group()


if __name__ == "__main__":
    main()
