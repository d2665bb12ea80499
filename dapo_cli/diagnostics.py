"""Per-step diagnostics that show whether a DAPO technique has something to act on.

* Token-level loss matters when a group's responses differ in length: sample-level averaging
  gives every response the same weight, so a long response's tokens count less. The spread is
  reported as the mean over groups of the within-group standard deviation of response lengths
  and of its coefficient of variation (std / mean).
* Overlong filtering and the soft punishment are meant for runaway generations, not for cutting
  off good solutions: the share of truncated responses whose text already contains the correct
  answer tells which of the two a length limit is doing (high: the limit cuts correct work).

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
