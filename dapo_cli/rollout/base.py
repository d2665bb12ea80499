"""The rollout protocol: ``generate(prompts, n, params) -> Rollouts``.

:class:`~dapo_cli.batch.Rollouts` lives beside the training batch it becomes (``dapo_cli/batch.py``, the layer
below every engine), and is re-exported here.

Shapes: ``P`` prompts, ``n`` samples each, ``N = P * n`` responses, ``T`` the
longest response in the batch (``<= params.max_tokens``). Response ``i`` belongs
to prompt ``i // n`` (responses of one prompt are contiguous).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from dapo_cli.batch import Rollouts

__all__ = ["RolloutEngine", "Rollouts", "SamplingParams", "WeightSource"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``top_k=0`` and ``top_p=1.0`` mean plain sampling."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 64
    seed: int | None = None
    logprobs: bool = False
    """Also return log π(o_t) of each sampled token at ``temperature`` (before top-k/top-p truncation)."""


class WeightSource(Protocol):
    """What a rollout engine syncs from: any training engine's ``export_weights``."""

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]: ...


class RolloutEngine(Protocol):
    """Samples ``n`` responses for each prompt with the current policy weights."""

    lockstep: bool
    """Every rank must call :meth:`generate` as often as the others (vLLM's data-parallel engines under
    torchrun step together): then every rank runs validation too, not rank 0 alone."""

    seeds_per_prompt: bool
    """Each response's random stream is keyed by its prompt's text (never by its place in the call), so
    ``train.rounds.RoundPlanner`` gives every rank the same seed and samples do not depend on the world size;
    False: a rank's seed must differ from the other ranks' (the planner derives it with the rank)."""

    def check_prompts(self, prompts: Sequence[str], max_tokens: int) -> None:
        """Raise a one-line ``UserError`` when the longest of ``prompts`` plus ``max_tokens`` exceeds the
        model's context, before anything is generated or recorded (an engine that checks inside
        :meth:`generate` with its own message, as vLLM does, may do nothing here)."""
        ...

    def generate(self, prompts: Sequence[str], n: int, params: SamplingParams) -> Rollouts:
        """``prompts`` are already-templated strings (chat template applied)."""
        ...

    def sleep(self) -> None:
        """Free what generation holds on the accelerator (KV cache, weights) while the trainer updates
        (no-op for engines that share the trainer's module)."""
        ...

    def wake_up(self) -> None:
        """Take back what :meth:`sleep` freed, before the next sync and generate."""
        ...

    def sync_weights(self, source: WeightSource) -> None:
        """Make the next ``generate`` use ``source``'s latest weights, in memory (no disk round trip).

        Called on every rank after every update (``export_weights`` may be a collective);
        an engine that samples with the trainer's own module does nothing.
        """
        ...

    def forget_prefixes(self) -> None:
        """Drop every prompt prefix cached across calls (its keys/values), so the next :meth:`generate`
        computes its prompts afresh. The session calls it after each validation: a run's rollouts then do
        not depend on whether or when it validates (and the worker process, which never validates, samples
        bit for bit what the inline loop samples). No-op for an engine that keeps nothing between calls."""
        ...

    def close(self) -> None:
        """Release what the engine holds beyond Python objects (vLLM: its engine core, KV cache and
        process groups), before the trainer leaves its own process group; no-op for the in-process samplers."""
        ...
