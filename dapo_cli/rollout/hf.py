"""Rollouts with transformers' ``model.generate`` (CPU, or one GPU without vLLM).

By default the engine holds the *trainer's own model object*
(``TrainingEngine.generation_model()``), so the weights it samples with are always
the latest ones and :meth:`HFRolloutEngine.sync_weights` is a no-op. When the
trainer's parameters are sharded (ZeRO-3) or carry LoRA adapters (``generation_model()``
is then None) it holds a copy of its own and
``sync_weights`` copies ``export_weights()`` into it, tensor by tensor. Sampling is plain ancestral sampling from

.. math:: \\pi_\\theta(o_t \\mid q, o_{<t}) \\propto \\exp(z_t / \\tau)

restricted by ``top_k`` / ``top_p`` when asked; ``temperature == 0`` means greedy.
Every logits processor that a model's ``generation_config.json`` could switch on
(e.g. Qwen2.5's ``repetition_penalty=1.05``, ``top_k=20``) is set explicitly to
its neutral value, so the sampled distribution is the one the loss assumes.

Seeding: with ``params.seed`` set, the engine calls ``torch.manual_seed(seed)``
inside ``torch.random.fork_rng`` (``generate`` draws from torch's global RNG and
accepts no ``torch.Generator``), so equal seeds give equal samples and the
caller's global RNG state is left as it was. With ``seed=None`` it draws from,
and advances, the global RNG.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, PreTrainedModel, PreTrainedTokenizerBase

from dapo_cli.models.context import check_fits, check_prompts_fit
from dapo_cli.rollout.base import Rollouts, SamplingParams, WeightSource

NEUTRAL_PROCESSORS: dict[str, float | int] = {
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "min_new_tokens": 0,
    "num_beams": 1,
    "num_return_sequences": 1,
}
"""Settings pinned to no-ops in every mode, so a checkpoint's defaults cannot reshape decoding."""

