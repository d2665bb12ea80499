"""A scripted rollout engine for trainer tests: responses chosen by the test, not sampled."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from dapo_cli.rollout.base import Rollouts, SamplingParams

Script = Callable[[str, int], tuple[str, int, bool]]
"""(prompt text, sample index) -> (response text, length in tokens, truncated)."""


class ScriptedRollout:
    """Implements the RolloutEngine protocol; token ids are arbitrary (3 + position) but shapes are real."""

    def __init__(self, script: Script, *, pad_id: int = 0) -> None:
        self.script = script
        self.pad_id = pad_id
        self.calls: list[int] = []

    lockstep = False
    seeds_per_prompt = False

    def check_prompts(self, prompts: Sequence[str], max_tokens: int) -> None:
        pass

    def sync_weights(self, source: object) -> None:
        pass

    def forget_prefixes(self) -> None:
        pass

    def sleep(self) -> None:
        pass

    def wake_up(self) -> None:
        pass

    def close(self) -> None:
        pass

    def generate(self, prompts: Sequence[str], n: int, params: SamplingParams) -> Rollouts:
        self.calls.append(len(prompts))
        rows = [self.script(p, j) for p in prompts for j in range(n)]
        t = max(length for _, length, _ in rows)
        N = len(rows)
        response_ids = torch.full((N, t), self.pad_id, dtype=torch.long)
        mask = torch.zeros(N, t, dtype=torch.bool)
        for i, (_, length, _) in enumerate(rows):
            response_ids[i, :length] = 3 + torch.arange(length) % 20
            mask[i, :length] = True
        return Rollouts(
            prompt_ids=torch.full((N, 2), 5, dtype=torch.long),
            prompt_mask=torch.ones(N, 2, dtype=torch.bool),
            response_ids=response_ids,
            response_mask=mask,
            lengths=mask.sum(-1),
            truncated=torch.tensor([tr for _, _, tr in rows]),
            texts=[text for text, _, _ in rows],
            prompt_index=torch.arange(len(prompts)).repeat_interleave(n),
        )


class Recorder:
    """A tracker that keeps what run_train logs (a NullTracker with a memory)."""

    def __init__(self) -> None:
        from dapo_cli.tracking import NullTracker

        self.null = NullTracker()
        self.metrics: dict[int, dict[str, float]] = {}

    def log_metrics(self, metrics, step=None):
        self.metrics.setdefault(step, {}).update(metrics)

    def __getattr__(self, name):
        return getattr(self.null, name)
