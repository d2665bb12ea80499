"""Run directories and atomic, resumable checkpoints.

Layout of one run (``trainer.output_dir`` / experiment / run name)::

    runs/dapo-tiny/dapo-s0/
        config.yaml                    the resolved config the run was started with
        checkpoints/step_000020/       one checkpoint, written as .step_000020.tmp/ then renamed
            model/                     save_pretrained policy + tokenizer (loadable by `dapo eval` and plain transformers)
            engine/                    the engine's training state: torch: optimizer.pt (optimizer + LR schedule);
                                       deepspeed: its sharded checkpoint (module, optimizer partitions per rank, schedule)
            rng/rank_00001.pt          RNG states of ranks other than 0
            trainer_state.pt           rank 0's RNG state, data position, step, MLflow run id, world size
        checkpoints/latest             name of the newest complete checkpoint (written atomically)

A checkpoint directory exists only once complete (every rank has written its part and
rank 0 renamed it into place), and ``latest`` is updated only after it, so a run killed
at any instant resumes from a consistent state.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch

from dapo_cli.engine.dist import Collective
from dapo_cli.errors import UserError
from dapo_cli.fileio import write_text_atomic

KEEP_CHECKPOINTS = 2
"""Complete checkpoints kept per run (older ones are deleted after a new one lands)."""

ENGINE_DIR = "engine"
"""Subdirectory of a checkpoint holding the training engine's own state."""


def run_dir_for(output_dir: str, experiment: str, run_name: str) -> Path:
    return Path(output_dir) / experiment / run_name


def fresh_run_name(output_dir: str, experiment: str, stem: str) -> str:
    """``stem``, or ``stem-2``, ``stem-3``… when earlier runs already used the name."""
    base = Path(output_dir) / experiment
    if not (base / stem).exists():
        return stem
    i = 2
    while (base / f"{stem}-{i}").exists():
        i += 1
    return f"{stem}-{i}"


def latest_run_name(output_dir: str, experiment: str, stem: str) -> str | None:
    """The newest run named ``stem`` or ``stem-K`` that has a checkpoint (for ``--resume``)."""
    base = Path(output_dir) / experiment
    if not base.is_dir():
        return None
    candidates = [
        d for d in base.iterdir()
        if d.is_dir() and (d.name == stem or (d.name.startswith(stem + "-") and d.name[len(stem) + 1 :].isdigit()))
        and (d / "checkpoints" / "latest").is_file()
    ]
    if not candidates:
        return None
    return max(candidates, key=lambda d: (d / "checkpoints" / "latest").stat().st_mtime).name


def rng_state() -> dict[str, Any]:
    """Python and torch RNG states (CUDA too when present)."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class CheckpointManager:
    """Writes and finds the checkpoints of one run directory."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.root = run_dir / "checkpoints"

    def save(self, step: int, *, dist: Collective, write: Any, trainer_state: dict[str, Any]) -> Path:
        """Write checkpoint ``step`` atomically; every rank calls it.

        Rank 0 creates ``.step_N.tmp``; every rank calls ``write(tmp)`` (the engine's shards, the
        model export) and saves its RNG state; rank 0 adds ``trainer_state.pt``, renames the
        directory into place and updates ``latest``. Barriers keep the ranks in step.
        """
        name = f"step_{step:06d}"
        final = self.root / name
        tmp = self.root / f".{name}.tmp"
        if dist.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        write(tmp)
        if not dist.is_main:
            (tmp / "rng").mkdir(exist_ok=True)
            torch.save(rng_state(), tmp / "rng" / f"rank_{dist.rank:05d}.pt")
        dist.barrier()
        if dist.is_main:
            torch.save({**trainer_state, "rng": rng_state(), "step": step}, tmp / "trainer_state.pt")
            if final.exists():
                old = self.root / f".{name}.old"
                shutil.rmtree(old, ignore_errors=True)
                os.replace(final, old)
                os.replace(tmp, final)
                shutil.rmtree(old)
            else:
                os.replace(tmp, final)
            write_text_atomic(self.root / "latest", name + "\n")
            self._prune(keep=name)
        dist.barrier()
        return final

    @staticmethod
    def rank_rng_state(path: Path, rank: int, *, default: dict[str, Any]) -> dict[str, Any]:
        """The RNG state rank ``rank`` saved in checkpoint ``path`` (rank 0's is ``default``)."""
        own = path / "rng" / f"rank_{rank:05d}.pt"
        return torch.load(own, weights_only=False) if rank and own.is_file() else default

    def _prune(self, keep: str) -> None:
        done = sorted(d for d in self.root.glob("step_*") if d.is_dir())
        for d in done[:-KEEP_CHECKPOINTS]:
            if d.name != keep:
                shutil.rmtree(d, ignore_errors=True)

    def latest(self) -> Path | None:
        marker = self.root / "latest"
        if not marker.is_file():
            return None
        path = self.root / marker.read_text(encoding="utf-8").strip()
        return path if (path / "trainer_state.pt").is_file() else None

    def load_state(self, path: Path) -> dict[str, Any]:
        try:
            return torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)
        except Exception as exc:  # a corrupt file is the user's to remove
            raise UserError(f"cannot read checkpoint {path}: {exc}; delete it to resume from an earlier one") from None