NEUTRAL_WARPERS: dict[str, float] = {"typical_p": 1.0, "min_p": 0.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0}
"""Sampling-only truncations pinned to no-ops when sampling (greedy ignores them)."""


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Ids that end a response: the tokenizer's EOS plus any in the model's generation config.

    Chat checkpoints (Qwen2.5-Instruct) list several, e.g. ``<|im_end|>`` and ``<|endoftext|>``.
    """
    ids: list[int] = [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]
    extra = model.generation_config.eos_token_id
    for i in [extra] if isinstance(extra, int) else list(extra or []):
        if int(i) not in ids:
            ids.append(int(i))
    if not ids:
        raise ValueError("the tokenizer and the model's generation config define no EOS token")
    return ids


def generation_config(params: SamplingParams, pad_token_id: int, eos_ids: list[int]) -> GenerationConfig:
    """A complete ``GenerationConfig`` for ``params`` (greedy when ``temperature == 0``)."""
    if params.temperature > 0:
        mode = {
            "do_sample": True,
            "temperature": params.temperature,
            "top_k": params.top_k,
            "top_p": params.top_p,
            **NEUTRAL_WARPERS,
        }
    else:
        mode = {"do_sample": False}  # sampling-only flags left unset: transformers warns about them
    return GenerationConfig(
        max_new_tokens=params.max_tokens,
        pad_token_id=pad_token_id,
        eos_token_id=eos_ids,
        use_cache=True,
        **mode,
        **NEUTRAL_PROCESSORS,
    )


def response_mask(response_ids: torch.Tensor, eos_ids: list[int]) -> torch.Tensor:
    """True on generated tokens up to and including the first EOS of each row.

    response_ids: LongTensor [N, T] as returned by ``generate`` after the prompt
    (rows that ended early are filled with pad, which may equal EOS).
    Returns BoolTensor [N, T]: position t is kept iff no EOS occurs strictly before t.
    """
    is_eos = torch.isin(response_ids, torch.tensor(eos_ids, device=response_ids.device))
    eos_before = torch.cumsum(is_eos.long(), dim=-1) - is_eos.long()  # EOS count in [0, t)
    return eos_before == 0


def check_engine_arguments(tokenizer: PreTrainedTokenizerBase, batch_size: int | None) -> None:
    """What every local rollout engine needs: a pad token, and a positive chunk size (or None)."""
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}")
    if tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer has no pad token (load_policy sets it to EOS)")


@torch.no_grad()
def copy_exported_weights(model: torch.nn.Module, source: WeightSource) -> None:
    """Copy every ``(name, tensor)`` of ``source.export_weights()`` into ``model``, tensor by tensor
    (each may be valid only until the next is requested); every parameter must be covered."""
    own = model.state_dict()
    seen = set()
    for name, tensor in source.export_weights():
        if name not in own:
            raise KeyError(f"the trainer exports {name!r}, which the rollout model does not have")
        own[name].copy_(tensor.to(own[name].device, own[name].dtype))
        seen.add(name)
    missing = set(own) - seen
    if missing:
        raise KeyError(f"the trainer exported no value for {sorted(missing)[:3]} ...")


class LocalRolloutEngine:
    """What the in-process engines (:class:`HFRolloutEngine`, ``fast.FastRolloutEngine``) share: a model and its
    tokenizer in this process, ``batch_size`` capping the sequences generated together (``None``: all at once;
    it only bounds memory), and ``shares_weights``: ``model`` is the trainer's own module (sync is a no-op);
    False: a private copy refreshed by :meth:`sync_weights`. Subclasses add ``generate`` and ``seeds_per_prompt``."""

    lockstep = False
    """Each rank's engine is its own: rank 0 alone may generate (validation)."""

    def __init__(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, batch_size: int | None = None, shares_weights: bool = True,
    ) -> None:
        check_engine_arguments(tokenizer, batch_size)
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.shares_weights = shares_weights

    @torch.no_grad()
    def sync_weights(self, source: WeightSource) -> None:
        """Copy ``source.export_weights()`` into the private model (no-op when it shares the trainer's)."""
        if self.shares_weights:
            return
        copy_exported_weights(self.model, source)

    def check_prompts(self, prompts: Sequence[str], max_tokens: int) -> None:
        """The longest prompt plus ``max_tokens`` within the model's context (:func:`check_prompts_fit`)."""
        check_prompts_fit(self.tokenizer, self.model, prompts, max_tokens)

    def forget_prefixes(self) -> None:
        """No-op: ``generate`` keeps no prefix between calls (the fast engine, a subclass, does)."""

    def sleep(self) -> None:
        """No-op: the weights are the trainer's (or a CPU-side copy) and no cache outlives ``generate``."""

    def wake_up(self) -> None:
        """No-op (see :meth:`sleep`)."""

    def close(self) -> None:
        """No-op: nothing outlives the Python objects."""


class SampledTokenLogProbs(LogitsProcessor):
    """Records log softmax(z / T) of every sampled token during ``generate``, one step behind.

    ``generate`` calls processors before sampling, with ``input_ids`` that end in the token
    sampled at the previous step; this processor runs before the temperature and top-k/top-p
    warpers (``transformers`` appends those after custom processors), so ``scores`` are the raw
    logits. It keeps one ``[B, V]`` distribution, never the whole ``[B, T, V]``; :meth:`finish`
    adds the last step's token. Greedy decoding (T = 0) records log softmax(z).
    """

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature if temperature > 0 else 1.0
        self.previous: torch.Tensor | None = None
        self.values: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.previous is not None:
            self.values.append(self.previous.gather(1, input_ids[:, -1:]).squeeze(1))
        self.previous = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, generated: torch.Tensor) -> torch.Tensor:
        """``[B, T]`` log-probs of ``generated`` ``[B, T]`` (the tokens after the prompt)."""
        if self.previous is not None and generated.shape[1] > len(self.values):
            self.values.append(self.previous.gather(1, generated[:, -1:].to(self.previous.device)).squeeze(1))
        if not self.values:
            return torch.zeros(generated.shape[0], 0)
        return torch.stack(self.values, dim=1).cpu()


