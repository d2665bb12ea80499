"""Per-step diagnostics that show whether a DAPO technique has something to act on.

* Token-level loss matters when a group's responses differ in length: sample-level averaging
  gives every response the same weight, so a long response's tokens count less. The spread is
  reported as the mean over groups of the within-group standard deviation of response lengths
  and of its coefficient of variation (std / mean).
* Overlong filtering and the soft punishment are meant for runaway generations (in the paper's
  regime a truncated response is mostly a repetition loop), not for cutting off good solutions.
  Two shares of the truncated responses tell which a length limit is doing: those that end in a
  loop (:func:`ends_in_loop`: runaway text) and those whose text already holds the correct answer
  (:func:`contains_answer`). Truncated responses that are neither were cut in unfinished work.

Pure functions on tensors and strings; the trainer gathers their inputs over all ranks first, so
the values do not depend on the world size or the micro-batching.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch


def group_length_spread(lengths: torch.Tensor, group_ids: torch.Tensor) -> tuple[float, float]:
    """``(mean_g std_g, mean_g std_g / mean_g)`` of response lengths within each group.

    ``lengths``, ``group_ids``: ``[N]``. std is the population one (``unbiased=False``), so a group
    of equal lengths has 0. Example: groups {2, 4} and {3, 3, 3}: stds 1 and 0, means 3 and 3 →
    (0.5, 1/6).
    """
    if lengths.numel() == 0:
        return 0.0, 0.0
    _, inverse = torch.unique(group_ids, return_inverse=True)
    k = int(inverse.max()) + 1
    x = lengths.double()
    count = torch.zeros(k, dtype=torch.float64).index_add_(0, inverse, torch.ones_like(x))
    mean = torch.zeros(k, dtype=torch.float64).index_add_(0, inverse, x) / count
    var = torch.zeros(k, dtype=torch.float64).index_add_(0, inverse, (x - mean[inverse]) ** 2) / count
    std = var.clamp_min(0).sqrt()
    cv = torch.where(mean > 0, std / mean.clamp_min(1e-12), torch.zeros_like(std))
    return float(std.mean()), float(cv.mean())


def contains_answer(texts: Sequence[str], ground_truths: Sequence[str]) -> torch.Tensor:
    """``[N]`` bool: the response text holds its ground truth as a whole token (``357`` in
    ``"... = 357\\n3"`` but not in ``"1357"``); an empty ground truth never matches."""
    found = []
    for text, truth in zip(texts, ground_truths, strict=True):
        truth = str(truth).strip()
        pattern = rf"(?<![\w.]){re.escape(truth)}(?![\w]|\.\d)" if truth else None
        found.append(bool(pattern and re.search(pattern, text)))
    return torch.tensor(found, dtype=torch.bool)


MAX_LOOP_PERIOD = 64
"""Longest repeated span (characters) :func:`ends_in_loop` looks for; bounds its work per text."""


def ends_in_loop(text: str, *, repeats: int = 3, min_chars: int = 16, max_period: int = MAX_LOOP_PERIOD) -> bool:
    """True when ``text`` ends in at least ``repeats`` copies, and at least ``min_chars`` characters,
    of one span of 1..``max_period`` characters (``"... 1 1 1 1 1 1 1 1"``, ``"carry 1, " * 3``), the
    way a degenerate generation runs into its limit. ``min_chars`` keeps short repeats that are
    ordinary text (an answer ``1000``, ``"..."``) out.

    Work is bounded by about ``max_period * (repeats * max_period + min_chars)`` character
    comparisons whatever the length of ``text``.
    """
    for period in range(1, max_period + 1):
        copies = max(repeats, -(-min_chars // period))
        if period * copies > len(text):
            break
        tail = text[-period * copies:]
        if tail == tail[:period] * copies:
            return True
    return False


def loops(texts: Sequence[str]) -> torch.Tensor:
    """``[N]`` bool: :func:`ends_in_loop` of each text."""
    return torch.tensor([ends_in_loop(t) for t in texts], dtype=torch.bool)
