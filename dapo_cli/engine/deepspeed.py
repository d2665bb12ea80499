"""The DeepSpeed engine: ZeRO stage 0-3, fp32 or bf16, optional CPU offload (the only module importing deepspeed).

Gradient accumulation is owned by the trainer (``managed_gradient_accumulation:
false``): every ``backward`` accumulates, ``step`` is the boundary that reduces (stage
0/1) or finalises the reduce-scattered partitions (stage 2/3) and applies AdamW. Stage
2/3 reduce in every backward and stage 3 gathers parameters in every forward, so
every rank runs the same number of micro-batches (the trainer pads with empty ones).

DeepSpeed averages gradients over ranks; the trainer's loss is a sum over ranks, so
:meth:`DeepSpeedEngine.backward` multiplies by the world size, as the torch engine does.

Optimizer (``engine.optimizer``, :func:`optimizer_choice`): by default a torch ``AdamW`` is built here and passed
to ``deepspeed.initialize`` (fused kernels on CUDA): nothing to compile. DeepSpeed's own
(``fused_adam``: FusedAdam, JIT-built with nvcc; ``cpu_adam``: DeepSpeedCPUAdam, C++-built, for
``offload_optimizer``) only when asked; a build that fails is one line (:func:`build_optimizer`). The
config never names an ``"optimizer"``, so DeepSpeed never builds one of its own.
A non-finite gradient makes DeepSpeed's ZeRO optimizers skip the step (its overflow
check); at stage 0 the engine averages, measures and checks the gradients itself.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from dapo_cli.batch import RolloutBatch
from dapo_cli.algo.logits import chunked_head_log_probs
from dapo_cli.engine.base import no_context
from dapo_cli.engine.dist import Collective
from dapo_cli.engine.forward import PLAIN_HEAD_TYPES, Packing
from dapo_cli.engine.torch import frozen, pick_device, policy_forward, reference_log_probs, warmup_constant
from dapo_cli.errors import UserError

CHECKPOINT_TAG = "state"


def deepspeed_config(
    *,
    zero_stage: int,
    bf16: bool,
    grad_clip: float,
    offload_optimizer: bool,
    offload_params: bool,
) -> dict[str, Any]:
    """The DeepSpeed JSON config for one training engine (the optimizer is passed in: :func:`build_optimizer`)."""
    zero: dict[str, Any] = {"stage": zero_stage}
    if offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if offload_params:
        zero["offload_param"] = {"device": "cpu"}
    if zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,  # batches come from the trainer, not DeepSpeed's loader
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": grad_clip if grad_clip > 0 else 0.0,
        "zero_optimization": zero,
        "bf16": {"enabled": bf16, "check_grad_overflow": True},
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    return cfg


BETAS = (0.9, 0.999)


def optimizer_choice(name: str, *, device_type: str, offload_optimizer: bool) -> tuple[str, dict[str, Any]]:
    """``engine.optimizer`` → (the class that steps, its extra keyword arguments).

    ``torch``: ``torch.optim.AdamW``, ``fused=True`` where its states live on CUDA (no offload), else torch's
    default implementation (CPU, or the CPU partitions of ``offload_optimizer``; the torch engine's AdamW); ``fused_adam``: ``deepspeed.ops.adam.FusedAdam``
    (AdamW mode); ``cpu_adam``: ``deepspeed.ops.adam.DeepSpeedCPUAdam`` (AdamW mode). Validation has already
    refused the combinations that cannot run (:func:`dapo_cli.config.validate.optimizer_problem`)."""
    if name == "fused_adam":
        return "FusedAdam", {"adam_w_mode": True}
    if name == "cpu_adam":
        return "DeepSpeedCPUAdam", {"adamw_mode": True}
    if name != "torch":
        raise ValueError(f"unknown engine.optimizer {name!r}")
    on_cuda = device_type == "cuda" and not offload_optimizer
    return "torch.optim.AdamW", ({"fused": True} if on_cuda else {})


def build_optimizer(
    name: str, params: list[torch.nn.Parameter], *, lr: float, weight_decay: float, device_type: str, offload_optimizer: bool
) -> torch.optim.Optimizer:
    """The optimizer of :func:`optimizer_choice` over ``params``. DeepSpeed's build theirs on construction (a JIT
    compile); one that cannot be built (no nvcc / CUDA_HOME, a toolkit that does not match torch, no compiler)
    raises a one-line :class:`~dapo_cli.errors.UserError` naming ``engine.optimizer=torch`` as the fix."""
    kind, extra = optimizer_choice(name, device_type=device_type, offload_optimizer=offload_optimizer)
    common = dict(lr=lr, weight_decay=weight_decay, betas=BETAS, eps=1e-8)
    if kind == "torch.optim.AdamW":
        return torch.optim.AdamW(params, **common, **extra)
    import subprocess

    from deepspeed.ops import adam
    from deepspeed.ops.op_builder.builder import CUDAMismatchException, MissingCUDAException

    # what DeepSpeed's op builders raise when the JIT build cannot run or fails (no CUDA_HOME / nvcc, a toolkit
    # that does not match torch, no ninja or compiler, the compile failing, the built library not loading)
    failed = (MissingCUDAException, CUDAMismatchException, RuntimeError, ImportError, OSError, subprocess.CalledProcessError)
    try:
        return getattr(adam, kind)(params, **common, **extra)
    except failed as exc:
        reason = (str(exc).strip().splitlines() or [""])[0][:200]
        raise UserError(
            f"engine.optimizer={name}: DeepSpeed could not build {kind} ({type(exc).__name__}: {reason}); "
            "set engine.optimizer=torch (torch.optim.AdamW, nothing to compile)"
        ) from None


def load_sharded(path: str | Path, *, dtype: torch.dtype, config: dict[str, Any]) -> torch.nn.Module:
    """The causal LM of the folder ``path`` with every parameter a ZeRO-3 shard from the start: host memory per rank
    is a shard of the model plus one tensor, never the whole model (``transformers``' own load would build it whole).

    The model is built under ``deepspeed.zero.Init`` (``config``: the engine's DeepSpeed config; each parameter is
    partitioned as its module is created). Then each parameter in turn is gathered with
    ``GatheredParameters(modifier_rank=0)``; rank 0 copies the file's tensor into it (read memory-mapped from
    its ``*.safetensors`` file, one tensor at a time) and on exit DeepSpeed broadcasts it and keeps each
    rank's partition. A tied output head is the embedding's parameter (filled once). A folder without
    safetensors weights is loaded whole (``models.load_policy``) and partitioned by ``deepspeed.initialize``."""
    import deepspeed
    import torch.distributed as tdist
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    from dapo_cli.models.loading import load_policy, local_model_dir, safetensors_index

    index = safetensors_index(path)
    if index is None:
        return load_policy(path, device="cpu", dtype=dtype)[0]
    local = local_model_dir(path)
    try:  # transformers' own ZeRO-3 build: skip the random init (it indexes into empty partitions), keep RoPE's dtype
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers 4
        from transformers.modeling_utils import no_init_weights
    try:
        from transformers.integrations.deepspeed import prevent_arange_dtype_change
    except ImportError:
        prevent_arange_dtype_change = contextlib.nullcontext
    with no_init_weights(), prevent_arange_dtype_change(), deepspeed.zero.Init(config_dict_or_path=config, dtype=dtype):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(local), dtype=dtype)
    model.tie_weights()  # a tied head is the embedding's parameter (from_pretrained ties after its load too)
    main = not tdist.is_initialized() or tdist.get_rank() == 0
    missing = [name for name, _ in model.named_parameters() if name not in index]
    if missing:
        raise UserError(f"cannot load model from {local}: its weights lack {missing[0]} (and {len(missing) - 1} more); "
                        "re-save it or give another model directory")
    for name, param in model.named_parameters():
        with deepspeed.zero.GatheredParameters([param], modifier_rank=0):
            if main:
                with safe_open(str(index[name]), "pt") as f, torch.no_grad():
                    param.copy_(f.get_tensor(name))
    return model


def reference_config(zero_stage: int, bf16: bool) -> dict[str, Any]:
    """Inference-only engine for the frozen reference: sharded like the policy at stage 3."""
    return {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 3 if zero_stage == 3 else 0},
        "bf16": {"enabled": bf16},
        "steps_per_print": 2**31 - 1,
    }


def chunkable_plain_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The output head :func:`gathered_head_log_probs` may chunk: a bias-free ``nn.Linear`` of a model whose forward is
    ``lm_head(base_model(...))`` (``forward.PLAIN_HEAD_TYPES``), else None (the model's own forward then)."""
    config = getattr(model, "config", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if getattr(config, "model_type", None) not in PLAIN_HEAD_TYPES or type(head) is not torch.nn.Linear or head.bias is not None:
        return None
    return head if getattr(model, "base_model", model) is not model else None


class _GatheredHead(torch.autograd.Function):
    """``algo.logits.chunked_head_log_probs`` on the whole head weight of a ZeRO-3 parameter, gathered by the caller.

    Forward (inside ``GatheredParameters``): the chunked head on a detached view of the gathered weight, its own
    small graph kept for the backward (which therefore holds the head's gathered storage, ``[V, H]``, from the
    forward to the backward: DeepSpeed's ``free_param`` drops the parameter's reference, not the storage). Backward:
    that graph's gradients, ``∂h`` to the backbone and ``∂W`` (full shape) to the parameter, whose ZeRO-3 hook
    reduce-scatters it into the partitions as for any module's weight."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, chunk, with_entropy, grad):  # type: ignore[override]
        h = hidden.detach().requires_grad_(grad and hidden.requires_grad)
        w = weight.detach().requires_grad_(grad and weight.requires_grad)
        with torch.set_grad_enabled(grad):
            logp, ent = chunked_head_log_probs(h, w, None, targets, temperature=temperature, chunk=chunk, with_entropy=with_entropy)
        ctx.graph = (h, w, logp, ent)
        return logp.detach(), (ent.detach() if ent is not None else torch.zeros_like(logp))

    @staticmethod
    def backward(ctx, g_logp, g_ent):  # type: ignore[override]
        h, w, logp, ent = ctx.graph
        outs, grads = [logp], [g_logp]
        if ent is not None:
            outs, grads = [logp, ent], [g_logp, g_ent]
        inputs = [t for t in (h, w) if t.requires_grad]
        got = iter(torch.autograd.grad(outs, inputs, grads, allow_unused=True))
        ctx.graph = None
        return (next(got) if h.requires_grad else None), (next(got) if w.requires_grad else None), None, None, None, None, None


def gathered_head_log_probs(
    ds: Any, model: Any, inner: torch.nn.Module, batch: RolloutBatch, *, temperature: float, with_entropy: bool,
    device: torch.device, chunk: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``forward.plain_log_probs`` with the chunked head, at any ZeRO stage (at 0-2 the gather is a no-op): the model runs through ``model`` (the
    DeepSpeed engine, its hooks gathering each layer) keeping the logits of one position only; the backbone's
    last hidden states (a forward hook) at the real response positions go through the head in ``chunk`` rows,
    its weight gathered for the call (``GatheredParameters(head.weight, modifier_rank=None)``, :class:`_GatheredHead`)."""
    prompt_ids, prompt_mask = batch.prompt_ids.to(device), batch.prompt_mask.to(device)
    response_ids, response_mask = batch.response_ids.to(device), batch.response_mask.to(device)
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    attention = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = (attention.long().cumsum(-1) - 1).clamp(min=0)
    n, t = response_ids.shape
    seen: list[torch.Tensor] = []
    backbone = inner.base_model
    handle = backbone.register_forward_hook(lambda _m, _i, out: seen.append(out.last_hidden_state))
    try:
        model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids, logits_to_keep=1, use_cache=False)
    finally:
        handle.remove()
    layout = Packing(response_mask.reshape(-1).nonzero().squeeze(1), n * t)
    hidden = layout.pack(seen[-1][:, -(t + 1) : -1].reshape(n * t, -1))
    targets = layout.pack(response_ids.reshape(-1)).long()
    weight = inner.get_output_embeddings().weight
    with ds.zero.GatheredParameters([weight], modifier_rank=None):
        grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
        logp, ent = _GatheredHead.apply(hidden, weight, targets, float(temperature), int(chunk), bool(with_entropy), grad)
    return layout.unpack(logp).view(n, t), (layout.unpack(ent).view(n, t) if with_entropy else None)


