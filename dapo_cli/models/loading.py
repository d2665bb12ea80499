"""Find and load a policy: ``builtin:tiny``, a local ``save_pretrained`` folder, or a hub id.

``resolve_model`` turns a model spec into a path without building anything (the
tiny policy's cache folder, built by :func:`dapo_cli.warmstart.ensure_model` on first
use); ``load_policy`` loads a path or hub id into a causal LM and
a left-padding tokenizer. Everything works offline for local folders; a hub id
resolves to its snapshot in the standard Hugging Face cache (``HF_HOME`` /
``HF_HUB_CACHE``; :mod:`dapo_cli.models.hub`), downloaded into it only when it is
missing and the hub is reachable (and ``HF_HUB_OFFLINE`` unset), and otherwise
fails with a one-line :class:`UserError` that says to give a local directory. Either
way the folder is loaded the same way, so a cached hub model and a local copy of it
behave alike.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from dapo_cli.config.tiny import TinyModelConfig
from dapo_cli.errors import UserError
from dapo_cli.models.door import FIX_TOKENIZER, folder_problem, nonfinite_tensor, read_json_object, tokenizer_problem
from dapo_cli.models.gguf import GGUF_PREFIX, named_model_dir
from dapo_cli.models.hub import first_line as _first_line
from dapo_cli.models.hub import hub_offline, hub_reachable, is_hub_id, model_snapshot  # noqa: F401 (re-exported)
from dapo_cli.models.tiny import quiet_hf_progress
from dapo_cli.models.tokenizer import format_prompt
from dapo_cli.redact import escape_controls

__all__ = [
    "BUILTIN_MODELS", "MODEL_CARD", "check_model_dir", "default_cache_dir", "format_prompt", "load_policy",
    "model_dir_problem", "resolve_model", "tiny_cache_path",
]

MODEL_CARD = "dapo_model.json"
"""File beside the weights that marks a directory as a ``builtin:tiny`` build (written last)."""

BUILTIN_MODELS: tuple[str, ...] = ("builtin:tiny",)
"""Model specs the project builds itself."""

NAMED_MODEL_PREFIXES: tuple[str, ...] = ("builtin:", GGUF_PREFIX)
"""Spec prefixes that :func:`resolve_model` turns into a cached folder (``builtin:`` built by
:func:`dapo_cli.warmstart.ensure_model`, ``gguf:`` imported by :func:`~dapo_cli.models.gguf.named_model_dir`)."""

GENERIC_TOKENIZER_CLASSES = frozenset({"PreTrainedTokenizerFast", "TokenizersBackend"})
"""``tokenizer_class`` values that mean "exactly the tokenizer.json in this folder".

``AutoTokenizer`` overrides them by model type (beside a ``qwen2`` config it builds a
byte-level Qwen2 tokenizer that drops spaces and newlines), so such folders -- all
tiny-policy folders and their checkpoints -- are loaded with
``PreTrainedTokenizerFast`` directly."""

def default_cache_dir() -> Path:
    """Where built-in models are cached: ``$DAPO_CACHE`` if set, else ``~/.cache/dapo``."""
    env = os.environ.get("DAPO_CACHE", "")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dapo"


def tiny_cache_path(tiny: TinyModelConfig, cache_dir: Path | None = None) -> Path:
    """Where ``builtin:tiny`` with these settings lives: ``<cache_dir>/tiny-<fingerprint>``."""
    return (cache_dir or default_cache_dir()) / f"tiny-{tiny.fingerprint()}"


def resolve_model(spec: str, tiny: TinyModelConfig, cache_dir: Path | None = None) -> Path:
    """Path (or, for a hub id, a ``Path`` whose string is the id) that :func:`load_policy` accepts.

    ``builtin:tiny`` resolves to ``<cache_dir>/tiny-<tiny.fingerprint()>`` whether or not it is
    built yet: this function never builds it (a dry run or a check must not spend minutes on a
    warm-start), so a caller that loads the weights calls :func:`dapo_cli.warmstart.ensure_model`,
    which builds a missing one; ``(path / MODEL_CARD).is_file()`` says whether it is there.
    ``gguf:NAME`` resolves to the imported folder of a registered GGUF
    (:func:`dapo_cli.models.gguf.named_model_dir`). Any other spec is returned as a path (``~`` expanded);
    :func:`load_policy` treats one that does not exist locally as a hub id.
    """
    if spec.startswith("builtin:"):
        if spec not in BUILTIN_MODELS:
            raise UserError(f"unknown built-in model '{spec}' (valid: {', '.join(BUILTIN_MODELS)})")
        return tiny_cache_path(tiny, cache_dir)
    if spec.startswith(GGUF_PREFIX):
        return named_model_dir(spec[len(GGUF_PREFIX) :], cache_dir or default_cache_dir())
    return Path(spec).expanduser()


def load_policy(
    path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer from a local folder or a hub id.

    The tokenizer pads on the left (prompts end where generation starts) and uses
    EOS as pad when it has no pad token. Raises :class:`UserError` for a missing or
    invalid folder, and for a hub id that cannot be fetched (offline, unreachable,
    unknown) unless it is in the local Hugging Face cache.
    """
    model, tokenizer = _load_local(local_model_dir(path), dtype)
    return model.to(device), _for_generation(tokenizer)


