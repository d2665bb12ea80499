"""The typed batches a training step's data travels in: a rollout's :class:`Rollouts`, then the step's :class:`RolloutBatch`.

Shapes: ``N`` responses (``G`` per prompt, a group), ``S`` prompt tokens (left-padded),
``T`` response tokens (right-padded). Phases fill fields in order and never
re-derive one another's:

=====================  ===========================  ===================================
field                  shape / type                 set by
=====================  ===========================  ===================================
prompt_ids             LongTensor [N, S]            rollout (left-padded)
prompt_mask            BoolTensor [N, S]            rollout
response_ids           LongTensor [N, T]            rollout (right-padded)
response_mask          BoolTensor [N, T]            rollout: generated tokens incl. EOS
lengths                LongTensor [N]               rollout
truncated              BoolTensor [N]               rollout: no EOS within L_max
group_ids              LongTensor [N]               trainer: one id per prompt instance
texts / ground_truths  list[str] (N)                rollout / data
preds                  list[str] (N)                verifier: normalised extraction
scores                 FloatTensor [N]              verifier: +1 / -1
acc                    BoolTensor [N]               verifier
rewards                FloatTensor [N]              shaping: score + overlong penalty
loss_mask              BoolTensor [N, T]            shaping: response_mask minus filtered rows
advantages             FloatTensor [N]              algo.advantages
old_log_probs          FloatTensor [N, T]           engine (no grad), policy that sampled
ref_log_probs          FloatTensor [N, T] | None    engine (frozen reference), KL only
entropy                FloatTensor [N, T] | None    engine, with old_log_probs
rollout_log_probs      FloatTensor [N, T] | None    rollout engine: log-probs of its own samples
versions               LongTensor [N] | None        round source: the weight version each response was sampled with
=====================  ===========================  ===================================
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Responses:
    """Sampled responses with their prompts: what a rollout returns and a batch starts from (shapes above;
    all tensors on CPU when a rollout engine returns them).

    prompt_ids:    LongTensor [N, S]  left-padded prompt token ids (pad = tokenizer pad id)
    prompt_mask:   BoolTensor [N, S]  True on real prompt tokens
    response_ids:  LongTensor [N, T]  right-padded response ids, EOS included when emitted
    response_mask: BoolTensor [N, T]  True on generated tokens (EOS included), False on padding
    lengths:       LongTensor [N]     number of generated tokens = response_mask.sum(-1)
    truncated:     BoolTensor [N]     True when no EOS was produced within max_tokens
    texts:         list[str] (N)      decoded responses without special tokens
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    lengths: torch.Tensor
    truncated: torch.Tensor
    texts: list[str]


@dataclass
class Rollouts(Responses):
    """What one ``generate`` call of a :class:`~dapo_cli.rollout.base.RolloutEngine` returns: the
    :class:`Responses`, and

    prompt_index:  LongTensor [N]     index into the ``prompts`` argument (i // n)
    logprobs:      FloatTensor [N, T] log softmax(z_t / temperature) of each sampled token under the
                                      engine's own weights and kernels (0.0 on padding); None unless
                                      ``params.logprobs`` (what the train-inference mismatch is measured on)
    """

    prompt_index: torch.Tensor
    logprobs: torch.Tensor | None = None


@dataclass
class RolloutBatch(Responses):
    """A step's responses and everything computed about them (see the module table)."""

    group_ids: torch.Tensor
    ground_truths: list[str]
    prompts: list[str]
    pad_id: int
    preds: list[str] = field(default_factory=list)
    scores: torch.Tensor | None = None
    acc: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    old_log_probs: torch.Tensor | None = None
    ref_log_probs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    rollout_log_probs: torch.Tensor | None = None
    versions: torch.Tensor | None = None

    @classmethod
    def from_rollouts(
        cls, rollouts: Rollouts, *, group_ids: torch.Tensor, ground_truths: list[str], prompts: list[str], pad_id: int,
        versions: torch.Tensor | None = None,
    ) -> RolloutBatch:
        """What one ``generate`` call returned (:class:`Rollouts`) as a batch: its :class:`Responses` as they are
        (the texts list copied), its ``logprobs`` as ``rollout_log_probs``. The caller says what the rollouts do not
        know: each response's group, prompt text and ground truth, and (optionally) the weight version that sampled it."""
        shared = {f.name: getattr(rollouts, f.name) for f in dataclasses.fields(Responses)}
        return cls(
            **{**shared, "texts": list(rollouts.texts)}, group_ids=group_ids, ground_truths=ground_truths, prompts=prompts,
            pad_id=pad_id, rollout_log_probs=rollouts.logprobs, versions=versions,
        )

    def __len__(self) -> int:
        return int(self.response_ids.shape[0])

    @property
    def input_ids(self) -> torch.Tensor:
        """``[N, S+T]`` prompt then response ids."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """``[N, S+T]`` real tokens (prompt padding and post-EOS padding are False)."""
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    def select(self, index: torch.Tensor) -> RolloutBatch:
        """Rows ``index`` (LongTensor [M], or a BoolTensor [N] row mask) of every per-response field, same column widths."""
        idx = index.nonzero().flatten() if index.dtype == torch.bool else index.long()
        picked = [i for i in idx.tolist()]
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                out[f.name] = value[idx]
            elif isinstance(value, list):
                out[f.name] = [value[i] for i in picked] if value else []
            else:
                out[f.name] = value
        return RolloutBatch(**out)

    @staticmethod
    def concat(parts: list[RolloutBatch]) -> RolloutBatch:
        """Stack batches row-wise; prompts are re-left-padded and responses re-right-padded."""
        if not parts:
            raise ValueError("concat needs at least one batch")
        if len(parts) == 1:
            return parts[0]
        s_max = max(p.prompt_ids.shape[1] for p in parts)
        t_max = max(p.response_ids.shape[1] for p in parts)
        out: dict[str, Any] = {}
        for f in dataclasses.fields(RolloutBatch):
            values = [getattr(p, f.name) for p in parts]
            first = values[0]
            if f.name in ("prompt_ids", "prompt_mask"):
                fill = parts[0].pad_id if f.name == "prompt_ids" else False
                out[f.name] = torch.cat([_pad(v, s_max, fill, left=True) for v in values])
            elif isinstance(first, torch.Tensor) and first.dim() == 2:
                fill = parts[0].pad_id if f.name == "response_ids" else 0
                out[f.name] = torch.cat([_pad(v, t_max, fill, left=False) for v in values])
            elif isinstance(first, torch.Tensor):
                out[f.name] = torch.cat(values)
            elif isinstance(first, list):
                out[f.name] = [x for v in values for x in v]
            else:
                out[f.name] = first
        return RolloutBatch(**out)


def _pad(x: torch.Tensor, width: int, fill: Any, *, left: bool) -> torch.Tensor:
    """Pad a ``[N, W]`` tensor to ``[N, width]`` with ``fill`` on the left or right."""
    extra = width - x.shape[1]
    if extra <= 0:
        return x
    pad = torch.full((x.shape[0], extra), fill, dtype=x.dtype, device=x.device)
    return torch.cat([pad, x] if left else [x, pad], dim=1)
