"""The torch engine: one process on CPU/CUDA, or torch DDP when launched with torchrun.

Log-probs come from ``forward.PolicyLogProbs``: for Llama / Qwen2 policies each distinct
prompt of a micro-batch is computed once and its rows' responses run against its keys/values
(``engine.shared_prompt_forward``, on by default); otherwise the model's own forward over
``[prompt ; response]`` with explicit position ids (left padding), only the last ``T + 1``
positions' logits materialised (``logits_to_keep``). A ``[N, S+T, V]`` tensor never exists.

LoRA (``adapters``, :mod:`dapo_cli.engine.lora`): the policy is the model with PEFT's LoRA layers in
place, AdamW holds the adapters only (the base is frozen), and what leaves the engine is the plain
model, merged (``export_weights``, ``save_model``); a checkpoint adds the adapters in PEFT's format.

Data parallel (world size > 1): the policy is wrapped in
``DistributedDataParallel``, which averages gradients over ranks in the backward of
the ``last`` micro-batch (``no_sync`` before it). The trainer's loss is a sum over
ranks, so :meth:`TorchEngine.backward` multiplies by the world size to turn DDP's
average back into that sum; the update is then exactly the one-process update.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from dapo_cli.batch import RolloutBatch
from dapo_cli.engine.base import no_context
from dapo_cli.engine.dist import Collective, SingleProcess
from dapo_cli.engine.forward import PolicyLogProbs, plain_log_probs
from dapo_cli.engine.lora import ADAPTER_DIR, LoraAdapters
from dapo_cli.resume_state import check_optimizer_state
from dapo_cli.statefiles import StateFileError, from_elsewhere, read_legacy, read_state, unreadable, write_state

OPTIMIZER_FILE = "optimizer.safetensors"
"""AdamW's and the LR schedule's state in a checkpoint's ``engine/`` (a :mod:`dapo_cli.statefiles` file: no pickle)."""
LEGACY_OPTIMIZER_FILE = "optimizer.pt"
"""The same, as checkpoints of an older dapo hold it (read with torch's weights-only reader only)."""


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto`` → this rank's cuda device when available, else cpu."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        return torch.device("cuda", local_rank)
    return torch.device(name)


