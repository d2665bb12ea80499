"""The tiny model builder and its config: parameter counts by hand, determinism, fingerprint."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import dapo_cli.config.tiny as tiny_config
from dapo_cli.config.tiny import TinyModelConfig
from dapo_cli.errors import UserError
from dapo_cli.models.tiny import ARCHITECTURES, build_tiny_model, count_parameters, quiet_hf_progress
from dapo_cli.models.tokenizer import build_char_tokenizer
from transformers.utils import logging as hf_logging

SMALL = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


def _build(cfg: TinyModelConfig) -> torch.nn.Module:
    return build_tiny_model(cfg, 114, pad_token_id=0, eos_token_id=1, bos_token_id=3)


def test_default_parameter_count_by_hand():
    # V=114, h=128, L=4, I=512, tied embeddings:
    #   embedding V*h = 14,592; per layer q,k,v,o 4*h*h = 65,536 + SwiGLU 3*h*I = 196,608
    #   + two RMSNorms 2*h = 256 -> 262,400; 4 layers 1,049,600; final norm 128
    #   total 14,592 + 1,049,600 + 128 = 1,064,320
    assert count_parameters(_build(TinyModelConfig())) == 1_064_320
    # qwen2 adds q/k/v biases: 3*h = 384 per layer, 1,536 in all
    assert count_parameters(_build(TinyModelConfig(architecture="qwen2"))) == 1_065_856


def test_config_carries_architecture_and_special_ids():
    model = _build(SMALL)
    c = model.config
    assert c.model_type == "llama" and c.vocab_size == 114 and c.tie_word_embeddings
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (32, 2, 2, 2)
    assert (c.intermediate_size, c.max_position_embeddings) == (64, 256)
    assert (c.pad_token_id, c.eos_token_id, c.bos_token_id) == (0, 1, 3)
    g = model.generation_config
    assert (g.pad_token_id, g.eos_token_id) == (0, 1)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_build_is_deterministic_per_seed_and_leaves_the_global_rng_alone():
    state = torch.get_rng_state()
    a, b, c = _build(SMALL), _build(SMALL), _build(dataclasses.replace(SMALL, seed=1))
    assert torch.equal(torch.get_rng_state(), state)
    pa, pb, pc = (torch.cat([p.flatten() for p in m.parameters()]) for m in (a, b, c))
    assert torch.equal(pa, pb)
    assert not torch.equal(pa, pc)


def test_invalid_architecture_or_head_count_raise_user_error():
    with pytest.raises(UserError, match=r"unknown model.tiny.architecture 'gpt2' \(valid: llama, qwen2\)"):
        _build(dataclasses.replace(SMALL, architecture="gpt2"))
    with pytest.raises(UserError, match="hidden_size \\(30\\) must be divisible by model.tiny.num_heads \\(4\\)"):
        _build(dataclasses.replace(SMALL, hidden_size=30, num_heads=4))


def test_char_tokenizer_fits_the_default_position_budget():
    # the longest default prompt ("What is 999+999?\n", 17 chars) + 64 response tokens < 256 positions
    prompt = build_char_tokenizer()("What is 999+999?\n")["input_ids"]
    assert len(prompt) + 64 <= TinyModelConfig().max_position_embeddings


def test_fingerprint_is_stable_short_and_covers_every_field(monkeypatch):
    base = TinyModelConfig()
    fp = base.fingerprint()
    assert fp == TinyModelConfig().fingerprint()
    assert len(fp) == 12 and int(fp, 16) >= 0
    for field in dataclasses.fields(TinyModelConfig):
        value = getattr(base, field.name)
        changed = value + "x" if isinstance(value, str) else value + 1
        assert dataclasses.replace(base, **{field.name: changed}).fingerprint() != fp, field.name
    monkeypatch.setattr(tiny_config, "TINY_FORMAT_VERSION", tiny_config.TINY_FORMAT_VERSION + 1)
    assert base.fingerprint() != fp


def test_every_field_is_a_documented_plain_python_type():
    for field in dataclasses.fields(TinyModelConfig):
        assert type(getattr(TinyModelConfig(), field.name)) in (int, float, str), field.name
        assert field.metadata["help"], field.name
    assert tuple(ARCHITECTURES) == tiny_config.TINY_ARCHITECTURES


def test_quiet_hf_progress_restores_the_previous_setting():
    assert hf_logging.is_progress_bar_enabled()
    with quiet_hf_progress():
        assert not hf_logging.is_progress_bar_enabled()
    assert hf_logging.is_progress_bar_enabled()
