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


# ---------------------------------------------------------------- every estimator, every loss

# One round of three groups of G = 4: group 0 has one right answer [1, 0, 0, 0], group 1 is all right, group 2 all
# wrong. Dynamic sampling keeps group 0 whole (its raw accuracy varies), and under every advantage estimator every
# member of it gets a non-zero advantage: the group is informative whatever the baseline. (NeMo-RL PR 3469: a filter
# on the row-wise std of something other than the group's raw accuracy emptied such groups.) Scores are ±1:
#   grpo:    mean -0.5, centred [1.5, -0.5, -0.5, -0.5], unbiased std sqrt((2.25 + 3 * 0.25) / 3) = 1
#            -> [1.5, -0.5, -0.5, -0.5] / (1 + 1e-6)
#   dr_grpo: [1.5, -0.5, -0.5, -0.5] (no std division)
#   rloo:    1 - mean(-1, -1, -1) = 2;  -1 - mean(1, -1, -1) = -2/3  -> [2, -2/3, -2/3, -2/3]
ONE_RIGHT = {
    "grpo": [1.5 / (1 + 1e-6), -0.5 / (1 + 1e-6), -0.5 / (1 + 1e-6), -0.5 / (1 + 1e-6)],
    "dr_grpo": [1.5, -0.5, -0.5, -0.5],
    "rloo": [2.0, -2 / 3, -2 / 3, -2 / 3],
}


@pytest.mark.parametrize("loss", ["dapo", "gspo", "cispo", "gmpo"])
@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_a_group_with_one_right_answer_is_kept_and_trained_under_every_estimator_and_loss(estimator, loss):
    from dapo_cli.algo.advantages import ADVANTAGE_ESTIMATORS, group_advantages
    from dapo_cli.algo.objectives import POLICY_LOSS_NAMES, get_policy_loss

    assert set(ONE_RIGHT) == set(ADVANTAGE_ESTIMATORS) and loss in POLICY_LOSS_NAMES  # the table covers them all
    acc = torch.tensor([1, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0], dtype=torch.float64)
    ids = torch.arange(3).repeat_interleave(4)
    keep = GroupBatchAssembler(target_groups=1, max_num_gen_batches=1).add(acc, ids)
    assert keep.tolist() == [0, 1, 2, 3]  # group 0, whole
    adv = group_advantages((2 * acc - 1)[keep], ids[keep], estimator=estimator)
    torch.testing.assert_close(adv, torch.tensor(ONE_RIGHT[estimator], dtype=torch.float64), rtol=0, atol=1e-12)
    assert bool((adv != 0).all())
    # at the policy that sampled (ratio 1), one token each: every loss's gradient is -A_i / 4 (DAPO: -A r / N;
    # GSPO: -A s_i / N with s_i = 1; CISPO: -sg(1) A / N; GMPO: -A e^0 / N), non-zero on every kept response
    old = torch.full((4, 1), -0.7, dtype=torch.float64)
    log_prob = old.clone().requires_grad_(True)
    settings = {"dapo": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": None},
                "gspo": {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4},
                "cispo": {"clip_ratio_low": None, "clip_ratio_high": 3.0},
                "gmpo": {"log_clip_low": 0.4, "log_clip_high": 0.4}}[loss]
    value, _ = get_policy_loss(loss)(log_prob, old, adv, torch.ones(4, 1, dtype=torch.bool), loss_agg_mode="token-mean",
                                     **settings)
    (grad,) = torch.autograd.grad(value, log_prob)
    torch.testing.assert_close(grad, -adv.unsqueeze(-1) / 4, rtol=0, atol=1e-12)
