"""FLOP counts of an RL step's phases and the matmul rate they are measured against (not a benchmark itself).

A phase's *floor* is its counted FLOPs divided by the machine's matmul rate measured in the same run
(a ``size``^3 matmul, the best of a few): the time it would take if every FLOP ran at the rate of one
big, well-blocked matmul. Counted (decoder-only Llama/Qwen2 shapes, read from the model's config):

- ``N`` = the parameters of every matmul a token goes through: per layer q, k, v, o and the gated
  MLP's three projections, plus ``lm_head`` (tied or not: it is a matmul either way; the input
  embedding is a lookup and costs nothing). A forward costs ``2 N`` per token, forward + backward ``6 N``.
- Attention adds ``4 d`` per query-key pair per layer in a forward (``Q K^T`` and ``A V``, ``d`` =
  heads x head_dim), ``12 d`` with the backward. A causal prompt of ``P`` tokens has ``P (P + 1) / 2``
  pairs; the ``j``-th response token (0-based) attends to ``P + j + 1`` keys.
- Generation: each distinct prompt prefilled once (the fast engine shares a prompt's prefill among its
  samples) and every generated token but the last decoded by one forward of its row (the last token
  is sampled from the previous forward's logits).
- Update (one optimizer step over the batch, old log-probs from its own forward): each distinct prompt
  once and every response token but the last (the shared-prompt, packed forward), forward + backward.

Element-wise work (norms, softmax, the log-softmax over the vocabulary, AdamW) is not counted: it is what
the floor leaves out, so measured / floor says how far the phase is from "all matmul at full rate".
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dapo_cli.models.flops import matmul_params


@dataclass(frozen=True)
class Shape:
    """What the counts need from a model's ``config.json``."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, config: object) -> Shape:
        heads = config.num_attention_heads
        return cls(
            layers=config.num_hidden_layers, hidden=config.hidden_size, heads=heads,
            kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            intermediate=config.intermediate_size, vocab=config.vocab_size,
        )

    @classmethod
    def read(cls, folder: Path) -> Shape:
        from transformers import AutoConfig

        return cls.of(AutoConfig.from_pretrained(folder))

    @property
    def matmul_params(self) -> int:
        """``N``: q, k, v, o, gate, up, down of every layer and ``lm_head`` (:func:`dapo_cli.models.flops.matmul_params`,
        the count the trainer's ``train/flops`` uses)."""
        return matmul_params(layers=self.layers, hidden=self.hidden, heads=self.heads, kv_heads=self.kv_heads,
                             head_dim=self.head_dim, intermediate=self.intermediate, vocab=self.vocab)

    @property
    def pair_flops(self) -> int:
        """Forward FLOPs of one query-key pair over all layers (``4 d`` per layer)."""
        return 4 * self.layers * self.heads * self.head_dim


def prompt_pairs(prompt_len: float) -> float:
    """Causal query-key pairs inside one prompt of ``prompt_len`` tokens."""
    return prompt_len * (prompt_len + 1) / 2


def response_pairs(prompt_len: float, length: int) -> float:
    """Query-key pairs of a row's first ``length`` response tokens (token j sees P + j + 1 keys)."""
    return length * (prompt_len + 1) + length * (length - 1) / 2


def generation_flops(shape: Shape, prompt_lens: Sequence[float], lengths: Sequence[int]) -> float:
    """Prefill of each distinct prompt (``prompt_lens``) once, then one decode forward per generated token
    but the last of every row (``lengths``: one per row; rows are spread evenly over the prompts)."""
    mean_prompt = sum(prompt_lens) / len(prompt_lens)
    prefill = sum(2 * shape.matmul_params * p + shape.pair_flops * prompt_pairs(p) for p in prompt_lens)
    decoded = sum(max(n - 1, 0) for n in lengths)
    decode = 2 * shape.matmul_params * decoded + shape.pair_flops * sum(
        response_pairs(mean_prompt, max(n - 1, 0)) for n in lengths)
    return prefill + decode


def update_flops(shape: Shape, prompt_lens: Sequence[float], lengths: Sequence[int]) -> float:
    """Forward + backward (3x a forward) of each distinct prompt once and every row's response tokens but
    the last (the shared-prompt, packed forward of ``dapo train``)."""
    mean_prompt = sum(prompt_lens) / len(prompt_lens)
    tokens = sum(prompt_lens) + sum(max(n - 1, 0) for n in lengths)
    pairs = sum(prompt_pairs(p) for p in prompt_lens) + sum(response_pairs(mean_prompt, max(n - 1, 0)) for n in lengths)
    return 3 * (2 * shape.matmul_params * tokens + shape.pair_flops * pairs)


def matmul_rate(dtype: object = None, size: int = 4096, repeats: int = 4) -> float:
    """FLOP/s of the best of ``repeats`` ``size``^3 matmuls in ``dtype`` (float32 by default) after a warm-up."""
    import torch

    dtype = dtype or torch.float32
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    torch.matmul(a, b)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best
