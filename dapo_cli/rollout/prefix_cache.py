"""The fast engine's prefix cache: keys and values of prompt prefixes, computed once, shared by token ids.

Prompts that start with the same tokens (a chat template's system turn, an instruction, few-shot
examples) have the same keys and values there, whatever follows (attention is causal). The cache is a
radix tree over **token ids** (never text: a shared prefix may end inside a multi-token chat marker):
each node holds a segment of tokens and its keys/values ``[layers, 2, kv_heads, len, head_dim]``; a
prompt is the path from the root to its end node, and a node where a prompt ends also keeps the
next-token logits after it ``[V]`` (so a prompt seen before is not computed at all).

:func:`prefill` takes the distinct prompts about to be decoded, inserts them all first (which splits
segments where prompts diverge, so a prefix several of them share becomes one node), then computes the
missing nodes in waves, parents before children, each wave one batched forward
(:func:`run_layers`): the prefix shared by 100 few-shot prompts is read once, then the 100 short
remainders together, each attending to the shared keys. A prompt whose end node exists but holds no
logits (it is a strict prefix of a prompt seen earlier) recomputes its last token only.

**Lifetime.** Keys/values are valid for the weights they were computed with: the engine clears the cache
on ``sync_weights`` and whenever a parameter's version counter moved (any in-place update PyTorch records:
an optimizer step, ``load_state_dict``), and a fresh ``NativeLlama`` is built per call. **Memory.**
After every prefill the least recently used leaves are evicted until the tree holds at most
``budget_bytes`` (keys/values plus stored logits; a node with children goes only after them). A call also
holds references to the prompts it is about to decode (at most one decode batch's worth of prompts:
``continuous.py``), which eviction does not free until their rows have been admitted.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from dapo_cli.models.native import NativeLlama


@dataclass(eq=False)
class Node:
    """A segment of tokens after its parent's, its keys/values once computed, and the next-token logits
    where a prompt ends here (kept only for nodes computed as a prompt's end)."""

    tokens: tuple[int, ...]
    parent: Node | None
    kv: torch.Tensor | None = None  # [layers, 2, kv_heads, len(tokens), head_dim]
    logits: torch.Tensor | None = None  # [V]
    children: dict[int, Node] = field(default_factory=dict)
    used: int = 0

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.kv, self.logits) if t is not None)


class PrefixCache:
    """A radix tree of token segments with their keys/values (see the module doc); ``budget_bytes`` bounds
    what it keeps between prefills."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.clear()

    def clear(self) -> None:
        """Forget everything (the weights changed)."""
        self.root = Node((), None)
        self.bytes = 0
        self.tick = 0
        self.stamp: object = None

    def insert(self, ids: Sequence[int]) -> Node:
        """The node where ``ids`` ends, creating (uncomputed) nodes and splitting segments as needed."""
        self.tick += 1
        node, pos = self.root, 0
        while pos < len(ids):
            child = node.children.get(ids[pos])
            if child is None:
                child = Node(tuple(ids[pos:]), node)
                node.children[ids[pos]] = child
                child.used = self.tick
                return child
            k = _common(child.tokens, ids, pos)
            if k < len(child.tokens):
                child = self._split(child, k)
            child.used = self.tick
            node, pos = child, pos + k
        return node

    def _split(self, node: Node, k: int) -> Node:
        """Cut ``node``'s segment after ``k`` tokens: a new parent holds the first ``k``; ``node`` (and its
        logits, which follow its last token) keeps the rest."""
        parent = node.parent
        mid = Node(node.tokens[:k], parent, used=node.used)
        if node.kv is not None:
            mid.kv, node.kv = node.kv[:, :, :, :k].clone(), node.kv[:, :, :, k:].clone()
        parent.children[node.tokens[0]] = mid
        node.tokens, node.parent = node.tokens[k:], mid
        mid.children[node.tokens[0]] = node
        return mid

    def chain(self, node: Node) -> list[torch.Tensor]:
        """Keys/values of every segment from the root to ``node`` (included), in order."""
        out = []
        while node is not self.root:
            out.append(node.kv)
            node = node.parent
        return out[::-1]

    def evict(self) -> None:
        """Drop least recently used leaves until at most ``budget_bytes`` are held."""
        if self.bytes <= self.budget_bytes:
            return
        heap = [(n.used, id(n), n) for n in self._nodes() if not n.children]
        heapq.heapify(heap)
        while heap and self.bytes > self.budget_bytes:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[leaf.tokens[0]]
            self.bytes -= leaf.nbytes()
            if parent is not self.root and not parent.children:
                heapq.heappush(heap, (parent.used, id(parent), parent))

    def _nodes(self) -> list[Node]:
        out, todo = [], list(self.root.children.values())
        while todo:
            node = todo.pop()
            out.append(node)
            todo.extend(node.children.values())
        return out


def _common(segment: tuple[int, ...], ids: Sequence[int], pos: int) -> int:
    """How many leading tokens of ``segment`` equal ``ids[pos:]``'s."""
    k, limit = 0, min(len(segment), len(ids) - pos)
    while k < limit and segment[k] == ids[pos + k]:
        k += 1
    return k


