"""Does each DAPO technique get something to act on? The base policy's regime on a ladder testbed.

A ladder can only show a technique's mechanism where the policy gives it work (issue 36,
``docs/real-model-ladder.md``). Measured on samples of the base policy, grouped ``n`` per prompt:

* ``truncated``: the share of responses cut at the response limit, what overlong filtering and the soft
  punishment act on (precondition: >= 5%);
* ``spread_3x`` / ``spread_median``: the share of groups whose longest response is at least 3x their
  shortest, and the median of that ratio, where the token-level loss weighs a group unlike the sample
  mean (precondition: half the groups, i.e. a median >= 3);
* ``all_equal``: the share of groups whose responses all score the same, what dynamic sampling drops
  (precondition: >= 30%);
* ``accuracy``: the share of right responses, which must leave room (precondition: 2% to 60%).

Clip-higher's precondition needs training (the ratio leaves 1 only after an update): the GRPO rung's
``actor/clipfrac_high``, read from its run.

:func:`sample_regimes` draws the samples with the fast engine, whose draws are keyed per sample and
token: one generation up to the largest limit gives every smaller limit's responses as the same tokens
cut there, so a limit sweep costs one generation.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dapo_cli.rewards.math_dapo import INVALID, compute_score
from dapo_cli.rollout.base import SamplingParams
from dapo_cli.rollout.fast import FastRolloutEngine

MIN_TRUNCATED, MIN_SPREAD_MEDIAN, MIN_ALL_EQUAL = 0.05, 3.0, 0.30
ACCURACY_ROOM = (0.02, 0.60)


@dataclass(frozen=True)
class Regime:
    """The base policy's regime at one response limit (shares in [0, 1], lengths in tokens)."""

    limit: int
    samples: int
    truncated: float
    spread_3x: float
    spread_median: float
    all_equal: float
    accuracy: float
    mean_length: float
    answered: float

    def unmet(self) -> list[str]:
        """The preconditions this regime misses, one readable line each (empty: every technique has work)."""
        checks = [
            (self.truncated >= MIN_TRUNCATED, f"truncated {self.truncated:.1%} < {MIN_TRUNCATED:.0%}"),
            (self.spread_median >= MIN_SPREAD_MEDIAN, f"median group length spread {self.spread_median:.1f}x < {MIN_SPREAD_MEDIAN:.0f}x"),
            (self.all_equal >= MIN_ALL_EQUAL, f"all-equal groups {self.all_equal:.0%} < {MIN_ALL_EQUAL:.0%}"),
            (ACCURACY_ROOM[0] <= self.accuracy <= ACCURACY_ROOM[1],
             f"accuracy {self.accuracy:.1%} outside {ACCURACY_ROOM[0]:.0%}-{ACCURACY_ROOM[1]:.0%}"),
        ]
        return [message for ok, message in checks if not ok]


def measure_regime(lengths: Sequence[int], ended: Sequence[bool], right: Sequence[bool], answered: Sequence[bool], *,
                   limit: int, n: int) -> Regime:
    """The regime of responses at ``limit`` (per response: length, ended before the limit, right, answered), groups of ``n``."""
    if not lengths or len(lengths) % n:
        raise ValueError(f"{len(lengths)} responses do not make groups of {n}")
    groups = range(0, len(lengths), n)
    spreads = [max(lengths[g : g + n]) / max(1, min(lengths[g : g + n])) for g in groups]
    equal = [len(set(right[g : g + n])) == 1 for g in groups]
    return Regime(
        limit=limit, samples=len(lengths), truncated=sum(not e for e in ended) / len(ended),
        spread_3x=sum(s >= 3 for s in spreads) / len(spreads), spread_median=statistics.median(spreads),
        all_equal=sum(equal) / len(equal), accuracy=sum(right) / len(right), mean_length=statistics.mean(lengths),
        answered=sum(answered) / len(answered),
    )


Scorer = Callable[[str, str], tuple[bool, bool]]
"""``(response text, ground truth) -> (right, answered)``."""


def math_dapo_score(response: str, ground_truth: str) -> tuple[bool, bool]:
    """The training verifier's verdict (``math_dapo``): right, and whether an ``Answer:`` line was read at all."""
    result = compute_score(response, ground_truth)
    return bool(result["acc"]), result["pred"] != INVALID


def sample_regimes(engine: FastRolloutEngine, prompts: Sequence[str], truths: Sequence[str], score: Scorer, *, n: int,
                   limits: Sequence[int], seed: int = 0, chunk: int = 32) -> list[Regime]:
    """One regime per limit (ascending) from ``n`` samples per prompt at T = 1 with no top-k/top-p (the rollout's sampling),
    generated once up to the largest limit and read at each limit as the same tokens cut there. Prompts go to the
    engine ``chunk`` at a time, which bounds its memory (128 prompts x 8 samples of 360 + 48 tokens in one call were
    killed for memory on a 24 GB machine) and not the samples: the fast engine keys each sample's draws by seed,
    prompt text and sample, not by its place in the call (distinct prompts assumed)."""
    top = max(limits)
    params = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=top, seed=seed)
    full_len: list[int] = []
    full_end: list[bool] = []
    rows: list[torch.Tensor] = []
    for start in range(0, len(prompts), chunk):
        out = engine.generate(list(prompts[start : start + chunk]), n, params)
        full_len += out.lengths.tolist()
        full_end += (~out.truncated).tolist()
        rows += list(out.response_ids)
    group_truths = [t for t in truths for _ in range(n)]
    regimes = []
    for limit in sorted(limits):
        lengths = [min(length, limit) for length in full_len]
        ended = [e and length <= limit for e, length in zip(full_end, full_len)]
        ids: list[torch.Tensor] = [row[:length] for row, length in zip(rows, lengths)]
        texts = engine.tokenizer.batch_decode([r.tolist() for r in ids], skip_special_tokens=True)
        scored = [score(text, truth) for text, truth in zip(texts, group_truths)]
        regimes.append(measure_regime(lengths, ended, [r for r, _ in scored], [a for _, a in scored], limit=limit, n=n))
    return regimes
