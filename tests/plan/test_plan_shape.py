"""The plan's model shapes: exact parameter counts against transformers, KV bytes, where config.json comes from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from dapo_cli.config.tiny import TinyModelConfig
from dapo_cli.errors import UserError
from dapo_cli.plan.shape import (
    KNOWN_MODELS,
    find_shape,
    kv_bytes_per_token,
    parameter_count,
    shape_from_config,
)

SMALL = {"hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 3, "num_attention_heads": 6, "num_key_value_heads": 2, "vocab_size": 97}


def real_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights are one Parameter, counted once


def written_shape(config, tmp_path: Path):
    """The shape the plan reads back from the config.json that save_pretrained writes."""
    config.save_pretrained(tmp_path)
    return find_shape(str(tmp_path), TinyModelConfig())


@pytest.mark.parametrize("tied", [False, True])
def test_qwen2_count_equals_a_random_init_model(tmp_path: Path, tied: bool) -> None:
    config = Qwen2Config(**SMALL, tie_word_embeddings=tied)
    model = Qwen2ForCausalLM(config)  # q/k/v biases, o_proj without
    shape = written_shape(config, tmp_path)
    assert shape.qkv_bias and not shape.o_bias
    assert parameter_count(shape) == real_count(model)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("tied", [False, True])
def test_llama_count_equals_a_random_init_model(tmp_path: Path, tied: bool, bias: bool) -> None:
    config = LlamaConfig(**SMALL, tie_word_embeddings=tied, attention_bias=bias, mlp_bias=bias)
    model = LlamaForCausalLM(config)
    assert parameter_count(written_shape(config, tmp_path)) == real_count(model)


def test_llama_with_an_explicit_head_dim(tmp_path: Path) -> None:
    config = LlamaConfig(**{**SMALL, "head_dim": 16})  # heads × head_dim (96) != hidden (48)
    model = LlamaForCausalLM(config)
    shape = written_shape(config, tmp_path)
    assert shape.q_width == 96 and parameter_count(shape) == real_count(model)


def test_qwen3_count_with_query_key_norms(tmp_path: Path) -> None:
    config = Qwen3Config(**SMALL, head_dim=8)
    assert parameter_count(written_shape(config, tmp_path)) == real_count(Qwen3ForCausalLM(config))


def test_builtin_tiny_count_equals_the_built_model() -> None:
    from dapo_cli.models import build_char_tokenizer
    from dapo_cli.models.tiny import build_tiny_model_for

    tiny = TinyModelConfig()
    model = build_tiny_model_for(tiny, build_char_tokenizer())
    shape = find_shape("builtin:tiny", tiny)
    assert parameter_count(shape) == real_count(model) == 1_064_320


def _meta_model(shape):
    fields = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size")
    kwargs = {name: getattr(shape, name) for name in fields}
    cls = (Qwen2Config, Qwen2ForCausalLM) if shape.model_type == "qwen2" else (LlamaConfig, LlamaForCausalLM)
    with torch.device("meta"):  # full size, no memory: only shapes
        return cls[1](cls[0](**kwargs, tie_word_embeddings=shape.tie_word_embeddings))


@pytest.mark.parametrize("hub_id", [k for k in KNOWN_MODELS if not k.endswith("-Instruct")])
@pytest.mark.slow
def test_known_architectures_count_like_transformers_at_full_size(hub_id: str) -> None:
    shape = KNOWN_MODELS[hub_id]
    assert parameter_count(shape) == real_count(_meta_model(shape))


def test_known_counts_match_the_published_totals() -> None:
    # pinned totals, so a table edit that changes a count shows up here (the same counts transformers gives above)
    assert parameter_count(KNOWN_MODELS["Qwen/Qwen2.5-32B"]) == 32_763_876_352
    assert parameter_count(KNOWN_MODELS["meta-llama/Llama-3.1-70B"]) == 70_553_706_496
    assert parameter_count(KNOWN_MODELS["Qwen/Qwen2.5-0.5B"]) == 494_032_768


def test_kv_cache_bytes_per_token() -> None:
    q32 = KNOWN_MODELS["Qwen/Qwen2.5-32B"]  # 64 layers, 8 KV heads, head_dim 128, bf16
    assert kv_bytes_per_token(q32, 2) == 2 * 64 * 8 * 128 * 2 == 262_144
    assert kv_bytes_per_token(q32, 2, tensor_parallel=4) == 2 * 64 * 2 * 128 * 2 == 65_536
    assert kv_bytes_per_token(q32, 2, tensor_parallel=16) == 2 * 64 * 1 * 128 * 2  # replicated: one head a GPU


def test_hub_id_from_the_local_hugging_face_cache(tmp_path: Path) -> None:
    snapshot = tmp_path / "models--someone--tiny-qwen" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (tmp_path / "models--someone--tiny-qwen" / "refs").mkdir()
    (tmp_path / "models--someone--tiny-qwen" / "refs" / "main").write_text("abc123")
    (snapshot / "config.json").write_text(json.dumps({"model_type": "qwen2", **SMALL}))
    shape = find_shape("someone/tiny-qwen", TinyModelConfig(), hf_cache_dir=tmp_path)
    assert "Hugging Face cache" in shape.source and shape.hidden_size == 48 and shape.qkv_bias


def test_known_ids_match_case_insensitively() -> None:
    assert find_shape("qwen/qwen2.5-7b-instruct", TinyModelConfig()).hidden_size == 3584


def test_unknown_hub_id_offline_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"cannot plan model 'someone/unknown'.*hf download someone/unknown config\.json"):
        find_shape("someone/unknown", TinyModelConfig(), hf_cache_dir=tmp_path)


def test_directory_without_config_and_unplanned_architectures(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="has no config.json"):
        find_shape(str(tmp_path), TinyModelConfig())
    with pytest.raises(UserError, match="cannot plan model_type 'mixtral'"):
        shape_from_config({"model_type": "mixtral", **SMALL}, "test")
    with pytest.raises(UserError, match="lacks or mangles"):
        shape_from_config({"model_type": "llama", "hidden_size": 8}, "test")
    with pytest.raises(UserError, match="model directory not found"):
        find_shape("./no/such/dir", TinyModelConfig())
