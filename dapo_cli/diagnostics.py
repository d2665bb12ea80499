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
  A third share, :func:`on_correct_path`, says whether that unfinished work was going the right
  way: the truncated text, its repeated lines collapsed, begins a response of the same group
  that reached the right answer.

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


def collapse_repeated_lines(text: str) -> str:
    """``text`` with every run of identical consecutive lines written once, and a trailing partial
    line dropped when it only begins the line before it (a loop cut mid-copy):
    ``"a=1\\na=1\\na=1\\nb=2\\nb="`` → ``"a=1\\nb=2\\n"``; ``"a=1\\na="`` → ``"a=1\\n"``."""
    lines = text.split("\n")
    tail = lines.pop()  # after the last newline: "" or a line cut by the limit
    kept: list[str] = []
    for line in lines:
        if not kept or line != kept[-1]:
            kept.append(line)
    if kept and kept[-1].startswith(tail):
        tail = ""
    return "".join(line + "\n" for line in kept) + tail


def on_correct_path(texts: Sequence[str], correct: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """``[N]`` bool: a response, its repetitions collapsed (:func:`collapse_repeated_lines`), is a
    prefix of a correct response of the same group (its repetitions collapsed too), and is not
    itself correct.

    For a truncated response this says "it was doing the work that succeeded elsewhere in its
    group, and ran out of room" -- e.g. a stuck ``5+7+0=12`` repeated until the limit, when a sibling
    wrote ``5+7+0=12\\n8+4+1=13\\nAnswer: 132``. Exact prefixes suit tasks with one way of writing
    the work (the synthetic arithmetic); on free-form reasoning the share is a lower bound, and a
    group without a correct response has none to match. ``correct``, ``group_ids``: ``[N]``.
    Work: one collapse per text and one prefix test per pair within a group.
    """
    by_group: dict[int, list[str]] = {}
    for text, ok, g in zip(texts, correct.tolist(), group_ids.tolist(), strict=True):
        if ok:
            by_group.setdefault(int(g), []).append(collapse_repeated_lines(text))
    out = []
    for text, ok, g in zip(texts, correct.tolist(), group_ids.tolist(), strict=True):
        mine = collapse_repeated_lines(text)
        out.append(not ok and bool(mine) and any(ref.startswith(mine) for ref in by_group.get(int(g), ())))
    return torch.tensor(out, dtype=torch.bool)
