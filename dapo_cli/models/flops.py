"""Counted matmul parameters ``N`` of a decoder-only model (Llama/Qwen2 shapes), the unit of the compute axis.

``N`` = the parameters of every matmul a token goes through: per layer q, k, v, o and the gated MLP's three
projections, plus ``lm_head`` (tied or not: a matmul either way; the input embedding is a lookup). A forward costs
``2 N`` FLOPs per token, forward + backward ``6 N`` (attention's query-key work and element-wise work left out).
``benchmarks/flops.py`` counts its phases with the same ``N``; the trainer logs ``2 N`` per generated token and
``6 N`` per trained token (``compute/flops``, ``dapo_cli.train.records.compute_metrics``).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path


def matmul_params(*, layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int,
                  vocab: int) -> int:
    """``N``: q, k, v, o (``hidden x head_dim x (2 heads + 2 kv_heads)``), gate, up, down (``3 hidden x
    intermediate``) of every layer, and ``lm_head`` (``hidden x vocab``)."""
    attn = hidden * head_dim * (2 * heads + 2 * kv_heads)
    mlp = 3 * hidden * intermediate
    return layers * (attn + mlp) + hidden * vocab


@lru_cache(maxsize=8)
def model_matmul_params(folder: str) -> int | None:
    """``N`` of the model whose ``config.json`` is in ``folder``; None when it lacks a decoder's shape fields."""
    try:
        c = json.loads((Path(folder) / "config.json").read_text())
        heads = int(c["num_attention_heads"])
        return matmul_params(
            layers=int(c["num_hidden_layers"]), hidden=int(c["hidden_size"]), heads=heads,
            kv_heads=int(c.get("num_key_value_heads") or heads),
            head_dim=int(c.get("head_dim") or c["hidden_size"] // heads),
            intermediate=int(c["intermediate_size"]), vocab=int(c["vocab_size"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
