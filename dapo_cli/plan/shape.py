"""The policy's shape without its weights: ``config.json`` → :class:`ModelShape` → parameter count.

Where the shape comes from, first match wins (nothing is downloaded, no weights are read):

1. ``builtin:tiny``: the ``model.tiny`` settings (the character vocabulary of
   :mod:`dapo_cli.models.tokenizer`), whether or not the model has been built yet;
2. a local directory: its ``config.json`` (a ``save_pretrained`` folder, a dapo checkpoint);
3. a hub id in the local Hugging Face cache: the cached snapshot's ``config.json``;
4. a hub id in :data:`KNOWN_MODELS`, the public ``config.json`` values of a few
   Qwen2.5 and Llama-3.1 models.

Anything else is a :class:`~dapo_cli.errors.UserError` saying how to make ``config.json``
reachable offline. Only Llama-style decoders are planned (``llama``, ``qwen2``, ``qwen3``,
``mistral``): RMSNorm, rotary attention with grouped-query heads, a gated MLP.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dapo_cli.config.tiny import TinyModelConfig
from dapo_cli.errors import UserError

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of an architecture (names as in transformers' ``config.json``)."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    tie_word_embeddings: bool
    head_dim: int = 0
    """Per-head width (0: ``hidden_size // num_attention_heads``)."""
    qkv_bias: bool = False
    """Biases on the q/k/v projections (always for qwen2; ``attention_bias`` for the others)."""
    o_bias: bool = False
    """Bias on the attention output projection (llama/qwen3/mistral ``attention_bias``)."""
    mlp_bias: bool = False
    qk_norm: bool = False
    """Per-head RMSNorm on queries and keys (qwen3)."""
    source: str = ""
    """Where the values came from, for the printed plan."""

    @property
    def head_width(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def q_width(self) -> int:
        return self.num_attention_heads * self.head_width

    @property
    def kv_width(self) -> int:
        return self.num_key_value_heads * self.head_width

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _known(hidden: int, inter: int, layers: int, heads: int, kv: int, vocab: int, tied: bool, model_type: str) -> ModelShape:
    return ModelShape(
        model_type=model_type, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab, tie_word_embeddings=tied,
        qkv_bias=model_type == "qwen2",
    )


_QWEN25 = {
    "0.5B": _known(896, 4864, 24, 14, 2, 151936, True, "qwen2"),
    "1.5B": _known(1536, 8960, 28, 12, 2, 151936, True, "qwen2"),
    "7B": _known(3584, 18944, 28, 28, 4, 152064, False, "qwen2"),
    "14B": _known(5120, 13824, 48, 40, 8, 152064, False, "qwen2"),
    "32B": _known(5120, 27648, 64, 40, 8, 152064, False, "qwen2"),
    "72B": _known(8192, 29568, 80, 64, 8, 152064, False, "qwen2"),
}
_LLAMA31 = {
    "8B": _known(4096, 14336, 32, 32, 8, 128256, False, "llama"),
    "70B": _known(8192, 28672, 80, 64, 8, 128256, False, "llama"),
}

KNOWN_MODELS: dict[str, ModelShape] = {
    **{f"Qwen/Qwen2.5-{size}{suffix}": shape for size, shape in _QWEN25.items() for suffix in ("", "-Instruct")},
    **{f"meta-llama/Llama-3.1-{size}{suffix}": shape for size, shape in _LLAMA31.items() for suffix in ("", "-Instruct")},
}
"""Hub id → the public ``config.json`` values (base and instruct models share the architecture)."""


# ---------------------------------------------------------------- parameter count


def layer_parameters(shape: ModelShape) -> int:
    """Parameters of one decoder layer: attention (GQA, optional biases, optional q/k norms),
    gated MLP (gate, up, down) and the two RMSNorms."""
    h, i, q, kv = shape.hidden_size, shape.intermediate_size, shape.q_width, shape.kv_width
    attention = h * q + 2 * h * kv + q * h
    if shape.qkv_bias:
        attention += q + 2 * kv
    if shape.o_bias:
        attention += h
    if shape.qk_norm:
        attention += 2 * shape.head_width
    mlp = 3 * h * i + ((2 * i + h) if shape.mlp_bias else 0)
    return attention + mlp + 2 * h


def embedding_parameters(shape: ModelShape) -> int:
    """Input embedding plus the output projection (lm_head) unless tied to it."""
    one = shape.vocab_size * shape.hidden_size
    return one if shape.tie_word_embeddings else 2 * one


def parameter_count(shape: ModelShape) -> int:
    """Every parameter of the causal LM, tied embeddings counted once (= transformers' count)."""
    return embedding_parameters(shape) + shape.num_hidden_layers * layer_parameters(shape) + shape.hidden_size


def kv_bytes_per_token(shape: ModelShape, dtype_bytes: int, tensor_parallel: int = 1) -> int:
    """KV-cache bytes one token costs on one GPU: 2 (K and V) × layers × kv heads × head_dim × bytes.

    Under tensor parallelism each GPU holds ``kv_heads / tp`` heads (at least one: with more
    GPUs than KV heads the heads are replicated)."""
    heads = max(1, shape.num_key_value_heads // tensor_parallel)
    return 2 * shape.num_hidden_layers * heads * shape.head_width * dtype_bytes


# ---------------------------------------------------------------- finding the shape


def shape_from_config(data: dict[str, Any], source: str) -> ModelShape:
    """A :class:`ModelShape` from a parsed ``config.json`` (UserError for an unplanned architecture)."""
    model_type = str(data.get("model_type", ""))
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UserError(
            f"cannot plan model_type '{model_type or '?'}' ({source}); the plan knows Llama-style decoders: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    try:
        heads = int(data["num_attention_heads"])
        attention_bias = bool(data.get("attention_bias", False))
        return ModelShape(
            model_type=model_type,
            hidden_size=int(data["hidden_size"]),
            intermediate_size=int(data["intermediate_size"]),
            num_hidden_layers=int(data["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(data.get("num_key_value_heads") or heads),
            vocab_size=int(data["vocab_size"]),
            tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
            head_dim=int(data.get("head_dim") or 0),
            qkv_bias=True if model_type == "qwen2" else attention_bias,
            o_bias=False if model_type == "qwen2" else attention_bias,
            mlp_bias=bool(data.get("mlp_bias", False)) if model_type == "llama" else False,
            qk_norm=model_type == "qwen3",
            source=source,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"cannot plan from {source}: config.json lacks or mangles {exc}; give a transformers config.json") from None


def tiny_shape(tiny: TinyModelConfig) -> ModelShape:
    """``builtin:tiny``: the architecture ``dapo_cli.models.tiny`` builds from these settings."""
    from dapo_cli.models.tokenizer import char_vocab

    return ModelShape(
        model_type=tiny.architecture, hidden_size=tiny.hidden_size, intermediate_size=tiny.intermediate_size,
        num_hidden_layers=tiny.num_layers, num_attention_heads=tiny.num_heads, num_key_value_heads=tiny.num_heads,
        vocab_size=len(char_vocab()), tie_word_embeddings=True, qkv_bias=tiny.architecture == "qwen2",
        source="built from the model.tiny settings",
    )


def _read_config(path: Path, source: str) -> ModelShape:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} is not a JSON object; give a transformers config.json")
    return shape_from_config(data, source)


def cached_config(repo_id: str, cache_dir: str | Path | None = None) -> Path | None:
    """``config.json`` of ``repo_id`` in the local Hugging Face cache (``$HF_HUB_CACHE``), if any."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache_dir)
    except ValueError:  # not a valid repo id for the hub client
        return None
    return Path(found) if isinstance(found, str) else None


def find_shape(spec: str, tiny: TinyModelConfig, *, hf_cache_dir: str | Path | None = None) -> ModelShape:
    """The shape of ``model.path`` = ``spec``, offline (see the module docstring for the order)."""
    from dapo_cli.models.loading import BUILTIN_MODELS, is_hub_id, resolve_model

    if spec.startswith("builtin:"):
        if spec not in BUILTIN_MODELS:
            raise UserError(f"unknown built-in model '{spec}' (valid: {', '.join(BUILTIN_MODELS)})")
        return tiny_shape(tiny)
    local = resolve_model(spec, tiny)  # a plain path for anything but builtin:*
    if local.exists():
        config = local / "config.json"
        if not config.is_file():
            raise UserError(f"{local} has no config.json; give a folder written by save_pretrained, a hub id, or builtin:tiny")
        return _read_config(config, f"{config}")
    if is_hub_id(spec):
        cached = cached_config(spec, hf_cache_dir)
        if cached is not None:
            return _read_config(cached, f"config.json in the Hugging Face cache: {cached}")
        known = {key.lower(): (key, value) for key, value in KNOWN_MODELS.items()}.get(spec.lower())
        if known is not None:
            key, shape = known
            return ModelShape(**{**shape.to_dict(), "source": f"public config.json values of {key} known to dapo"})
        raise UserError(
            f"cannot plan model '{spec}': no config.json reachable offline (not a local directory, not in the "
            f"Hugging Face cache, not a known architecture); fetch it once with `hf download {spec} config.json` "
            "or set model.path to a save_pretrained directory"
        )
    raise UserError(f"model directory not found: {spec} (give a folder written by save_pretrained, a hub id, or builtin:tiny)")
