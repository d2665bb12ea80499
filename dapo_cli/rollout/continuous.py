"""The fast engine's refilled decode loop (Llama / Qwen2, ``models.native`` blocks): a batch of slots that
stays full while rows wait.

The call's ``N = P * n`` rows (prompt ``i // n``, sample ``i % n``) wait in order. The batch has
``B`` slots (``batch_size``, or all rows). A slot holds one row: its keys/values left-aligned in its own
columns of one buffer ``[layers, 2, B, kv_heads, C, head_dim]`` (column ``c`` = position ``c``), its next
position, and its step (how many tokens it has drawn). Each step runs every slot's last token at the slot's
own column (:func:`~dapo_cli.rollout.prefix_cache.run_layers` with per-row columns), attends to columns
``<=`` its position (an additive mask), and draws each row's next token from the row's own stream at the
row's own step (:func:`~dapo_cli.rollout.sampling.row_uniforms`). With the prefix cache, a prefix every prompt of
the call shares (at least :data:`SHARED_MIN` tokens) is attended to from one copy for the whole batch
(:func:`~dapo_cli.rollout.prefix_cache.shared_attend`), the rows' own columns after it.

**Refill.** When a row ends (EOS, or ``max_tokens``), the next waiting row takes its slot at once: its prompt's
keys/values are copied in from the prefill (:func:`~dapo_cli.rollout.prefix_cache.prefill`, shared prefixes
computed once), it draws its first token from the prompt's stored logits, and joins the next step. Prompts are
prefilled a batch's worth at a time (the distinct prompts of the next ``B`` waiting rows), so what a call holds
beyond the buffer is at most one batch's prompts. ``refill=False`` admits rows only into an empty batch
(a batch of ``B`` rows decodes to its end, then the next: the chunked loop's schedule).

**The tail.** Once no row waits (the last rows of a call, and always in a training round whose rows all fit
one batch), finished rows are dropped from the batch when ``compact_at`` of it has finished (the buffer is
re-indexed to the running rows), so the last few runaway rows decode as a small batch; what bounds that
tail is ``max_tokens`` minus the step the batch's other rows ended at (``docs/performance.md`` measures it).

A row's tokens depend on its key, its prompt and its own logits only, so they do not depend on which slot it
took, when it was admitted or which rows shared its steps (up to the last-bit rounding of logits between batch
shapes that ``fast.py``'s module doc describes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dapo_cli.models.native import NativeLlama
from dapo_cli.rollout.base import SamplingParams
from dapo_cli.rollout.prefix_cache import PrefixCache, prefill, run_layers
from dapo_cli.rollout.sampling import draw, row_uniforms


SHARED_MIN = 16
"""A prefix every prompt of a call shares, of at least this many tokens, is attended to once per step for the
whole batch (:func:`~dapo_cli.rollout.prefix_cache.shared_attend`) rather than once per row."""


def _common_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """Tokens every prompt starts with, short of the shortest prompt's last (a row's own columns are never empty)."""
    first, k = prompts[0], min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        k = next((i for i in range(k) if p[i] != first[i]), k)
    return max(k, 0)


@dataclass
class Outputs:
    """The call's result tensors the loop writes into (by call row): ``tokens``/``logprobs`` [N, max_tokens],
    ``lengths`` [N], ``ended`` [N] (True: stopped at EOS); plus prefill counts for the cache's savings."""

    tokens: torch.Tensor
    logprobs: torch.Tensor | None
    lengths: torch.Tensor
    ended: torch.Tensor
    prompt_tokens: int = 0
    computed_tokens: int = 0


