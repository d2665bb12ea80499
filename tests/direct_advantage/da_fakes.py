"""A deterministic rollout engine: completions looked up by prompt, cycled over the samples."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from dapo_cli.rollout.base import Rollouts, SamplingParams


class ScriptedEngine:
    """``generate`` returns ``script(prompt)[j % len]`` for sample ``j`` of each prompt (a truncated
    completion is written with a trailing ``"…"``, which is stripped and flags it as truncated)."""

    def __init__(self, script: Callable[[str], Sequence[str]]) -> None:
        self.script = script
        self.calls: list[tuple[list[str], int, SamplingParams]] = []

    def generate(self, prompts: Sequence[str], n: int, params: SamplingParams) -> Rollouts:
        self.calls.append((list(prompts), n, params))
        texts, cut = [], []
        for p in prompts:
            options = list(self.script(p))
            for j in range(n):
                t = options[j % len(options)]
                cut.append(t.endswith("…"))
                texts.append(t.rstrip("…"))
        n_rows = len(texts)
        width = max([len(t) for t in texts] + [1])
        lengths = torch.tensor([len(t) + (0 if c else 1) for t, c in zip(texts, cut)])
        return Rollouts(
            prompt_ids=torch.zeros(n_rows, 1, dtype=torch.long), prompt_mask=torch.ones(n_rows, 1, dtype=torch.bool),
            response_ids=torch.zeros(n_rows, width + 1, dtype=torch.long),
            response_mask=torch.arange(width + 1).unsqueeze(0) < lengths.unsqueeze(1),
            lengths=lengths, truncated=torch.tensor(cut), texts=texts,
            prompt_index=torch.arange(len(prompts)).repeat_interleave(n),
        )

    lockstep = False
    seeds_per_prompt = False

    def check_prompts(self, prompts: Sequence[str], max_tokens: int) -> None:
        pass

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...

    def close(self) -> None: ...

    def sync_weights(self, source: object) -> None: ...

    def forget_prefixes(self) -> None: ...
