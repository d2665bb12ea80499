"""The fast engine's sampling: per-sample keyed random streams and exact draws from truncated softmaxes.

Every response row has its own random stream: row ``j`` of prompt text ``q`` uses the key
``sha256(seed, d, j, q)`` (:func:`row_key`; ``d`` counts earlier copies of the same text in the call).
Its ``t``-th uniform is SplitMix64 of ``key + (t + 1) * golden gamma`` (a counter-based generator,
computed for all rows at once with int64 tensor ops: :func:`stream_uniforms` for a block of steps,
:func:`row_uniforms` for one step per row, each row at its own step), and the token is drawn by
inverting the row's cumulative distribution (float64) at that uniform (:func:`draw`). Moved out of
``rollout/fast.py`` so both decode loops (``fast.py``'s chunked one, ``continuous.py``'s refilled one)
share them.

**Top-p without sorting the vocabulary.** Nucleus sampling keeps the most probable tokens until their
mass reaches ``top_p``; sorting all ``V`` probabilities of every row to find them cost ~1.2 s a decode
step at 200 rows of SmolLM2's 49,152 tokens (one thread), three times the step's head matmul.
:func:`draw` first looks among each row's :data:`TOP_P_CANDIDATES` most probable tokens
(:func:`nucleus_draw`): where the nucleus ends strictly above the smallest candidate's probability, every
token the full sort would keep is a candidate, in the same order, so the kept set, its float32 running
mass and the float64 cumulative distribution the draw inverts are the same numbers (a prefix of the same
sequential sums; zero-probability tokens add nothing), hence the same token. Rows where that does not
hold try the next candidate count, then the full sort (:func:`nucleus_probs`).

**The inverse CDF without scanning the vocabulary.** The draw inverts the sequential float64 running sum of
the row's probabilities; :func:`blocked_cdf_draw` finds the token from 64-token block sums and one block's scan,
and keeps it only where a bound on float64 summation error proves it is the scan's token
(:func:`inverse_cdf_draw` scans the rest).
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
    (at least one token; among tokens of equal probability the lower id comes first). ``logits`` are
    already divided by the temperature."""
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return nucleus_probs(probs, top_p) if top_p < 1.0 else probs


