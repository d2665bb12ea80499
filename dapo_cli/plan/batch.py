"""Batch arithmetic of one RL step, and the checks a world size must pass.

The counts follow ``dapo_cli.train``: a generation round samples ``rollout.n`` responses
for each of ``data.gen_batch_size`` prompts (0: ``train_batch_size``); with dynamic sampling
rounds repeat until ``train_batch_size`` informative groups are kept (at most
``filter_groups.max_num_gen_batches`` rounds); the update runs ``ppo_epochs`` passes of
``train_batch_size / ppo_mini_batch_size`` optimizer steps, each accumulated over
micro-batches of ``ppo_micro_batch_size`` responses per rank.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from dapo_cli.config import Config
from dapo_cli.errors import UserError

EXPECTED_FILL = 0.5
"""Assumed mean prompt and response length as a share of their limits (for "expected" tokens)."""

KEPT_FRACTIONS = (1.0, 0.5, 0.25, 0.1)
"""Kept-group fractions the plan shows generation rounds for (FINDINGS: ~0.1 late in training)."""


@dataclass
class BatchPlan:
    """Counts of one RL step (per step, all ranks together unless a name says per rank)."""

    world_size: int
    prompts: int
    """Prompts (groups) trained per step."""
    responses: int
    gen_batch_size: int
    dynamic_sampling: bool
    min_rounds: int
    """Rounds when every group is kept (1 without dynamic sampling)."""
    max_rounds: int | None
    """The cap on rounds (None: unlimited); 1 without dynamic sampling."""
    rounds_at: dict[float, int | None]
    """Kept fraction → rounds needed (capped; None when unlimited and nothing is kept)."""
    mini_batch_size: int
    """Prompts per mini-batch (trainer.ppo_mini_batch_size)."""
    mini_batches: int
    """Mini-batches per epoch (optimizer steps per epoch)."""
    epochs: int
    updates: int
    """Optimizer steps per RL step (mini_batches × epochs)."""
    responses_per_rank: int
    """Trained responses a rank holds (train prompts / world size × n)."""
    mini_rows_per_rank: float
    """Responses of one mini-batch on one rank, on average."""
    micro_batch: int
    micro_per_update: int
    """Micro-batches (forward/backward) per optimizer step per rank, on average."""
    old_logprob_forwards: int
    """Micro-batch forwards per rank for the old log-probs (no grad)."""
    max_prompt: int
    max_response: int
    expected_fill: float
    trained_tokens_expected: int
    trained_tokens_worst: int
    generated_tokens_expected: int
    """Response tokens generated in one round at the expected fill."""
    generated_tokens_worst: int | None
    """Response tokens if every allowed round runs and every response hits the limit (None: unlimited)."""
    prompts_generated_worst: int | None
    notes: list[str] = field(default_factory=list)

    @property
    def seq_worst(self) -> int:
        return self.max_prompt + self.max_response

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["rounds_at"] = {str(k): v for k, v in self.rounds_at.items()}
        return out


def batch_plan(cfg: Config, world_size: int, *, fill: float = EXPECTED_FILL) -> BatchPlan:
    """The step's counts at ``world_size`` ranks (no divisibility checks: see :func:`world_checks`)."""
    data, rollout, trainer, fg = cfg.data, cfg.rollout, cfg.trainer, cfg.algorithm.filter_groups
    n = rollout.n
    per_round = data.prompts_per_round
    notes: list[str] = []
    if fg.enable:
        prompts = data.train_batch_size
        cap = fg.max_num_gen_batches if fg.max_num_gen_batches > 0 else None
        min_rounds = math.ceil(prompts / per_round)
        rounds_at: dict[float, int | None] = {}
        for frac in KEPT_FRACTIONS:
            need = math.ceil(prompts / (per_round * frac))
            rounds_at[frac] = min(need, cap) if cap else need
        if cap is not None and min_rounds > cap:
            notes.append(
                f"even with every group kept, {min_rounds} rounds are needed but max_num_gen_batches={cap}: "
                "raise data.gen_batch_size or max_num_gen_batches"
            )
    else:
        prompts = per_round  # one round, every group trained (gen_batch_size > train_batch_size trains them all)
        cap, min_rounds, rounds_at = 1, 1, {1.0: 1}
        if per_round != data.train_batch_size:
            notes.append(f"without dynamic sampling the step trains all {per_round} prompts of its one round")
    mini = trainer.ppo_mini_batch_size
    mini_batches = math.ceil(prompts / mini)
    responses = prompts * n
    per_rank = max(1, responses // world_size)
    mini_rows = min(mini, prompts) * n / world_size
    micro = trainer.ppo_micro_batch_size
    trained_expected = responses * round(fill * data.max_prompt_length + fill * rollout.max_response_length)
    generated_one_round = per_round * n * round(fill * rollout.max_response_length)
    return BatchPlan(
        world_size=world_size,
        prompts=prompts,
        responses=responses,
        gen_batch_size=per_round,
        dynamic_sampling=fg.enable,
        min_rounds=min_rounds,
        max_rounds=cap,
        rounds_at=rounds_at,
        mini_batch_size=mini,
        mini_batches=mini_batches,
        epochs=trainer.ppo_epochs,
        updates=mini_batches * trainer.ppo_epochs,
        responses_per_rank=per_rank,
        mini_rows_per_rank=mini_rows,
        micro_batch=micro,
        micro_per_update=max(1, math.ceil(mini_rows / micro)),
        old_logprob_forwards=max(1, math.ceil(per_rank / micro)),
        max_prompt=data.max_prompt_length,
        max_response=rollout.max_response_length,
        expected_fill=fill,
        trained_tokens_expected=trained_expected,
        trained_tokens_worst=responses * (data.max_prompt_length + rollout.max_response_length),
        generated_tokens_expected=generated_one_round,
        generated_tokens_worst=None if cap is None else cap * per_round * n * rollout.max_response_length,
        prompts_generated_worst=None if cap is None else cap * per_round,
        notes=notes,
    )


@dataclass
class Check:
    """One requirement on the world size: ``ok`` or a message saying how to fix it."""

    name: str
    ok: bool
    message: str
    hard: bool = True
    """False for a warning (the run starts, but slowly or not as intended)."""


def world_checks(cfg: Config, world_size: int, *, gpus_per_node: int, num_attention_heads: int, num_kv_heads: int) -> list[Check]:
    """The checks ``dapo train`` would apply (``config.validate.check_world_size``) and vLLM's tensor-parallel ones."""
    from dapo_cli.config import validate as rules

    checks: list[Check] = []
    try:
        rules.check_world_size(cfg.data, world_size)
        per_round = cfg.data.prompts_per_round
        checks.append(Check(
            "batches divide the world size", True,
            f"the batches split over {world_size} rank{'s' if world_size > 1 else ''} "
            f"(a generation round of {per_round} prompts: {per_round // world_size} a rank)",
        ))
    except UserError as exc:
        checks.append(Check("batches divide the world size", False, str(exc)))
    if cfg.rollout.engine == "vllm":
        tp = cfg.rollout.tensor_parallel_size
        checks.append(Check(
            "tensor_parallel_size divides the world size", world_size % tp == 0,
            f"rollout.tensor_parallel_size={tp} {'divides' if world_size % tp == 0 else 'does not divide'} "
            f"the world size {world_size}" + ("" if world_size % tp == 0 else f"; use a world size that is a multiple of {tp}"),
        ))
        heads_ok = num_attention_heads % tp == 0 and (num_kv_heads % tp == 0 if num_kv_heads >= tp else tp % num_kv_heads == 0)
        checks.append(Check(
            "heads split over tensor_parallel_size", heads_ok,
            f"{num_attention_heads} attention / {num_kv_heads} KV heads over tensor_parallel_size={tp}"
            + ("" if heads_ok else ": pick a tensor_parallel_size that divides the attention heads"),
        ))
        within = tp <= gpus_per_node
        checks.append(Check(
            "one vLLM engine within one node", within,
            f"tensor_parallel_size={tp} {'<=' if within else '>'} {gpus_per_node} GPUs per node"
            + ("" if within else " (tensor parallelism across nodes is slow)"),
            hard=False,
        ))
    checks.extend(Check(name, False, message) for name, message in rules.engine_problems(cfg.engine))
    return checks


def valid_world_size(cfg: Config, world_size: int, *, num_attention_heads: int, num_kv_heads: int, gpus_per_node: int) -> bool:
    """True when every hard check passes at ``world_size``."""
    checks = world_checks(cfg, world_size, gpus_per_node=gpus_per_node, num_attention_heads=num_attention_heads, num_kv_heads=num_kv_heads)
    return all(c.ok for c in checks if c.hard)
