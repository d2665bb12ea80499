"""What a resumed run reads back from its checkpoint, checked field by field before any of it is restored.

``dapo train --resume`` continues from the newest complete checkpoint (:mod:`dapo_cli.checkpoint`):
``trainer_state.json`` (step, data position, collapse count, MLflow run id, validation results), every
rank's RNG state (``rng/rank_N.safetensors``) and the engine's optimizer and LR-schedule state
(``engine/optimizer.safetensors``). The session checks each here against the run's config, its data
and the model it has just built, before it restores anything, so before the MLflow run opens and before
anything is written. Unchecked, a wrong value failed late: ``random.setstate`` raised at the restore, and
optimizer moments of the wrong shape were taken by ``Optimizer.load_state_dict`` (which compares only
parameter counts) and crashed AdamW inside the first step, with the MLflow run open and then left FAILED.

Every check raises :class:`~dapo_cli.statefiles.StateFileError` ``<file>: <field> <what is wrong>``; the
caller turns it into :func:`~dapo_cli.statefiles.unreadable`'s one line (which checkpoint, and how to go on).
Which checkpoint is taken does not change: a file that cannot be read at all (what a crash, a full disk or a
copy cut short leaves) is passed over for the checkpoint before it (:func:`~dapo_cli.checkpoint.checkpoint_problem`),
but a file that reads and holds wrong values was edited, or comes from another run or model: it is refused,
never skipped without a word, and the message says to delete that checkpoint (``--resume`` then takes the one
before) or to start afresh.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from dapo_cli.redact import shown as shown_value
from dapo_cli.statefiles import StateFileError

REQUIRED_FIELDS = ("step", "stream", "barren_steps")
"""Fields of the trainer state every dapo wrote (older ones too); the others are optional."""

RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
"""An MLflow run id (32 hex digits for MLflow's own stores): what the tracker may look up, and print."""

PYTHON_STATE_WORDS = 625
"""Words of Python's Mersenne Twister state: 624 of state and the index (``random.getstate()[1]``)."""


@dataclass(frozen=True)
class TrainerState:
    """The checked trainer state of a checkpoint: what :meth:`TrainingSession.restore` continues from."""

    step: int
    barren_steps: int
    stream: dict[str, int]
    """``{"epoch": e, "position": p}``: where the prompt stream resumes."""
    mlflow_run_id: str | None
    base_val: float | None
    last_val: float | None


def shown(value: Any) -> str:
    """A saved value as a message quotes it: a tensor by its dtype and shape, anything else by
    :func:`~dapo_cli.redact.shown` (escaped, at most 60 characters)."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {list(value.shape)}"
    return shown_value(value)


def whole(value: Any, where: str, low: int, high: int | None = None, why: str = "") -> int:
    """``value`` when it is an int (not a bool) in ``[low, high]``; else a StateFileError naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise StateFileError(f"{where} is {shown(value)}, not a whole number")
    if value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise StateFileError(f"{where} is {shown(value)}; it must be {bound}{why}")
    return value


def real(value: Any, where: str, low: float = -math.inf, high: float = math.inf) -> float:
    """``value`` when it is a finite int or float (not a bool) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise StateFileError(f"{where} is {shown(value)}, not a finite number")
    if not low <= value <= high:
        raise StateFileError(f"{where} is {shown(value)}; it must be in [{low:g}, {high:g}]")
    return float(value)


def fields_of(state: Any, where: str, required: tuple[str, ...]) -> Mapping[str, Any]:
    """``state`` when it is a dict holding every ``required`` key."""
    if not isinstance(state, dict):
        raise StateFileError(f"{where} is {shown(state)}, not an object of fields")
    missing = [key for key in required if key not in state]
    if missing:
        raise StateFileError(f"{where} lacks {', '.join(missing)}")
    return state


# ---------------------------------------------------------------- trainer_state.json


def check_trainer_state(state: Any, file: str, *, checkpoint_step: int | None, num_prompts: int) -> TrainerState:
    """The fields of trainer state ``state`` (read from ``file``), each checked.

    ``step``: a whole number >= 0, the step in the checkpoint's name (``checkpoint_step``; None: a name
    that holds none). The caller compares it with ``trainer.total_steps``, a setting the resume may change.
    ``barren_steps``: in ``[0, step]`` (steps in a row without an informative group). ``stream``: ``epoch``
    >= 0 and ``position`` in ``[0, num_prompts]`` (the training prompts the run loaded; ``num_prompts``
    itself means the epoch is used up). ``mlflow_run_id``: absent, null, empty or an id of letters, digits,
    ``-`` and ``_``. ``base_val``, ``last_val``: absent, null or an accuracy in [0, 1]. ``world_size``:
    absent or >= 1. Fields this dapo does not know are left alone (a newer dapo may add some).
    """
    fields = fields_of(state, file, REQUIRED_FIELDS)
    step = whole(fields["step"], f"{file}: step", 0)
    if checkpoint_step is not None and step != checkpoint_step:
        raise StateFileError(f"{file}: step is {step}, but the checkpoint is step {checkpoint_step}")
    barren = whole(fields["barren_steps"], f"{file}: barren_steps", 0, step, " (steps in a row without an informative group)")
    stream = fields_of(fields["stream"], f"{file}: stream", ("epoch", "position"))
    epoch = whole(stream["epoch"], f"{file}: stream.epoch", 0)
    position = whole(stream["position"], f"{file}: stream.position", 0, num_prompts,
                     f" (the run has {num_prompts} training prompts)")
    run_id = fields.get("mlflow_run_id")
    if run_id is not None and not (isinstance(run_id, str) and (run_id == "" or RUN_ID.fullmatch(run_id))):
        raise StateFileError(f"{file}: mlflow_run_id is {shown(run_id)}, not an MLflow run id")
    vals = {}
    for key in ("base_val", "last_val"):
        value = fields.get(key)
        vals[key] = None if value is None else real(value, f"{file}: {key}", 0.0, 1.0)
    if fields.get("world_size") is not None:
        whole(fields["world_size"], f"{file}: world_size", 1)
    return TrainerState(step=step, barren_steps=barren, stream={"epoch": epoch, "position": position},
                        mlflow_run_id=run_id or None, base_val=vals["base_val"], last_val=vals["last_val"])


# ---------------------------------------------------------------- rng/rank_N.safetensors


def check_rng_state(state: Any, file: str) -> None:
    """An RNG state as :func:`~dapo_cli.checkpoint.rng_state` saves it: ``python``, what ``random.getstate()``
    returns (version, 625 words each < 2**32, the cached gauss value); ``torch``, a uint8 tensor as long as
    ``torch.get_rng_state()`` (the CPU generator's fixed-size state; torch's own ``set_state`` then checks
    its content); ``cuda`` (optional), a list of such tensors, at most one per visible GPU. Each is tried on
    a scratch generator, never on the process's own. No numpy state is saved (dapo draws nothing from numpy).
    """
    fields = fields_of(state, file, ("python", "torch"))
    python = fields["python"]
    words = python[1] if isinstance(python, tuple) and len(python) == 3 else None
    if words is None:
        raise StateFileError(f"{file}: python is {shown(python)}, not a state of Python's random (version, words, gauss)")
    if not (isinstance(words, tuple) and len(words) == PYTHON_STATE_WORDS):
        held = f"{len(words)} words" if isinstance(words, (tuple, list)) else shown(words)
        raise StateFileError(f"{file}: python[1] is {held}; Python's random keeps a tuple of {PYTHON_STATE_WORDS}")
    for i, word in enumerate(words):
        whole(word, f"{file}: python[1][{i}]", 0, 2**32 - 1)
    try:
        random.Random().setstate(python)
    except (TypeError, ValueError, OverflowError) as exc:
        raise StateFileError(f"{file}: python is not a state of Python's random ({exc})") from None
    _check_generator(fields["torch"], f"{file}: torch", torch.get_rng_state(), torch.Generator())
    if "cuda" not in fields:
        return
    cuda = fields["cuda"]
    if not isinstance(cuda, (list, tuple)):
        raise StateFileError(f"{file}: cuda is {shown(cuda)}, not a list of CUDA generator states")
    if not torch.cuda.is_available():  # set_rng_state leaves CUDA alone here; each entry is still a byte tensor
        for i, entry in enumerate(cuda):
            _check_generator(entry, f"{file}: cuda[{i}]", None, None)
        return
    if len(cuda) > torch.cuda.device_count():
        raise StateFileError(f"{file}: cuda holds {len(cuda)} GPU states; {torch.cuda.device_count()} GPU(s) are visible")
    for i, entry in enumerate(cuda):
        _check_generator(entry, f"{file}: cuda[{i}]", torch.cuda.get_rng_state(i), None)


def _check_generator(value: Any, where: str, like: torch.Tensor | None, scratch: torch.Generator | None) -> None:
    """``value`` is a 1-D uint8 tensor, as long as ``like`` (None: any length), that ``scratch`` accepts."""
    if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8 or value.dim() != 1:
        raise StateFileError(f"{where} is {shown(value)}, not a generator state (a 1-D uint8 tensor)")
    if like is not None and value.shape != like.shape:
        raise StateFileError(f"{where} holds {value.numel()} bytes; this torch's generator state is {like.numel()}")
    if scratch is not None:
        try:
            scratch.set_state(value.detach().to("cpu").clone())
        except RuntimeError as exc:
            raise StateFileError(f"{where} is not a valid generator state ({str(exc).splitlines()[0]})") from None


# ---------------------------------------------------------------- engine/optimizer.safetensors

ADAM_MOMENTS = ("exp_avg", "exp_avg_sq")
"""Per-parameter tensors of Adam/AdamW (``max_exp_avg_sq`` too with ``amsgrad``), beside its ``step``."""

HYPER_RANGES = {"lr": (0.0, math.inf), "initial_lr": (0.0, math.inf), "eps": (0.0, math.inf),
                "weight_decay": (0.0, math.inf), "betas": (0.0, 1.0), "base_lrs": (0.0, math.inf), "_last_lr": (0.0, math.inf)}
"""Ranges of the optimizer's hyperparameters (what AdamW's constructor enforces; its load does not)."""


def check_optimizer_state(state: Any, optimizer: torch.optim.Optimizer, scheduler: Any, file: str) -> None:
    """``{"optimizer": ..., "scheduler": ...}`` as the torch engine saves it, against the optimizer and LR
    schedule built for this run's model.

    ``optimizer``: as many parameter groups, each listing as many parameters (distinct ids) as the
    optimizer trains; each hyperparameter the optimizer has of the same kind (a number finite and in
    :data:`HYPER_RANGES`, a flag a bool, a pair a pair); a per-parameter entry only for a listed id, with
    every tensor of that parameter's shape, floating point and finite (Adam's ``exp_avg_sq`` >= 0), Adam's
    entries exactly ``step`` and its moments, ``step`` one finite number >= 0. ``scheduler``: the keys its
    ``load_state_dict`` needs, each value of the kind the current schedule holds, one LR per group.
    """
    fields = fields_of(state, file, ("optimizer", "scheduler"))
    saved = fields_of(fields["optimizer"], f"{file}: optimizer", ("state", "param_groups"))
    groups, saved_groups = optimizer.param_groups, saved["param_groups"]
    if not isinstance(saved_groups, list) or len(saved_groups) != len(groups):
        count = f"{len(saved_groups)} groups" if isinstance(saved_groups, list) else shown(saved_groups)
        raise StateFileError(f"{file}: optimizer.param_groups is {count}; the optimizer of this model has {len(groups)}")
    params: dict[Any, torch.Tensor] = {}
    for g, (old, new) in enumerate(zip(saved_groups, groups)):
        where = f"{file}: optimizer.param_groups[{g}]"
        old = fields_of(old, where, ("params",))
        ids = old["params"]
        if not isinstance(ids, list) or len(ids) != len(new["params"]):
            count = f"{len(ids)} parameters" if isinstance(ids, list) else shown(ids)
            raise StateFileError(f"{where}.params lists {count}; this model trains {len(new['params'])} in it")
        for i, param in zip(ids, new["params"]):
            whole(i, f"{where}.params entry", 0)
            if i in params:
                raise StateFileError(f"{where}.params lists parameter {i} twice")
            params[i] = param
        for key, value in new.items():
            if key not in ("params", "param_names"):
                _same_kind(old, key, value, f"{where}.{key}", required=isinstance(value, (int, float, tuple)))
    entries = saved["state"]
    if not isinstance(entries, dict):
        raise StateFileError(f"{file}: optimizer.state is {shown(entries)}, not a map of parameters to their state")
    adam = isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW))
    for i, entry in entries.items():
        where = f"{file}: optimizer.state[{shown(i)}]"
        if i not in params:
            raise StateFileError(f"{where} is the state of a parameter the param_groups do not list")
        _check_entry(entry, params[i], where, adam=adam)
    _check_scheduler(fields["scheduler"], scheduler, f"{file}: scheduler")


def _check_entry(entry: Any, param: torch.Tensor, where: str, *, adam: bool) -> None:
    """One parameter's optimizer state: tensors of its shape, floating point and finite; a step >= 0."""
    if not isinstance(entry, dict):
        raise StateFileError(f"{where} is {shown(entry)}, not an object of tensors")
    if adam and entry and set(entry) - {"max_exp_avg_sq"} != {"step", *ADAM_MOMENTS}:
        raise StateFileError(f"{where} holds {', '.join(map(str, sorted(entry, key=str)))}; Adam's state is step, "
                             f"{', '.join(ADAM_MOMENTS)}")
    for key, value in entry.items():
        field = f"{where}.{key}"
        if key == "step":
            step = value if not isinstance(value, torch.Tensor) else value.item() if value.numel() == 1 else value
            real(step, field, 0.0)
            continue
        if not isinstance(value, torch.Tensor):
            raise StateFileError(f"{field} is {shown(value)}, not a tensor")
        if value.shape != param.shape:
            raise StateFileError(f"{field} has shape {list(value.shape)}; the model's parameter has {list(param.shape)}")
        if not value.is_floating_point():
            raise StateFileError(f"{field} is a {value.dtype} tensor; optimizer moments are floating point")
        if not bool(torch.isfinite(value).all()):
            raise StateFileError(f"{field} holds NaN or infinite values")
        if key.endswith("exp_avg_sq") and bool((value < 0).any()):
            raise StateFileError(f"{field} holds negative values (a mean of squares)")