class SlotDecoder:
    """Decodes the rows of one ``generate`` call in a refilled batch (see the module doc)."""

    def __init__(
        self, net: NativeLlama, head, cache: PrefixCache | None, prompts: Sequence[Sequence[int]], n: int,
        keys: torch.Tensor, params: SamplingParams, eos: torch.Tensor, *, batch: int, refill: bool, compact_at: float,
    ) -> None:
        self.net, self.head, self.cache, self.prompts, self.n = net, head, cache, prompts, n
        self.params, self.eos, self.batch, self.refill, self.compact_at = params, eos, batch, refill, compact_at
        self.device = net.embed.weight.device
        self.keys = keys.to(self.device)  # [N]
        self.total = len(prompts) * n
        self.next_row = 0  # the first waiting row
        self.ready: dict[int, tuple[list[torch.Tensor], torch.Tensor]] = {}  # prompt -> (kv segments, logits)
        self.limit = params.max_tokens
        self.max_prompt = max(len(p) for p in prompts)
        net.build_rope_table(self.max_prompt + self.limit + 1, self.device)
        self.shared_len = _common_prefix(prompts) if cache is not None else 0
        self.shared: torch.Tensor | None = None  # [layers, 2, kv_heads, P0, d]: what every row's columns 0..P0-1 hold

    # ------------------------------------------------------------ the batch

    def _open(self, size: int) -> None:
        """An empty batch of ``size`` slots (a zeroed buffer: masked columns must hold finite values)."""
        net, d = self.net, self.device
        capacity = self.max_prompt + min(self.limit, 64)
        self.kv = torch.zeros(len(net.layers), 2, size, net.kv_heads, capacity, net.head_dim, dtype=net.dtype, device=d)
        self.row = torch.full((size,), -1, dtype=torch.long, device=d)  # call row of each slot (-1: free)
        self.pos = torch.zeros(size, dtype=torch.long, device=d)  # column/position of the slot's last token
        self.step = torch.zeros(size, dtype=torch.long, device=d)  # tokens drawn so far
        self.tok = torch.zeros(size, dtype=torch.long, device=d)  # the last drawn token
        self.alive = torch.zeros(size, dtype=torch.bool, device=d)

    def _grow(self, need: int) -> None:
        if need <= self.kv.shape[4]:
            return
        capacity = min(max(need, 2 * self.kv.shape[4]), self.max_prompt + self.limit)
        grown = self.kv.new_zeros(*self.kv.shape[:4], capacity, self.kv.shape[5])
        grown[:, :, :, :, : self.kv.shape[4]] = self.kv
        self.kv = grown

    def _keep(self, index: torch.Tensor) -> None:
        """Only the slots ``index`` stay (the running rows, once none waits)."""
        self.kv = self.kv.index_select(2, index)
        for name in ("row", "pos", "step", "tok", "alive"):
            setattr(self, name, getattr(self, name)[index])

    # ------------------------------------------------------------ admission

    def _prepare(self) -> None:
        """Prefill the distinct prompts of the next ``batch`` waiting rows that are not ready."""
        rows = range(self.next_row, min(self.next_row + self.batch, self.total))
        todo = list(dict.fromkeys(r // self.n for r in rows if r // self.n not in self.ready))
        if not todo:
            return
        kvs, logits, computed = prefill(self.net, self.cache, [self.prompts[p] for p in todo], self.head)
        for p, kv, z in zip(todo, kvs, logits):
            self.ready[p] = (kv, z)
        self.out.prompt_tokens += sum(len(self.prompts[p]) for p in todo)
        self.out.computed_tokens += computed

    def _admit(self) -> None:
        """Fill free slots with waiting rows, each drawing its first token from its prompt's logits; a row
        that ends at once (EOS, or ``max_tokens`` 1) frees its slot again."""
        while self.next_row < self.total:
            free = (~self.alive).nonzero().squeeze(1).tolist()
            if not free:
                return
            if self.next_row // self.n not in self.ready:
                self._prepare()
            slots, rows, logits = [], [], []
            for s in free:
                r = self.next_row
                if r >= self.total or r // self.n not in self.ready:
                    break
                segments, z = self.ready[r // self.n]
                if self.shared is None and self.shared_len >= SHARED_MIN:
                    self.shared = torch.cat(segments, dim=3)[:, :, :, : self.shared_len]
                col = 0
                for seg in segments:
                    self.kv[:, :, s, :, col : col + seg.shape[3]] = seg
                    col += seg.shape[3]
                slots.append(s)
                rows.append(r)
                logits.append(z)
                self.pos[s] = col - 1
                self.next_row += 1
                if r % self.n == self.n - 1:  # the prompt's last row: nobody needs its prefill any more
                    del self.ready[r // self.n]
            index = torch.tensor(slots, device=self.device)
            self.row[index] = torch.tensor(rows, device=self.device)
            self.step[index] = 0
            self.alive[index] = True
            self._draw(index, torch.stack(logits))

    # ------------------------------------------------------------ one step

    def _draw(self, index: torch.Tensor, logits: torch.Tensor) -> None:
        """Draw the next token of slots ``index`` from ``logits`` [k, V]; record it; end the rows that stop."""
        rows, steps = self.row[index], self.step[index]
        uniforms = None if self.params.temperature <= 0 else row_uniforms(self.keys[rows], steps)
        tok, lp = draw(logits, self.params, uniforms)
        out = self.out
        out.tokens[rows, steps] = tok
        if out.logprobs is not None:
            out.logprobs[rows, steps] = lp
        self.tok[index] = tok
        self.step[index] = steps + 1
        stop = torch.isin(tok, self.eos)
        done = stop | (steps + 1 >= self.limit)
        if bool(done.any()):
            out.lengths[rows[done]] = steps[done] + 1
            out.ended[rows[done]] = stop[done]
            self.alive[index[done]] = False

    def _forward(self) -> None:
        """One step of every slot: its last token at its next column; draws for the running slots."""
        self.pos = torch.where(self.alive, self.pos + 1, self.pos)
        width = int(self.pos.max()) + 1
        self._grow(width)
        b, kvh = len(self.pos), self.net.kv_heads
        p0 = self.shared_len if self.shared is not None else 0
        cols = torch.arange(p0, width, device=self.device)
        bias = torch.zeros(b, width - p0, dtype=self.net.dtype, device=self.device)
        bias.masked_fill_(cols[None, :] > self.pos[:, None], float("-inf"))
        flat = bias[:, None, :].expand(b, kvh, width - p0).reshape(b * kvh, 1, width - p0)
        hidden = run_layers(
            self.net, self.kv, self.net.embed(self.tok[:, None]), self.pos[:, None], self.pos, width, flat, self.shared,
        )
        logits = self.head(hidden[:, -1])
        index = self.alive.nonzero().squeeze(1)
        self._draw(index, logits.index_select(0, index) if len(index) < b else logits)

    def run(self, out: Outputs) -> Outputs:
        self.out = out
        while self.next_row < self.total:
            self._open(min(self.batch, self.total - self.next_row))
            self._admit()
            while bool(self.alive.any()):
                self._forward()
                if self.refill and self.next_row < self.total:
                    self._admit()
                    continue
                dead = int((~self.alive).sum())
                if dead and dead >= self.compact_at * len(self.alive) and bool(self.alive.any()):
                    self._keep(self.alive.nonzero().squeeze(1))
        return out
