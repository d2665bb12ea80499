"""Tests for ``dapo_cli.batch.RolloutBatch``: row selection and re-padded concatenation.

Two hand-made parts with different widths: A has S=2 prompt and T=3 response
columns, B has S=4 and T=1. ``pad_id`` is 99 so padding is told apart from 0.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dapo_cli.batch import RolloutBatch

PAD = 99
F, T_ = False, True


def part_a() -> RolloutBatch:
    """N=2 (one group of 2), S=2, T=3; row 0 has one prompt pad on the left, row 1 two response pads."""
    return RolloutBatch(
        prompt_ids=torch.tensor([[PAD, 5], [6, 7]]),
        prompt_mask=torch.tensor([[F, T_], [T_, T_]]),
        response_ids=torch.tensor([[8, 9, 1], [10, PAD, PAD]]),
        response_mask=torch.tensor([[T_, T_, T_], [T_, F, F]]),
        lengths=torch.tensor([3, 1]),
        truncated=torch.tensor([F, F]),
        group_ids=torch.tensor([0, 0]),
        texts=["a0", "a1"],
        ground_truths=["g0", "g0"],
        prompts=["p0", "p0"],
        pad_id=PAD,
        preds=["1", "2"],
        scores=torch.tensor([1.0, -1.0]),
        acc=torch.tensor([T_, F]),
        rewards=torch.tensor([1.0, -1.5]),
        loss_mask=torch.tensor([[T_, T_, T_], [T_, F, F]]),
        advantages=torch.tensor([0.7, -0.7]),
        old_log_probs=torch.tensor([[-0.1, -0.2, -0.3], [-0.4, 0.0, 0.0]]),
    )


def part_b() -> RolloutBatch:
    """N=1, S=4, T=1, truncated (no EOS within its one token)."""
    return RolloutBatch(
        prompt_ids=torch.tensor([[11, 12, 13, 14]]),
        prompt_mask=torch.tensor([[T_, T_, T_, T_]]),
        response_ids=torch.tensor([[15]]),
        response_mask=torch.tensor([[T_]]),
        lengths=torch.tensor([1]),
        truncated=torch.tensor([T_]),
        group_ids=torch.tensor([1]),
        texts=["b0"],
        ground_truths=["g1"],
        prompts=["p1"],
        pad_id=PAD,
        preds=["3"],
        scores=torch.tensor([-1.0]),
        acc=torch.tensor([F]),
        rewards=torch.tensor([-1.0]),
        loss_mask=torch.tensor([[F]]),
        advantages=torch.tensor([0.0]),
        old_log_probs=torch.tensor([[-0.5]]),
    )


def test_len_and_input_views() -> None:
    a = part_a()
    assert len(a) == 2
    assert a.input_ids.tolist() == [[PAD, 5, 8, 9, 1], [6, 7, 10, PAD, PAD]]
    assert a.attention_mask.tolist() == [[F, T_, T_, T_, T_], [T_, T_, T_, F, F]]


def test_concat_repads_prompts_left_and_responses_right() -> None:
    c = RolloutBatch.concat([part_a(), part_b()])
    assert len(c) == 3
    assert c.prompt_ids.tolist() == [[PAD, PAD, PAD, 5], [PAD, PAD, 6, 7], [11, 12, 13, 14]]
    assert c.prompt_mask.tolist() == [[F, F, F, T_], [F, F, T_, T_], [T_, T_, T_, T_]]
    assert c.response_ids.tolist() == [[8, 9, 1], [10, PAD, PAD], [15, PAD, PAD]]
    assert c.response_mask.tolist() == [[T_, T_, T_], [T_, F, F], [T_, F, F]]
    assert c.loss_mask.tolist() == [[T_, T_, T_], [T_, F, F], [F, F, F]]
    assert torch.equal(c.old_log_probs, torch.tensor([[-0.1, -0.2, -0.3], [-0.4, 0.0, 0.0], [-0.5, 0.0, 0.0]]))
    # dtypes survive padding
    assert c.prompt_ids.dtype == torch.int64 and c.prompt_mask.dtype == torch.bool
    assert c.loss_mask.dtype == torch.bool and c.old_log_probs.dtype == torch.float32
    # the real tokens of every row are unchanged, and still adjacent prompt|response
    assert c.input_ids[2].tolist() == [11, 12, 13, 14, 15, PAD, PAD]
    assert c.attention_mask.sum(-1).tolist() == [1 + 3, 2 + 1, 4 + 1]


def test_concat_rows_and_lists_follow_the_parts() -> None:
    c = RolloutBatch.concat([part_a(), part_b()])
    assert c.lengths.tolist() == [3, 1, 1]
    assert c.truncated.tolist() == [F, F, T_]
    assert c.group_ids.tolist() == [0, 0, 1]
    assert c.scores.tolist() == [1.0, -1.0, -1.0]
    assert c.acc.tolist() == [T_, F, F]
    assert c.rewards.tolist() == [1.0, -1.5, -1.0]
    assert c.advantages.tolist() == pytest.approx([0.7, -0.7, 0.0], abs=1e-7)
    assert c.texts == ["a0", "a1", "b0"]
    assert c.ground_truths == ["g0", "g0", "g1"]
    assert c.prompts == ["p0", "p0", "p1"]
    assert c.preds == ["1", "2", "3"]
    assert c.pad_id == PAD
    assert c.ref_log_probs is None and c.entropy is None
    assert c.lengths.tolist() == c.response_mask.sum(-1).tolist()


def test_concat_in_the_other_order() -> None:
    c = RolloutBatch.concat([part_b(), part_a()])
    assert c.prompt_ids.tolist() == [[11, 12, 13, 14], [PAD, PAD, PAD, 5], [PAD, PAD, 6, 7]]
    assert c.response_ids.tolist() == [[15, PAD, PAD], [8, 9, 1], [10, PAD, PAD]]
    assert c.texts == ["b0", "a0", "a1"]


def test_concat_of_one_and_of_none() -> None:
    a = part_a()
    assert RolloutBatch.concat([a]) is a
    with pytest.raises(ValueError, match="at least one batch"):
        RolloutBatch.concat([])


def test_select_rows_keeps_widths_and_lists_follow() -> None:
    c = RolloutBatch.concat([part_a(), part_b()])
    s = c.select(torch.tensor([2, 0]))
    assert len(s) == 2
    assert s.prompt_ids.tolist() == [[11, 12, 13, 14], [PAD, PAD, PAD, 5]]
    assert s.response_ids.tolist() == [[15, PAD, PAD], [8, 9, 1]]
    assert s.response_mask.shape == (2, 3)  # same column widths, no re-trimming
    assert s.lengths.tolist() == [1, 3]
    assert s.group_ids.tolist() == [1, 0]
    assert s.texts == ["b0", "a0"]
    assert s.prompts == ["p1", "p0"]
    assert s.preds == ["3", "1"]
    assert s.scores.tolist() == [-1.0, 1.0]
    assert s.pad_id == PAD
    assert s.entropy is None


def test_select_with_a_bool_row_mask() -> None:
    c = RolloutBatch.concat([part_a(), part_b()])
    s = c.select(torch.tensor([True, False, True]))
    assert s.texts == ["a0", "b0"]
    assert s.lengths.tolist() == [3, 1]
    assert torch.equal(s.response_ids, c.select(torch.tensor([0, 2])).response_ids)


def test_select_before_verification_keeps_empty_lists_and_none_fields() -> None:
    early = dataclasses.replace(part_a(), preds=[], scores=None, acc=None, rewards=None, loss_mask=None, advantages=None, old_log_probs=None)
    s = early.select(torch.tensor([1]))
    assert s.preds == []
    assert s.scores is None and s.old_log_probs is None
    assert s.texts == ["a1"]
    assert s.response_ids.tolist() == [[10, PAD, PAD]]
    empty = early.select(torch.tensor([], dtype=torch.long))
    assert len(empty) == 0 and empty.texts == []


def test_select_then_concat_round_trips() -> None:
    c = RolloutBatch.concat([part_a(), part_b()])
    again = RolloutBatch.concat([c.select(torch.tensor([0, 1])), c.select(torch.tensor([2]))])
    for f in dataclasses.fields(RolloutBatch):
        x, y = getattr(c, f.name), getattr(again, f.name)
        assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y, f.name


def test_from_rollouts_carries_every_field_of_the_rollouts_and_what_the_caller_adds():
    from dapo_cli.rollout.base import Rollouts

    out = Rollouts(
        prompt_ids=torch.tensor([[PAD, 5], [PAD, 5]]), prompt_mask=torch.tensor([[F, T_], [F, T_]]),
        response_ids=torch.tensor([[8, PAD], [9, 1]]), response_mask=torch.tensor([[T_, F], [T_, T_]]),
        lengths=torch.tensor([1, 2]), truncated=torch.tensor([T_, F]), texts=("a", "b"),
        prompt_index=torch.tensor([0, 0]), logprobs=torch.tensor([[-0.5, 0.0], [-0.25, -0.125]]),
    )
    batch = RolloutBatch.from_rollouts(out, group_ids=torch.tensor([7, 7]), ground_truths=["g", "g"], prompts=["p", "p"],
                                       pad_id=PAD, versions=torch.tensor([3, 3]))
    renamed = {"logprobs": "rollout_log_probs", "prompt_index": None}  # the caller numbers the groups
    for f in dataclasses.fields(Rollouts):  # a field added to Rollouts must reach the batch (or be named here)
        target = renamed.get(f.name, f.name)
        if target is not None:
            value = getattr(batch, target)
            assert (torch.equal(value, getattr(out, f.name)) if isinstance(value, torch.Tensor)
                    else value == list(getattr(out, f.name))), f.name
    assert batch.texts == ["a", "b"] and isinstance(batch.texts, list)
    assert batch.group_ids.tolist() == [7, 7] and batch.versions.tolist() == [3, 3]
    assert (batch.ground_truths, batch.prompts, batch.pad_id) == (["g", "g"], ["p", "p"], PAD)
    assert batch.scores is None and batch.advantages is None  # later phases fill the rest