def _same_kind(saved: Mapping[str, Any], key: str, like: Any, where: str, *, required: bool) -> None:
    """``saved[key]`` is of ``like``'s kind (bool, number, string, None or bool, a sequence as long);
    absent only when not ``required``."""
    if key not in saved:
        if required:
            raise StateFileError(f"{where} is missing")
        return
    value = saved[key]
    if isinstance(like, bool) or like is None:
        if not (isinstance(value, bool) or (like is None and value is None)):
            raise StateFileError(f"{where} is {shown(value)}, not {'true/false' if like is not None else 'null or true/false'}")
    elif isinstance(like, (int, float)):
        if isinstance(like, int):  # a count (the schedule's last_epoch, _step_count): >= 0 once it has been built
            whole(value, where, 0)
        else:
            real(value, where, *HYPER_RANGES.get(where.rsplit(".", 1)[-1].split("[")[0], (-math.inf, math.inf)))
    elif isinstance(like, str):
        if not isinstance(value, str):
            raise StateFileError(f"{where} is {shown(value)}, not a string")
    elif isinstance(like, (tuple, list)):
        if not isinstance(value, (tuple, list)) or len(value) != len(like):
            raise StateFileError(f"{where} is {shown(value)}, not a list of {len(like)}")
        for i, item in enumerate(like):
            _same_kind(dict(enumerate(value)), i, item, f"{where}[{i}]", required=True)  # type: ignore[arg-type]


SCHEDULER_NEEDS = ("base_lrs", "last_epoch", "lr_lambdas")
"""Keys ``LambdaLR.load_state_dict`` needs; the others it has (``_step_count``, ``_last_lr``, ...) are checked
when present (a torch that wrote the checkpoint may have had fewer)."""


def _check_scheduler(saved: Any, scheduler: Any, where: str) -> None:
    """The LR schedule's state against ``scheduler``'s own: the keys it needs there, each of the same kind."""
    current = scheduler.state_dict()
    saved = fields_of(saved, where, tuple(k for k in SCHEDULER_NEEDS if k in current))
    for key, value in current.items():  # base_lrs and _last_lr: as many rates as the optimizer has groups
        _same_kind(saved, key, value, f"{where}.{key}", required=False)