def nucleus_probs(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """``probs`` [B, V] with every token outside its top-``top_p`` nucleus set to 0, by sorting the whole
    vocabulary (ties: lower token id first); the reference :func:`nucleus_draw` agrees with."""
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass strictly more probable than each token
    keep_sorted = before < top_p
    keep_sorted[:, 0] = True
    keep = torch.zeros_like(keep_sorted).scatter_(1, order, keep_sorted)
    return probs.masked_fill(~keep, 0.0)


def inverse_cdf_draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Token i with probability probs[i] / sum(probs) for each row: the first index whose cumulative
    mass exceeds ``u * total`` (float64; a zero-probability token is never chosen).

    The cumulative mass is the sequential float64 running sum over the vocabulary (:func:`sequential_cdf_draw`).
    Over a large vocabulary that scan is most of a draw (12.9 ms for 64 rows of 49,152 tokens on one quiet
    thread, against 5.1 ms located by blocks), so rows are first located by :func:`blocked_cdf_draw`, which gives the same token or says it cannot
    be sure; only those rows are scanned."""
    if probs.shape[1] < BLOCKED_CDF_MIN:
        return sequential_cdf_draw(probs, uniforms)
    tok, sure = blocked_cdf_draw(probs, uniforms)
    if not bool(sure.all()):
        rows = (~sure).nonzero().squeeze(1)
        tok[rows] = sequential_cdf_draw(probs.index_select(0, rows), uniforms[rows])
    return tok


def sequential_cdf_draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The reference draw: the first index whose sequential float64 running sum exceeds ``u * total``
    (``total``: the sum's last value; ``u * total`` kept just below it)."""
    cdf = torch.cumsum(probs.double(), dim=-1)
    total = cdf[:, -1]
    x = torch.minimum(uniforms * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, x.unsqueeze(1), right=True).squeeze(1)


BLOCKED_CDF_MIN = 4096
"""Vocabularies at least this large are drawn through :func:`blocked_cdf_draw` first."""

BLOCK = 64
"""Tokens per block of :func:`blocked_cdf_draw`."""


def blocked_cdf_draw(probs: torch.Tensor, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [B], sure [B]): where ``sure``, the token :func:`sequential_cdf_draw` gives, found without the scan.

    Blocks of :data:`BLOCK` tokens are summed in float64, the block sums accumulated (``n_b = V / BLOCK`` of
    them), the block where the mass passes ``x = u * T`` located, and the running sum inside it alone computed:
    ``a_j``, an approximation of the sequential sum ``s_j`` at every token of that block. Float64 sums of ``n``
    non-negative terms are within ``n * 2^-53`` (relative) of the true sum in any order (Higham, *Accuracy and
    Stability of Numerical Algorithms*, 4.2), so ``|a_j - s_j|`` and the uncertainty of ``x`` are below
    ``m = 4 (V + 2 BLOCK + n_b + 8) 2^-53 T``. If the token ``j`` found has ``a_{j-1} + m < x - m`` and
    ``a_j - m > x + m``, then ``s_{j-1} <= u * total < s_j`` for the exact values too, so ``j`` is the scan's
    answer (and ``p_j > 0``: the running sum grew there). A row within ``2m`` of a boundary (about 10^-11 of the
    mass at SmolLM2's size) is not ``sure``."""
    b, v = probs.shape
    nb = -(-v // BLOCK)
    p = probs if nb * BLOCK == v else torch.nn.functional.pad(probs, (0, nb * BLOCK - v))
    blocks = p.reshape(b, nb, BLOCK)
    block_cdf = torch.cumsum(blocks.sum(-1, dtype=torch.float64), dim=-1)  # [B, nb]
    total = block_cdf[:, -1]
    margin = 4.0 * (v + 2 * BLOCK + nb + 8) * 2.0**-53 * total
    x = uniforms * total
    at = torch.searchsorted(block_cdf, x.unsqueeze(1), right=True).squeeze(1).clamp(max=nb - 1)  # the block
    start = torch.where(at > 0, block_cdf.gather(1, (at - 1).clamp(min=0).unsqueeze(1)).squeeze(1), torch.zeros_like(total))
    inside = blocks.gather(1, at.view(b, 1, 1).expand(b, 1, BLOCK)).squeeze(1).double()
    running = start.unsqueeze(1) + torch.cumsum(inside, dim=-1)  # a_j over the block
    j = torch.searchsorted(running, x.unsqueeze(1), right=True).squeeze(1)
    sure = j < BLOCK
    j = j.clamp(max=BLOCK - 1)
    a_j = running.gather(1, j.unsqueeze(1)).squeeze(1)
    a_before = torch.where(j > 0, running.gather(1, (j - 1).clamp(min=0).unsqueeze(1)).squeeze(1), start)
    sure &= (a_before + margin < x - margin) & (a_j - margin > x + margin)
    return at * BLOCK + j, sure


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
    elif params.top_p < 1.0:
        tok = nucleus_draw(truncated_probs(z, params.top_k, 1.0), params.top_p, uniforms)
    else:
        probs = truncated_probs(z, params.top_k, 1.0) if params.top_k > 0 else logp.exp()
        tok = inverse_cdf_draw(probs, uniforms)
    return tok, logp.gather(1, tok[:, None]).squeeze(1)


TOP_P_CANDIDATES: tuple[int, ...] = (64, 1024)
"""Candidate counts :func:`nucleus_draw` tries, in order, before sorting a row's whole vocabulary."""


def nucleus_draw(probs: torch.Tensor, top_p: float, uniforms: torch.Tensor) -> torch.Tensor:
    """Tokens [B] drawn at ``uniforms`` [B] (float64) from ``probs`` [B, V] (a softmax, rows summing to 1)
    restricted to its top-``top_p`` nucleus: the same token as ``inverse_cdf_draw(truncated_probs(...))``.

    For each candidate count ``k`` of :data:`TOP_P_CANDIDATES` below ``V``: the ``k`` most probable tokens,
    ordered by probability then token id (the full sort's order). With ``before_j`` their float32 running
    mass before position ``j``, the nucleus is positions ``j`` with ``before_j < top_p`` (position 0 always),
    ending before the first ``m`` with ``before_m >= top_p``. If such an ``m`` exists and ``p_m > p_{k-1}``,
    every token outside the candidates (probability ``<= p_{k-1}``) sorts after ``m`` in the full order too;
    if ``p_{m-1} > p_m``, the nucleus is exactly the tokens more probable than ``p_m``, all candidates, in
    the same order. Either way the nucleus and its sums are exact; the row draws by inverting the float64 running sum of the
    nucleus' probabilities in token-id order. Other rows go on to the next ``k``, the rest to the full sort.
    """
    tok = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
    todo = torch.arange(probs.shape[0], device=probs.device)
    for k in TOP_P_CANDIDATES:
        if k >= probs.shape[1] or len(todo) == 0:
            break
        sub = probs.index_select(0, todo) if len(todo) < probs.shape[0] else probs
        vals, ids = torch.topk(sub, k, dim=-1)  # descending; ties in no promised order
        ids, by_id = torch.sort(ids, dim=-1)  # token-id order ...
        vals = vals.gather(1, by_id)
        vals_s, order = torch.sort(vals, dim=-1, descending=True, stable=True)  # ... then probability, ties by id
        before = torch.cumsum(vals_s, dim=-1) - vals_s
        out = before >= top_p
        out[:, 0] = False
        m = out.to(torch.uint8).argmax(dim=-1)  # first position outside the nucleus (0: none)
        at_m = vals_s.gather(1, m[:, None]).squeeze(1)
        above = vals_s.gather(1, (m - 1).clamp(min=0)[:, None]).squeeze(1)
        exact = out.any(dim=-1) & ((above > at_m) | (at_m > vals_s[:, -1]))
        if bool(exact.any()):
            rows = exact.nonzero().squeeze(1)
            keep = torch.zeros_like(out).scatter_(1, order, ~out)[rows]  # nucleus membership, in token-id order
            pos = sequential_cdf_draw(vals[rows].masked_fill(~keep, 0.0), uniforms[todo[rows]])  # the scan's prefix
            tok[todo[rows]] = ids[rows].gather(1, pos.unsqueeze(1)).squeeze(1)
        todo = todo[~exact]
    if len(todo):
        rest = nucleus_probs(probs.index_select(0, todo), top_p)
        tok[todo] = inverse_cdf_draw(rest, uniforms[todo])
    return tok
