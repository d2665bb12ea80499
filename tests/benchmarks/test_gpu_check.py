"""``benchmarks/gpu_check.py`` (``make gpu-check``) without a GPU: it stops at once with one line, and the parts
that need none (the policy builder, the gates, the forced rewards, the arguments) do what the GPU run relies on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import gpu_check  # noqa: E402


@pytest.mark.slow
def test_without_a_cuda_gpu_it_fails_fast_with_one_line():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(BENCH / "gpu_check.py")], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {gpu_check.NEEDS_CUDA}" and "needs a CUDA GPU" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("tied", [True, False])
def test_the_policy_is_a_bf16_qwen2_with_gqa_head_dim_128_tied_or_not(tmp_path, tied):
    import torch

    from dapo_cli.models import load_policy

    shape = {"hidden_size": 256, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "head_dim": 128, "intermediate_size": 64}
    path = gpu_check.build_policy(tmp_path / "p", tied=tied, **shape)
    model, tokenizer = load_policy(path, dtype=torch.bfloat16)
    c = model.config
    assert c.model_type == "qwen2" and c.num_attention_heads == 2 and c.num_key_value_heads == 1 and c.head_dim == 128
    assert c.tie_word_embeddings is tied and c.vocab_size == len(tokenizer)
    names = dict(model.named_parameters())
    assert ("lm_head.weight" in names) is (not tied)  # untied: a head of its own to sync
    assert names["model.layers.0.self_attn.k_proj.weight"].shape == (128, 256)  # 1 KV head x 128
    assert "model.layers.0.self_attn.q_proj.bias" in names  # Qwen2's q/k/v bias
    text = "What is 1+2?\n\nAnswer: 3"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text  # spaces and newlines kept
    assert gpu_check.build_policy(tmp_path / "q", tied=tied, **shape) and (tmp_path / "q" / "model.safetensors").read_bytes() \
        == (tmp_path / "p" / "model.safetensors").read_bytes()  # seeded: the same policy every run


def test_every_gate_decides_and_one_failure_fails_the_run():
    good = [gpu_check.at_most("c", "gap", 0.01, 0.05), gpu_check.at_least("c", "freed", 0.9, 0.5), gpu_check.holds("c", "ok", True)]
    assert all(g.ok for g in good) and gpu_check.exit_code(good) == 0
    bad = gpu_check.at_most("c", "gap", float("nan"), 0.05)
    assert not bad.ok and bad.line().startswith("FAIL c: gap")
    assert gpu_check.exit_code([*good, bad]) == 1
    assert gpu_check.exit_code([]) == 1  # nothing checked is not a pass
    assert not gpu_check.at_most("c", "gap", 0.06, 0.05).ok and not gpu_check.at_least("c", "freed", 0.4, 0.5).ok


def test_forced_rewards_make_every_group_informative_or_none():
    from dapo_cli.rewards.math_dapo import compute_score

    truths = ["7"] * 4 + ["12"] * 4
    mixed = gpu_check.forced_texts([""] * 8, truths, 4, barren=False)
    barren = gpu_check.forced_texts([""] * 8, truths, 4, barren=True)
    right = [compute_score(t, g)["acc"] for t, g in zip(mixed, truths)]
    assert right == [True, True, False, False] * 2  # every group of 4 half right: informative
    assert not any(compute_score(t, g)["acc"] for t, g in zip(barren, truths))  # no informative group


def test_the_arguments_run_every_check_by_default_and_a_child_one():
    assert gpu_check.parse_args([]).only == list(gpu_check.CHECKS)
    child = gpu_check.parse_args(["--check", "sleep", "--work", "/w", "--result", "/w/r.json"])
    assert child.check == "sleep" and child.work == Path("/w")
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--only", "nope"])


@pytest.mark.parametrize("check", ["deepspeed", "lora"], ids=["zero3", "torch-adapters"])  # "lora" in an id marks it lora
def test_the_training_checks_configs_are_valid_and_read_back(tmp_path, check):
    from dapo_cli.config import load_config

    sets = {"deepspeed": ["engine.name=deepspeed", "engine.zero_stage=3", "rollout.sleep_level=2"],
            "lora": ["engine.name=torch", "model.lora.rank=8", "rollout.sleep_level=1", "trainer.lr=1e-3"]}[check]
    cfg = load_config(gpu_check.train_config(tmp_path, check, sets))
    assert cfg.rollout.engine == "vllm" and cfg.model.dtype == "bfloat16" and cfg.trainer.save_freq == 1
    assert cfg.algorithm.filter_groups.max_num_gen_batches == 1  # a forced barren step trains nothing
    assert (cfg.engine.name, cfg.rollout.sleep_level) == (("deepspeed", 2) if check == "deepspeed" else ("torch", 1))