def local_model_dir(path: str | Path) -> Path:
    """The folder ``path`` names: itself when it exists, else the hub cache's snapshot of a hub id
    (downloaded into the cache when online; see :mod:`dapo_cli.models.hub`)."""
    spec = str(path)
    local = Path(path).expanduser()
    if local.exists():
        return local
    if is_hub_id(spec):
        return model_snapshot(spec)
    raise UserError(f"model directory not found: {spec} (give a folder written by save_pretrained)")


def safetensors_index(path: str | Path) -> dict[str, Path] | None:
    """Which ``*.safetensors`` file of the model folder ``path`` holds each tensor (``model.safetensors``, or the
    shards of ``model.safetensors.index.json``); None when the folder has no safetensors weights (a ``*.bin`` folder).
    Checks the folder as :func:`load_policy` does (one-line :class:`UserError`)."""
    local = local_model_dir(path)
    if not local.is_dir() or not (local / "config.json").is_file():
        raise UserError(f"{local} is not a model directory (no config.json); give a folder written by save_pretrained")
    check_model_dir(local)
    index = local / "model.safetensors.index.json"
    if index.is_file():
        data, _ = read_json_object(index)  # checked by check_model_dir: an object with a weight_map object
        return {name: local / str(shard) for name, shard in (data or {})["weight_map"].items()}
    single = local / "model.safetensors"
    if not single.is_file():
        return None
    from safetensors import safe_open

    with safe_open(str(single), "pt") as f:
        return {name: single for name in f.keys()}


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer of a local folder or cached hub id, set up as :func:`load_policy` sets it up."""
    local = local_model_dir(path)
    if local.is_dir() and (problem := tokenizer_problem(local)):
        raise problem.error()
    return _for_generation(_read_tokenizer(local))


def _for_generation(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Left padding (prompts end where generation starts); EOS as pad when there is no pad token."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_errors() -> tuple[type[BaseException], ...]:
    """What loading a broken model folder raises: I/O and format errors of transformers, tokenizers,
    torch (a corrupt ``pytorch_model.bin``) and safetensors (a corrupt or truncated ``*.safetensors``)."""
    errors: list[type[BaseException]] = [OSError, ValueError, KeyError, EOFError, RuntimeError]
    try:
        from safetensors import SafetensorError

        errors.append(SafetensorError)
    except ImportError:  # pragma: no cover - transformers requires safetensors
        pass
    import pickle

    errors.append(pickle.UnpicklingError)
    return tuple(errors)




def model_dir_problem(path: Path) -> str | None:
    """Why the ``save_pretrained`` folder ``path`` cannot load (None: it looks loadable).

    Cheap (the JSON files, the safetensors headers and a bounded probe of the chat template, no
    weights; :func:`dapo_cli.models.door.folder_problem`), so commands check a model before they create
    outputs, run directories or MLflow runs.
    """
    problem = folder_problem(path)
    return None if problem is None else problem.line


def check_model_dir(path: Path) -> None:
    """:func:`model_dir_problem` as a one-line :class:`UserError` saying what to do."""
    problem = folder_problem(path)
    if problem:
        raise problem.error()


def _load_local(path: Path, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    if not path.is_dir() or not (path / "config.json").is_file():
        raise UserError(
            f"{path} is not a model directory (no config.json); give a folder written by "
            "save_pretrained (a dapo checkpoint, a downloaded Qwen2.5) or builtin:tiny"
        )
    check_model_dir(path)
    tokenizer = _read_tokenizer(path)
    try:
        with quiet_hf_progress(), held_hf_warnings() as held:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except torch.cuda.OutOfMemoryError:  # memory is not the folder's fault: keep the traceback
        raise
    except load_errors() as exc:
        detail = _report_row(held)
        why = f"its weights do not fit its config.json ({detail})" if detail else f"{type(exc).__name__}: {_first_line(exc)}"
        raise UserError(f"cannot load model from {path}: {escape_controls(why)}; re-save it or give another model directory") from None
    bad = nonfinite_tensor(model)
    if bad is not None:
        raise UserError(
            f"cannot load model from {path}: tensor '{escape_controls(bad)}' holds NaN/inf values; "
            "re-save it from a healthy checkpoint or give another model directory"
        )
    return model, tokenizer


def _read_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    """The tokenizer of the checked folder ``path``. The Rust ``tokenizers`` library reports a malformed
    ``tokenizer.json`` as a plain ``Exception``, so every ``Exception`` from reading these (already
    shape-checked, untrusted) files is the folder's fault: a one-line :class:`UserError`."""
    try:
        with quiet_hf_progress(), held_hf_warnings():
            return _tokenizer_class(path).from_pretrained(path)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        raise UserError(
            f"cannot load the tokenizer of {escape_controls(str(path))}: {type(exc).__name__}: "
            f"{escape_controls(_first_line(exc))}; {FIX_TOKENIZER}"
        ) from None


