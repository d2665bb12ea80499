"""A faster sampler than ``model.generate``: a decode loop of its own (``rollout.engine: fast``).

Same protocol, same weights and same distribution as :class:`~dapo_cli.rollout.hf.HFRolloutEngine`
(ancestral sampling from softmax(z / T), restricted by top-k then top-p, greedy at T = 0; the
log-prob of each sampled token is log softmax(z / T) before truncation), with less work per token:

- **One forward and one draw per token, no per-token framework work.** For Llama / Qwen2
  decoders (``_NativeDecoder``) the loop calls the model's own weights and rotary module directly:
  fused q/k/v and gate/up projections, a key/value buffer allocated once (grown by doubling, never
  concatenated per token), a RoPE table looked up per step, and attention as two batched matmuls
  (faster than ``scaled_dot_product_attention`` for one query per row on CPU); no cache objects,
  mask builders, logits processors or stopping criteria per token (the blocks live in
  ``models/native.py``, shared with the trainer's forward). Other architectures take the
  generic path (the model's own ``forward`` and its cache); both share everything else below.
- **A prefix is read once** (default, Llama / Qwen2): prompts that share leading token ids (the chat
  template, an instruction, few-shot examples) compute those keys/values once, in this call or an
  earlier one with the same weights (``rollout/prefix_cache.py``: a radix tree over token ids, at most
  ``cache_mib`` kept between calls, cleared by :meth:`FastRolloutEngine.sync_weights` and whenever a
  parameter changes in place); ``prefill_stats`` counts the prompt tokens read against those computed.
- **Finished rows are refilled** (default, Llama / Qwen2; ``rollout/continuous.py``): when a row ends, the
  next waiting row (prompt x sample) takes its place, so a batch of ``batch_size`` rows stays full while
  rows wait; once none waits, finished rows leave the batch when a quarter of it has stopped
  (``compact_at``), so a long tail of a few runaway samples decodes with a small batch.
- ``prefix_cache=False, refill=False`` (and every other architecture): the chunked loop, ``batch_size`` rows
  at a time, each chunk's distinct prompts prefilled whole (keys/values repeated to the ``n`` rows of a
  prompt) and finished rows dropped the same way. Both loops draw the same tokens.
- **Log-probs and the draw come from the same logits** (one ``log_softmax``), under
  ``torch.inference_mode``.

Seeding (reproducible by construction). Every response row has its own random stream: row ``j``
of prompt text ``q`` uses the key ``sha256(params.seed, d, j, q)``, where ``d`` counts earlier
copies of the same text in the call (so duplicated prompts still get distinct samples). Its
``t``-th uniform is SplitMix64 of ``key + (t + 1) * golden gamma`` (a counter-based generator,
computed for all rows at once with int64 tensor ops) and the token is drawn by inverting the
row's cumulative distribution (float64) at that uniform — an exact draw from the (truncated)
categorical. A row's samples therefore depend on ``(seed, prompt text, copy, j)`` and on its own
logits only: not on the chunk size (``batch_size``), the other prompts of the call, the prompt's
position in it, or which rows finished first. (Logits themselves can differ in the last bit
between batch shapes on some BLAS kernels; a draw changes only when its uniform falls within that
rounding of a CDF boundary, about 1e-7 per token.) ``seed=None`` draws a seed from torch's global
RNG (advancing it); with a seed the global RNG is not touched.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from dapo_cli.models.native import NativeLlama
from dapo_cli.models.context import check_fits
from dapo_cli.rollout.base import Rollouts, SamplingParams, WeightSource
from dapo_cli.rollout.continuous import Outputs, SlotDecoder
from dapo_cli.rollout.hf import LocalRolloutEngine, eos_token_ids
from dapo_cli.rollout.prefix_cache import PrefixCache, run_layers
from dapo_cli.rollout.sampling import (  # re-exported: tests and benchmarks import them from here
    draw, inverse_cdf_draw, row_keys, splitmix64, stream_uniforms, truncated_probs,
)

@dataclass
class _Chunk:
    """One decode batch: rows ``rows`` of the call, their prompts (unique, left-padded) and streams."""

    rows: torch.Tensor  # LongTensor [B] indices into the call's N rows
    prompt_ids: torch.Tensor  # [P_c, S_c] left-padded distinct prompts of the chunk
    prompt_mask: torch.Tensor  # [P_c, S_c]
    prompt_of_row: torch.Tensor  # [B] index into prompt_ids
    keys: torch.Tensor  # [B] stream keys


def vocab_logits(lm_head: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """Logits [B, V] of the final hidden states ``hidden`` [B, H] of a decode step.

    Computed as ``(W h^T)^T`` -- the same dot products as ``lm_head(hidden)`` -- because with a few
    rows and a large vocabulary MKL runs ``W @ h^T`` [V, H] x [H, B] about twice as fast as ``h @ W^T``
    (SmolLM2's 49,152 x 576 head, 64 rows: ~50 against ~85 ms a step on 2 AVX2 cores; see
    docs/performance.md). The result is a transposed view. A head with a bias or forward hooks (tests
    and benchmarks force outputs through them), or one that is not a plain ``nn.Linear``, runs as its module.
    """
    if type(lm_head) is not torch.nn.Linear or lm_head.bias is not None or lm_head._forward_hooks or lm_head._forward_pre_hooks:
        return lm_head(hidden)
    return torch.mm(lm_head.weight, hidden.t()).t()


class _NativeDecoder:
    """A Llama / Qwen2 decode loop on the module's own weights (``models.native`` blocks), with a
    key/value buffer of its own.

    Fused weights are built once per ``generate`` call (the trainer's module changes between calls).
    The buffer is ``[layers, 2, B, kv_heads, capacity, head_dim]``; column ``c`` holds position ``c``
    of every row (prompts are left-padded to the chunk's longest, so every row writes the same column).
    """

    def __init__(self, model: PreTrainedModel) -> None:
        self.net = NativeLlama(model)
        self.kv_heads, self.head_dim, self.dtype = self.net.kv_heads, self.net.head_dim, self.net.dtype
        self.kv: torch.Tensor | None = None

    @staticmethod
    def supports(model: Any) -> bool:
        return NativeLlama.supports(model)

    def _blocks(self, x: torch.Tensor, positions: torch.Tensor, start: int, bias: torch.Tensor) -> torch.Tensor:
        """Every layer on ``x`` [B, q, H] at ``positions`` [B, q], keys/values written into buffer columns
        ``start .. start+q-1``, attending to columns ``< start + q`` (:func:`run_layers`)."""
        return run_layers(self.net, self.kv, x, positions, start, start + x.shape[1], bias)

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, capacity: int, max_position: int) -> torch.Tensor:
        """Fill columns ``0 .. S-1`` for the distinct prompts ``ids`` [P, S]; logits [P, V] of the next token.
        ``capacity``: initial buffer columns; ``max_position``: the largest position the call can reach.

        A left-pad query attends to itself only (keeps its values finite; no real token sees it)."""
        p = ids.shape[0]
        self.net.build_rope_table(max_position + 1, ids.device)
        self.kv = torch.empty(
            len(self.net.layers), 2, p, self.kv_heads, capacity, self.head_dim, dtype=self.dtype, device=ids.device
        )
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        hidden = self._blocks(self.net.embed(ids), positions, 0, self.net.causal_bias(mask))
        return vocab_logits(self.net.lm_head, hidden[:, -1])

    def expand(self, prompt_of_row: torch.Tensor) -> None:
        """Rows become copies of their prompt's cache: [.., P, ..] -> [.., B, ..]."""
        self.kv = self.kv.index_select(2, prompt_of_row)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, column: int, bias: torch.Tensor) -> torch.Tensor:
        """One token per row at buffer ``column``; ``bias`` [B, > column] is 0 on real key columns and
        -inf on prompt padding. Logits [B, V]."""
        if column >= self.kv.shape[4]:
            grown = torch.empty(*self.kv.shape[:4], 2 * self.kv.shape[4], self.head_dim, dtype=self.dtype, device=self.kv.device)
            grown[:, :, :, :, :column] = self.kv[:, :, :, :, :column]
            self.kv = grown
        b, c = tokens.shape[0], column + 1
        flat = bias[:, None, :c].expand(b, self.kv_heads, c).reshape(b * self.kv_heads, 1, c)  # one per step, all layers
        hidden = self._blocks(self.net.embed(tokens[:, None]), positions[:, None], column, flat)
        return vocab_logits(self.net.lm_head, hidden[:, -1])

    def keep(self, index: torch.Tensor) -> None:
        self.kv = self.kv.index_select(2, index)

    def release(self) -> None:
        self.kv = None


class _GenericDecoder:
    """Any causal LM through its own ``forward`` and its KV cache object (same loop, fewer shortcuts)."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.dtype = model.dtype
        self.cache: Any = None
        self.mask: torch.Tensor | None = None
        # transformers 5.x names the cache argument and output ``cache``; 4.x ``past_key_values``
        self.cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def _cache_of(self, out: Any) -> Any:
        return out["cache"] if self.cache_arg == "cache" else out["past_key_values"]

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, capacity: int, max_position: int) -> torch.Tensor:
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=mask.long(), position_ids=positions, use_cache=True, logits_to_keep=1)
        self.cache = self._cache_of(out)
        self.mask = mask.long()
        return out.logits[:, -1]

    def expand(self, prompt_of_row: torch.Tensor) -> None:
        self.cache.batch_select_indices(prompt_of_row)
        self.mask = self.mask.index_select(0, prompt_of_row)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, column: int, bias: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], dim=1)
        out = self.model(
            input_ids=tokens[:, None], attention_mask=self.mask, position_ids=positions[:, None], use_cache=True,
            **{self.cache_arg: self.cache},
        )
        self.cache = self._cache_of(out)
        return out.logits[:, -1]

    def keep(self, index: torch.Tensor) -> None:
        self.cache.batch_select_indices(index)
        self.mask = self.mask.index_select(0, index)

    def release(self) -> None:
        self.cache = self.mask = None


class FastRolloutEngine(LocalRolloutEngine):
    """:class:`~dapo_cli.rollout.base.RolloutEngine` with its own decode loop (see the module doc).

    ``batch_size`` caps the rows decoded together (``None``: all at once; it only bounds memory:
    samples do not depend on it). ``shares_weights``: ``model`` is the trainer's own module (sync is a
    no-op); False: a private copy refreshed by :meth:`sync_weights`. ``compact_at``: drop finished
    rows from the batch once this share of it has finished (0: at every finish; > 1: never).
    ``native``: use the Llama/Qwen2 decoder when the model is one (False: always the model's forward).
    ``prefix_cache``: share prompt prefixes' keys/values within and across calls, keeping at most ``cache_mib``
    MiB of them between calls; ``refill``: refill finished rows from the waiting ones (both Llama/Qwen2 only;
    both False: the chunked loop, the benchmarks' "before").
    """

    seeds_per_prompt = True
    """Each response's random stream is keyed by (seed, prompt text, copy, sample), never by its place
    in the call: ``train.rounds.RoundPlanner`` therefore gives every rank the same seed, and a run's samples
    do not depend on the world size."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        batch_size: int | None = None,
        shares_weights: bool = True,
        compact_at: float = 0.25,
        native: bool = True,
        prefix_cache: bool = True,
        refill: bool = True,
        cache_mib: float = 512,
    ) -> None:
        super().__init__(model, tokenizer, batch_size=batch_size, shares_weights=shares_weights)
        self.compact_at = compact_at
        self.native = native
        self.refill = refill
        self.cache = PrefixCache(int(cache_mib * 2**20)) if prefix_cache else None
        self.prefill_stats = {"prompt_tokens": 0, "computed_tokens": 0}
        """Prompt tokens the calls so far had to read (each distinct prompt of a call, once) and tokens their
        prefill actually ran through the model (fewer where the prefix cache served a prefix)."""

    def sync_weights(self, source: WeightSource) -> None:
        """Copy the trainer's weights in (a no-op when sharing its module) and forget every cached prefix."""
        if self.cache is not None:
            self.cache.clear()
        super().sync_weights(source)

    def forget_prefixes(self) -> None:
        """Empty the prefix cache (the protocol's reason: rollouts independent of validation)."""
        if self.cache is not None:
            self.cache.clear()

    def _cache_for_call(self) -> PrefixCache | None:
        """The prefix cache, cleared first if a parameter changed in place since it was filled (PyTorch's
        version counters: an optimizer step, ``load_state_dict``); ``sync_weights`` clears it in any case."""
        if self.cache is not None:
            stamp = (id(self.model), tuple(p._version for p in self.model.parameters()))
            if stamp != self.cache.stamp:
                self.cache.clear()
                self.cache.stamp = stamp
        return self.cache

    def generate(self, prompts: Sequence[str], n: int, params: SamplingParams) -> Rollouts:
        """Sample ``n`` responses per already-templated prompt; see :class:`Rollouts` for shapes."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not prompts:
            raise ValueError("generate needs at least one prompt")
        if params.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {params.max_tokens}")
        pad_id = int(self.tokenizer.pad_token_id)
        eos_ids = eos_token_ids(self.model, self.tokenizer)
        enc = self.tokenizer(
            list(prompts), padding=True, padding_side="left", add_special_tokens=False, return_tensors="pt"
        )
        ids, mask = enc["input_ids"], enc["attention_mask"].bool()  # [P, S]
        if not bool(mask.any(-1).all()):
            raise ValueError("a prompt tokenised to no tokens; the fast engine needs at least one prompt token")
        check_fits(int(mask.sum(-1).max()), params.max_tokens, self.model)
        seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, ()).item())
        keys = row_keys(seed, prompts, n)
        total = len(prompts) * n
        prompt_of_row = torch.arange(len(prompts)).repeat_interleave(n)
        tokens = torch.full((total, params.max_tokens), pad_id, dtype=torch.long)
        logprobs = torch.zeros(total, params.max_tokens) if params.logprobs else None
        lengths = torch.zeros(total, dtype=torch.long)
        ended = torch.zeros(total, dtype=torch.bool)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                native = self.native and _NativeDecoder.supports(self.model)
                if native and (self.cache is not None or self.refill):
                    self._decode_slots(ids, mask, n, keys, params, eos_ids, tokens, logprobs, lengths, ended)
                else:
                    self._decode_chunks(ids, mask, prompt_of_row, keys, params, eos_ids, tokens, logprobs, lengths, ended, native)
        finally:
            self.model.train(was_training)
        return self._rollouts(ids, mask, n, tokens, logprobs, lengths, ended, prompt_of_row)

    def _decode_chunks(
        self, ids: torch.Tensor, mask: torch.Tensor, prompt_of_row: torch.Tensor, keys: torch.Tensor, params: SamplingParams,
        eos_ids: list[int], tokens: torch.Tensor, logprobs: torch.Tensor | None, lengths: torch.Tensor, ended: torch.Tensor,
        native: bool,
    ) -> None:
        """The chunked loop (no prefix cache, no refill; any architecture): ``batch_size`` rows at a time, each
        chunk's distinct prompts prefilled whole."""
        total = len(prompt_of_row)
        chunk = self.batch_size or total
        decoder = _NativeDecoder(self.model) if native else _GenericDecoder(self.model)
        for start in range(0, total, chunk):
            rows = torch.arange(start, min(start + chunk, total))
            chunk_prompts, local = torch.unique(prompt_of_row[rows], return_inverse=True)
            p_ids, p_mask = _trim_left(ids[chunk_prompts], mask[chunk_prompts])
            part = _Chunk(rows, p_ids, p_mask, local, keys[rows])
            self.prefill_stats["prompt_tokens"] += int(p_mask.sum())
            self.prefill_stats["computed_tokens"] += int(p_mask.sum())
            self._decode(decoder, part, params, eos_ids, tokens, logprobs, lengths, ended)
        decoder.release()

    def _decode_slots(
        self, ids: torch.Tensor, mask: torch.Tensor, n: int, keys: torch.Tensor, params: SamplingParams, eos_ids: list[int],
        tokens: torch.Tensor, logprobs: torch.Tensor | None, lengths: torch.Tensor, ended: torch.Tensor,
    ) -> None:
        """The refilled loop with the prefix cache (``continuous.py``), for Llama / Qwen2 models."""
        net = NativeLlama(self.model)
        device = self.model.device
        prompts = [row[m].tolist() for row, m in zip(ids, mask)]
        out = Outputs(tokens.to(device), logprobs.to(device) if logprobs is not None else None, lengths.to(device), ended.to(device))
        decoder = SlotDecoder(
            net, lambda h: vocab_logits(net.lm_head, h), self._cache_for_call(), prompts, n, keys, params,
            torch.tensor(eos_ids, device=device), batch=self.batch_size or len(prompts) * n, refill=self.refill,
            compact_at=self.compact_at,
        )
        decoder.run(out)
        tokens.copy_(out.tokens.cpu())
        if logprobs is not None:
            logprobs.copy_(out.logprobs.float().cpu())
        lengths.copy_(out.lengths.cpu())
        ended.copy_(out.ended.cpu())
        self.prefill_stats["prompt_tokens"] += out.prompt_tokens
        self.prefill_stats["computed_tokens"] += out.computed_tokens

    def _rollouts(
        self, ids: torch.Tensor, mask: torch.Tensor, n: int, tokens: torch.Tensor, logprobs: torch.Tensor | None,
        lengths: torch.Tensor, ended: torch.Tensor, prompt_of_row: torch.Tensor,
    ) -> Rollouts:
        width = int(lengths.max())
        tokens = tokens[:, :width]
        response_mask = torch.arange(width)[None, :] < lengths[:, None]
        texts = self.tokenizer.batch_decode(
            [row[:length].tolist() for row, length in zip(tokens, lengths.tolist())], skip_special_tokens=True
        )
        return Rollouts(
            prompt_ids=ids.repeat_interleave(n, dim=0),
            prompt_mask=mask.repeat_interleave(n, dim=0),
            response_ids=tokens,
            response_mask=response_mask,
            lengths=lengths,
            truncated=~ended,
            texts=texts,
            prompt_index=prompt_of_row,
            logprobs=logprobs[:, :width].contiguous() if logprobs is not None else None,
        )

    # ------------------------------------------------------------ the decode loop

    def _decode(
        self, decoder: Any, part: _Chunk, params: SamplingParams, eos_ids: list[int],
        tokens: torch.Tensor, logprobs: torch.Tensor | None, lengths: torch.Tensor, ended: torch.Tensor,
    ) -> None:
        """Decode one chunk's rows, writing into the call's ``tokens``/``logprobs``/``lengths``/``ended``."""
        device = self.model.device
        greedy = params.temperature <= 0
        limit = params.max_tokens
        eos = torch.tensor(eos_ids, device=device)
        p_ids, p_mask = part.prompt_ids.to(device), part.prompt_mask.to(device)
        width = p_ids.shape[1]
        capacity = width + min(limit, 64)
        logits = decoder.prefill(p_ids, p_mask, capacity, width + limit).index_select(0, part.prompt_of_row.to(device))
        decoder.expand(part.prompt_of_row.to(device))
        rows = part.rows.to(device)  # call-level row of each batch row
        keys = part.keys.to(device)  # by chunk row (never re-indexed)
        positions = p_mask.long().sum(-1).index_select(0, part.prompt_of_row.to(device))  # next position per row
        bias = torch.zeros(len(rows), width + limit, dtype=decoder.dtype, device=device)  # additive key mask
        bias[:, :width].masked_fill_(~p_mask.index_select(0, part.prompt_of_row.to(device)), float("-inf"))
        alive = torch.ones(len(rows), dtype=torch.bool, device=device)
        out_tok = torch.empty(len(rows), limit, dtype=torch.long, device=device)
        out_lp = torch.empty(len(rows), limit, device=device) if logprobs is not None else None
        done_len = torch.full((len(rows),), limit, dtype=torch.long, device=device)  # filled as rows end
        done_eos = torch.zeros(len(rows), dtype=torch.bool, device=device)
        slot = torch.arange(len(rows), device=device)  # batch row -> chunk row
        block = 64  # uniforms are computed for this many steps at a time
        dead = 0
        for t in range(limit):
            if not greedy and t % block == 0:  # by chunk row; a batch row reads its own through ``slot``
                uniforms = stream_uniforms(keys, t, min(block, limit - t))  # [B_chunk, block]
            tok, lp = draw(logits, params, None if greedy else uniforms[slot, t % block])
            out_tok[slot, t] = tok
            if out_lp is not None:
                out_lp[slot, t] = lp
            finished = torch.isin(tok, eos) & alive
            if bool(finished.any()):
                done_len[slot[finished]] = t + 1
                done_eos[slot[finished]] = True
                alive = alive & ~finished
                dead += int(finished.sum())
            if t == limit - 1 or dead == len(alive):
                break
            if dead and dead >= self.compact_at * len(alive):
                index = alive.nonzero().squeeze(1)
                decoder.keep(index)
                tok, positions, bias, slot = tok[index], positions[index], bias[index], slot[index]
                alive = alive[index]
                dead = 0
            logits = decoder.step(tok, positions + t, width + t, bias)
        # write back into the call's tensors: tokens after a row's end become pad (already pad there)
        width_used = min(limit, t + 1)
        keep = torch.arange(width_used, device=device)[None, :] < done_len[:, None]
        rows_cpu = rows.cpu()
        tokens[rows_cpu, :width_used] = out_tok[:, :width_used].masked_fill(~keep, int(self.tokenizer.pad_token_id)).cpu()
        if logprobs is not None and out_lp is not None:
            logprobs[rows_cpu, :width_used] = out_lp[:, :width_used].masked_fill(~keep, 0.0).float().cpu()
        lengths[rows_cpu] = done_len.cpu()
        ended[rows_cpu] = done_eos.cpu()


def _trim_left(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop the left-pad columns no row of a chunk needs (chunks of short prompts prefill less)."""
    first = int((~mask).all(0).long().cumprod(0).sum())
    return ids[:, first:], mask[:, first:]
