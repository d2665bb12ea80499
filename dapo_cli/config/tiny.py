"""Settings of the tiny built-in policy (``model.tiny`` in the config schema).

``builtin:tiny`` is a character-level causal LM built and warm-started by the
project itself (``dapo_cli.warmstart``) so that the whole RL pipeline runs
on a CPU laptop offline. Every field changes the built model, so all of them
enter :meth:`TinyModelConfig.fingerprint`, the key of the on-disk cache.
No torch import here: the config layer stays light.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from dapo_cli.config.fields import setting

TINY_FORMAT_VERSION = 1
"""Bump when the tokenizer, synthetic formats or warm-start recipe change, so that
cached ``builtin:tiny`` models built by older code are not reused."""

TINY_ARCHITECTURES: tuple[str, ...] = ("llama", "qwen2")
"""Valid ``architecture`` values (``dapo_cli.models.tiny.ARCHITECTURES``; a test keeps them equal)."""


@dataclass
class TinyModelConfig:
    """Architecture and supervised warm-start of the ``builtin:tiny`` policy (~1 M parameters)."""

    architecture: str = setting(
        "llama",
        "transformers architecture; prefer llama (AutoTokenizer swaps the char tokenizer beside qwen2)",
        choices=TINY_ARCHITECTURES,
    )
    hidden_size: int = setting(128, "width of the residual stream")
    num_layers: int = setting(4, "transformer blocks")
    num_heads: int = setting(4, "attention heads (no grouped-query attention); must divide hidden_size")
    intermediate_size: int = setting(512, "width of the SwiGLU MLP")
    max_position_embeddings: int = setting(256, "longest prompt + response in tokens (= characters)")
    rope_theta: float = setting(10000.0, "RoPE base frequency")
    task: str = setting("add-3digit", "synthetic task of the warm-start (dapo_cli.data.synthetic.SYNTHETIC_TASKS)")
    sft_steps: int = setting(600, "supervised steps; stops by step count, never wall time (~2 min on 2 cores)")
    sft_batch_size: int = setting(64, "examples per supervised step")
    sft_lr: float = setting(3e-3, "AdamW peak learning rate of the warm-start")
    sft_warmup_steps: int = setting(20, "linear warm-up steps, then linear decay to 10% of sft_lr")
    sft_direct_frac: float = setting(
        0.5, "share of examples answered 'Answer: N' directly instead of worked (lowers base accuracy)"
    )
    sft_loop_frac: float = setting(
        0.0, "share of worked examples with a working line repeated (dapo_cli.data.synthetic.looped_solution): "
        "a policy that sometimes loops, so truncation marks runaway text"
    )
    sft_loop_continue: float = setting(
        0.75, "chance that a looped line is repeated once more (geometric; 0.75: 3 extra copies on average)"
    )
    sft_loop_max_chars: int = setting(
        96, "longest looped solution in the warm-start (copies stop there); above the RL response limit, so loops run into it"
    )
    seed: int = setting(0, "seeds the weights, the training stream and the accuracy measurement")
    eval_problems: int = setting(200, "held-out val problems for the base accuracy stored in dapo_model.json")
    eval_max_tokens: int = setting(64, "response limit (tokens) when measuring the base accuracy")

    def fingerprint(self) -> str:
        """Short stable hash (12 hex chars) of every field and :data:`TINY_FORMAT_VERSION`."""
        payload = json.dumps(
            {"format": TINY_FORMAT_VERSION, **asdict(self)}, sort_keys=True, separators=(",", ":")
        )
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:12]
