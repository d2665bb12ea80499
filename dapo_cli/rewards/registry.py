"""Verifiers by name: ``math_dapo`` (default), ``strict_box``, ``math_equiv``.

A verifier maps ``(response, ground_truth)`` to
``{"score": ±1.0, "acc": bool, "pred": str}``, reading a bounded part of each
(:mod:`dapo_cli.rewards.bounds`). Strings in, dicts out: nothing here
knows about configs, tensors or batches.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from dapo_cli.errors import LISTED_AS_NAMES, look_up
from dapo_cli.rewards import math_dapo, strict_box
from dapo_cli.rewards.bounds import scorable
from dapo_cli.rewards.math_dapo import INVALID, ScoreResult, make_result

Verifier = Callable[[str, str], ScoreResult]

DEFAULT_VERIFIER = "math_dapo"


def extract_equiv_answer(response: str) -> str:
    """The answer ``math_equiv`` compares: last ``Answer:`` line, else last ``\\boxed{}``.

    Both are searched in the same final :data:`~dapo_cli.rewards.math_dapo.WINDOW_CHARS`
    characters as ``math_dapo``; the result is stripped but not normalised
    (:func:`~dapo_cli.rewards.math_equiv.is_equivalent` does its own parsing).
    Returns ``"[INVALID]"`` when neither is present.
    """
    window = math_dapo.answer_window(response)
    answer = math_dapo.extract_answer(window)
    if answer is None:
        answer = strict_box.last_boxed_content(window)
    return INVALID if answer is None else answer.strip()


def math_equiv_score(response: str, ground_truth: str) -> ScoreResult:
    """Score by mathematical equivalence (safe sympy) of the extracted answer and the ground truth.

    A ground truth over :data:`~dapo_cli.rewards.bounds.MAX_GROUND_TRUTH_CHARS` characters
    is unscorable (``acc`` False) and not parsed.
    """
    # Imported here so this module loads without sympy's import cost, and before math_equiv exists.
    from dapo_cli.rewards.math_equiv import is_equivalent

    pred = extract_equiv_answer(response)
    return make_result(pred != INVALID and scorable(ground_truth) and is_equivalent(pred, ground_truth), pred)


VERIFIERS: Mapping[str, Verifier] = MappingProxyType(
    {
        "math_dapo": math_dapo.compute_score,
        "strict_box": strict_box.compute_score,
        "math_equiv": math_equiv_score,
    }
)
"""Every verifier by name (read-only)."""


def get_verifier(name: str) -> Verifier:
    """The verifier called ``name``; :class:`~dapo_cli.errors.UnknownName` (a ValueError) naming the valid ones otherwise."""
    return look_up(VERIFIERS, name, "verifier", listed=LISTED_AS_NAMES)


def score_batch(
    name: str, responses: Sequence[str], ground_truths: Sequence[str]
) -> tuple[list[float], list[bool], list[str]]:
    """Score ``responses[i]`` against ``ground_truths[i]``; returns ``(scores, accs, preds)``, each of length B.

    Raises ValueError for an unknown ``name`` or when the two sequences differ in length.
    """
    verify = get_verifier(name)
    if len(responses) != len(ground_truths):
        raise ValueError(
            f"score_batch needs one ground truth per response: got {len(responses)} responses "
            f"and {len(ground_truths)} ground truths"
        )
    results = [verify(response, truth) for response, truth in zip(responses, ground_truths, strict=True)]
    return (
        [r["score"] for r in results],
        [r["acc"] for r in results],
        [r["pred"] for r in results],
    )
