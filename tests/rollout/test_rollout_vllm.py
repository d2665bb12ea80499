"""vLLM's engine beyond the shared protocol: the weight sync, proven against the trainer; greedy with n > 1;
seeded sampling of more prompt tokens than one scheduler step holds; what the platform lacks.

Runs on vLLM's CPU build in ``make test`` (``.venv-vllm``), and wherever else vLLM is installed.
"""

from __future__ import annotations

import torch

import pytest

from dapo_cli.batch import RolloutBatch
from dapo_cli.engine.torch import TorchEngine
from dapo_cli.models import load_policy
from dapo_cli.rollout.base import Rollouts, SamplingParams

pytestmark = pytest.mark.vllm

PROMPTS = ["What is 12+7?\n", "Add 3 and 4.\n", "Q"]
SYNCED_TOL = 1e-4
"""Largest |log π_vLLM − log π_trainer| per token with the same float32 weights (the conformance
tests' vLLM tolerance): vLLM's CPU kernels (oneDNN matmuls, its own attention) round differently;
measured 4.8e-7 on this policy, before and after 3 synced steps (0.54 with one step unsynced)."""


@pytest.fixture(scope="module")
def setup(head32_model_dir):
    from dapo_cli.rollout.vllm import VLLMRolloutEngine

    model, tokenizer = load_policy(head32_model_dir)
    notes: list[str] = []
    rollout = VLLMRolloutEngine(
        head32_model_dir, tokenizer, gpu_memory_utilization=0.1, sleep_level=1, dtype="float32", note=notes.append
    )
    trainer = TorchEngine(model, lr=3e-3, weight_decay=0.0, warmup_steps=0, grad_clip=1.0)
    yield rollout, trainer, tokenizer, notes
    rollout.close()


def as_batch(out: Rollouts, pad_id: int) -> RolloutBatch:
    n = len(out.texts)
    return RolloutBatch.from_rollouts(
        out, group_ids=out.prompt_index, ground_truths=[""] * n, prompts=[""] * n, pad_id=pad_id,
    )


def gap(rollout, trainer, tokenizer, seed: int) -> float:
    """max |log π_vLLM(o_t) − log π_trainer(o_t)| over the tokens vLLM samples now."""
    out = rollout.generate(PROMPTS, 4, SamplingParams(temperature=1.0, max_tokens=12, seed=seed, logprobs=True))
    with torch.no_grad():
        mine, _ = trainer.log_probs(as_batch(out, tokenizer.pad_token_id), temperature=1.0, with_entropy=False)
    return float(((mine - out.logprobs).abs() * out.response_mask).max())


def optimizer_step(rollout, trainer, tokenizer, seed: int) -> None:
    """One AdamW step raising the log-likelihood of vLLM's samples (what an RL update does to the weights)."""
    out = rollout.generate(PROMPTS, 4, SamplingParams(temperature=1.0, max_tokens=12, seed=seed))
    batch = as_batch(out, tokenizer.pad_token_id)
    logp, _ = trainer.log_probs(batch, temperature=1.0, with_entropy=False)
    mask = batch.response_mask.float()
    trainer.backward(-(logp * mask).sum() / mask.sum())
    trainer.step()


def test_synced_log_probs_match_the_trainer_after_k_steps_and_an_unsynced_engine_does_not(setup):
    rollout, trainer, tokenizer, _ = setup
    assert gap(rollout, trainer, tokenizer, seed=100) < SYNCED_TOL  # same weights on both sides
    for step in range(3):  # k = 3 optimizer steps, each followed by the sync the training loop does
        optimizer_step(rollout, trainer, tokenizer, seed=step)
        rollout.sync_weights(trainer)
    synced = gap(rollout, trainer, tokenizer, seed=101)
    assert synced < SYNCED_TOL
    optimizer_step(rollout, trainer, tokenizer, seed=3)  # negative control: a step with no sync after it
    stale = gap(rollout, trainer, tokenizer, seed=102)
    assert stale > 20 * SYNCED_TOL, (synced, stale)
    rollout.sync_weights(trainer)
    assert gap(rollout, trainer, tokenizer, seed=103) < SYNCED_TOL


def test_greedy_with_several_samples_repeats_the_one_greedy_sequence(setup):
    rollout, _, _, _ = setup
    out = rollout.generate(PROMPTS, 3, SamplingParams(temperature=0.0, max_tokens=8, seed=0, logprobs=True))
    assert out.response_ids.shape[0] == 3 * len(PROMPTS)
    for p in range(len(PROMPTS)):
        rows = out.response_ids[3 * p : 3 * p + 3]
        assert (rows == rows[0]).all() and out.texts[3 * p] == out.texts[3 * p + 2]
    single = rollout.generate(PROMPTS, 1, SamplingParams(temperature=0.0, max_tokens=8, seed=0))
    assert single.texts == out.texts[::3]


