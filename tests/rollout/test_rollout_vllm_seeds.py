"""The vLLM engine's per-request seeds (pure: runs without vLLM installed)."""

from __future__ import annotations

from dapo_cli.rollout.vllm import request_seed


def test_no_two_samples_of_one_call_share_a_random_stream():
    """vLLM seeds sample j of a request with seed + j: the per-prompt seeds must leave n apart."""
    for base in (0, 1, 12345):
        streams = [request_seed(base, i) + j for i in range(64) for j in range(16)]
        assert len(set(streams)) == len(streams)
        assert all(0 <= s < 2**63 for s in streams)
    assert request_seed(0, 3) == request_seed(0, 3) != request_seed(1, 3)
