"""Tests for dapo_cli.algo.advantages: hand-derived values and a plain-loop reference."""

from __future__ import annotations

import math
import random

import pytest
import torch

from dapo_cli.algo.advantages import ADVANTAGE_ESTIMATORS, group_advantages, group_index

EPS = 1e-6

# Interleaved groups: a = {1, -1, 1} at positions 0, 2, 4; b = {0.5, 0.5} at 1, 5; c = {2} at 3.
IDS = ["a", "b", "a", "c", "a", "b"]
SCORES = [1.0, 0.5, -1.0, 2.0, 1.0, 0.5]


def test_grpo_hand_derived():
    # group a: mean = 1/3; deviations 2/3, -4/3, 2/3; sum of squares = 4/9 + 16/9 + 4/9 = 8/3;
    # unbiased var = (8/3) / (3 - 1) = 4/3 -> std = 2/sqrt(3).
    std_a = 2.0 / math.sqrt(3.0)
    expected = [
        (2 / 3) / (std_a + EPS),
        0.0,  # b is all-equal -> exactly 0
        (-4 / 3) / (std_a + EPS),
        2.0 / (1.0 + EPS),  # c has size 1: mean 0, std 1
        (2 / 3) / (std_a + EPS),
        0.0,
    ]
    adv = group_advantages(torch.tensor(SCORES, dtype=torch.float64), IDS, estimator="grpo")
    assert adv.dtype == torch.float64
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)
    assert adv[1].item() == 0.0 and adv[5].item() == 0.0


def test_dr_grpo_hand_derived():
    # s - mean: a -> 2/3, -4/3, 2/3; b -> 0; c (size 1, mean 0) -> 2.
    expected = [2 / 3, 0.0, -4 / 3, 2.0, 2 / 3, 0.0]
    adv = group_advantages(torch.tensor(SCORES, dtype=torch.float64), IDS, estimator="dr_grpo")
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)


def test_rloo_hand_derived():
    # a: 1 - mean(-1, 1) = 1; -1 - mean(1, 1) = -2; 1 - mean(1, -1) = 1. b: 0.5 - 0.5 = 0. c: size 1 -> 0.
    expected = [1.0, 0.0, -2.0, 0.0, 1.0, 0.0]
    adv = group_advantages(torch.tensor(SCORES, dtype=torch.float64), IDS, estimator="rloo")
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)


def _loop_reference(scores: list[float], ids: list[int], estimator: str) -> list[float]:
    """Plain Python: one pass per response over the whole batch."""
    out = []
    for i, s in enumerate(scores):
        members = [scores[j] for j in range(len(scores)) if ids[j] == ids[i]]
        n = len(members)
        if estimator == "rloo":
            out.append(0.0 if n == 1 else s - (sum(members) - s) / (n - 1))
            continue
        mean = sum(members) / n if n > 1 else 0.0
        if estimator == "dr_grpo":
            out.append(s - mean)
            continue
        std = math.sqrt(sum((m - mean) ** 2 for m in members) / (n - 1)) if n > 1 else 1.0
        out.append((s - mean) / (std + EPS))
    return out


@pytest.mark.parametrize("estimator", ADVANTAGE_ESTIMATORS)
def test_matches_plain_loop_on_random_interleaved_groups(estimator):
    rng = random.Random(1234)
    for _ in range(5):
        sizes = [1, 1, 2, 3, 5, 8] + [rng.randint(1, 6) for _ in range(6)]
        ids = [g * 7 + 100 for g, size in enumerate(sizes) for _ in range(size)]
        scores = []
        for g, size in enumerate(sizes):
            if g % 4 == 3:  # every fourth group is all-equal
                scores += [rng.choice([-1.0, 1.0, 0.3])] * size
            else:
                scores += [rng.choice([-1.0, 1.0]) + rng.uniform(-0.5, 0.5) for _ in range(size)]
        order = list(range(len(ids)))
        rng.shuffle(order)  # interleave the groups
        ids = [ids[k] for k in order]
        scores = [scores[k] for k in order]
        expected = torch.tensor(_loop_reference(scores, ids, estimator), dtype=torch.float64)
        got_list = group_advantages(torch.tensor(scores, dtype=torch.float64), ids, estimator=estimator)
        got_tensor = group_advantages(torch.tensor(scores, dtype=torch.float64), torch.tensor(ids), estimator=estimator)
        torch.testing.assert_close(got_list, expected, rtol=0, atol=1e-9)
        torch.testing.assert_close(got_tensor, expected, rtol=0, atol=1e-9)
        got32 = group_advantages(torch.tensor(scores, dtype=torch.float32), ids, estimator=estimator)
        assert got32.dtype == torch.float32
        torch.testing.assert_close(got32, expected.float(), rtol=0, atol=1e-5)


@pytest.mark.parametrize("estimator", ADVANTAGE_ESTIMATORS)
def test_all_equal_groups_are_exactly_zero(estimator):
    # In float64, (0.1 + 0.1 + 0.1) / 3 = 0.10000000000000002 != 0.1, so a naive s - mean is ~1e-17
    # (and ~1e-11 after the grpo division by std + eps); the result must still be exactly 0.
    assert (0.1 + 0.1 + 0.1) / 3 != 0.1
    scores = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7, 0.7], dtype=torch.float64)
    adv = group_advantages(scores, [0, 0, 0, 1, 1, 1], estimator=estimator)
    assert torch.equal(adv, torch.zeros(6, dtype=torch.float64))


def test_dtype_follows_scores():
    assert group_advantages(torch.tensor([1, 0, 1]), [0, 0, 0], estimator="grpo").dtype == torch.float32
    assert group_advantages(torch.tensor([1.0, 0.0], dtype=torch.float16), [0, 0], estimator="grpo").dtype == torch.float32
    assert group_advantages(torch.tensor([1.0, 0.0], dtype=torch.float64), [0, 0], estimator="grpo").dtype == torch.float64


def test_group_index_follows_first_appearance():
    index, k = group_index(torch.tensor([5, 2, 5, 9, 2]), 5)
    assert k == 3 and index.tolist() == [0, 1, 0, 2, 1]
    index, k = group_index(["x", ("t", 1), "x"], 3)
    assert k == 2 and index.tolist() == [0, 1, 0]


def test_errors():
    with pytest.raises(ValueError, match="grpo, dr_grpo, rloo"):
        group_advantages(torch.tensor([1.0, 0.0]), [0, 0], estimator="ppo")
    with pytest.raises(ValueError, match="2 entries"):
        group_advantages(torch.tensor([1.0, 0.0]), [0, 0, 1], estimator="grpo")
    with pytest.raises(ValueError, match="integer"):
        group_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]), estimator="grpo")
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(torch.zeros(2, 2), [0, 0], estimator="grpo")