def test_seeded_sampling_of_more_prompt_tokens_than_one_scheduler_step_replays(setup):
    """24 prompts x 8 samples x ~100 prompt tokens is over the 16,384-token step budget: on the CPU
    platform a chunked prefill would rewind a seeded CPU generator and crash ("CPU Generator does not
    use offset"); with chunking off the prompts that do not fit wait for the next step."""
    from dapo_cli.rollout.vllm import CPU_MIN_BATCHED_TOKENS

    rollout, _, tokenizer, _ = setup
    prompts = [f"{i:03d} " + "add the numbers one by one, carry the tens, " * 2 + "then answer.\n" for i in range(24)]
    tokens = sum(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts) * 8
    assert tokens > CPU_MIN_BATCHED_TOKENS
    params = SamplingParams(temperature=1.0, max_tokens=4, seed=7)
    a, b = rollout.generate(prompts, 8, params), rollout.generate(prompts, 8, params)
    assert torch.equal(a.response_ids, b.response_ids)


def test_the_platform_comes_from_vllm_and_a_missing_sleep_mode_is_said_once(setup):
    from dapo_cli.rollout.vllm import platform_info

    rollout, _, _, notes = setup
    info = platform_info()
    assert info["runs"]
    if info["sleep_mode"]:
        assert rollout.sleep_level == 1 and notes == []
    else:  # vLLM's CPU build: the engine stays awake, and the user hears it once
        assert rollout.sleep_level == 0 and len(notes) == 1 and "no sleep mode" in notes[0]
        rollout.sleep()
        assert not rollout.asleep


def test_the_trainers_thread_count_survives_the_engine(setup):
    """vLLM's CPU worker replaces ``torch.set_num_threads`` process-wide; the engine gives it back."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    assert torch.get_num_threads() == 2
    torch.set_num_threads(before)


def test_the_engine_starts_in_a_process_that_holds_more_than_its_memory_share(head32_model_dir):
    """vLLM's own CPU rule (gpu_memory_utilization x node memory minus the process's resident memory) gave
    a negative KV budget once the process held more than that share; dapo's explicit size does not care."""
    import psutil

    from dapo_cli.hardware import node_memory
    from dapo_cli.models.loading import load_tokenizer
    from dapo_cli.rollout.vllm import VLLMRolloutEngine, kv_cache_need

    share = 0.05
    process = psutil.Process()
    over = int(share * node_memory().total) - process.memory_info().rss + 256 * 2**20
    ballast = torch.ones(max(0, over) // 4 + 1)  # resident: ones are written, not lazily mapped zeros
    assert process.memory_info().rss > share * node_memory().total
    notes: list[str] = []
    rollout = VLLMRolloutEngine(head32_model_dir, load_tokenizer(head32_model_dir), gpu_memory_utilization=share,
                                sleep_level=0, dtype="float32", max_model_len=64, max_sequences=8, note=notes.append)
    try:
        # hidden 64, 2 layers, 2 KV heads of 32, float32: 2 x 2 x 2 x 32 x 4 = 1,024 bytes a token
        assert rollout.kv_cache_bytes == kv_cache_need(1024, 8, 64)
        out = rollout.generate(PROMPTS, 2, SamplingParams(temperature=1.0, max_tokens=8, seed=0))
        assert out.response_ids.shape[0] == 6 and int(out.lengths.min()) >= 1
    finally:
        rollout.close()
        del ballast


def test_a_layer_the_sync_leaves_out_is_reported_in_the_log_and_the_rotary_warning_is_not(setup):
    """vLLM's reload logger is no longer muted: a layer that loaded nothing (kept on its old weights) is named."""
    import logging

    from dapo_cli.rollout.vllm import RELOAD_LOGGER

    rollout, trainer, _, _ = setup

    class Partial:
        def export_weights(self):
            return ((n, t) for n, t in trainer.export_weights() if ".layers.0.mlp." not in n)

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Keep(logging.WARNING)
    log = logging.getLogger(RELOAD_LOGGER)
    log.addHandler(handler)
    try:
        rollout.sync_weights(Partial())
    finally:
        log.removeHandler(handler)
        rollout.sync_weights(trainer)  # the module's other tests see the whole policy again
    failed = [m for m in seen if m.endswith("Failed to load weights")]
    assert failed and not any("RotaryEmbedding" in m for m in failed), seen


def test_gpu_checks_engine_facts_read_the_runner_and_attention_backend_from_a_real_engine(setup):
    """``benchmarks/gpu_check.py``'s environment report, against vLLM's real worker (here its CPU build)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import gpu_check

    facts = gpu_check.engine_facts(setup[0].llm)
    assert facts["model_runner"].endswith("ModelRunner") and facts["attention_backends"], facts
