"""The training-engine protocol the trainer is written against.

An engine owns the trainable policy (however it is wrapped or sharded), its
optimizer and LR schedule, the frozen reference policy when a KL term needs one,
and this process's place among the data-parallel ranks (``dist``). The loop in
``train/loop.py`` calls only what is declared here; ``torch.TorchEngine`` (one process,
or torch DDP under torchrun) and ``deepspeed.DeepSpeedEngine`` (ZeRO 0-3) implement it.

One optimizer step over a mini-batch, on every rank::

    for i, micro in enumerate(micro_batches):          # same count on every rank
        with engine.accumulate(last=i == len(micro_batches) - 1):
            logp, ent = engine.log_probs(micro, temperature=T, with_entropy=True)
            engine.backward(loss(logp))                # this rank's term of the global loss
    grad_norm, applied = engine.step()                 # clears gradients, applied or skipped

Gradient convention: ``backward(loss)`` takes this rank's share of a loss that is a
**sum over ranks** (the trainer normalises by all-reduced global counts), and the
gradient the optimizer sees is that of the sum. DDP and DeepSpeed *average* gradients
over ranks; the engines multiply by the world size to undo it (see each ``backward``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import torch

from dapo_cli.batch import RolloutBatch
from dapo_cli.engine.dist import Collective


class TrainingEngine(Protocol):
    """Owns the policy, its optimizer and schedule, the reference policy and the ranks."""

    dist: Collective
    device: torch.device

    def log_probs(
        self, batch: RolloutBatch, *, temperature: float, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log π_θ(o_t | q, o_<t) ``[N, T]`` (and entropy ``[N, T]``), differentiable.

        Under ZeRO-3 this is a collective: every rank calls it the same number of times.
        """
        ...

    def ref_log_probs(self, batch: RolloutBatch, *, temperature: float) -> torch.Tensor:
        """log π_ref of the response tokens ``[N, T]`` under the frozen initial policy (no grad).

        Raises ``RuntimeError`` when the engine was built without a reference policy.
        """
        ...

    def accumulate(self, *, last: bool) -> contextlib.AbstractContextManager[None]:
        """Wrap one micro-batch's forward and backward; ``last`` on the final one before ``step``
        (gradients are reduced across ranks there and nowhere else)."""
        ...

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate the gradient of this rank's term of a loss summed over ranks."""
        ...

    def step(self) -> tuple[float, bool]:
        """Clip, step optimizer and LR schedule; returns (global grad norm, applied).

        A non-finite gradient (on any rank) skips the update. Gradients are cleared either
        way, so a skipped step leaves nothing behind for the next one.
        """
        ...

    @property
    def lr(self) -> float:
        """The learning rate the next ``step`` uses."""
        ...

    def generation_model(self) -> torch.nn.Module | None:
        """The live, unsharded module a rollout engine may sample with (no copy, no sync),
        or None when parameters are sharded (ZeRO-3) or trained as LoRA adapters (the torch engine): then sync a private
        copy from :meth:`export_weights`."""
        ...

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, full tensor)`` for every parameter and buffer, in ``state_dict`` order and names.

        Under ZeRO-3 a collective (every rank iterates it to the end); tensors are complete
        on every rank and are only valid until the next item is requested.
        """
        ...

    def params_finite(self) -> bool:
        """False if any parameter holds NaN/Inf (on any rank)."""
        ...

    def save_checkpoint(self, directory: Path) -> None:
        """Write the full training state (weights, optimizer, schedule) into ``directory``.

        Every rank calls it with the same directory; ranks write their own shards.
        """
        ...

    def load_checkpoint(self, directory: Path) -> None:
        """Restore what :meth:`save_checkpoint` wrote (same world size and engine settings)."""
        ...

    def save_model(self, directory: Path, tokenizer: Any) -> None:
        """A Hugging Face ``save_pretrained`` directory of the current policy, written by rank 0
        (gathered from shards first; every rank calls it)."""
        ...


@contextlib.contextmanager
def no_context() -> Iterator[None]:
    yield
