"""ZeRO-3 on 2 gloo ranks, several checks in one launch (issue 52): run by ``test_distributed_zero3.py``.

    torchrun --standalone --nproc_per_node 2 zero3_worker.py MODEL_DIR OUT.pt

Every tensor is sharded (``stage3_param_persistence_threshold`` 0: none kept whole for being small). Rank 0
writes what it measured to OUT.pt:

- ``sync``: ``export_weights`` consumed as a weight sync consumes it (each tensor read, then dropped) and kept
  (a list, what a materialising consumer holds). At every yield the *extra* bytes are measured: the storages of
  ZeRO-3 parameters currently gathered (``p.data`` full-size) plus the storages of yielded tensors still alive
  (weak references, dropped by finalizers), each storage counted once. The received tensors are compared with
  the model file.
- ``finite``: ``params_finite`` before and after an inf is written into rank 1's local shard of one parameter,
  with ``GatheredParameters`` replaced by a function that raises (a gather there fails the check).
- ``head``: log-probs, entropies and the full gradient of every parameter (``safe_get_full_grad``) of one loss,
  through the chunked head (its weight gathered for the call) and through the full logits.
"""

from __future__ import annotations

import sys
import weakref
from pathlib import Path

import torch

from dapo_cli.batch import RolloutBatch
from dapo_cli.config import load_config
from dapo_cli.components import build_collective, sharded_model_loader
from dapo_cli.engine.deepspeed import DeepSpeedEngine
from dapo_cli.engine.torch import policy_forward
from dapo_cli.models import load_policy
from dist_worker import finish  # this script's folder is on sys.path

SHARD_ALL = {"stage3_param_persistence_threshold": 0}
HEAD_CALLS: list[int] = []


def count_head_calls() -> None:
    """Record each call of the chunked head under ZeRO-3 (so a case knows which path ran)."""
    import dapo_cli.engine.deepspeed as module

    original = module.gathered_head_log_probs

    def counted(*args, **kwargs):
        HEAD_CALLS.append(1)
        return original(*args, **kwargs)

    module.gathered_head_log_probs = counted


def storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def measure_sync(engine: DeepSpeedEngine, reference: dict[str, torch.Tensor], *, keep: bool) -> dict:
    params = list(engine.module.parameters())
    alive: dict[int, tuple[int, int]] = {}  # id(yielded) -> (storage key, bytes) while the consumer holds it
    kept, peak, worst = [], 0, 0.0
    for name, tensor in engine.export_weights():
        if hasattr(tensor, "ds_id") or name not in reference:
            raise AssertionError(f"{name}: a parameter object or an unknown name left the engine")
        alive[id(tensor)] = (storage_key(tensor), tensor.untyped_storage().nbytes())
        weakref.finalize(tensor, alive.pop, id(tensor), None)
        live = {storage_key(p.data): p.data.untyped_storage().nbytes() for p in params if p.data.numel() == p.ds_numel > 0}
        live.update(dict(alive.values()))
        peak = max(peak, sum(live.values()))
        worst = max(worst, float((tensor - reference[name]).abs().max()))
        if keep:
            kept.append(tensor)
        del tensor
    return {"peak": peak, "max_diff": worst, "kept": len(kept)}


def loaded_shards(model: torch.nn.Module, reference: dict[str, torch.Tensor]) -> dict:
    """Right after the load: each parameter's (full numel, local shard numel, numel of ``p.data``), the bytes this
    rank holds in parameter shards, and the largest difference of a gathered parameter from the file."""
    import deepspeed

    shapes = {name: (p.ds_numel, p.ds_tensor.numel(), p.data.numel()) for name, p in model.named_parameters()}
    held = sum(p.ds_tensor.numel() * p.ds_tensor.element_size() for p in model.parameters())
    worst = 0.0
    for name, p in model.named_parameters():
        with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
            worst = max(worst, float((p.data - reference[name]).abs().max()))
    return {"shapes": shapes, "held_bytes": held, "max_diff": worst}