@dataclass
class _Job:
    """One row of a prefill wave: ``tokens`` to run after the keys/values ``past`` (segments, in order)."""

    past: list[torch.Tensor]
    tokens: tuple[int, ...]
    node: Node | None  # stores the new keys/values (None: recompute for logits only)
    end: Node | None  # stores the logits after the last token (None: not a prompt's end)

    @property
    def past_len(self) -> int:
        return sum(p.shape[3] for p in self.past)


def shared_attend(
    net: NativeLlama, q: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
    bias: torch.Tensor,
) -> torch.Tensor:
    """One decode query per row (``q`` [B, h, 1, d]) attending to a prefix every row shares, ``k0``/``v0``
    [kv_heads, P0, d] (one copy, read once for the whole batch as a matrix product), then to each row's own
    columns ``keys``/``values`` [B, kv_heads, c, d] under ``bias`` [B * kv_heads, 1, c] (0 / -inf): the softmax of
    :meth:`NativeLlama.attend` over the concatenated keys, summed in another order. [B, h, 1, d]."""
    b, h, _, d = q.shape
    kvh, p0, c = k0.shape[0], k0.shape[1], keys.shape[2]
    g = h // kvh
    qh = q.view(b, kvh, g, d)
    shared = torch.matmul(qh.transpose(0, 1).reshape(kvh, b * g, d), k0.transpose(1, 2))  # [kvh, B*g, P0]
    shared = shared.view(kvh, b, g, p0).transpose(0, 1).reshape(b * kvh, g, p0)
    own = torch.baddbmm(bias, qh.reshape(b * kvh, g, d), keys.reshape(b * kvh, c, d).transpose(1, 2), alpha=net.scaling)
    weights = torch.softmax(torch.cat([shared.mul_(net.scaling), own], dim=-1).float(), dim=-1).to(q.dtype)
    w0 = weights[:, :, :p0].reshape(b, kvh, g, p0).transpose(0, 1).reshape(kvh, b * g, p0)
    out = torch.matmul(w0, v0).view(kvh, b, g, d).transpose(0, 1)  # [B, kvh, g, d]
    out = out + torch.bmm(weights[:, :, p0:], values.reshape(b * kvh, c, d)).view(b, kvh, g, d)
    return out.reshape(b, h, 1, d)


def run_layers(
    net: NativeLlama, kv: torch.Tensor, x: torch.Tensor, positions: torch.Tensor, write: int | torch.Tensor,
    width: int, bias: torch.Tensor, shared: torch.Tensor | None = None,
) -> torch.Tensor:
    """Every layer on ``x`` [B, q, H] at ``positions`` [B, q], keys/values kept in ``kv``
    [layers, 2, B, kv_heads, C, d]: written at columns ``write .. write+q-1`` (an int: the same for every
    row) or, for one token per row, at column ``write[b]`` of row ``b`` (a LongTensor [B]); queries attend
    to columns ``< width`` under the additive ``bias`` (0 or -inf; see :meth:`NativeLlama.attend`).
    ``shared`` [layers, 2, kv_heads, P0, d] (decode only): keys/values of columns ``0 .. P0-1``, the same in every
    row, read once (:func:`shared_attend`); the buffer's own columns from ``P0`` on, ``bias`` covering those.
    Returns the final-norm hidden states [B, q, H]."""
    cos, sin = net.rope(positions)
    rows = torch.arange(x.shape[0], device=x.device) if isinstance(write, torch.Tensor) else None
    for i, layer in enumerate(net.layers):
        q, k, v = net.qkv(layer, x, cos, sin)
        if rows is None:
            kv[i, 0, :, :, write : write + k.shape[2]] = k
            kv[i, 1, :, :, write : write + k.shape[2]] = v
        else:
            kv[i, 0, rows, :, write] = k[:, :, 0]
            kv[i, 1, rows, :, write] = v[:, :, 0]
        if shared is None:
            att = net.attend(q, kv[i, 0, :, :, :width], kv[i, 1, :, :, :width], bias)
        else:
            p0 = shared.shape[3]
            att = shared_attend(net, q, shared[i, 0], shared[i, 1], kv[i, 0, :, :, p0:width], kv[i, 1, :, :, p0:width], bias)
        x = net.finish(layer, x, att)
    return net.rms_norm(net.norm, x)


