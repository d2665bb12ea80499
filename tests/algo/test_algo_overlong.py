"""Tests for dapo_cli.algo.overlong: each region of DAPO Eq. 13 incl. both boundaries, and filtering."""

from __future__ import annotations

import pytest
import torch

from dapo_cli.algo.overlong import mask_responses, overlong_filter_mask, overlong_penalty


def test_soft_punishment_every_region_and_boundary():
    # Lmax = 20, Lcache = 5 -> Lmax - Lcache = 15.
    #   L <= 15: 0               (0, 10, and the boundary 15)
    #   15 < L <= 20: (15 - L)/5 (16 -> -0.2, 18 -> -0.6, boundary 20 -> -1.0)
    #   L > 20: -1               (21, 100)
    lengths = torch.tensor([0, 10, 15, 16, 18, 20, 21, 100])
    expected = torch.tensor([0.0, 0.0, 0.0, -0.2, -0.6, -1.0, -1.0, -1.0])
    got = overlong_penalty(lengths, max_length=20, buffer_length=5, penalty_factor=1.0)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-7)
    # penalty_factor scales every region: 0.5 * the above.
    torch.testing.assert_close(overlong_penalty(lengths, max_length=20, buffer_length=5, penalty_factor=0.5), expected * 0.5, rtol=0, atol=1e-7)


def test_buffer_equal_to_max_length():
    # Lmax = Lcache = 4 -> the buffer starts at 0: L = 0 -> 0, L = 1 -> -1/4, L = 2 -> -0.5, L = 4 -> -1, L = 5 -> -1.
    got = overlong_penalty(torch.tensor([0, 1, 2, 4, 5]), max_length=4, buffer_length=4, penalty_factor=1.0)
    torch.testing.assert_close(got, torch.tensor([0.0, -0.25, -0.5, -1.0, -1.0]), rtol=0, atol=1e-7)


@pytest.mark.parametrize("buffer_length", [0, -1, 21])
def test_invalid_buffer_length(buffer_length):
    with pytest.raises(ValueError, match=r"buffer_length must be in \(0, max_length=20\]"):
        overlong_penalty(torch.tensor([1]), max_length=20, buffer_length=buffer_length, penalty_factor=1.0)


def test_filter_mask_drops_truncated_responses():
    keep = overlong_filter_mask(torch.tensor([True, False, True, False]))
    assert keep.tolist() == [False, True, False, True]
    with pytest.raises(ValueError, match="bool"):
        overlong_filter_mask(torch.tensor([1, 0]))


def test_mask_responses_zeroes_dropped_rows():
    token_mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    keep = torch.tensor([True, False, True])
    got = mask_responses(token_mask, keep)
    assert got.dtype == torch.bool
    assert got.tolist() == [[True, True, False], [False, False, False], [True, False, False]]
    got_float = mask_responses(token_mask.float(), keep)
    assert got_float.dtype == torch.float32 and got_float.tolist() == [[1, 1, 0], [0, 0, 0], [1, 0, 0]]
    with pytest.raises(ValueError, match="disagree"):
        mask_responses(token_mask, torch.tensor([True, False]))
