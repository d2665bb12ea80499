"""The fast engine's sampling: per-sample keyed random streams and exact draws from truncated softmaxes.

Every response row has its own random stream: row ``j`` of prompt text ``q`` uses the key
``sha256(seed, d, j, q)`` (:func:`row_key`; ``d`` counts earlier copies of the same text in the call).
Its ``t``-th uniform is SplitMix64 of ``key + (t + 1) * golden gamma`` (a counter-based generator,
computed for all rows at once with int64 tensor ops: :func:`stream_uniforms` for a block of steps,
:func:`row_uniforms` for one step per row, each row at its own step), and the token is drawn by
inverting the row's cumulative distribution (float64) at that uniform (:func:`draw`). Moved out of
``rollout/fast.py`` so both decode loops (``fast.py``'s chunked one, ``continuous.py``'s refilled one)
share them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from dapo_cli.rollout.base import SamplingParams

_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def _signed(x: int) -> int:
    """The int64 with the same 64 bits as ``x mod 2**64``."""
    x &= _MASK64
    return x - (1 << 64) if x >> 63 else x


def _lsr(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (``>>`` on int64 is arithmetic)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def splitmix64(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's output function on int64 tensors (wrapping multiplication = arithmetic mod 2**64)."""
    z = (z ^ _lsr(z, 30)) * _signed(_MIX1)
    z = (z ^ _lsr(z, 27)) * _signed(_MIX2)
    return z ^ _lsr(z, 31)


def stream_uniforms(keys: torch.Tensor, start: int, count: int = 1) -> torch.Tensor:
    """Uniforms ``start .. start+count-1`` in [0, 1) (float64, 53 random bits) of each row's stream:
    float64 [B, count] for int64 ``keys`` [B]. Uniform ``t`` is SplitMix64(key + (t + 1) * gamma)."""
    offsets = torch.tensor([_signed((t + 1) * _GAMMA) for t in range(start, start + count)], device=keys.device)
    z = splitmix64(keys[:, None] + offsets[None, :])
    return _lsr(z, 11).double() * (2.0**-53)


def row_key(seed: int, text: str, copy: int, sample: int) -> int:
    """The int64 key of sample ``sample`` of the ``copy``-th occurrence of prompt ``text`` under ``seed``."""
    digest = hashlib.sha256(f"dapo-rollout\0{seed}\0{copy}\0{sample}\0".encode() + text.encode("utf-8")).digest()
    return _signed(int.from_bytes(digest[:8], "little"))


def row_keys(seed: int, prompts: Sequence[str], n: int) -> torch.Tensor:
    """LongTensor [P * n]: one stream key per response row (row ``i`` answers prompt ``i // n``)."""
    seen: dict[str, int] = {}
    keys = []
    for text in prompts:
        copy = seen.get(text, 0)
        seen[text] = copy + 1
        keys.extend(row_key(seed, text, copy, j) for j in range(n))
    return torch.tensor(keys, dtype=torch.long)


def truncated_probs(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Unnormalised probabilities [B, V] of softmax(``logits``) restricted like transformers' warpers:
    top-k keeps tokens whose logit is >= the k-th largest (ties kept), then top-p keeps the
    smallest most-probable set whose mass (renormalised after top-k) reaches ``top_p``
    (at least one token). ``logits`` are already divided by the temperature."""
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass strictly more probable than each token
        keep_sorted = before < top_p
        keep_sorted[:, 0] = True
        keep = torch.zeros_like(keep_sorted).scatter_(1, order, keep_sorted)
        probs = probs.masked_fill(~keep, 0.0)
    return probs


def inverse_cdf_draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Token i with probability probs[i] / sum(probs) for each row: the first index whose cumulative
    mass exceeds ``u * total`` (float64; a zero-probability token is never chosen)."""
    cdf = torch.cumsum(probs.double(), dim=-1)
    total = cdf[:, -1]
    x = torch.minimum(uniforms * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, x.unsqueeze(1), right=True).squeeze(1)


def row_uniforms(keys: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Uniform number ``steps[b]`` of row ``b``'s stream (float64 [B] for int64 ``keys``, ``steps`` [B]):
    the same value as ``stream_uniforms(keys, t)[b, 0]`` at ``t = steps[b]`` (int64 products wrap mod 2**64)."""
    z = splitmix64(keys + (steps + 1) * _signed(_GAMMA))
    return _lsr(z, 11).double() * (2.0**-53)


def draw(logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of ``logits`` [B, V] and its log-prob log softmax(z / T) (before truncation):
    argmax at T = 0, else the inverse-CDF draw at ``uniforms`` [B] from softmax(z / T) restricted by
    top-k then top-p. Returns (tokens [B] long, log-probs [B] float32)."""
    greedy = params.temperature <= 0
    z = logits.float()
    if not greedy and params.temperature != 1.0:
        z = z / params.temperature
    logp = torch.log_softmax(z, dim=-1)
    if greedy:
        tok = z.argmax(-1)
    else:
        truncate = params.top_k > 0 or params.top_p < 1.0
        probs = truncated_probs(z, params.top_k, params.top_p) if truncate else logp.exp()
        tok = inverse_cdf_draw(probs, uniforms)
    return tok, logp.gather(1, tok[:, None]).squeeze(1)