def policy_forward(
    model: torch.nn.Module, batch: RolloutBatch, *, temperature: float, with_entropy: bool, device: torch.device, chunk: int = 0
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π of each response token ``[N, T]`` (and entropy ``[N, T]`` of the sampling distribution).

    ``model``: a causal LM (its own forward, :func:`~dapo_cli.engine.forward.plain_log_probs`) or a
    :class:`~dapo_cli.engine.forward.PolicyLogProbs` (possibly inside DDP). Logit at position
    ``S - 1 + t`` predicts response token ``t``; logits are divided by ``temperature`` so the
    log-probs are those of the distribution that sampled. ``chunk``: the output head's rows per chunk for
    a plain causal LM (a ``PolicyLogProbs`` carries its own; 0: the full logits).
    """
    tensors = (batch.prompt_ids.to(device), batch.prompt_mask.to(device), batch.response_ids.to(device), batch.response_mask.to(device))
    inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    if isinstance(inner, PolicyLogProbs):
        return model(*tensors, temperature=temperature, with_entropy=with_entropy)
    return plain_log_probs(model, *tensors, temperature=temperature, with_entropy=with_entropy, chunk=chunk)


@torch.no_grad()
def reference_log_probs(
    ref: torch.nn.Module | None, batch: RolloutBatch, *, temperature: float, device: torch.device, chunk: int = 0
) -> torch.Tensor:
    """log π_ref of the response tokens ``[N, T]`` under a frozen reference module (no grad)."""
    if ref is None:
        raise RuntimeError("this engine was built without a reference policy (algorithm.use_kl_loss is off)")
    logp, _ = policy_forward(ref, batch, temperature=temperature, with_entropy=False, device=device, chunk=chunk)
    return logp


def warmup_constant(warmup_steps: int) -> Callable[[int], float]:
    """LR multiplier: linear warm-up over ``warmup_steps`` optimizer steps, then 1."""

    def factor(step: int) -> float:
        return min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0

    return factor


def frozen(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` in eval mode with gradients off (a reference policy)."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def adamw(params: list[torch.nn.Parameter], *, lr: float, weight_decay: float) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.999))


class TorchEngine:
    """AdamW + linear warm-up + global-norm clipping; DDP over ``dist`` when it has several ranks.

    ``shared_prompt_forward``: compute each distinct prompt of a micro-batch once where the policy
    supports it (``forward.shared_prompt_log_probs``; the same log-probs and gradients), for the
    policy and the reference alike. ``autocast`` ("none" or "bfloat16"): the forwards' mixed
    precision (``forward.PolicyLogProbs``); parameters, gradients and optimizer state keep their dtype.
    ``logprob_chunk``: rows of the output head per chunk in every forward (``forward.head_log_probs``; the
    logits of all response tokens never exist at once; 0: they do, the unchunked path).
    ``adapters``: LoRA adapters injected into ``model`` (their ``module`` is ``model``); only its parameters
    that require grad (the adapters) are trained. ``base_reference`` (with ``adapters``): the reference
    policy is the base, computed by the policy's own forward with the adapters off (no ``ref_model``)."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        lr: float,
        weight_decay: float,
        warmup_steps: int,
        grad_clip: float,
        device: str = "cpu",
        dist: Collective | None = None,
        ref_model: torch.nn.Module | None = None,
        shared_prompt_forward: bool = True,
        logprob_chunk: int = 0,
        autocast: str = "none",
        adapters: LoraAdapters | None = None,
        base_reference: bool = False,
    ) -> None:
        if adapters is not None and adapters.module is not model:
            raise ValueError("adapters must be injected into the model the engine trains")
        if base_reference and (adapters is None or ref_model is not None):
            raise ValueError("base_reference is the LoRA policy's base: give adapters and no ref_model")
        self.adapters = adapters
        self.base_reference = base_reference
        self.dist = dist or SingleProcess()
        self.device = pick_device(device, self.dist.local_rank)
        self.module = model.to(self.device)
        self.module.train()
        self.grad_clip = grad_clip
        self.forward_module = PolicyLogProbs(self.module, shared_prompt=shared_prompt_forward, chunk=logprob_chunk, autocast=autocast)
        self._wrapped: torch.nn.Module = self.forward_module  # the forward DDP's reducer sees
        if self.dist.world_size > 1:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            self._wrapped = DistributedDataParallel(self.forward_module, device_ids=ids)
        self._params = [p for p in self.module.parameters() if p.requires_grad]
        self.optimizer = adamw(self._params, lr=lr, weight_decay=weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, warmup_constant(warmup_steps))
        self.ref_model = frozen(ref_model.to(self.device)) if ref_model is not None else None
        self._ref_forward = None
        if self.ref_model is not None:
            self._ref_forward = PolicyLogProbs(self.ref_model, shared_prompt=shared_prompt_forward, chunk=logprob_chunk, autocast=autocast)

    # ------------------------------------------------------------ forward / backward / step

    def log_probs(
        self, batch: RolloutBatch, *, temperature: float, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if torch.is_grad_enabled():
            model = self._wrapped
        else:  # no-grad forwards (old log-probs) bypass DDP: nothing to reduce
            model = self.forward_module
        return policy_forward(model, batch, temperature=temperature, with_entropy=with_entropy, device=self.device)

    def ref_log_probs(self, batch: RolloutBatch, *, temperature: float) -> torch.Tensor:
        if self.base_reference and self.adapters is not None:  # the reference is the base: the adapters off
            with self.adapters.disabled():
                return reference_log_probs(self.forward_module, batch, temperature=temperature, device=self.device)
        return reference_log_probs(self._ref_forward, batch, temperature=temperature, device=self.device)

    def accumulate(self, *, last: bool) -> contextlib.AbstractContextManager[None]:
        """DDP reduces gradients only in the backward of the ``last`` micro-batch."""
        if last or self._wrapped is self.forward_module:
            return no_context()
        return self._wrapped.no_sync()  # type: ignore[operator]

    def backward(self, loss: torch.Tensor) -> None:
        # DDP averages over ranks; the loss is a sum over ranks → scale by the world size.
        (loss * self.dist.world_size).backward()

    def step(self) -> tuple[float, bool]:
        max_norm = self.grad_clip if self.grad_clip > 0 else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(self._params, max_norm))
        applied = math.isfinite(norm)  # gradients are identical on every rank after DDP's reduce
        if applied:
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm, applied

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    # ------------------------------------------------------------ weights for rollouts and checks

    def generation_model(self) -> torch.nn.Module | None:
        """The live module; None with LoRA adapters: a rollout engine samples with a plain copy synced
        from the merged :meth:`export_weights` (the fast sampler would read the base weights)."""
        return None if self.adapters is not None else self.module

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The module's state dict; with LoRA the plain model's, adapters merged (``LoraAdapters.merged_weights``)."""
        if self.adapters is not None:
            yield from self.adapters.merged_weights()
        else:
            yield from self.module.state_dict().items()

    def params_finite(self) -> bool:
        bad = any(not bool(torch.isfinite(p).all()) for p in self.module.parameters())
        return not bool(self.dist.all_reduce(torch.tensor([float(bad)]), "max").item())

    # ------------------------------------------------------------ checkpoints

    def save_checkpoint(self, directory: Path) -> None:
        """Optimizer and schedule (rank 0; replicas are identical). The weights are the
        checkpoint's ``model/`` export, which the engine is built from on resume; with LoRA the
        engine is built from the base model again and the adapters are saved here (``adapter/``)."""
        if self.dist.is_main:
            directory.mkdir(parents=True, exist_ok=True)
            state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
            write_state(directory / OPTIMIZER_FILE, state)
            if self.adapters is not None:
                self.adapters.save(directory / ADAPTER_DIR)

    def load_checkpoint(self, directory: Path) -> None:
        """Optimizer and schedule (with LoRA the adapters first), the state checked against this model's
        parameters before it is loaded (:func:`~dapo_cli.resume_state.check_optimizer_state`): torch's own load
        compares only how many there are, and moments of another shape would crash AdamW in the first step."""
        if self.adapters is not None:
            self.adapters.load(directory / ADAPTER_DIR)
        checkpoint = directory.parent
        name = OPTIMIZER_FILE if (directory / OPTIMIZER_FILE).exists() else LEGACY_OPTIMIZER_FILE
        try:
            if name == OPTIMIZER_FILE:
                state = read_state(directory / OPTIMIZER_FILE, device=self.device)
            else:
                state = read_legacy(directory / LEGACY_OPTIMIZER_FILE, fix=from_elsewhere(checkpoint), device=self.device)
            check_optimizer_state(state, self.optimizer, self.scheduler, f"{directory.name}/{name}")
        except StateFileError as exc:
            raise unreadable(checkpoint, exc) from None
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def save_model(self, directory: Path, tokenizer: Any) -> None:
        """The plain policy (with LoRA: merged, under the plain model's names)."""
        if self.dist.is_main:
            from dapo_cli.models import save_policy

            merged = dict(self.adapters.merged_weights()) if self.adapters is not None else None
            save_policy(self.module, tokenizer, directory, state_dict=merged)
