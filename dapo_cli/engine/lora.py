"""LoRA on the torch engine's policy, through PEFT (Hu et al. 2021, arXiv:2106.09685).

Each targeted linear layer computes ``x (W0 + s B A)ᵀ + b`` with the base weight ``W0`` frozen,
``A`` [r, in] and ``B`` [out, r] trained, ``s = alpha / r`` (``model.lora``). PEFT replaces the layers
in place (``lora.Linear``: ``base_layer``, ``lora_A``, ``lora_B``), so the policy stays the
transformers model and every forward includes the adapters:

- the model's own forward (PEFT's layers: ``W0 x + s B (A x)``);
- the trainer's fused Llama / Qwen2 forward (``models/native.py``), which builds ``W0 + s B A``
  from the parameters per forward (``native.linear_params``; gradients reach ``A`` and ``B``).

What leaves the engine is always the **plain** model: :meth:`LoraAdapters.merged_weights` yields
``W0 + s B A`` under the layer's own name (``...q_proj.weight``, never ``base_layer`` or ``lora_A``),
the state dict of the model without adapters. Rollout engines (fast, hf, vLLM, the worker process)
and ``save_pretrained`` folders (``dapo eval``, plain transformers) read that and nothing else. The
adapters alone are saved in PEFT's format (``adapter_config.json`` + ``adapter_model.safetensors``),
which :meth:`LoraAdapters.load` restores exactly on top of the same base. The KL reference of a
LoRA run is the base itself: the policy's forward with the adapters off (:meth:`LoraAdapters.disabled`),
no second copy of the model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch

from dapo_cli.config.schema import LORA_ALL_LINEAR
from dapo_cli.errors import UserError
from dapo_cli.models.native import is_lora, linear_params

ADAPTER_DIR = "adapter"
"""Beside ``optimizer.safetensors`` in a checkpoint's ``engine/``: the adapters in PEFT's format."""

ADAPTER_WEIGHTS = "adapter_model.safetensors"
"""PEFT's file name for the adapter weights in a ``save_pretrained`` folder."""


class LoraAdapters:
    """PEFT LoRA adapters injected into ``model`` (in place): the base frozen, the adapters trainable.

    ``module`` is ``model`` itself, its targeted layers now PEFT's; train its parameters that require
    grad (the adapters only). ``target_modules``: ``["all-linear"]`` or module names (``q_proj``, ...).
    A model with gradient checkpointing on gets ``enable_input_require_grads`` (under reentrant checkpointing,
    transformers 4.x's default, its blocks would otherwise see inputs without grad, the embeddings being
    frozen, and give the adapters none; transformers 5 does it in ``gradient_checkpointing_enable`` too).
    """

    def __init__(self, model: torch.nn.Module, *, rank: int, alpha: float, target_modules: list[str], dropout: float) -> None:
        import peft

        # PEFT takes its "all-linear" shorthand as a string, names as a list
        targets: str | list[str] = LORA_ALL_LINEAR if list(target_modules) == [LORA_ALL_LINEAR] else list(target_modules)
        config = peft.LoraConfig(
            r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=dropout, bias="none", task_type="CAUSAL_LM",
        )
        try:
            self.peft_model = peft.get_peft_model(model, config)
        except ValueError as exc:  # e.g. a target module name the model does not have
            raise UserError(f"model.lora.target_modules={list(target_modules)}: {str(exc).splitlines()[0]}") from None
        self.module: torch.nn.Module = self.peft_model.get_base_model()
        if getattr(self.module, "is_gradient_checkpointing", False):
            self.module.enable_input_require_grads()  # type: ignore[operator]

    def disabled(self) -> contextlib.AbstractContextManager[None]:
        """Within it the model is the base: every adapter off (the KL reference of a LoRA run)."""
        return self.peft_model.disable_adapter()

    def layers(self) -> dict[str, torch.nn.Module]:
        """The LoRA layers by their name in :attr:`module` (``model.layers.0.self_attn.q_proj``)."""
        return {name: m for name, m in self.module.named_modules() if is_lora(m)}

    @torch.no_grad()
    def merged_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` of the plain model (no adapters), in its ``state_dict`` order: a LoRA layer's
        ``W0 + s B A`` under ``<layer>.weight`` and its bias under ``<layer>.bias``; adapter tensors left out."""
        layers = self.layers()
        for key, tensor in self.module.state_dict().items():
            owner = _owner(key, layers)
            if owner is None:
                yield key, tensor
                continue
            rest = key[len(owner) + 1 :]
            if rest.startswith("base_layer."):
                leaf = rest.removeprefix("base_layer.")
                yield f"{owner}.{leaf}", (linear_params(layers[owner])[0] if leaf == "weight" else tensor)
            # else an adapter tensor (lora_A, lora_B): not part of the plain model

    def save(self, directory: Path) -> None:
        """The adapters in PEFT's format (``PeftModel.from_pretrained(base, directory)`` loads them)."""
        # save_embedding_layers=False: no embedding is ever adapted here, and "auto" may look the base up on the hub
        self.peft_model.save_pretrained(str(directory), save_embedding_layers=False)

    def load(self, directory: Path) -> None:
        """Restore what :meth:`save` wrote (the same base and settings): every adapter tensor, exactly."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        device = next(self.module.parameters()).device
        state = load_file(str(directory / ADAPTER_WEIGHTS), device=str(device))
        result = set_peft_model_state_dict(self.peft_model, state)
        unexpected = list(getattr(result, "unexpected_keys", []) or [])
        if unexpected:
            raise RuntimeError(f"{directory}: adapter tensors this model has no place for: {unexpected[:3]}")


def _owner(key: str, layers: dict[str, torch.nn.Module]) -> str | None:
    """The LoRA layer whose tensor ``key`` is (None: a tensor of no LoRA layer; layers do not nest)."""
    parts = key.split(".")
    return next((p for p in (".".join(parts[:i]) for i in range(1, len(parts))) if p in layers), None)