class DeepSpeedEngine:
    """:class:`~dapo_cli.engine.base.TrainingEngine` on ``deepspeed.initialize``."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        dist: Collective,
        lr: float,
        weight_decay: float,
        warmup_steps: int,
        grad_clip: float,
        zero_stage: int,
        bf16: bool = False,
        offload_optimizer: bool = False,
        offload_params: bool = False,
        device: str = "auto",
        ref_model: torch.nn.Module | None = None,
        optimizer: str = "torch",
        logprob_chunk: int = 0,
        zero_extra: dict[str, Any] | None = None,
    ) -> None:
        import deepspeed

        self._ds = deepspeed
        self.dist = dist
        self.device = pick_device(device, dist.local_rank)
        self.zero_stage = zero_stage
        config = deepspeed_config(
            zero_stage=zero_stage, bf16=bf16, grad_clip=grad_clip, offload_optimizer=offload_optimizer,
            offload_params=offload_params,
        )
        config["zero_optimization"].update(zero_extra or {})  # tests: stage3_param_persistence_threshold 0 shards every tensor
        self.chunk = logprob_chunk
        factor = warmup_constant(warmup_steps)

        def schedule(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
            return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)

        params = [p for p in model.parameters() if p.requires_grad]
        client = build_optimizer(
            optimizer, params, lr=lr, weight_decay=weight_decay, device_type=self.device.type, offload_optimizer=offload_optimizer,
        )
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, model_parameters=params, optimizer=client, lr_scheduler=schedule, config=config,
            dist_init_required=True,
        )
        self.module: torch.nn.Module = self.engine.module
        self.module.train()
        if zero_stage == 0:
            self.engine.enable_backward_allreduce = False  # _step_stage0 reduces, once
        self.ref: Any = None
        if ref_model is not None:
            ref_model = frozen(ref_model)
            if zero_stage == 3:
                self.ref, *_ = deepspeed.initialize(model=ref_model, config=reference_config(zero_stage, bf16))
                self.ref.module.eval()
            else:
                self.ref = ref_model.to(self.device)

    # ------------------------------------------------------------ forward / backward / step

    def log_probs(
        self, batch: RolloutBatch, *, temperature: float, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self._forward(self.engine, batch, temperature=temperature, with_entropy=with_entropy)

    def ref_log_probs(self, batch: RolloutBatch, *, temperature: float) -> torch.Tensor:
        if self.ref is None:
            return reference_log_probs(None, batch, temperature=temperature, device=self.device)
        with torch.no_grad():
            return self._forward(self.ref, batch, temperature=temperature, with_entropy=False)[0]

    def _forward(
        self, model: Any, batch: RolloutBatch, *, temperature: float, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The plain forward; with ``logprob_chunk`` > 0 and a plain head, through the chunked head
        (:func:`gathered_head_log_probs`: no ``[N, T+1, V]`` logits), else the model's logits of the last T + 1 positions."""
        inner = getattr(model, "module", model)
        if self.chunk > 0 and chunkable_plain_head(inner) is not None:
            return gathered_head_log_probs(self._ds, model, inner, batch, temperature=temperature, with_entropy=with_entropy,
                                   device=self.device, chunk=self.chunk)
        return policy_forward(model, batch, temperature=temperature, with_entropy=with_entropy, device=self.device)

    def accumulate(self, *, last: bool) -> contextlib.AbstractContextManager[None]:
        """No-op: with unmanaged accumulation, ``step`` is the boundary."""
        return no_context()

    def backward(self, loss: torch.Tensor) -> None:
        # DeepSpeed averages over ranks; the loss is a sum over ranks → scale by the world size.
        self.engine.backward(loss * self.dist.world_size, scale_wrt_gas=False)

    def step(self) -> tuple[float, bool]:
        if self.zero_stage == 0:
            return self._step_stage0()
        self.engine.step()  # ZeRO 1-3: DeepSpeed's overflow check skips a non-finite step
        applied = bool(self.engine.was_step_applied())
        norm = self.engine.get_global_grad_norm()
        self.engine.zero_grad()
        return (float(norm) if applied and norm is not None else math.nan), applied

    def _step_stage0(self) -> tuple[float, bool]:
        """Stage 0 has no overflow check and reports no norm: average the gradients here
        (DeepSpeed's own reduce in ``step`` is switched off), check and measure them, then step."""
        self.engine.buffered_allreduce_fallback()
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) if grads else 0.0
        applied = math.isfinite(norm)  # the averaged gradients are identical on every rank
        if applied:
            self.engine.step()
        self.engine.zero_grad()
        return (norm if applied else math.nan), applied

    @property
    def lr(self) -> float:
        return float(self.engine.get_lr()[0])

    # ------------------------------------------------------------ weights

    def generation_model(self) -> torch.nn.Module | None:
        return None if self.zero_stage == 3 else self.module

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        if self.zero_stage != 3:
            yield from self.module.state_dict().items()
            return
        # keep_vars: the Parameter objects themselves (tied weights appear under each name)
        for name, tensor in self.module.state_dict(keep_vars=True).items():
            if not hasattr(tensor, "ds_id"):  # a buffer: never partitioned
                yield name, tensor.detach()
                continue
            with self._ds.zero.GatheredParameters([tensor], modifier_rank=None):
                yield name, tensor.detach()

    def params_finite(self) -> bool:
        """Every parameter finite on every rank. Each rank checks what it holds, ZeRO-3's local partition
        (``ds_tensor``; its padding is zeros) without gathering anything; one all-reduce of the flag."""
        local = [getattr(p, "ds_tensor", p) for p in self.module.parameters()] + list(self.module.buffers())
        bad = any(not bool(torch.isfinite(t).all()) for t in local)
        return not bool(self.dist.all_reduce(torch.tensor([float(bad)]), "max").item())

    # ------------------------------------------------------------ checkpoints

    def save_checkpoint(self, directory: Path) -> None:
        """DeepSpeed's sharded checkpoint (module, optimizer partitions, schedule); every rank writes its part."""
        self.engine.save_checkpoint(str(directory), tag=CHECKPOINT_TAG)

    def load_checkpoint(self, directory: Path) -> None:
        """DeepSpeed reads its own files (``state/*.pt``) with ``torch.load`` unrestricted, i.e. it unpickles them:
        resume only checkpoints you trust (docs/reliability.md). ``dapo eval`` never opens ``engine/``."""
        path, _ = self.engine.load_checkpoint(
            str(directory), tag=CHECKPOINT_TAG, load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint under {directory}")

    def save_model(self, directory: Path, tokenizer: Any) -> None:
        """Gathers full tensors (a collective at stage 3) and writes a ``save_pretrained`` dir on rank 0."""
        state: dict[str, torch.Tensor] = {}
        for name, tensor in self.export_weights():  # every rank iterates: a collective at stage 3
            if self.dist.is_main:
                state[name] = tensor.detach().cpu().clone()
        if self.dist.is_main:
            from dapo_cli.models import save_policy

            save_policy(self.module, tokenizer, directory, state_dict=state)
