"""The per-step diagnostics of dapo_cli/diagnostics.py, with hand-computed values."""

from __future__ import annotations

import pytest
import torch

from dapo_cli.diagnostics import contains_answer, group_length_spread


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
