"""Reasoning steps of a solution text, the states (prefixes) they define, and which solutions to keep.

A step is the text up to and including the next run of the delimiter (``"\\n"`` by default), so
the steps of a solution concatenate back to it exactly::

    "5+7+0=12\\n8+4+1=13\\nAnswer: 132"  ->  ["5+7+0=12\\n", "8+4+1=13\\n", "Answer: 132"]

A step that ends with the delimiter is *open* (the solution goes on); the last step of a
finished solution has no delimiter and ends the solution (*terminal*: its tokens are followed
by EOS). The empty step ``""`` is the policy stopping at once. The states of a solution are
the problem plus each prefix of whole steps: ``""``, ``step1``, ``step1 step2``, ... (never
the finished solution itself, whose value is its reward).

Pure Python: no torch, no config.
"""

from __future__ import annotations

import codecs
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass


def unescape_delimiter(delimiter: str) -> str:
    """``"\\\\n"`` typed on a command line (``--set direct_advantage.step_delimiter=\\n\\n``) means a newline."""
    return codecs.decode(delimiter, "unicode_escape") if "\\" in delimiter else delimiter


def split_steps(text: str, delimiter: str = "\n") -> list[str]:
    """The steps of ``text``: each ends with a run of ``delimiter``, except possibly the last."""
    if not delimiter:
        raise ValueError("the step delimiter must not be empty")
    if not text:
        return []
    d = re.escape(delimiter)
    return re.findall(rf"(?s).*?(?:{d})+|.+\Z", text)


def is_open(step: str, delimiter: str = "\n") -> bool:
    """True when the solution continues after ``step`` (it ends with the delimiter)."""
    return bool(step) and step.endswith(delimiter)


@dataclass(frozen=True)
class FirstStep:
    """The next step a completion took from its state.

    ``text``: the step (``""``: stopped at once); ``terminal``: the solution ended with it
    (EOS follows); ``valid``: False when the completion was cut off inside its first step
    (no delimiter and no EOS), so there is no whole step to learn from.
    """

    text: str
    terminal: bool
    valid: bool


def first_step(completion: str, *, truncated: bool, delimiter: str = "\n") -> FirstStep:
    """The first step of ``completion`` (the text generated after a state)."""
    steps = split_steps(completion, delimiter)
    if not steps:
        return FirstStep("", terminal=True, valid=not truncated)
    head = steps[0]
    if is_open(head, delimiter):
        return FirstStep(head, terminal=False, valid=True)
    # no delimiter: the whole completion is one step, which ends the solution unless it was cut off
    return FirstStep(head, terminal=True, valid=not truncated)


def state_prefixes(solution: str, delimiter: str = "\n", max_states: int = 0) -> list[tuple[int, str]]:
    """``(depth, prefix)`` of every state of ``solution``: depth k = the first k whole steps.

    Depth 0 is the problem alone. A solution of T steps has states 0..T-1 (after its last step
    it is finished), or 0..T when its last step ends with the delimiter (it could have gone on);
    one cut off mid-step has states up to its last whole step. ``max_states > 0`` keeps that
    many, evenly spaced from depth 0 to the deepest.
    """
    steps = split_steps(solution, delimiter)
    # after a last step that ends with the delimiter, the solution could still go on: one more state
    depth_max = len(steps) if steps and is_open(steps[-1], delimiter) else max(len(steps) - 1, 0)
    depths = list(range(depth_max + 1))
    if 0 < max_states < len(depths):
        if max_states == 1:
            depths = [0]
        else:
            depths = sorted({round(j * depth_max / (max_states - 1)) for j in range(max_states)})
    return [(k, "".join(steps[:k])) for k in depths]


def choose_solutions(
    texts: Sequence[str], correct: Sequence[bool], count: int, rng: random.Random
) -> list[int]:
    """Indices of up to ``count`` distinct solutions, half right and half wrong where possible.

    Duplicates (same text) are considered once (the first occurrence). The right half gets
    ``ceil(count / 2)`` places; when one side has too few distinct solutions, the other fills
    the rest. Within a side the choice is uniform (``rng``). Returned in ascending order.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if len(texts) != len(correct):
        raise ValueError(f"{len(texts)} texts but {len(correct)} correctness flags")
    first: dict[str, int] = {}
    for i, t in enumerate(texts):
        first.setdefault(t, i)
    right = [i for i in first.values() if correct[i]]
    wrong = [i for i in first.values() if not correct[i]]
    rng.shuffle(right)
    rng.shuffle(wrong)
    want_right = (count + 1) // 2
    take_right = min(len(right), max(want_right, count - len(wrong)))
    take_wrong = min(len(wrong), count - take_right)
    return sorted(right[:take_right] + wrong[:take_wrong])