class HFRolloutEngine(LocalRolloutEngine):
    """:class:`~dapo_cli.rollout.base.RolloutEngine` on a transformers causal LM.

    ``batch_size`` caps the sequences per ``generate`` call (``None``: all at once);
    chunking only bounds memory: greedy results do not depend on it. ``shares_weights``:
    ``model`` is the trainer's own module (sync is a no-op); False: a private copy.
    """

    seeds_per_prompt = False
    """One seed drives the whole call (transformers samples from one global stream), so ranks need seeds of their own."""

    def generate(self, prompts: Sequence[str], n: int, params: SamplingParams) -> Rollouts:
        """Sample ``n`` responses per already-templated prompt; see :class:`Rollouts` for shapes.

        Prompts are tokenised without added special tokens, left-padded to the
        longest, and each is repeated ``n`` times (response ``i`` answers prompt
        ``i // n``).
        """
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not prompts:
            raise ValueError("generate needs at least one prompt")
        pad_id = int(self.tokenizer.pad_token_id)
        eos_ids = eos_token_ids(self.model, self.tokenizer)
        enc = self.tokenizer(
            list(prompts), padding=True, padding_side="left", add_special_tokens=False, return_tensors="pt"
        )
        check_fits(int(enc["attention_mask"].sum(-1).max()), params.max_tokens, self.model)
        prompt_ids = enc["input_ids"].repeat_interleave(n, dim=0)  # [N, S]
        prompt_mask = enc["attention_mask"].bool().repeat_interleave(n, dim=0)  # [N, S]
        gen_config = generation_config(params, pad_id, eos_ids)
        chunk = self.batch_size or prompt_ids.shape[0]
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.random.fork_rng(devices=self._rng_devices(), enabled=params.seed is not None):
                if params.seed is not None:
                    torch.manual_seed(params.seed)
                pieces = [
                    self._generate_chunk(prompt_ids[i : i + chunk], prompt_mask[i : i + chunk], gen_config, params)
                    for i in range(0, prompt_ids.shape[0], chunk)
                ]
        finally:
            self.model.train(was_training)
        response_ids = _right_pad_cat([ids for ids, _ in pieces], pad_id)  # [N, T]
        mask = response_mask(response_ids, eos_ids)  # [N, T]
        logprobs = None
        if params.logprobs:
            logprobs = _right_pad_cat([lp for _, lp in pieces], 0.0).masked_fill(~mask, 0.0)  # [N, T]
        ended = (torch.isin(response_ids, torch.tensor(eos_ids)) & mask).any(-1)  # [N]
        response_ids = response_ids.masked_fill(~mask, pad_id)
        lengths = mask.sum(-1)
        texts = [
            self.tokenizer.decode(row[:length].tolist(), skip_special_tokens=True)
            for row, length in zip(response_ids, lengths.tolist())
        ]
        return Rollouts(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=response_ids,
            response_mask=mask,
            lengths=lengths,
            truncated=~ended,
            texts=texts,
            prompt_index=torch.arange(len(prompts)).repeat_interleave(n),
            logprobs=logprobs,
        )

    def _rng_devices(self) -> list[int]:
        """CUDA devices whose RNG ``fork_rng`` must save and restore (none on CPU)."""
        device = self.model.device
        return [device.index or 0] if device.type == "cuda" else []

    @torch.inference_mode()
    def _generate_chunk(
        self, ids: torch.Tensor, mask: torch.Tensor, gen_config: GenerationConfig, params: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Generated tokens only, on CPU: LongTensor [B, T_chunk] (T_chunk <= max_tokens), and
        their log-probs [B, T_chunk] when ``params.logprobs``."""
        device = self.model.device
        recorder = SampledTokenLogProbs(params.temperature) if params.logprobs else None
        out = self.model.generate(
            input_ids=ids.to(device), attention_mask=mask.long().to(device), generation_config=gen_config,
            logits_processor=LogitsProcessorList([recorder]) if recorder is not None else None,
        )
        generated = out[:, ids.shape[1] :].cpu()
        return generated, (recorder.finish(generated) if recorder is not None else None)


def _right_pad_cat(pieces: list[torch.Tensor], pad_id: float) -> torch.Tensor:
    """Concatenate [B_i, T_i] tensors along rows, right-padding each to max T_i with ``pad_id``."""
    width = max(p.shape[1] for p in pieces)
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1]), value=pad_id) for p in pieces])
