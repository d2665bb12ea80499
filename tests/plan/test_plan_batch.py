"""Batch arithmetic of one RL step and the world-size checks of the plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo_cli.config import load_config
from dapo_cli.errors import UserError
from dapo_cli.plan.batch import batch_plan, world_checks

REPO = Path(__file__).resolve().parents[2]


def tiny(*overrides: str):
    return load_config(REPO / "experiments" / "tiny.yaml", overrides)


def test_tiny_experiment_step_counts() -> None:
    # tiny.yaml: 16 prompts × n=8, mini-batch 8, micro 64, prompt <= 64, response <= 64, dynamic sampling, 10 rounds
    b = batch_plan(tiny(), world_size=1)
    assert (b.prompts, b.responses, b.gen_batch_size) == (16, 128, 16)
    assert b.dynamic_sampling and b.min_rounds == 1 and b.max_rounds == 10
    assert b.rounds_at == {1.0: 1, 0.5: 2, 0.25: 4, 0.1: 10}  # ⌈16 / (16 f)⌉, capped at 10
    assert (b.mini_batches, b.updates) == (2, 2)  # 16 / 8 × 1 epoch
    assert b.micro_per_update == 1  # 8 prompts × 8 = 64 responses per mini-batch, micro 64
    assert b.old_logprob_forwards == 2  # 128 responses / 64
    assert b.trained_tokens_worst == 128 * (64 + 64)
    assert b.trained_tokens_expected == 128 * (32 + 32)  # both lengths at EXPECTED_FILL = 0.5
    assert b.generated_tokens_expected == 16 * 8 * 32
    assert b.generated_tokens_worst == 10 * 16 * 8 * 64 == 81_920
    assert b.prompts_generated_worst == 160


def test_world_size_splits_the_micro_batches() -> None:
    b = batch_plan(tiny("trainer.ppo_micro_batch_size=8", "trainer.ppo_epochs=3"), world_size=2)
    assert b.updates == 2 * 3
    assert b.mini_rows_per_rank == 32  # 8 prompts × 8 responses / 2 ranks
    assert b.micro_per_update == 4  # ⌈32 / 8⌉
    assert b.old_logprob_forwards == 8  # 64 responses a rank / 8


def test_without_dynamic_sampling_one_round_of_the_gen_batch() -> None:
    b = batch_plan(tiny("algorithm.filter_groups.enable=false"), world_size=1)
    assert (b.min_rounds, b.max_rounds, b.rounds_at) == (1, 1, {1.0: 1})
    assert b.generated_tokens_worst == 16 * 8 * 64
    b = batch_plan(tiny("algorithm.filter_groups.enable=false", "data.gen_batch_size=32"), world_size=1)
    assert b.prompts == 32 and "trains all 32 prompts" in b.notes[0]  # as collect_batch does


def test_dynamic_sampling_with_oversampling_and_no_cap() -> None:
    b = batch_plan(tiny("data.gen_batch_size=48", "algorithm.filter_groups.max_num_gen_batches=0"), world_size=1)
    assert b.rounds_at[1.0] == 1 and b.rounds_at[0.25] == 2 and b.rounds_at[0.1] == 4  # ⌈16 / (48 f)⌉
    assert b.max_rounds is None and b.generated_tokens_worst is None
    b = batch_plan(tiny("data.gen_batch_size=4", "algorithm.filter_groups.max_num_gen_batches=2"), world_size=1)
    assert b.min_rounds == 4 and "raise data.gen_batch_size" in b.notes[0]


def _checks(cfg, world: int, heads: int = 40, kv: int = 8, per_node: int = 8):
    return {c.name: c for c in world_checks(cfg, world, gpus_per_node=per_node, num_attention_heads=heads, num_kv_heads=kv)}


def test_world_checks_reuse_check_world_size(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tiny()
    assert _checks(cfg, 8)["batches divide the world size"].ok  # 16 and 8 divide by 8
    bad = _checks(cfg, 3)["batches divide the world size"]
    assert not bad.ok and "not divisible by the world size 3" in bad.message

    from dapo_cli.config import validate as rules

    def sentinel(data, world_size):
        raise UserError(f"sentinel {world_size}")

    monkeypatch.setattr(rules, "check_world_size", sentinel)
    assert _checks(cfg, 2)["batches divide the world size"].message == "sentinel 2"


def test_vllm_tensor_parallel_checks() -> None:
    cfg = tiny("rollout.engine=vllm", "rollout.tensor_parallel_size=4")
    ok = _checks(cfg, 8)
    assert all(c.ok for c in ok.values())
    assert not _checks(cfg, 2)["tensor_parallel_size divides the world size"].ok
    assert not _checks(cfg, 8, heads=6, kv=2)["heads split over tensor_parallel_size"].ok  # 6 heads over 4 GPUs
    assert _checks(cfg, 8, heads=8, kv=2)["heads split over tensor_parallel_size"].ok  # 2 KV heads replicated twice
    across = _checks(cfg, 8, per_node=2)["one vLLM engine within one node"]
    assert not across.ok and not across.hard
    assert "tensor_parallel_size divides the world size" not in _checks(tiny(), 8)  # hf engine: no TP checks


def test_offload_checks() -> None:
    cfg = tiny("engine.offload_optimizer=true")  # torch engine
    assert not _checks(cfg, 1)["offload needs DeepSpeed"].ok
    cfg = tiny("engine.name=deepspeed", "engine.zero_stage=2", "engine.offload_params=true")
    assert not _checks(cfg, 1)["offload_params needs ZeRO-3"].ok
