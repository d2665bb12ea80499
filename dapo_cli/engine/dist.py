"""Ranks and collectives: one process (no-ops) or a torch.distributed process group.

The trainer is written against :class:`Collective`; ``SingleProcess`` stands in when
there is one process, the way ``NullTracker`` stands in for MLflow, so the loop has
no ``if distributed:`` branches. ``ProcessGroup`` wraps ``torch.distributed`` (gloo on
CPU, nccl on GPU), initialised from the launcher's environment::

    torchrun --standalone --nproc_per_node 2 -m dapo_cli train experiments/tiny.yaml
    deepspeed --hostfile hosts --num_gpus 8 -m dapo_cli train experiments/dapo-qwen2.5-32b.yaml

Every collective is called by every rank in the same order; values are CPU tensors or
picklable objects and come back on the CPU.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Protocol

import torch

from dapo_cli.errors import UserError

LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""What torchrun and the deepspeed launcher set for each process."""

LAUNCH_HINT = "launch with: torchrun --standalone --nproc_per_node N -m dapo_cli train CONFIG"


class Collective(Protocol):
    """This process's place among the data-parallel ranks, and the collectives the loop needs."""

    rank: int
    world_size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        """True on rank 0: the rank that tracks, prints, writes reports and exports checkpoints."""
        ...

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Elementwise ``sum`` / ``max`` / ``min`` over ranks of a CPU tensor (returns a new tensor)."""
        ...

    def all_gather_object(self, obj: Any) -> list[Any]:
        """``[obj of rank 0, obj of rank 1, ...]`` on every rank."""
        ...

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (what the other ranks pass is ignored)."""
        ...

    def barrier(self) -> None: ...

    def close(self) -> None: ...


class SingleProcess:
    """The collectives of a world of one: every reduction is the identity."""

    rank = 0
    world_size = 1
    local_rank = 0
    backend = "none"

    @property
    def is_main(self) -> bool:
        return True

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        _check_op(op)
        return tensor.clone()

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def broadcast_object(self, obj: Any) -> Any:
        return obj

    def barrier(self) -> None:
        pass

    def close(self) -> None:
        pass


_OPS = ("sum", "max", "min")


def _check_op(op: str) -> None:
    if op not in _OPS:
        raise ValueError(f"unknown reduction {op!r}; valid: {', '.join(_OPS)}")


class ProcessGroup:
    """``torch.distributed`` collectives on the default process group (created here if needed)."""

    def __init__(self, backend: str, *, timeout_s: float = 1800.0) -> None:
        import torch.distributed as dist

        self._dist = dist
        if not dist.is_initialized():
            dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
        self.backend = dist.get_backend()
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        # nccl moves tensors on the GPU; everything the loop reduces lives on the CPU
        self._device = torch.device("cuda", self.local_rank) if self.backend == "nccl" else torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        _check_op(op)
        red = {"sum": self._dist.ReduceOp.SUM, "max": self._dist.ReduceOp.MAX, "min": self._dist.ReduceOp.MIN}[op]
        work = tensor.detach().clone().to(self._device)
        self._dist.all_reduce(work, op=red)
        return work.cpu()

    def all_gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        self._dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj: Any) -> Any:
        box = [obj if self.rank == 0 else None]
        self._dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        self._dist.barrier()

    def close(self) -> None:
        shutdown_process_group()


# ---------------------------------------------------------------- helpers on any Collective


def reduce_sums(dist: Collective, values: Mapping[str, float]) -> dict[str, float]:
    """Sum each named float over ranks in one all-reduce (float64, so counts stay exact)."""
    keys = sorted(values)
    if not keys:
        return {}
    total = dist.all_reduce(torch.tensor([float(values[k]) for k in keys], dtype=torch.float64), "sum")
    return dict(zip(keys, total.tolist()))


def gather_cat(dist: Collective, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Concatenate each named ``[N_r, ...]`` CPU tensor over ranks (rank order) → ``[sum N_r, ...]``."""
    parts = dist.all_gather_object({k: v.detach().cpu() for k, v in tensors.items()})
    return {k: torch.cat([p[k] for p in parts]) for k in tensors}


# ---------------------------------------------------------------- building one from the environment


def launch_env(environ: Mapping[str, str] | None = None) -> dict[str, int] | None:
    """RANK / LOCAL_RANK / WORLD_SIZE from a launcher, or None for a plain single process.

    Raises a :class:`UserError` naming the missing variables when only some are set.
    """
    env = os.environ if environ is None else environ
    present = [v for v in LAUNCH_VARS if env.get(v)]
    if not present:
        return None
    missing = [v for v in LAUNCH_VARS if not env.get(v)]
    if missing:
        raise UserError(f"launcher environment incomplete: {', '.join(missing)} not set; {LAUNCH_HINT}")
    try:
        values = {k: int(env[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    except ValueError:
        raise UserError(f"RANK, LOCAL_RANK and WORLD_SIZE must be integers; {LAUNCH_HINT}") from None
    if not 0 <= values["RANK"] < values["WORLD_SIZE"]:
        raise UserError(f"RANK={values['RANK']} is outside WORLD_SIZE={values['WORLD_SIZE']}; {LAUNCH_HINT}")
    return values


def init_collective(device: str, environ: Mapping[str, str] | None = None) -> Collective:
    """``SingleProcess`` outside a launcher (or with WORLD_SIZE=1), else a process group (gloo/nccl)."""
    values = launch_env(environ)
    if values is None or values["WORLD_SIZE"] == 1:
        return SingleProcess()
    backend = "nccl" if device != "cpu" and torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(values["LOCAL_RANK"])
    return ProcessGroup(backend)


def ensure_single_process_env() -> None:
    """Give a lone process the launcher variables that DeepSpeed insists on (it looks for MPI otherwise)."""
    if launch_env() is not None:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})


def shutdown_process_group() -> None:
    """Destroy the default process group if one exists (ours, or the one DeepSpeed created)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        _free_garbage()
        dist.destroy_process_group()


def _free_garbage() -> None:
    """Collect unreachable objects before the process group goes: an engine's DDP reducer still holds the group,
    and left to the interpreter's exit, gloo's threads aborted one rank of a finished 2-rank run in about 1 of 6
    (``terminate called without an active exception``, exit -6; tests/train/test_train_old_log_probs.py's worker,
    0 of 12 with this collection first)."""
    import gc

    gc.collect()
