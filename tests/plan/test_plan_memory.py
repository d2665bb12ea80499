"""The per-GPU memory terms, checked against hand-computed numbers, and the verdicts and knobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo_cli.config import load_config
from dapo_cli.plan.memory import GIB, activation_bytes_per_token_layer, memory_plan
from dapo_cli.plan.shape import KNOWN_MODELS, ModelShape, parameter_count

REPO = Path(__file__).resolve().parents[2]

# A Llama-style shape with round numbers: hidden 1024, MLP 4096, 8 layers, 8 heads = 8 KV heads, vocab 32000, untied.
#   layer  = 4·1024² (q, k, v, o) + 3·1024·4096 (gate, up, down) + 2·1024 (norms) = 16,779,264
#   P      = 2·32000·1024 (embedding + lm_head) + 8·16,779,264 + 1024 (final norm) = 199,771,136
SHAPE = ModelShape("llama", 1024, 4096, 8, 8, 8, 32000, False)
P = 199_771_136


def cfg(*overrides: str):
    # tiny.yaml: 16 prompts × 8, mini-batch 8, prompt <= 64, response <= 64 (S = 128, R = 64)
    return load_config(REPO / "experiments" / "tiny.yaml", ["model.dtype=bfloat16", "engine.name=deepspeed", *overrides])


def phase(plan, name: str):
    return next(p for p in plan.phases + plan.alternatives if p.name == name)


def gpu(plan, name: str, key: str) -> float:
    term = phase(plan, name).term(key)
    return 0.0 if term is None else term.gpu


def test_the_round_shape() -> None:
    assert parameter_count(SHAPE) == P


@pytest.mark.parametrize(
    "stage, weights, grads, optimizer",
    [
        # bf16 (b = 2), DeepSpeed AdamW: 2 fp32 moments + fp32 master = 12 bytes a parameter; W = 8
        (0, 2 * P, 2 * P, 12 * P),  # 399,542,272 / 399,542,272 / 2,397,253,632: nothing sharded
        (1, 2 * P, 2 * P, 12 * P // 8),  # optimizer 299,656,704
        (2, 2 * P, 2 * P // 8, 12 * P // 8),  # + gradients 49,942,784
        (3, 2 * P // 8, 2 * P // 8, 12 * P // 8),  # + parameters 49,942,784
    ],
)
def test_zero_stages_divide_the_states_by_the_world_size(stage: int, weights: int, grads: int, optimizer: int) -> None:
    plan = memory_plan(cfg(f"engine.zero_stage={stage}"), SHAPE, world_size=8)
    assert gpu(plan, "update", "weights") == weights
    assert gpu(plan, "update", "gradients") == grads
    assert gpu(plan, "update", "optimizer") == optimizer
    assert gpu(plan, "rollout", "gradients") == 0  # freed between updates
    # ZeRO-3 gathers ≈ 2 layers + the embedding: (2·16,779,264 + 32000·1024)·2 = 132,653,056 bytes, doubled in the update
    assert gpu(plan, "old log-probs", "gathered") == (132_653_056 if stage == 3 else 0)
    assert gpu(plan, "update", "gathered") == (2 * 132_653_056 if stage == 3 else 0)


def test_fp32_has_no_master_copy_and_torch_adamw_keeps_the_param_dtype() -> None:
    fp32 = memory_plan(cfg("model.dtype=float32", "engine.zero_stage=3"), SHAPE, world_size=8)
    assert gpu(fp32, "update", "optimizer") == 8 * P // 8  # 2 fp32 moments, sharded: 199,771,136
    torch_ddp = memory_plan(cfg("engine.name=torch"), SHAPE, world_size=8)
    assert gpu(torch_ddp, "update", "optimizer") == 2 * 2 * P  # moments in bf16, every rank a full replica
    assert gpu(torch_ddp, "update", "weights") == gpu(torch_ddp, "update", "gradients") == 2 * P


def test_offload_moves_states_to_cpu_memory() -> None:
    plan = memory_plan(cfg("engine.zero_stage=3", "engine.offload_optimizer=true", "engine.offload_params=true"), SHAPE, world_size=8)
    update = phase(plan, "update")
    assert gpu(plan, "update", "weights") == gpu(plan, "update", "optimizer") == gpu(plan, "update", "gradients") == 0
    # CPU per rank: weights 2P/8 = 49,942,784 + AdamW 12P/8 = 299,656,704 + fp32 gradient partition 4P/8 = 99,885,568
    assert update.cpu == 49_942_784 + 299_656_704 + 99_885_568
    assert plan.cpu_per_rank == update.cpu and plan.ranks_per_node == 8
    # the hf rollout engine samples from a full copy under ZeRO-3
    assert gpu(plan, "rollout", "copy") == 2 * P


def test_activation_terms() -> None:
    # A = b·(2q + 2kv + 4I) + 2·(4 + b)·h = 2·(2048 + 2048 + 16384) + 12·1024 = 53,248 bytes a token per layer
    assert activation_bytes_per_token_layer(SHAPE, 2) == 53_248
    m, S = 4, 128  # micro-batch 4 rows, 64 + 64 tokens
    plain = memory_plan(cfg("trainer.ppo_micro_batch_size=4"), SHAPE, world_size=1)
    assert gpu(plain, "update", "activations") == m * S * 8 * 53_248  # m·S·L·A = 218,103,808
    assert gpu(plain, "old log-probs", "activations") == m * S * 53_248  # no grad: one layer at a time
    ckpt = memory_plan(cfg("trainer.ppo_micro_batch_size=4", "engine.gradient_checkpointing=true"), SHAPE, world_size=1)
    assert gpu(ckpt, "update", "activations") == m * S * (8 * 1024 * 2 + 2 * 53_248)  # m·S·(L·h·b + 2A) = 62,914,560


def test_micro_batch_rows_are_capped_by_the_rank_share() -> None:
    # micro 64 but a rank holds at most min(mini 8, 16 prompts / 4 ranks) = 4 groups × 8 = 32 rows of a mini-batch
    plan = memory_plan(cfg("trainer.ppo_micro_batch_size=64"), SHAPE, world_size=4)
    assert gpu(plan, "update", "activations") == 32 * 128 * 8 * 53_248


def test_logits_term() -> None:
    # m·(R+1)·V·(b + 8): 4·65·32000·10 = 83,200,000 bytes; + 4 with entropy (always for old log-probs)
    plan = memory_plan(cfg("trainer.ppo_micro_batch_size=4"), SHAPE, world_size=1)
    assert gpu(plan, "update", "logits") == 4 * 65 * 32000 * 10
    assert gpu(plan, "old log-probs", "logits") == 4 * 65 * 32000 * 14
    ent = memory_plan(cfg("trainer.ppo_micro_batch_size=4", "algorithm.entropy_coeff=0.01"), SHAPE, world_size=1)
    assert gpu(ent, "update", "logits") == 4 * 65 * 32000 * 14
    # one 20k-token response of a 152k-vocabulary model: 1·20481·152064·10 = 31,144,227,840 bytes ≈ 29 GiB
    q32 = KNOWN_MODELS["Qwen/Qwen2.5-32B"]
    long = memory_plan(cfg("trainer.ppo_micro_batch_size=1", "rollout.max_response_length=20480", "engine.logprob_chunk=0"), q32,
                       world_size=1)
    assert gpu(long, "update", "logits") == 31_144_227_840


def test_the_sync_term_is_one_tensor_in_flight() -> None:
    # ZeRO-3: the largest parameter, gathered: max(V·h, I·h, q·h) = 32000·1024 (the embedding) · b 2 = 65,536,000 bytes,
    # in the rollout phase; LoRA (torch engine): the largest merged linear, I·h·b = 4096·1024·2 = 8,388,608; otherwise 0
    z3 = memory_plan(cfg("engine.zero_stage=3"), SHAPE, world_size=2)
    assert gpu(z3, "rollout", "sync") == 32000 * 1024 * 2 == 65_536_000
    assert "one gathered parameter" in phase(z3, "rollout").term("sync").name
    lora = memory_plan(cfg("engine.name=torch", "model.lora.rank=8"), SHAPE, world_size=1)
    assert gpu(lora, "rollout", "sync") == 4096 * 1024 * 2
    assert phase(memory_plan(cfg("engine.zero_stage=2"), SHAPE, world_size=2), "rollout").term("sync") is None


def test_the_deepspeed_engine_plans_one_chunk_of_logits_too() -> None:
    # the same k·V·(8 + b) as the torch engine below: 1024·152064·10 = 1,557,135,360 bytes for a 20k-token response
    q32 = KNOWN_MODELS["Qwen/Qwen2.5-32B"]
    plan = memory_plan(cfg("trainer.ppo_micro_batch_size=1", "rollout.max_response_length=20480", "engine.zero_stage=3"), q32,
                       world_size=8)
    assert gpu(plan, "update", "logits") == 1_557_135_360


def test_the_torch_engine_plans_one_chunk_of_logits() -> None:
    # engine.logprob_chunk 1024 (the default), bf16 (b = 2): k·V·(8 + b) = 1024·152064·10 = 1,557,135,360 bytes
    # for the update of one 20k-token response, where the full logits take 31,144,227,840 (above); the old
    # log-probs add the entropy's 4: 1024·152064·14 = 2,179,989,504. The name prints the full size.
    q32 = KNOWN_MODELS["Qwen/Qwen2.5-32B"]
    plan = memory_plan(cfg("engine.name=torch", "trainer.ppo_micro_batch_size=1", "rollout.max_response_length=20480"), q32, world_size=1)
    assert gpu(plan, "update", "logits") == 1_557_135_360
    assert gpu(plan, "old log-probs", "logits") == 2_179_989_504
    assert "1024-token chunks (full: 29.0 GiB)" in phase(plan, "update").term("logits").name
    # fewer tokens than a chunk: all of them at once; chunk 0: the full term again
    short = memory_plan(cfg("engine.name=torch", "trainer.ppo_micro_batch_size=4"), SHAPE, world_size=1)
    assert gpu(short, "update", "logits") == 4 * 65 * 32000 * 10
    off = memory_plan(cfg("engine.name=torch", "engine.logprob_chunk=0", "trainer.ppo_micro_batch_size=1",
                          "rollout.max_response_length=20480"), q32, world_size=1)
    assert gpu(off, "update", "logits") == 31_144_227_840


def q32_cfg(*overrides: str):
    return cfg(
        "engine.zero_stage=3", "engine.gradient_checkpointing=true", "rollout.engine=vllm", "rollout.tensor_parallel_size=4",
        "rollout.gpu_memory_utilization=0.5", "rollout.n=16", "data.train_batch_size=512", "data.gen_batch_size=1536",
        "trainer.ppo_mini_batch_size=32", "data.max_prompt_length=2048", "rollout.max_response_length=20480",
        "algorithm.overlong_buffer.len=4096", *overrides,
    )


def test_vllm_kv_cache() -> None:
    q32 = KNOWN_MODELS["Qwen/Qwen2.5-32B"]  # P = 32,763,876,352
    plan = memory_plan(q32_cfg("trainer.ppo_micro_batch_size=1"), q32, world_size=32)
    v = plan.vllm
    assert v.pool == 0.5 * 80 * GIB == 42_949_672_960
    assert v.weights == 2 * 32_763_876_352 / 4 == 16_381_938_176  # bf16 weights over TP 4
    assert v.kv_bytes_per_token == 65_536  # 2·64 layers·(8/4) heads·128·2 bytes
    assert v.tokens_fit == (42_949_672_960 - 16_381_938_176) // 65_536 == 405_391
    assert v.sequences_per_engine == 1536 * 16 // (32 // 4) == 3072  # a round over 8 engines
    assert v.tokens_needed == 3072 * (2048 + 20480)
    assert v.concurrent_worst == 405_391 // 22_528 == 17
    # asleep (level 1) vLLM frees the GPU and keeps its weights in CPU memory; awake it keeps the pool
    asleep, awake = phase(plan, "update"), phase(plan, "update, vLLM awake")
    assert awake.total - asleep.total == v.pool
    assert asleep.term("vllm").cpu == v.weights
    level2 = memory_plan(q32_cfg("trainer.ppo_micro_batch_size=1", "rollout.sleep_level=2"), q32, world_size=32)
    assert phase(level2, "update").term("vllm").cpu == 0
    # the rollout phase: trainer weights 2P/32 + AdamW 12P/32 resident next to the pool, and the sync's one gathered
    # parameter, the embedding: V·h·b = 152,064·5,120·2 = 1,557,135,360 bytes
    assert phase(plan, "rollout").total == pytest.approx(14 * 32_763_876_352 / 32 + v.pool + 152_064 * 5_120 * 2)


def test_tiny_fits_everywhere() -> None:
    plan = memory_plan(load_config(REPO / "experiments" / "tiny.yaml"), KNOWN_MODELS["Qwen/Qwen2.5-0.5B"], world_size=1)
    assert plan.fits and all(p.verdict.startswith("fits:") and not p.knob for p in plan.phases)


def test_32b_at_the_paper_micro_batch_does_not_fit_and_says_what_to_turn() -> None:
    q32 = KNOWN_MODELS["Qwen/Qwen2.5-32B"]
    plan = memory_plan(q32_cfg("trainer.ppo_micro_batch_size=16"), q32, world_size=32)
    update = phase(plan, "update")
    assert not plan.fits and not update.fits
    assert update.verdict.startswith("does not fit:") and "over by" in update.verdict
    assert update.knob.startswith("first knob: trainer.ppo_micro_batch_size=1")
    assert phase(plan, "rollout").fits
    fixed = memory_plan(q32_cfg("trainer.ppo_micro_batch_size=1"), q32, world_size=32)
    assert fixed.fits


def test_state_bound_phase_asks_for_zero3() -> None:
    # Qwen2.5-14B, ZeRO-1 on 4 GPUs, short sequences: weights 2P + gradients 2P replicated, AdamW 12P/4 ≈ 96 GiB
    shape = KNOWN_MODELS["Qwen/Qwen2.5-14B"]
    common = ("engine.gradient_checkpointing=true", "trainer.ppo_micro_batch_size=1", "rollout.tensor_parallel_size=4",
              "rollout.gpu_memory_utilization=0.3")
    c = cfg("engine.zero_stage=1", "rollout.engine=vllm", *common)
    update = phase(memory_plan(c, shape, world_size=4), "update")
    assert not update.fits and update.knob.startswith("first knob: engine.zero_stage=3")
    # with the hf engine ZeRO-3 samples from a full unsharded copy, so it is not the answer there
    hf = phase(memory_plan(cfg("engine.zero_stage=1", *common), shape, world_size=4), "update")
    assert not hf.fits and "engine.zero_stage=3" not in hf.knob.split(",")[0]


def test_awake_vllm_in_the_update_asks_for_sleep() -> None:
    shape = KNOWN_MODELS["Qwen/Qwen2.5-7B"]
    c = cfg("engine.zero_stage=3", "rollout.engine=vllm", "rollout.sleep_level=0", "rollout.gpu_memory_utilization=0.9",
            "trainer.ppo_micro_batch_size=1", "engine.gradient_checkpointing=true", "rollout.max_response_length=4096")
    update = phase(memory_plan(c, shape, world_size=8), "update")
    assert not update.fits and update.knob.startswith("first knob: rollout.sleep_level=1")


def test_vllm_without_room_for_one_sequence() -> None:
    shape = KNOWN_MODELS["Qwen/Qwen2.5-72B"]  # bf16 weights 145 GB: 0.5 × 80 GiB on one GPU holds no KV cache
    c = cfg("engine.zero_stage=3", "rollout.engine=vllm", "rollout.tensor_parallel_size=1", "engine.offload_optimizer=true")
    rollout = phase(memory_plan(c, shape, world_size=8), "rollout")
    assert not rollout.fits and "KV cache holds 0 tokens" in rollout.problem
    assert "rollout.tensor_parallel_size=" in rollout.knob


def test_larger_gpu_flips_the_verdict() -> None:
    shape = KNOWN_MODELS["Qwen/Qwen2.5-7B"]
    c = cfg("engine.zero_stage=3", "trainer.ppo_micro_batch_size=8", "rollout.max_response_length=8192")
    small = phase(memory_plan(c, shape, world_size=8, gpu_memory_gib=40), "update")
    big = phase(memory_plan(c, shape, world_size=8, gpu_memory_gib=1000), "update")
    assert not small.fits and big.fits and small.total == big.total
