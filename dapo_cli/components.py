"""The one factory: training engines, rollout engines and trackers, built from config sections.

Every command (``train``, ``eval``, ``train --algo direct-advantage``, ``ablate``'s children, the
``builtin:tiny`` warm-start) gets its components here; nothing else constructs an engine, so adding
one (vLLM, a faster sampler, another algorithm's trainer) means one registry entry::

    dist    = build_collective(cfg.engine)                          # SingleProcess, or gloo/nccl under torchrun
    engine  = build_training_engine(cfg.engine, model, dist, lr=...) # torch (+DDP, + LoRA) | deepspeed (ZeRO 0-3)
    rollout = build_train_rollout(cfg.rollout, engine, ...)         # fast | hf | vllm, synced from engine.export_weights()
    rollout = build_policy_rollout("hf", model, tokenizer)          # fast | hf on a module in this process
    tracker = open_tracker(cfg.tracking, dist, ...)                 # MLflow on rank 0, NullTracker elsewhere

Builders take the settings they use (a config section and plain values), never a whole ``Config``,
and only build: settings are checked before anything loads, by ``config/validate.py`` (rules about
values) and ``cli/preflight.py`` (packages, devices and paths of this machine).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from dapo_cli.config.schema import (
    LOCAL_ROLLOUT_ENGINES, ROLLOUT_ENGINES, EngineConfig, LoraConfig, RolloutConfig, TrackingConfig,
)
from dapo_cli.config.validate import lora_engine_problem
from dapo_cli.engine.base import TrainingEngine
from dapo_cli.engine.dist import Collective, init_collective
from dapo_cli.errors import LISTED_AS_NAMES, UserError, unknown_name
from dapo_cli.rollout.base import RolloutEngine
from dapo_cli.tracking import NullTracker, Tracker, start_run


PromptFormatter = Callable[[Sequence[Mapping[str, str]]], str]


def build_collective(engine_cfg: EngineConfig) -> Collective:
    """This process's ranks from the launcher's environment (a plain process: a world of one)."""
    return init_collective(engine_cfg.device)


# ---------------------------------------------------------------- training engines


def training_device(engine_cfg: EngineConfig, dist: Collective) -> torch.device:
    """Where a training engine puts this rank's policy: ``engine.device`` (auto: cuda when visible)."""
    from dapo_cli.engine.torch import pick_device

    return pick_device(engine_cfg.device, dist.local_rank)


def build_training_engine(
    engine_cfg: EngineConfig, model: torch.nn.Module, dist: Collective, *, lr: float, weight_decay: float,
    warmup_steps: int, grad_clip: float, bf16: bool, load_reference: Callable[[], torch.nn.Module] | None,
    lora: LoraConfig | None = None,
) -> TrainingEngine:
    """``engine.name`` → an engine on ``model`` with AdamW at ``lr``; ``load_reference`` (given when the
    loss has a KL term) builds a fresh frozen copy of the reference policy (never a deepcopy of possibly
    sharded parameters). ``bf16``: DeepSpeed's bf16 mode (the policy is bfloat16). ``lora`` with a rank > 0:
    the torch engine trains LoRA adapters on ``model`` (the base), and the KL reference is that base with
    the adapters off (``load_reference`` is then not called)."""
    e = engine_cfg
    lora_rank = lora.rank if lora is not None else 0
    if (problem := lora_engine_problem(e.name, lora_rank)) is not None:
        raise UserError(problem)
    # with LoRA the reference is the base: the policy's forward with its adapters off, no copy loaded
    ref = load_reference() if load_reference is not None and lora_rank == 0 else None
    common = dict(lr=lr, weight_decay=weight_decay, warmup_steps=warmup_steps, grad_clip=grad_clip, ref_model=ref)
    if e.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if e.name == "deepspeed":
        from dapo_cli.engine.deepspeed import DeepSpeedEngine
        from dapo_cli.engine.dist import ensure_single_process_env

        if dist.world_size == 1:
            ensure_single_process_env()  # DeepSpeed wants the launcher's variables even alone

        return DeepSpeedEngine(
            model, dist=dist, zero_stage=e.zero_stage, bf16=bf16,
            offload_optimizer=e.offload_optimizer, offload_params=e.offload_params, device=e.device,
            optimizer=e.optimizer, logprob_chunk=e.logprob_chunk, **common,
        )
    from dapo_cli.engine.torch import TorchEngine

    adapters = None
    if lora is not None and lora_rank > 0:
        from dapo_cli.engine.lora import LoraAdapters

        adapters = LoraAdapters(model, rank=lora.rank, alpha=lora.alpha, target_modules=lora.target_modules, dropout=lora.dropout)
    return TorchEngine(
        model, device=e.device, dist=dist, shared_prompt_forward=e.shared_prompt_forward, logprob_chunk=e.logprob_chunk,
        autocast=e.autocast, adapters=adapters, base_reference=adapters is not None and load_reference is not None, **common,
    )


