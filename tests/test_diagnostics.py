"""The per-step diagnostics of dapo_cli/diagnostics.py, with hand-computed values."""

from __future__ import annotations

import pytest
import torch

import time

from dapo_cli.diagnostics import (
    MAX_LOOP_PERIOD,
    collapse_repeated_lines,
    contains_answer,
    ends_in_loop,
    group_length_spread,
    loops,
    on_correct_path,
)


def test_group_length_spread_by_hand() -> None:
    # group 7: lengths {2, 4}: mean 3, population std 1, cv 1/3
    # group 1: lengths {3, 3, 3}: std 0, cv 0           → means over groups: std 0.5, cv 1/6
    lengths = torch.tensor([2, 3, 4, 3, 3])
    groups = torch.tensor([7, 1, 7, 1, 1])  # rows of a group anywhere, ids not 0..k-1
    std, cv = group_length_spread(lengths, groups)
    assert std == pytest.approx(0.5, abs=1e-12) and cv == pytest.approx(1 / 6, abs=1e-12)


def test_group_length_spread_is_order_free_and_zero_for_equal_lengths() -> None:
    lengths = torch.tensor([10, 30, 5, 5, 20, 0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    # group 0: std 10, cv 0.5; group 1: 0, 0; group 2: {20, 0}: std 10, cv 1 → (20/3, 0.5)
    perm = torch.tensor([5, 2, 0, 4, 1, 3])
    for idx in (torch.arange(6), perm):
        std, cv = group_length_spread(lengths[idx], groups[idx])
        assert std == pytest.approx(20 / 3, abs=1e-12) and cv == pytest.approx(0.5, abs=1e-12)
    assert group_length_spread(torch.tensor([4, 4]), torch.tensor([3, 3])) == (0.0, 0.0)
    assert group_length_spread(torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long)) == (0.0, 0.0)


def test_contains_answer_matches_whole_numbers_only() -> None:
    texts = ["4+3 = 7, carry 0\n357", "the sum is 1357", "3570 is wrong", "357.5", "= 357.", "", "Answer: 12"]
    truths = ["357", "357", "357", "357", "357", "357", ""]
    assert contains_answer(texts, truths).tolist() == [True, False, False, False, True, False, False]
    with pytest.raises(ValueError):
        contains_answer(["a"], [])


def test_ends_in_loop_finds_a_repeated_tail_and_nothing_else() -> None:
    assert ends_in_loop("What is 2+2? " + "4 " * 8)       # period 2, 16 characters
    assert ends_in_loop("carry 1, carry 1, carry 1, ")    # period 9, 3 copies (27 characters)
    assert not ends_in_loop("What is 2+2? 4 4 4 4")       # 3 copies of " 4" but only 8 characters
    assert not ends_in_loop("10 x 100 = 1000")            # "000" is a number, not a loop
    assert not ends_in_loop("7 + 5 = 12, write 2 carry 1; 1 + 3 + 1 = 5; Answer: 52")
    assert not ends_in_loop("abcdefgh" * 2 + "abcdefg")   # the loop must reach the end
    span = "".join(chr(0x4E00 + i) for i in range(MAX_LOOP_PERIOD + 1))  # distinct characters: no shorter period
    assert not ends_in_loop("start " + span * 3)            # spans longer than the bound are not looked for
    assert ends_in_loop("start " + span[1:] * 3)
    assert loops(["ab" * 8, "ab" * 7]).tolist() == [True, False]


@pytest.mark.slow
def test_ends_in_loop_is_bounded_on_long_texts() -> None:
    import random

    rng = random.Random(0)
    text = "".join(rng.choice("0123456789 +=") for _ in range(1_000_000))  # 1 MB without a periodic tail
    t0 = time.perf_counter()
    assert not ends_in_loop(text)
    assert time.perf_counter() - t0 < 0.5


def test_collapse_repeated_lines() -> None:
    assert collapse_repeated_lines("a=1\na=1\na=1\nb=2\nc") == "a=1\nb=2\nc"          # "c" begins a new line
    assert collapse_repeated_lines("a=1\nb=2\nb=2\nb=") == "a=1\nb=2\n"            # cut inside a copy of "b=2"
    assert collapse_repeated_lines("a=1\na=1\n") == "a=1\n"
    assert collapse_repeated_lines("a=1\nb=2\na=1") == "a=1\nb=2\na=1"              # not consecutive: kept
    assert collapse_repeated_lines("") == ""


def test_on_correct_path_matches_the_work_of_a_correct_sibling() -> None:
    right = "5+7+0=12\n8+4+1=13\nAnswer: 132"
    texts = [
        right,                                          # correct itself: not "on a path", it arrived
        "5+7+0=12\n5+7+0=12\n5+7+0=12\n5+7+",          # stuck on the first column: on the path
        "5+7+0=12\n8+4+1=13\n8+4+1=13\n8+4",            # stuck on the second: on the path
        "5+7+0=13\n5+7+0=13\n5+7+0=13\n",              # a wrong column: off the path
        "5+7+0=12\n5+7+0=12\n5+7+",                     # the same loop in a group with no correct answer
        "",                                             # nothing written: no path
    ]
    correct = torch.tensor([True, False, False, False, False, False])
    groups = torch.tensor([0, 0, 0, 0, 1, 0])
    assert on_correct_path(texts, correct, groups).tolist() == [False, True, True, False, False, False]
