"""The cluster plan of ``dapo train CONFIG --dry-run``: batch arithmetic, world-size checks and a
per-GPU memory estimate for every phase of an RL step, without a GPU and without any weights.

    shape.py   config.json (local dir, Hugging Face cache, known hub ids, builtin:tiny) → ModelShape,
               the exact parameter count of a Llama/Qwen2 decoder, KV-cache bytes per token
    batch.py   prompts, responses, generation rounds, updates, micro-batches, tokens; world-size checks
    memory.py  the memory terms of each phase (rollout, old log-probs, update), verdicts, the first knob
    render.py  the printed plan (rich) and its JSON form

``make_plan(cfg, world_size=8)`` returns a :class:`Plan`; docs/scaling.md explains the numbers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from dapo_cli.config import Config
from dapo_cli.errors import UserError
from dapo_cli.plan.batch import BatchPlan, Check, batch_plan, world_checks
from dapo_cli.plan.memory import MemoryPlan, memory_plan
from dapo_cli.plan.shape import KNOWN_MODELS, ModelShape, find_shape, parameter_count

@dataclass
class Plan:
    config: str
    model_path: str
    dtype: str
    shape: ModelShape
    parameters: int
    world_size: int
    world_source: str
    gpus_per_node: int
    batch: BatchPlan
    checks: list[Check]
    memory: MemoryPlan
    notes: list[str] = field(default_factory=list)

    @property
    def nodes(self) -> int:
        return -(-self.world_size // self.gpus_per_node)

    @property
    def runnable(self) -> bool:
        """Every hard world-size check passes (memory verdicts are estimates and do not count)."""
        return all(c.ok for c in self.checks if c.hard)

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config, "model": {"path": self.model_path, "dtype": self.dtype, "parameters": self.parameters, **self.shape.to_dict()},
            "world": {"world_size": self.world_size, "source": self.world_source, "gpus_per_node": self.gpus_per_node, "nodes": self.nodes},
            "batch": self.batch.to_dict(),
            "checks": [{"name": c.name, "ok": c.ok, "hard": c.hard, "message": c.message} for c in self.checks],
            "memory": self.memory.to_dict(), "notes": self.notes, "runnable": self.runnable,
        }


def default_world_size(cluster_world_size: int = 0) -> tuple[int, str]:
    """``$WORLD_SIZE`` (set by torchrun and the deepspeed launcher), else the config's ``cluster.world_size``
    (the cluster a preset is written for), else 1; with where it came from."""
    raw = os.environ.get("WORLD_SIZE", "").strip()
    if raw:
        try:
            return int(raw), "$WORLD_SIZE"
        except ValueError:
            raise UserError(f"WORLD_SIZE={raw!r} is not an integer; unset it or pass --world-size N") from None
    if cluster_world_size > 0:
        return cluster_world_size, "cluster.world_size in the config"
    return 1, "the default: WORLD_SIZE is unset"


def make_plan(
    cfg: Config,
    *,
    world_size: int | None = None,
    gpu_memory_gib: float | None = None,
    gpus_per_node: int | None = None,
    config_name: str = "",
) -> Plan:
    """The whole plan for ``cfg`` on the cluster given (--world-size, --gpus-per-node, --gpu-memory-gib); None:
    the config's ``cluster`` section (world size: $WORLD_SIZE first, then ``cluster.world_size``, else 1)."""
    if world_size is None:
        world_size, source = default_world_size(cfg.cluster.world_size)
    else:
        source = "--world-size"
    if world_size < 1:
        raise UserError(f"world size {world_size} must be >= 1 (--world-size N)")
    if gpus_per_node is None:
        gpus_per_node = cfg.cluster.gpus_per_node
    elif gpus_per_node < 1:
        raise UserError(f"--gpus-per-node {gpus_per_node} must be >= 1")
    if gpu_memory_gib is None:
        gpu_memory_gib = cfg.cluster.gpu_memory_gib
    elif gpu_memory_gib <= 0:
        raise UserError(f"--gpu-memory-gib {gpu_memory_gib} must be > 0")
    shape = find_shape(cfg.model.path, cfg.model.tiny)
    checks = world_checks(
        cfg, world_size, gpus_per_node=gpus_per_node, num_attention_heads=shape.num_attention_heads,
        num_kv_heads=shape.num_key_value_heads,
    )
    batch = batch_plan(cfg, world_size)
    memory = memory_plan(cfg, shape, world_size=world_size, gpu_memory_gib=gpu_memory_gib, gpus_per_node=gpus_per_node)
    notes = list(batch.notes)
    if cfg.engine.device == "cpu":
        notes.append("engine.device=cpu: this run trains in host memory; the GPU figures are for the same settings on GPUs")
    if cfg.engine.name == "torch" and world_size > 1:
        notes.append("engine.name=torch: DDP keeps a full replica of weights, gradients and optimizer on every rank")
    return Plan(
        config=config_name, model_path=cfg.model.path, dtype=cfg.model.dtype, shape=shape, parameters=parameter_count(shape),
        world_size=world_size, world_source=source, gpus_per_node=gpus_per_node, batch=batch, checks=checks,
        memory=memory, notes=notes,
    )


__all__ = ["KNOWN_MODELS", "ModelShape", "Plan", "default_world_size", "find_shape", "make_plan", "parameter_count"]
