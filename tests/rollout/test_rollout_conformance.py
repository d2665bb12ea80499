"""What every rollout engine must do (the protocol in ``rollout/base.py``), run on each engine.

The HF and fast engines run everywhere; vLLM wherever vLLM is installed, on its CPU build as on GPUs
(``make test`` runs the ``vllm``-marked tests in ``.venv-vllm``). All load the same tiny policy, whose
head_dim of 32 vLLM's CPU attention supports, and log-probs are checked against the trainer's own
teacher-forced forward of the same weights.
"""

from __future__ import annotations

import pytest
import torch

from dapo_cli.algo.importance import SAMPLER_LOGPROB_TOL
from dapo_cli.batch import RolloutBatch
from dapo_cli.engine.torch import policy_forward
from dapo_cli.models import load_policy
from dapo_cli.rollout.base import SamplingParams

PROMPTS = ["What is 12+7?\n", "Q", "Add 3 and 4, then say the answer.\n"]
LOGPROB_TOL = {"hf": SAMPLER_LOGPROB_TOL, "fast": SAMPLER_LOGPROB_TOL, "vllm": 1e-4}  # vLLM: other kernels (float32 weights; measured 5e-7)


@pytest.fixture(scope="module")
def policy(head32_model_dir):
    return load_policy(head32_model_dir)


@pytest.fixture(scope="module", params=["hf", "fast", pytest.param("vllm", marks=pytest.mark.vllm)])
def engine(request, head32_model_dir, policy):
    model, tokenizer = policy
    if request.param == "hf":
        from dapo_cli.rollout.hf import HFRolloutEngine as Engine
    elif request.param == "fast":
        from dapo_cli.rollout.fast import FastRolloutEngine as Engine
    else:
        from dapo_cli.rollout.vllm import VLLMRolloutEngine

        built = VLLMRolloutEngine(head32_model_dir, tokenizer, gpu_memory_utilization=0.1, sleep_level=0, dtype="float32")
        yield "vllm", built
        built.close()  # its KV cache reservation, before the next module's engine
        return
    yield request.param, Engine(model, tokenizer)


def sample(engine, n=4, **kw):
    params = SamplingParams(**{"temperature": 1.0, "max_tokens": 10, "seed": 0, "logprobs": True, **kw})
    return engine[1].generate(PROMPTS, n, params)


def test_shapes_and_prompt_index(engine):
    out = sample(engine)
    n_rows = len(PROMPTS) * 4
    assert out.prompt_ids.shape[0] == out.response_ids.shape[0] == n_rows
    assert out.prompt_mask.shape == out.prompt_ids.shape and out.response_mask.shape == out.response_ids.shape
    assert out.response_ids.shape[1] <= 10 and len(out.texts) == n_rows
    assert out.prompt_index.tolist() == [i for i in range(len(PROMPTS)) for _ in range(4)]
    assert torch.equal(out.lengths, out.response_mask.sum(-1))
    assert out.logprobs.shape == out.response_ids.shape


def test_masks_are_prefixes_and_padding_is_the_pad_token(engine, policy):
    _, tokenizer = policy
    out = sample(engine)
    pad = tokenizer.pad_token_id
    for row, mask, length in zip(out.response_ids, out.response_mask, out.lengths.tolist()):
        assert mask[:length].all() and not mask[length:].any()
        assert (row[length:] == pad).all()
    for row, mask in zip(out.prompt_ids, out.prompt_mask):  # prompts are left-padded
        first = int(mask.long().argmax())
        assert mask[first:].all() and not mask[:first].any() and (row[:first] == pad).all()


def test_eos_ends_a_response_and_truncation_means_no_eos_within_the_limit(engine, policy):
    _, tokenizer = policy
    out = sample(engine, n=8, max_tokens=6)
    eos = tokenizer.eos_token_id
    for row, length, truncated in zip(out.response_ids, out.lengths.tolist(), out.truncated.tolist()):
        ids = row[:length].tolist()
        if truncated:
            assert length == 6 and eos not in ids
        else:
            assert ids[-1] == eos and eos not in ids[:-1]


@pytest.mark.slow
def test_the_same_seed_replays_and_another_seed_does_not(engine):
    a, b, c = sample(engine), sample(engine), sample(engine, seed=1)
    assert torch.equal(a.response_ids, b.response_ids) and a.texts == b.texts
    assert not torch.equal(a.response_ids, c.response_ids)
    g1, g2 = sample(engine, temperature=0.0, seed=0), sample(engine, temperature=0.0, seed=5)
    assert torch.equal(g1.response_ids, g2.response_ids)  # greedy ignores the seed


def test_texts_are_the_decoded_responses(engine, policy):
    _, tokenizer = policy
    out = sample(engine)
    for row, length, text in zip(out.response_ids, out.lengths.tolist(), out.texts):
        assert text == tokenizer.decode(row[:length].tolist(), skip_special_tokens=True)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_log_probs_are_the_trainers_log_probs_of_the_same_tokens(engine, policy, temperature):
    model, tokenizer = policy
    out = sample(engine, temperature=temperature)
    batch = RolloutBatch.from_rollouts(
        out, group_ids=out.prompt_index, ground_truths=[""] * len(out.texts), prompts=[""] * len(out.texts), pad_id=tokenizer.pad_token_id,
    )
    with torch.no_grad():
        trainer, _ = policy_forward(model, batch, temperature=temperature, with_entropy=False, device=torch.device("cpu"))
    mask = out.response_mask
    assert float(((trainer - out.logprobs).abs() * mask).max()) < LOGPROB_TOL[engine[0]]
    assert (out.logprobs[~mask] == 0).all()
    assert (out.logprobs[mask] < 0).all()


def test_log_probs_only_when_asked(engine):
    assert sample(engine, logprobs=False).logprobs is None
