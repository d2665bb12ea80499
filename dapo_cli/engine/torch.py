"""Single-device training engine on plain torch (CPU by default, CUDA when asked).

Log-probs are computed over ``[prompt ; response]`` with explicit position ids
(left padding) and only the last ``T + 1`` positions' logits are materialised
(``logits_to_keep``), so a ``[N, S+T, V]`` tensor never exists.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from dapo_cli.algo.logits import entropy_from_logits, token_log_probs
from dapo_cli.batch import RolloutBatch


def pick_device(name: str) -> torch.device:
    """``auto`` → cuda when available, else cpu."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def policy_forward(
    model: torch.nn.Module, batch: RolloutBatch, *, temperature: float, with_entropy: bool, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π of each response token ``[N, T]`` (and entropy ``[N, T]`` of the sampling distribution).

    Logit at position ``S - 1 + t`` predicts response token ``t``; logits are divided by
    ``temperature`` so the log-probs are those of the distribution that sampled.
    """
    input_ids = batch.input_ids.to(device)
    attention = batch.attention_mask.to(device)
    position_ids = (attention.long().cumsum(-1) - 1).clamp(min=0)
    t = batch.response_ids.shape[1]
    out = model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids, logits_to_keep=t + 1, use_cache=False)
    logits = out.logits[:, :-1, :]
    if logits.dtype in (torch.float16, torch.bfloat16):  # log-softmax in at least float32
        logits = logits.float()
    logits = logits / temperature
    logp = token_log_probs(logits, batch.response_ids.to(device))
    ent = entropy_from_logits(logits) if with_entropy else None
    return logp, ent


def warmup_constant(warmup_steps: int):
    """LR multiplier: linear warm-up over ``warmup_steps`` optimizer steps, then 1."""

    def factor(step: int) -> float:
        return min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0

    return factor


class TorchEngine:
    """AdamW + linear warm-up + global-norm clipping on one device."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        lr: float,
        weight_decay: float,
        warmup_steps: int,
        grad_clip: float,
        device: str = "cpu",
    ) -> None:
        self.device = pick_device(device)
        self.model = model.to(self.device)
        self.model.train()
        self.grad_clip = grad_clip
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.999))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, warmup_constant(warmup_steps))

    def log_probs(
        self, batch: RolloutBatch, *, temperature: float, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return policy_forward(self.model, batch, temperature=temperature, with_entropy=with_entropy, device=self.device)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> tuple[float, bool]:
        params = [p for p in self.model.parameters() if p.requires_grad]
        max_norm = self.grad_clip if self.grad_clip > 0 else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        applied = math.isfinite(norm)
        if applied:
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm, applied

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def save_model(self, directory: Path, tokenizer: Any) -> None:
        from dapo_cli.models import save_policy

        save_policy(self.model, tokenizer, directory)

    def params_finite(self) -> bool:
        """False if any parameter holds NaN/Inf (such a model is never checkpointed)."""
        return all(bool(torch.isfinite(p).all()) for p in self.model.parameters())
