"""benchmarks/flops.py: the FLOP counts behind the RL benchmark's floor table (hand-counted cases)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import flops
import rl_step_vs_trl

TINY = flops.Shape(layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=10)


def test_matmul_parameters_are_every_linear_weight_of_a_llama_with_that_shape():
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(num_hidden_layers=2, hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                         intermediate_size=16, vocab_size=10, tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    # per layer: q 8x8 + k 8x4 + v 8x4 + o 8x8 = 192, gate/up/down 3 x 8x16 = 384; 2 layers; lm_head 8x10 = 80
    assert flops.Shape.of(config) == TINY
    assert TINY.matmul_params == linear == 2 * (192 + 384) + 80
    assert TINY.pair_flops == 4 * 2 * 2 * 4  # 4 d per layer, d = heads x head_dim = 8


def test_generation_counts_the_prefill_once_and_every_generated_token_but_the_last():
    n, pf = TINY.matmul_params, TINY.pair_flops
    # one prompt of 2 tokens (pairs 1 + 2 = 3), one row of 3 tokens: tokens 0 and 1 are fed back at positions
    # 2 and 3 (3 and 4 keys), token 2 is sampled from the last forward and never fed
    assert flops.generation_flops(TINY, [2], [3]) == 2 * n * 2 + 3 * pf + 2 * n * 2 + 7 * pf
    # two rows of the same prompt share its prefill
    assert flops.generation_flops(TINY, [2], [3, 3]) == 2 * n * 2 + 3 * pf + 2 * (2 * n * 2 + 7 * pf)


def test_the_update_is_three_forwards_of_the_prompt_once_and_the_fed_response_tokens():
    n, pf = TINY.matmul_params, TINY.pair_flops
    assert flops.update_flops(TINY, [2], [3]) == 3 * (2 * n * (2 + 2) + pf * (3 + 7))
    assert flops.update_flops(TINY, [2], [1]) == 3 * (2 * n * 2 + pf * 3)  # a one-token response feeds nothing


def test_the_real_model_window_is_steps_two_to_the_last():
    ends = [float(i * i) for i in range(1, 5)]  # 4 steps: step k lasts 2k - 1 (k >= 2)
    assert rl_step_vs_trl.steady(ends, skip=1, last=4) == 5.0  # median of steps 2, 3, 4: 3, 5, 7
    assert rl_step_vs_trl.steady(ends, skip=1, last=3) == 4.0  # steps 2 and 3
