"""The check after a weight sync: does the rollout engine serve the trainer's weights?

A sync that left a layer on old weights, loaded garbage (vLLM woken from a level-2 sleep without a
sync), or cast the weights wrongly samples from another policy, silently: the update then trains on
what that policy sampled. After each sync to vLLM (:class:`~dapo_cli.train.rounds.InlineRounds`),
:func:`probe_gap` samples a fixed probe (:data:`PROBE_PROMPTS` of the run's prompts, :data:`PROBE_TOKENS`
tokens each, one seed) and compares the engine's log-probs of its samples with the trainer's, the
quantity ``rollout/logprob_diff_mean`` measures on every trained batch (``train/update.rollout_mismatch``):

.. math:: \\text{gap} = \\frac{\\sum_{i,t} m_{i,t} \\, |\\log \\pi_\\theta(o_{i,t}) - \\log \\pi_\\text{rollout}(o_{i,t})|}{\\sum_{i,t} m_{i,t}}

over every rank's probe tokens (``m``: the response mask). :func:`check_gap` stops the run (exit 5, one
line) when it exceeds ``rollout.sync_check_gap`` or is not a number.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from dapo_cli.batch import RolloutBatch
from dapo_cli.engine.base import TrainingEngine
from dapo_cli.engine.dist import Collective
from dapo_cli.errors import EnvironmentFailure
from dapo_cli.rollout.base import RolloutEngine, SamplingParams

PROBE_PROMPTS = 4
"""Prompts of the probe (the first ones the run's first round drew on this rank)."""

PROBE_TOKENS = 16
"""Tokens sampled for each probe prompt."""


@torch.no_grad()
def probe_gap(
    rollout: RolloutEngine, engine: TrainingEngine, prompts: Sequence[str], *, temperature: float, seed: int, pad_id: int,
    dist: Collective,
) -> float:
    """Mean |log π_θ − log π_rollout| per token of one sample of each of ``prompts`` (every rank's tokens).

    Every rank calls it (the trainer's forward is a collective under ZeRO-3, vLLM's engines step together);
    NaN when either side's log-probs are not finite."""
    temperature = temperature if temperature > 0 else 1.0
    out = rollout.generate(list(prompts), 1, SamplingParams(temperature=temperature, max_tokens=PROBE_TOKENS, seed=seed, logprobs=True))
    n = len(out.texts)
    batch = RolloutBatch.from_rollouts(out, group_ids=out.prompt_index, ground_truths=[""] * n, prompts=[""] * n, pad_id=pad_id)
    mine, _ = engine.log_probs(batch, temperature=temperature, with_entropy=False)
    assert out.logprobs is not None
    mask = out.response_mask
    diff = (mine.detach().float().cpu() - out.logprobs.float()).abs()
    total = torch.stack([torch.where(mask, diff, torch.zeros_like(diff)).sum().double(), mask.sum().double()])
    total = dist.all_reduce(total, "sum")
    return float(total[0] / total[1]) if float(total[1]) > 0 else 0.0


def check_gap(gap: float, bound: float, version: int) -> None:
    """Raise :class:`EnvironmentFailure` (exit 5) when ``gap`` (:func:`probe_gap` after the sync of weight
    version ``version``) is above ``bound`` or not finite; ``bound`` 0: no check."""
    if bound <= 0 or (math.isfinite(gap) and gap <= bound):
        return
    shown = f"{gap:.3g}" if math.isfinite(gap) else "not a number"
    raise EnvironmentFailure(
        f"after the weight sync of step {version}, vLLM's log-probs differ from the trainer's by {shown} nats a token "
        f"on the probe (bound: rollout.sync_check_gap={bound:g}): vLLM is not serving the trainer's weights (see vLLM's "
        "warnings above); dapo train --resume continues from the last complete checkpoint"
    )