def _run_wave(net: NativeLlama, jobs: list[_Job], head) -> None:
    """One batched forward of ``jobs``: row ``i`` holds its past in columns ``0 .. p_i-1`` (zeros after, masked)
    and its ``s_i`` new tokens left-padded into columns ``P .. P+S-1`` (``P`` the longest past, ``S`` the most new
    tokens), so every row's last token is in the last column (the embedding's and the head's rows correspond, as
    forward hooks on them expect); a new token sees its past and the new tokens at or before it, a pad query only
    itself (finite values that nothing reads)."""
    n, device = len(jobs), net.embed.weight.device
    big_p, big_s = max(j.past_len for j in jobs), max(len(j.tokens) for j in jobs)
    kv = torch.zeros(len(net.layers), 2, n, net.kv_heads, big_p + big_s, net.head_dim, dtype=net.dtype, device=device)
    ids = torch.zeros(n, big_s, dtype=torch.long, device=device)
    past = torch.tensor([j.past_len for j in jobs], device=device)
    size = torch.tensor([len(j.tokens) for j in jobs], device=device)
    for i, job in enumerate(jobs):
        col = 0
        for seg in job.past:
            kv[:, :, i, :, col : col + seg.shape[3]] = seg
            col += seg.shape[3]
        ids[i, big_s - len(job.tokens) :] = torch.tensor(job.tokens, device=device)
    j = torch.arange(big_s, device=device)
    first = big_s - size  # [n]: the column (after P) of each row's first new token
    positions = past[:, None] + (j[None, :] - first[:, None]).clamp(min=0)  # [n, S]; a pad query takes the first position
    c = torch.arange(big_p + big_s, device=device)
    new = c[None, None, :] - big_p  # [1, 1, C]: new-token column index, negative over the past
    real = new >= first[:, None, None]  # [n, 1, C]
    sees = (c[None, None, :] < past[:, None, None]) | ((new >= 0) & (new <= j[None, :, None]) & real)
    sees |= new == j[None, :, None]  # every query sees its own column (pad queries: only that)
    bias = torch.zeros(n, 1, big_s, big_p + big_s, dtype=net.dtype, device=device).masked_fill_(~sees[:, None], float("-inf"))
    hidden = run_layers(net, kv, net.embed(ids), positions, big_p, big_p + big_s, bias)
    logits = head(hidden[:, -1]) if any(job.end is not None for job in jobs) else None
    for i, job in enumerate(jobs):
        if job.node is not None:
            job.node.kv = kv[:, :, i, :, big_p + big_s - len(job.tokens) :].clone()
        if job.end is not None:
            job.end.logits = logits[i].float().clone()


def prefill(
    net: NativeLlama, cache: PrefixCache | None, prompts: Sequence[Sequence[int]], head,
) -> tuple[list[list[torch.Tensor]], list[torch.Tensor], int]:
    """Keys/values (as segments) and next-token logits [V] of each of ``prompts`` (token ids), and how many
    tokens were run through the model. With ``cache`` the prompts share what they and earlier calls have in
    common (see the module doc); ``None``: each prompt whole, nothing shared or kept. ``head`` maps final
    hidden states [k, H] to logits [k, V]."""
    if cache is None:
        jobs = [_Job([], tuple(p), Node(tuple(p), None), None) for p in prompts]
        for job in jobs:
            job.end = job.node
        for wave in _by_length(jobs):
            _run_wave(net, wave, head)
        return [[j.node.kv] for j in jobs], [j.node.logits for j in jobs], sum(len(p) for p in prompts)
    ends = [cache.insert(p) for p in prompts]
    want = dict.fromkeys(ends)  # in call order (a set's order would vary the waves' batch shapes run to run)
    computed = 0
    while True:  # waves: the uncomputed nodes whose parent is computed, and prompt ends lacking logits
        jobs = [
            _Job(cache.chain(n.parent), n.tokens, n, n if n in want else None)
            for n in _uncomputed(cache) if n.parent is cache.root or n.parent.kv is not None
        ]
        jobs += [
            _Job([*cache.chain(n.parent), n.kv[:, :, :, :-1]], n.tokens[-1:], None, n)
            for n in want if n.kv is not None and n.logits is None
        ]
        if not jobs:
            break
        for wave in _by_length(jobs):
            before = [j.node.nbytes() if j.node is not None else j.end.nbytes() for j in wave]
            _run_wave(net, wave, head)
            cache.bytes += sum((j.node or j.end).nbytes() for j in wave) - sum(before)
            computed += sum(len(j.tokens) for j in wave)
    kvs, logits = [cache.chain(n) for n in ends], [n.logits for n in ends]
    cache.evict()
    return kvs, logits, computed


def _uncomputed(cache: PrefixCache) -> list[Node]:
    return [n for n in cache._nodes() if n.kv is None]


def _by_length(jobs: list[_Job], spread: float = 2.0) -> list[list[_Job]]:
    """Jobs grouped so that no wave pads a row beyond ``spread`` times its own length (new tokens plus past):
    one long shared prefix is not run padded beside 100 short remainders' worth of columns, nor they beside it."""
    jobs = sorted(jobs, key=lambda j: (len(j.tokens), j.past_len))
    waves: list[list[_Job]] = []
    for job in jobs:
        if waves and len(job.tokens) <= spread * max(1, len(waves[-1][0].tokens)):
            waves[-1].append(job)
        else:
            waves.append([job])
    return waves
