"""Tests for ``dapo_cli.rewards.registry``: verifiers by name, batch scoring, math_equiv wiring."""

from __future__ import annotations

import sys
import time
import types

import pytest

import dapo_cli.rewards as rewards
from dapo_cli.rewards import math_dapo, strict_box
from dapo_cli.rewards.math_dapo import INVALID
from dapo_cli.rewards.registry import (
    DEFAULT_VERIFIER,
    VERIFIERS,
    extract_equiv_answer,
    get_verifier,
    math_equiv_score,
    score_batch,
)


def test_names_default_and_package_reexports() -> None:
    assert list(VERIFIERS) == ["math_dapo", "strict_box", "math_equiv"]
    assert DEFAULT_VERIFIER == "math_dapo"
    assert get_verifier("math_dapo") is math_dapo.compute_score
    assert get_verifier("strict_box") is strict_box.compute_score
    assert get_verifier("math_equiv") is math_equiv_score
    assert rewards.get_verifier is get_verifier
    assert rewards.score_batch is score_batch
    assert rewards.VERIFIERS is VERIFIERS


def test_registry_is_read_only() -> None:
    with pytest.raises(TypeError):
        VERIFIERS["mine"] = math_dapo.compute_score  # type: ignore[index]


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="unknown verifier 'math'") as info:
        get_verifier("math")
    for name in ("math_dapo", "strict_box", "math_equiv"):
        assert name in str(info.value)


def test_score_batch_math_dapo() -> None:
    responses = ["Answer: 5", "Answer: 1,000", "no answer", "Answer: 007"]
    truths = ["5", "1000", "3", "7"]
    # "5"=="5"; "1,000" -> "1000" == "1000"; no Answer -> "[INVALID]"; "007" != "7".
    assert score_batch("math_dapo", responses, truths) == (
        [1.0, 1.0, -1.0, -1.0],
        [True, True, False, False],
        ["5", "1000", INVALID, "007"],
    )


def test_score_batch_strict_box_and_empty() -> None:
    # Same strings, different verifier: "\boxed{5}" matches, an "Answer:" line does not count.
    assert score_batch("strict_box", ["\\boxed{5}", "Answer: 5"], ["5", "5"]) == (
        [1.0, -1.0],
        [True, False],
        ["5", INVALID],
    )
    assert score_batch("strict_box", [], []) == ([], [], [])


def test_score_batch_rejects_mismatched_lengths_and_unknown_names() -> None:
    with pytest.raises(ValueError, match="2 responses and 1 ground truths"):
        score_batch("math_dapo", ["a", "b"], ["a"])
    with pytest.raises(ValueError, match="valid names"):
        score_batch("nope", [], [])


# ------------------------------------------------------------------- math_equiv


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("work\nAnswer: 1/2 ", "1/2"),  # the Answer line, stripped, not normalised
        ("\\boxed{3}\nAnswer: x = 5", "x = 5"),  # an Answer line beats a box
        ("so \\boxed{\\frac{1}{2}} is it", "\\frac{1}{2}"),  # fallback: last balanced box
        ("\\boxed{4} or \\boxed{ 6 }", "6"),
        ("nothing", INVALID),
        # The box lies outside the same 300-char window math_dapo reads -> invalid.
        ("\\boxed{9}" + "x" * 300, INVALID),
    ],
)
def test_extract_equiv_answer(response: str, expected: str) -> None:
    assert extract_equiv_answer(response) == expected


def test_extract_equiv_answer_is_fast_on_a_megabyte() -> None:
    response = "\\boxed{" * 150_000
    start = time.perf_counter()
    assert extract_equiv_answer(response) == INVALID
    assert (time.perf_counter() - start) * 1e3 < 50.0


def test_math_equiv_calls_is_equivalent_with_pred_and_ground_truth(monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in module, so the wiring is tested whether or not math_equiv.py exists yet.
    calls: list[tuple[str, str]] = []

    def is_equivalent(a: str, b: str, *, timeout_s: float = 2.0) -> bool:
        calls.append((a, b))
        return a == "1/2" and b == "0.5"

    fake = types.ModuleType("dapo_cli.rewards.math_equiv")
    fake.is_equivalent = is_equivalent  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "dapo_cli.rewards.math_equiv", fake)

    assert math_equiv_score("Answer: 1/2", "0.5") == {"score": 1.0, "acc": True, "pred": "1/2"}
    assert math_equiv_score("\\boxed{2/3}", "0.5") == {"score": -1.0, "acc": False, "pred": "2/3"}
    # No answer: invalid without asking the equivalence checker.
    assert math_equiv_score("no answer", "0.5") == {"score": -1.0, "acc": False, "pred": INVALID}
    assert calls == [("1/2", "0.5"), ("2/3", "0.5")]


def test_math_equiv_end_to_end() -> None:
    pytest.importorskip("dapo_cli.rewards.math_equiv")
    assert score_batch("math_equiv", ["Answer: 1/2", "Answer: 3"], ["\\frac{1}{2}", "4"]) == (
        [1.0, -1.0],
        [True, False],
        ["1/2", "3"],
    )


def test_math_equiv_never_parses_a_ground_truth_over_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    from dapo_cli.rewards.bounds import MAX_GROUND_TRUTH_CHARS

    calls: list[int] = []
    fake = types.ModuleType("dapo_cli.rewards.math_equiv")
    fake.is_equivalent = lambda a, b, **_: calls.append(len(b)) or True  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "dapo_cli.rewards.math_equiv", fake)
    assert math_equiv_score("Answer: 5", "5" * MAX_GROUND_TRUTH_CHARS)["acc"] is True
    assert math_equiv_score("Answer: 5", "5" * (MAX_GROUND_TRUTH_CHARS + 1)) == {"score": -1.0, "acc": False, "pred": "5"}
    assert calls == [MAX_GROUND_TRUTH_CHARS]  # the longer one never reached the checker