# ---------------------------------------------------------------- rollout engines


def build_policy_rollout(
    name: str, model: torch.nn.Module, tokenizer: Any, *, batch_size: int = 0, shares_weights: bool = True
) -> RolloutEngine:
    """An in-process engine (``fast``: ``rollout/fast.py``'s own decode loop, ``hf``: transformers'
    ``generate``) sampling with ``model``; ``batch_size`` sequences per generate call (0: all at once)."""
    if name == "fast":
        from dapo_cli.rollout.fast import FastRolloutEngine as Engine
    elif name == "hf":
        from dapo_cli.rollout.hf import HFRolloutEngine as Engine
    else:
        raise unknown_name("engine", name, ROLLOUT_ENGINES, listed=LISTED_AS_NAMES)
    return Engine(model, tokenizer, batch_size=batch_size or None, shares_weights=shares_weights)


def load_policy_rollout(
    name: str, path: str | Path, *, device: str | torch.device, dtype: torch.dtype, batch_size: int = 0
) -> tuple[RolloutEngine, Any]:
    """The policy at ``path`` loaded on ``device`` and an in-process engine (fast | hf) on it; its tokenizer."""
    from dapo_cli.models.loading import load_policy

    policy, tokenizer = load_policy(path, device=device, dtype=dtype)
    return build_policy_rollout(name, policy, tokenizer, batch_size=batch_size), tokenizer


def build_train_rollout(
    rollout_cfg: RolloutConfig, engine: TrainingEngine, tokenizer: Any, load_copy: Callable[[], torch.nn.Module],
    model_path: str | Path, *, max_model_len: int, max_sequences: int, dtype: str, seed: int,
    note: Callable[[str], None] | None = None,
) -> RolloutEngine:
    """The rollout engine of a training run.

    ``fast`` (the default; ``rollout/fast.py``, its own decode loop) and ``hf`` (transformers'
    ``generate``): sample with the trainer's live module when it is unsharded, else with a private
    copy (``load_copy()``) that ``sync_weights(engine)`` refreshes after each update. ``vllm``: a
    colocated engine on ``model_path`` (the policy the trainer starts from; ``max_model_len`` tokens of
    prompt + response, ``max_sequences`` of them in one generate call (what its KV cache is sized for on
    CPU), weights in ``rollout.dtype`` (auto: bfloat16 on GPUs, the policy's ``dtype`` on CPU;
    ``rollout.vllm.serving_dtype``), sampling seeded by ``seed``), synced the same way (and again from
    ``engine`` when it wakes from a level-2 sleep), on
    whichever platform vLLM finds (CUDA, or its CPU build). ``note`` hears what the user should know
    about how the engine runs here (once each).
    """
    r = rollout_cfg
    if r.engine == "vllm":
        from dapo_cli.rollout.vllm import VLLMRolloutEngine, platform_info, serving_dtype

        return VLLMRolloutEngine(
            model_path, tokenizer, gpu_memory_utilization=r.gpu_memory_utilization, tensor_parallel_size=r.tensor_parallel_size,
            sleep_level=r.sleep_level, max_model_len=max_model_len, kv_cache_gib=r.kv_cache_gib, max_sequences=max_sequences,
            dtype=serving_dtype(r.dtype, dtype, platform_info()["device"]), seed=seed, dist=engine.dist, note=note,
            weights=engine,
        )
    live = engine.generation_model()
    if live is not None:
        return build_policy_rollout(r.engine, live, tokenizer, batch_size=r.batch_size, shares_weights=True)
    copy = load_copy().to(engine.device)
    rollout = build_policy_rollout(r.engine, copy, tokenizer, batch_size=r.batch_size, shares_weights=False)
    rollout.sync_weights(engine)
    return rollout


