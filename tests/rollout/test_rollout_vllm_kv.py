"""The KV-cache size dapo gives vLLM on its CPU platform (``rollout.vllm.cpu_kv_cache_bytes``): pure
arithmetic on a model's config.json and a node's memory, so it runs without vLLM; the engine's own start
in a process that already holds more than ``gpu_memory_utilization`` x node memory is in
``test_rollout_vllm.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dapo_cli.config import build_config
from dapo_cli.config.schema import round_sequences
from dapo_cli.errors import UserError
from dapo_cli.hardware import NodeMemory
from dapo_cli.rollout.vllm import CPU_BLOCK_TOKENS, CPU_MAX_NUM_SEQS, cpu_kv_cache_bytes, kv_cache_need

GIB = 2**30

# SmolLM2-135M's attention: 30 layers, 3 KV heads of 64 (9 query heads over hidden 576)
SMOLLM2 = {
    "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152, "tie_word_embeddings": True,
    "max_position_embeddings": 8192,
}
SMOLLM2_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4  # K and V x layers x KV heads x head_dim x float32 = 46,080


@pytest.fixture
def smollm2_config(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    return tmp_path


def node(available_gib: float, total_gib: float = 16.0) -> NodeMemory:
    return NodeMemory(total=int(total_gib * GIB), available=int(available_gib * GIB), node=0)


def test_need_counts_whole_blocks_for_every_sequence_with_the_margin():
    # 64 sequences of 200 tokens: each takes 2 blocks of 128 = 256 token slots; 64 x 256 = 16,384 slots
    # x 46,080 bytes = 754,974,720; x 1.25 = 943,718,400 bytes (0.879 GiB)
    assert CPU_BLOCK_TOKENS == 128
    assert kv_cache_need(SMOLLM2_BYTES_PER_TOKEN, 64, 200) == 943_718_400
    # one full-length sequence without the margin: exactly its blocks
    assert kv_cache_need(SMOLLM2_BYTES_PER_TOKEN, 1, 128, margin=1.0) == 128 * 46_080
    # vLLM runs at most CPU_MAX_NUM_SEQS at once: more sequences need no more cache
    assert kv_cache_need(1000, 10_000, 128) == kv_cache_need(1000, CPU_MAX_NUM_SEQS, 128)


def test_auto_size_is_the_need_and_ignores_what_the_process_holds(smollm2_config):
    size = cpu_kv_cache_bytes(smollm2_config, dtype="float32", sequences=64, max_model_len=200, kv_cache_gib=None,
                              memory=node(available_gib=8.0))
    assert size == 943_718_400
    # bfloat16 halves every token's bytes
    half = cpu_kv_cache_bytes(smollm2_config, dtype="bfloat16", sequences=64, max_model_len=200, kv_cache_gib=None,
                              memory=node(available_gib=8.0))
    assert half == 943_718_400 // 2


def test_auto_size_is_capped_at_80_percent_of_the_available_memory_with_a_note(smollm2_config):
    notes: list[str] = []
    # 256 sequences of the model's 8192-token context: 256 x 8192 x 46,080 x 1.25 = 120.8 GB, far over 2 GiB
    size = cpu_kv_cache_bytes(smollm2_config, dtype="float32", sequences=256, max_model_len=None, kv_cache_gib=None,
                              memory=node(available_gib=2.0), note=notes.append)
    assert size == int(2.0 * GIB * 0.8)
    # one 8192-token sequence takes 8192 x 46,080 x 1.25 = 471.9 MB: 1.6 GiB holds 3 of them
    assert len(notes) == 1 and "about 3 of 256 sequences of 8192 tokens run at once" in notes[0], notes


def test_a_node_that_cannot_hold_one_sequence_is_one_line_that_says_how_much(smollm2_config):
    # one 8192-token sequence without margin: 8192 x 46,080 = 377,487,360 bytes = 0.35 GiB > 0.8 x 0.3 GiB
    with pytest.raises(UserError) as err:
        cpu_kv_cache_bytes(smollm2_config, dtype="float32", sequences=8, max_model_len=None, kv_cache_gib=None,
                           memory=node(available_gib=0.3))
    message = str(err.value)
    assert "\n" not in message
    assert "vLLM needs 0.35 GiB of KV cache for one 8192-token sequence" in message
    assert "NUMA node 0 has 0.30 GiB available" in message


def test_an_explicit_size_is_given_as_is_and_refused_over_the_available_memory(smollm2_config):
    assert cpu_kv_cache_bytes(smollm2_config, dtype="float32", sequences=64, max_model_len=200, kv_cache_gib=1.5,
                              memory=node(available_gib=4.0)) == int(1.5 * GIB)
    with pytest.raises(UserError, match=r"rollout.kv_cache_gib=6 is more than vLLM can have: NUMA node 0 has 4.00 GiB"):
        cpu_kv_cache_bytes(smollm2_config, dtype="float32", sequences=64, max_model_len=200, kv_cache_gib=6.0,
                           memory=node(available_gib=4.0))


def test_a_model_without_a_readable_config_leaves_the_size_to_vllm(tmp_path):
    assert cpu_kv_cache_bytes(tmp_path, dtype="float32", sequences=8, max_model_len=64, kv_cache_gib=None,
                              memory=node(4.0)) is None


def test_the_tiny_policy_config_is_read(tiny_model_dir):
    # hidden 32, 2 layers, 2 heads of 16: 2 x 2 x 2 x 16 x 4 = 512 bytes a token; 16 sequences of 1 block
    size = cpu_kv_cache_bytes(tiny_model_dir, dtype="float32", sequences=16, max_model_len=100, kv_cache_gib=None,
                              memory=node(4.0))
    assert size == 16 * 128 * 512 * 5 // 4


def test_round_sequences_is_the_ranks_share_of_the_round_times_the_group_and_the_tp_group():
    cfg = build_config(None, ["data.train_batch_size=16", "rollout.n=8"])
    assert round_sequences(cfg.data, cfg.rollout, 1) == 128
    assert round_sequences(cfg.data, cfg.rollout, 2) == 64
    cfg = build_config(None, ["data.train_batch_size=16", "data.gen_batch_size=48", "rollout.n=4",
                              "rollout.tensor_parallel_size=2"])
    assert round_sequences(cfg.data, cfg.rollout, 4) == 48 // 4 * 4 * 2
