"""The training-engine protocol the trainer is written against."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch

from dapo_cli.batch import RolloutBatch


class TrainingEngine(Protocol):
    """Owns the trainable policy, its optimizer and LR schedule."""

    model: torch.nn.Module

    def log_probs(
        self, batch: RolloutBatch, *, temperature: float, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log π(o_t | q, o_<t) ``[N, T]`` (and entropy ``[N, T]``), differentiable."""
        ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self) -> tuple[float, bool]:
        """Clip, step the optimizer and scheduler; returns (grad_norm, applied). Non-finite → skipped."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def save_model(self, directory: Path, tokenizer: Any) -> None: ...
