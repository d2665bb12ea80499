"""Tests for ``dapo_cli.rewards.strict_box``: last balanced ``\\boxed{}`` in the final 100 chars.

verl: the released ``is_correct_strict_box`` compares ``extracted == gt`` with no
whitespace stripping on either side, although the brief's prose says "after stripping
whitespace"; the code wins, so ``\\boxed{5 }`` does not match ``"5"`` (see below).
"""

from __future__ import annotations

import time

import pytest

from dapo_cli.rewards.math_dapo import INVALID
from dapo_cli.rewards.strict_box import BOX_WINDOW_CHARS, compute_score, last_boxed_content


def test_window_is_100_code_points() -> None:
    assert BOX_WINDOW_CHARS == 100


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\\boxed{5}", "5"),
        ("\\boxed{4} then \\boxed{5}", "5"),  # the last box wins
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # braces counted: depth 1,2,1,2,1,0
        ("x \\boxed{a{b}c}d}", "a{b}c"),  # stops at the brace that closes the box
        ("\\boxed{}", ""),  # empty box: depth 1 then 0 at once
        # verl: only the LAST "\boxed{" is tried; it never closes -> None, although an
        # earlier box is complete.
        ("\\boxed{5} and \\boxed{6", None),
        ("\\boxed {5}", None),  # a space before "{" is not a box
        ("\\fbox{5}", None),
        ("no box", None),
    ],
)
def test_last_boxed_content(text: str, expected: str | None) -> None:
    assert last_boxed_content(text) == expected


@pytest.mark.parametrize(
    ("response", "ground_truth", "result"),
    [
        ("so \\boxed{5}.", "5", {"score": 1.0, "acc": True, "pred": "5"}),
        ("\\boxed{4} no, \\boxed{5}", "5", {"score": 1.0, "acc": True, "pred": "5"}),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", {"score": 1.0, "acc": True, "pred": "\\frac{1}{2}"}),
        # Compared unnormalised: no \frac shorthand expansion, no comma dropping.
        ("\\boxed{\\frac12}", "\\frac{1}{2}", {"score": -1.0, "acc": False, "pred": "\\frac12"}),
        ("\\boxed{1,000}", "1000", {"score": -1.0, "acc": False, "pred": "1,000"}),
        ("\\boxed{007}", "7", {"score": -1.0, "acc": False, "pred": "007"}),
        # verl: no strip on either side (the brief's prose said strip; the code does not).
        ("\\boxed{5 }", "5", {"score": -1.0, "acc": False, "pred": "5 "}),
        ("\\boxed{5}", " 5", {"score": -1.0, "acc": False, "pred": "5"}),
        # An "Answer:" line is ignored by this verifier.
        ("Answer: 5", "5", {"score": -1.0, "acc": False, "pred": INVALID}),
        ("\\boxed{5} and \\boxed{6", "5", {"score": -1.0, "acc": False, "pred": INVALID}),
    ],
)
def test_compute_score(response: str, ground_truth: str, result: dict[str, object]) -> None:
    assert compute_score(response, ground_truth) == result


@pytest.mark.parametrize(
    ("filler", "expected"),
    [
        # "\boxed{5}" is 9 chars; 9 + 91 = 100 -> the whole string is the window.
        (91, "5"),
        # 9 + 92 = 101 -> the window starts at "boxed{5}" (the backslash is cut) -> no box.
        (92, INVALID),
    ],
)
def test_box_just_inside_vs_just_outside_the_window(filler: int, expected: str) -> None:
    response = "\\boxed{5}" + "x" * filler
    assert compute_score(response, "5")["pred"] == expected


def test_a_box_must_open_inside_the_window() -> None:
    # "\boxed{" + 200 "1"s + "}" is 208 chars; the box opens 208 chars from the end, so the
    # window (last 100) is 99 "1"s and the "}" -> no "\boxed{" in it -> invalid.
    assert compute_score("\\boxed{" + "1" * 200 + "}", "1" * 200)["pred"] == INVALID


@pytest.mark.parametrize(
    "response",
    ["\\boxed{" * 150_000, "a" * 1_000_000, "\\boxed{" * 150_000 + "5" + "}" * 150_000, "{" * 1_000_000],
    ids=["open-boxes", "a", "nested-balanced", "braces"],
)
def test_megabyte_hostile_inputs_score_in_milliseconds(response: str) -> None:
    # Nested balanced boxes: the last 100 chars are all "}" -> no "\boxed{" -> invalid.
    assert compute_score(response, "5") == {"score": -1.0, "acc": False, "pred": INVALID}
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        compute_score(response, "5")
        best = min(best, time.perf_counter() - start)
    assert best * 1e3 < 50.0


def test_ground_truth_over_the_cap_is_unscorable_and_never_compared() -> None:
    from dapo_cli.rewards.bounds import MAX_GROUND_TRUTH_CHARS

    compared: list[int] = []

    class Watched(str):
        """A ground truth that records every comparison made with it."""

        __hash__ = str.__hash__

        def __eq__(self, other: object) -> bool:
            compared.append(len(self))
            return str.__eq__(self, other)

    at_cap = Watched("5" * MAX_GROUND_TRUTH_CHARS)
    assert compute_score("\\boxed{5}", at_cap)["acc"] is False and compared == [MAX_GROUND_TRUTH_CHARS]
    compared.clear()
    over = Watched("5" * (MAX_GROUND_TRUTH_CHARS + 1))
    assert compute_score("\\boxed{5}", over) == {"score": -1.0, "acc": False, "pred": "5"}
    assert compared == []  # unscorable: not even compared