def batch(vocab: int) -> RolloutBatch:
    g = torch.Generator().manual_seed(3)
    n, s, t = 4, 5, 6
    prompt_ids = torch.randint(3, vocab, (n, s), generator=g)
    prompt_mask = torch.ones(n, s, dtype=torch.long)
    prompt_mask[1, :2] = 0  # left padding
    response_ids = torch.randint(3, vocab, (n, t), generator=g)
    response_mask = torch.ones(n, t, dtype=torch.long)
    response_mask[2, 4:] = 0  # right padding
    response_mask[3, 1:] = 0
    return RolloutBatch(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids, response_mask=response_mask,
        lengths=response_mask.sum(1), truncated=torch.zeros(n, dtype=torch.bool), group_ids=torch.zeros(n, dtype=torch.long),
        texts=[""] * n, ground_truths=[""] * n, prompts=[""] * n, pad_id=0,
    )


def head_case(engine: DeepSpeedEngine, rows: RolloutBatch, chunk: int) -> dict:
    from deepspeed.utils import safe_get_full_grad

    engine.chunk = chunk
    calls = len(HEAD_CALLS)
    logp, ent = engine.log_probs(rows, temperature=0.7, with_entropy=True)
    mask = rows.response_mask.bool()
    coef = torch.linspace(-1.0, 1.0, logp.numel()).view_as(logp)
    loss = (logp * coef)[mask].sum() + 0.3 * ent[mask].sum()
    engine.backward(loss / engine.dist.world_size)  # backward scales by the world size: the same rows on every rank
    # DeepSpeed keeps adding into its gradient partitions until step (the trainer owns accumulation): the caller
    # takes differences of these running sums
    grads = {name: safe_get_full_grad(p).detach().clone() for name, p in engine.module.named_parameters()}
    return {"logp": logp.detach()[mask], "ent": ent.detach()[mask], "grads": grads, "chunked": len(HEAD_CALLS) > calls}


def main() -> None:
    model_dir, out = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    cfg = load_config(None, ["engine.name=deepspeed", "engine.zero_stage=3", "engine.device=cpu"])
    dist = build_collective(cfg.engine)
    reference = {k: v.clone() for k, v in load_policy(model_dir)[0].state_dict().items()}
    # the session's ZeRO-3 load: built partitioned under zero.Init, each file tensor copied into its shard
    model = sharded_model_loader(cfg.engine, model_dir, torch.float32, bf16=False)()
    results: dict = {"loaded": loaded_shards(model, reference)}
    engine = DeepSpeedEngine(
        model, dist=dist, lr=1e-3, weight_decay=0.0, warmup_steps=0, grad_clip=1.0, zero_stage=3, device="cpu",
        logprob_chunk=3, zero_extra=SHARD_ALL,
    )
    sizes = {name: p.ds_numel * p.element_size() for name, p in engine.module.named_parameters()}
    results["sizes"] = sizes
    results["sync"] = measure_sync(engine, reference, keep=False)
    results["sync_kept"] = measure_sync(engine, reference, keep=True)

    import deepspeed

    finite = {"before": engine.params_finite()}
    original = deepspeed.zero.GatheredParameters

    def no_gather(*args, **kwargs):
        raise AssertionError("params_finite gathered a parameter")

    deepspeed.zero.GatheredParameters = no_gather
    try:
        finite["no_gather"] = engine.params_finite()
        target = dict(engine.module.named_parameters())["model.layers.1.mlp.down_proj.weight"]
        kept = float(target.ds_tensor[0])
        if dist.rank == 1:
            with torch.no_grad():
                target.ds_tensor[0] = float("inf")
        finite["inf_on_rank1"] = engine.params_finite()
        with torch.no_grad():
            target.ds_tensor[0] = kept
        finite["after"] = engine.params_finite()
    finally:
        deepspeed.zero.GatheredParameters = original
    results["finite"] = finite

    rows = batch(int(engine.module.config.vocab_size))
    plain, _ = load_policy(model_dir)  # the whole model, as transformers loads it: the sharded load's numbers
    with torch.no_grad():
        results["plain_logp"] = policy_forward(plain, rows, temperature=0.7, with_entropy=False, device=torch.device("cpu"))[0][rows.response_mask.bool()]
    count_head_calls()
    results["head"] = {chunk: head_case(engine, rows, chunk) for chunk in (0, 3)}
    finish(dist, results, out)


if __name__ == "__main__":
    main()
