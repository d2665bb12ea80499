"""Build the tiny causal LM, and save/load Hugging Face directories without progress bars.

The tiny policy is a standard transformers decoder (Llama by default, Qwen2
allowed): RMSNorm, RoPE, SwiGLU MLP, tied input/output embeddings. With the
default :class:`~dapo_cli.config.tiny.TinyModelConfig` (hidden 128, 4 layers,
MLP 512, 114-token character vocabulary) it has about 1.06 M parameters.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.utils import logging as hf_logging

from dapo_cli.config.tiny import TinyModelConfig
from dapo_cli.errors import UserError, look_up


@dataclass(frozen=True)
class Architecture:
    """A transformers config class and the causal-LM class built from it."""

    config_cls: type[PretrainedConfig]
    model_cls: type[PreTrainedModel]


ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture(LlamaConfig, LlamaForCausalLM),
    "qwen2": Architecture(Qwen2Config, Qwen2ForCausalLM),
}
"""Architectures the tiny policy can be built as. Prefer ``llama``: beside a
``qwen2`` config, ``AutoTokenizer`` swaps the character tokenizer for a byte-level
Qwen2 one (``dapo_cli.models.loading.load_policy`` avoids that for our models)."""


def get_architecture(name: str) -> Architecture:
    """Look up an architecture; an unknown name raises :class:`UserError` listing the valid ones."""
    return look_up(ARCHITECTURES, name, "model.tiny.architecture")


def tiny_model_config(
    cfg: TinyModelConfig,
    vocab_size: int,
    *,
    pad_token_id: int,
    eos_token_id: int,
    bos_token_id: int | None = None,
) -> PretrainedConfig:
    """The transformers config of the tiny policy (full multi-head attention, tied embeddings)."""
    if cfg.hidden_size % cfg.num_heads != 0:
        raise UserError(
            f"model.tiny.hidden_size ({cfg.hidden_size}) must be divisible by "
            f"model.tiny.num_heads ({cfg.num_heads})"
        )
    return get_architecture(cfg.architecture).config_cls(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=True,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=bos_token_id,
    )


def build_tiny_model(
    cfg: TinyModelConfig,
    vocab_size: int,
    *,
    pad_token_id: int,
    eos_token_id: int,
    bos_token_id: int | None = None,
) -> PreTrainedModel:
    """A freshly initialised tiny causal LM, identical for identical ``cfg`` (seeded by ``cfg.seed``).

    The initialisation runs under ``torch.random.fork_rng`` so the caller's global
    RNG state is left untouched. The model's ``generation_config`` carries the pad
    and EOS ids.
    """
    config = tiny_model_config(
        cfg, vocab_size, pad_token_id=pad_token_id, eos_token_id=eos_token_id, bos_token_id=bos_token_id
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = get_architecture(cfg.architecture).model_cls(config)
    model.generation_config.pad_token_id = pad_token_id
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.bos_token_id = bos_token_id
    return model


def build_tiny_model_for(cfg: TinyModelConfig, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """:func:`build_tiny_model` with vocabulary size and special ids taken from ``tokenizer``."""
    return build_tiny_model(
        cfg,
        len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


@contextlib.contextmanager
def quiet_hf_progress() -> Iterator[None]:
    """Silence the tqdm bars transformers / huggingface_hub print on save and load, then restore."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def save_policy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    out_dir: str | Path,
    *,
    state_dict: dict[str, Any] | None = None,
) -> None:
    """``save_pretrained`` the model (safetensors) and tokenizer into ``out_dir``, quietly.

    ``state_dict`` replaces the module's own tensors (a ZeRO-3 module holds only shards). The folder
    is then made readable by transformers 4.5x too (:func:`dapo_cli.models.compat.make_portable`).
    """
    from dapo_cli.models.compat import make_portable

    with quiet_hf_progress():
        model.save_pretrained(out_dir, state_dict=state_dict)
        tokenizer.save_pretrained(out_dir)
    make_portable(out_dir)
