"""Tests for dapo_cli.algo.sampling: the Eq. 11 filter and the multi-round group assembler."""

from __future__ import annotations

import pytest
import torch

from dapo_cli.algo.sampling import GroupBatchAssembler, informative_groups


def test_informative_groups_interleaved():
    # a = {1, 1} constant; b = {0, 0} constant; c = {1, 0} informative; d = {0} size 1, constant.
    ids = ["a", "b", "a", "c", "b", "d", "c"]
    acc = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    expected = [False, False, False, True, False, False, True]
    assert informative_groups(acc, ids).tolist() == expected
    assert informative_groups(acc.bool(), torch.tensor([3, 1, 3, 8, 1, 0, 8])).tolist() == expected


def test_target_reached_over_rounds_with_trimming():
    asm = GroupBatchAssembler(target_groups=3, max_num_gen_batches=5)
    assert not asm.done and not asm.exhausted
    # Round 1: groups 0 {1,0} informative, 1 {1,1} constant, 2 {0,1} informative -> keep 2 groups.
    keep = asm.add(torch.tensor([1, 0, 1, 1, 0, 1]), torch.tensor([0, 0, 1, 1, 2, 2]))
    assert keep.dtype == torch.long and keep.tolist() == [0, 1, 4, 5]
    assert asm.num_kept_groups == 2 and not asm.done
    # Round 2, interleaved: 7 {1,0} informative, 8 {1,1} constant, 9 {0,1} informative; room for 1 -> group 7
    # only (first appearance); group 9 is trimmed.
    keep = asm.add(torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 1.0]), [7, 8, 9, 7, 8, 9])
    assert keep.tolist() == [0, 3]
    assert asm.done and not asm.exhausted
    assert (asm.num_gen_batches, asm.num_kept_groups, asm.samples_generated) == (2, 3, 12)
    # 3 kept of 6 generated groups; 12 samples / 3 kept groups = 4.
    assert asm.metrics() == {
        "train/num_gen_batches": 2.0,
        "train/kept_group_frac": 0.5,
        "train/samples_generated": 12.0,
        "train/samples_per_kept_group": 4.0,
    }
    with pytest.raises(RuntimeError, match="already full"):
        asm.add(torch.tensor([1, 0]), [0, 0])


def test_kept_groups_come_whole_in_order_of_first_appearance():
    # Group 5 appears first (positions 0, 2), then group 3 (1, 3); both informative.
    asm = GroupBatchAssembler(target_groups=4, max_num_gen_batches=0)
    assert asm.add(torch.tensor([1, 0, 0, 1]), torch.tensor([5, 3, 5, 3])).tolist() == [0, 2, 1, 3]


def test_exhausted_after_max_rounds():
    asm = GroupBatchAssembler(target_groups=2, max_num_gen_batches=2)
    all_right = torch.tensor([1, 1, 1, 1])
    assert asm.add(all_right, [0, 0, 1, 1]).tolist() == []
    assert not asm.exhausted
    # Round 2 keeps one informative group ({0,1}) of two; still short of 2.
    assert asm.add(torch.tensor([0, 1, 0, 0]), [0, 0, 1, 1]).tolist() == [0, 1]
    assert asm.exhausted and not asm.done
    # 1 kept of 4 generated groups; 8 samples / 1 kept group.
    assert asm.metrics() == {
        "train/num_gen_batches": 2.0,
        "train/kept_group_frac": 0.25,
        "train/samples_generated": 8.0,
        "train/samples_per_kept_group": 8.0,
    }


def test_done_is_never_exhausted():
    asm = GroupBatchAssembler(target_groups=1, max_num_gen_batches=1)
    asm.add(torch.tensor([1, 0]), [0, 0])
    assert asm.done and not asm.exhausted


@pytest.mark.parametrize("max_rounds", [0, -1])
def test_unlimited_rounds_never_exhaust(max_rounds):
    asm = GroupBatchAssembler(target_groups=1, max_num_gen_batches=max_rounds)
    for _ in range(50):
        asm.add(torch.tensor([0, 0, 0]), [0, 0, 1])
    assert not asm.exhausted and not asm.done
    # nothing kept: kept fraction 0, samples per kept group reported as 0.0 (undefined)
    assert asm.metrics() == {
        "train/num_gen_batches": 50.0,
        "train/kept_group_frac": 0.0,
        "train/samples_generated": 150.0,
        "train/samples_per_kept_group": 0.0,
    }


def test_invalid_target():
    with pytest.raises(ValueError, match="target_groups"):
        GroupBatchAssembler(target_groups=0, max_num_gen_batches=1)