@contextlib.contextmanager
def held_hf_warnings() -> Iterator[list[logging.LogRecord]]:
    """Hold what transformers logs during a load: replayed when the load succeeds, dropped when it
    fails (the caller's one-line error replaces transformers' multi-line load report)."""
    logger = logging.getLogger("transformers")
    held: list[logging.LogRecord] = []

    class Hold(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            held.append(record)

    saved_handlers, saved_propagate = logger.handlers[:], logger.propagate
    logger.handlers, logger.propagate = [Hold(logging.WARNING)], False
    succeeded = False
    try:
        yield held
        succeeded = True
    finally:
        logger.handlers, logger.propagate = saved_handlers, saved_propagate
        if succeeded:
            for record in held:
                logger.handle(record)


def _report_row(records: list[logging.LogRecord]) -> str:
    """The first problem row of transformers' load report (``key | MISMATCH | ...``), on one line."""
    for record in records:
        for line in record.getMessage().splitlines():
            cells = [c.strip() for c in line.split("|")]
            if len(cells) >= 2 and cells[1] and cells[1] not in ("Status",) and not set(cells[0]) <= {"-", "+"}:
                return re.sub(r"\x1b\[[0-9;]*m", "", " ".join(c for c in cells if c))
    return ""


def _tokenizer_class(path: Path) -> type[PreTrainedTokenizerBase]:
    """``PreTrainedTokenizerFast`` for our own folders (see :data:`GENERIC_TOKENIZER_CLASSES`), else Auto."""
    if (path / MODEL_CARD).is_file():
        return PreTrainedTokenizerFast
    config_file = path / "tokenizer_config.json"
    if config_file.is_file() and (path / "tokenizer.json").is_file():
        config, _ = read_json_object(config_file)
        if config is not None and config.get("tokenizer_class") in GENERIC_TOKENIZER_CLASSES:
            return PreTrainedTokenizerFast
    return AutoTokenizer