def build_eval_rollout(
    name: str, model: str, batch_size: int, log: Callable[[str], None], *,
    messages: Sequence[Any] = (), max_tokens: int = 0, max_sequences: int = 0, tensor_parallel_size: int = 1,
) -> tuple[RolloutEngine, PromptFormatter]:
    """``dapo eval``'s engine on a checkpoint or hub id, with the prompt formatter of its tokenizer
    (``--engine vllm`` is checked by the command's preflight). vLLM's is sized for the evaluation: its
    context for the longest of ``messages`` plus ``max_tokens``, its KV cache on CPU for ``max_sequences``
    sequences in one generate call, across ``tensor_parallel_size`` GPUs."""
    from dapo_cli.models.tokenizer import format_prompt

    if name in LOCAL_ROLLOUT_ENGINES:
        device, dtype = ("cuda", torch.bfloat16) if torch.cuda.is_available() else ("cpu", torch.float32)
        log(f"loading {model} on {device}")
        engine, tokenizer = load_policy_rollout(name, model, device=device, dtype=dtype, batch_size=batch_size)
        return engine, lambda m: format_prompt(tokenizer, m)
    if name == "vllm":
        from dapo_cli.rollout import vllm as vllm_rollout

        log(f"loading {model} with vLLM")
        sizing: dict[str, Any] = {"max_sequences": max_sequences} if max_sequences else {}
        engine, tokenizer = vllm_rollout.load_vllm_engine(
            model, messages=messages, max_tokens=max_tokens, note=log, tensor_parallel_size=tensor_parallel_size, **sizing,
        )
        return engine, lambda m: format_prompt(tokenizer, m)
    raise unknown_name("engine", name, ROLLOUT_ENGINES, listed=LISTED_AS_NAMES)


# ---------------------------------------------------------------- trackers


@contextlib.contextmanager
def open_tracker(tracking_cfg: TrackingConfig, dist: Collective, run_name: str, **kwargs: Any) -> Iterator[Tracker]:
    """The run's tracker on rank 0 (``start_run``: MLflow or null); a ``NullTracker`` on other ranks."""
    if not dist.is_main:
        yield NullTracker()
        return
    with start_run(tracking_cfg, run_name, background=tracking_cfg.background, **kwargs) as tracker:
        yield tracker


def sharded_model_loader(
    engine_cfg: EngineConfig, path: str | Path, dtype: torch.dtype, *, bf16: bool, reference: bool = False
) -> Callable[[], torch.nn.Module] | None:
    """Under DeepSpeed ZeRO-3, a loader that builds the policy at ``path`` already partitioned
    (``engine.deepspeed.load_sharded``: host memory per rank is a shard), with the zero config of the engine
    (``reference``: of the frozen reference's engine) it is handed to; None at any other engine or stage
    (the whole model is loaded, :func:`model_loader`). Call it after :func:`build_collective`."""
    e = engine_cfg
    if e.name != "deepspeed" or e.zero_stage != 3:
        return None

    def load() -> torch.nn.Module:
        from dapo_cli.engine.deepspeed import deepspeed_config, load_sharded, reference_config
        from dapo_cli.engine.dist import ensure_single_process_env

        ensure_single_process_env()  # zero.Init starts DeepSpeed's process group when alone
        config = reference_config(3, bf16) if reference else deepspeed_config(
            zero_stage=3, bf16=bf16, grad_clip=0.0, offload_optimizer=e.offload_optimizer, offload_params=e.offload_params,
        )
        return load_sharded(path, dtype=dtype, config=config)

    return load


def model_loader(path: str | Path, dtype: torch.dtype) -> Callable[[], torch.nn.Module]:
    """A function that loads a fresh copy of the policy at ``path`` (reference / rollout copies)."""

    def load() -> torch.nn.Module:
        from dapo_cli.models import load_policy

        model, _ = load_policy(path, device="cpu", dtype=dtype)
        return model

    return load
