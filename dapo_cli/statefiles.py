"""State files a checkpoint holds, never unpickled: a JSON tree in a safetensors file, its tensors beside it.

``torch.load`` unpickles, and unpickling a file can run any code the file names: a checkpoint
downloaded, copied from another machine or fetched back from MLflow is such a file. So everything
dapo writes into a checkpoint and reads back is JSON (``trainer_state.json``) or one of these files
(``rng/rank_N.safetensors``, ``engine/optimizer.safetensors``): a safetensors file whose tensors
are stored as safetensors stores them (no code, sizes checked against the file) and whose
metadata key :data:`TREE_KEY` holds the rest of the object as JSON, tensors named in it by
reference (:func:`encode`). Tuples and dicts with keys other than plain strings keep their type
(``random.setstate`` wants tuples; an optimizer's state is keyed by parameter index).

Files of checkpoints written before (``*.pt``) are read with :func:`read_legacy` only:
``torch.load(weights_only=True)``, torch's restricted unpickler, which builds tensors, dicts,
lists, tuples, numbers and strings and nothing else. That is all those files hold (RNG states,
the data position, AdamW's state and LambdaLR's), so nothing needs allow-listing. A file it
refuses is refused with one line (:class:`~dapo_cli.errors.UserError`), never read in full.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import torch

from dapo_cli.errors import UserError
from dapo_cli.fileio import UnreadableJson, atomic_path, load_json, safetensors_problem
from dapo_cli.redact import escape_controls

TREE_KEY = "dapo.tree"
"""Metadata key of a state file: the JSON tree of the object, tensors as ``{"__tensor__": name}``."""

_TUPLE, _ITEMS, _TENSOR = "__tuple__", "__items__", "__tensor__"
REFUSED = "is refused: "
"""How the reason of a :class:`RefusedFile` begins (a checkpoint passed over for one says so with it)."""


class StateFileError(ValueError):
    """A state file that is damaged or not one (the message says which file and what is wrong)."""


class RefusedFile(UserError):
    """An older dapo's ``.pt`` file that torch's weights-only reader refuses: never read (one line, exit 2).

    ``reason``: what is wrong with it and how to continue, without the path (the message begins with it)."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path} {reason}")
        self.reason = reason


def encode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """``obj`` as a JSON-able tree; each tensor moved into ``tensors`` (CPU, contiguous) under a new name.

    ``None``, bools, ints, floats, strings and lists stay as they are; a tuple becomes
    ``{"__tuple__": [...]}``, a dict with a key that is no string (or begins with ``__``)
    ``{"__items__": [[key, value], ...]}``, a tensor ``{"__tensor__": name}``. Anything else is a
    programming error (TypeError): dapo's states hold nothing else.
    """
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, torch.Tensor):
        name = f"t{len(tensors)}"
        tensors[name] = obj.detach().to("cpu").contiguous()
        return {_TENSOR: name}
    if isinstance(obj, list):
        return [encode(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return {_TUPLE: [encode(v, tensors) for v in obj]}
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: encode(v, tensors) for k, v in obj.items()}
        return {_ITEMS: [[encode(k, tensors), encode(v, tensors)] for k, v in obj.items()]}
    raise TypeError(f"a checkpoint state holds only tensors, numbers, strings, lists, tuples and dicts, not {type(obj).__name__}")


def decode(node: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The object :func:`encode` turned into ``node``; an unknown shape or tensor name is a StateFileError."""
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, list):
        return [decode(v, tensors) for v in node]
    if not isinstance(node, dict):
        raise StateFileError(f"unexpected {type(node).__name__} in the state tree")
    if len(node) == 1 and _TENSOR in node:
        if node[_TENSOR] not in tensors:
            raise StateFileError(f"the state tree names a tensor {node[_TENSOR]!r} the file does not hold")
        return tensors[node[_TENSOR]]
    if len(node) == 1 and _TUPLE in node and isinstance(node[_TUPLE], list):
        return tuple(decode(v, tensors) for v in node[_TUPLE])
    if len(node) == 1 and _ITEMS in node and isinstance(node[_ITEMS], list):
        if not all(isinstance(item, list) and len(item) == 2 for item in node[_ITEMS]):
            raise StateFileError("a dict of the state tree is not a list of [key, value] pairs")
        return {_key(decode(k, tensors)): decode(v, tensors) for k, v in node[_ITEMS]}
    if any(k.startswith("__") for k in node):
        raise StateFileError(f"unknown entry {sorted(node)[0]!r} in the state tree")
    return {k: decode(v, tensors) for k, v in node.items()}


def _key(key: Any) -> Any:
    if isinstance(key, (list, dict, torch.Tensor)):
        raise StateFileError("a dict key of the state tree is not a number, string or tuple")
    return key


def write_state(path: Path, obj: Any) -> None:
    """Write ``obj`` (see :func:`encode`) to the state file ``path``, atomically."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    tree = json.dumps(encode(obj, tensors), separators=(",", ":"))
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={TREE_KEY: tree})


def read_state(path: Path, *, device: str | torch.device = "cpu") -> Any:
    """The object in state file ``path`` (tensors on ``device``); a damaged file is a StateFileError."""
    from safetensors import safe_open

    problem = safetensors_problem(path)
    if problem:
        raise StateFileError(f"{path.name} {problem}")
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            tree = (f.metadata() or {}).get(TREE_KEY)
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except Exception as exc:  # safetensors' own errors: a file the header check let through but it cannot read
        raise StateFileError(f"{path.name} cannot be read ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
    if tree is None:
        raise StateFileError(f"{path.name} is a safetensors file without a dapo state ({TREE_KEY} metadata)")
    node = parse_json(tree, f"{path.name} holds a state that is")
    try:
        return decode(node, tensors)
    except RecursionError:  # a tree under json's limit can still be too deep for decode's own recursion
        raise StateFileError(f"{path.name} holds a state nested too deeply to read") from None


def parse_json(text: str, what: str) -> Any:
    """The JSON value of ``text``; what :func:`~dapo_cli.fileio.load_json` refuses (bad syntax, nesting past the
    recursion limit, a number of over 4,300 digits) is a StateFileError ``<what> unreadable (<why>)``."""
    try:
        return load_json(text)
    except UnreadableJson as exc:
        raise StateFileError(f"{what} unreadable ({exc})") from None


def read_legacy(path: Path, *, fix: str, device: str | torch.device = "cpu") -> Any:
    """A ``.pt`` state of a checkpoint written before :func:`write_state` existed, read with torch's
    weights-only unpickler and nothing else.

    A file that reader refuses (it names a class or function: a full unpickle could run it) raises
    :class:`RefusedFile` saying so, ending with ``fix`` (how to continue without the file); a damaged
    one a StateFileError.
    """
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise RefusedFile(path, (
            f"{REFUSED}torch's safe reader (weights_only) cannot read it ({_reason(exc)}) and dapo never "
            f"unpickles a file in full, which can run code from it; {fix}"
        )) from None
    except Exception as exc:  # a truncated or foreign file: torch's zip reader, EOF, ...
        raise StateFileError(f"{path.name} is unreadable ({type(exc).__name__})") from None


def from_elsewhere(checkpoint: Path) -> str:
    """How to continue when a state file of ``checkpoint`` is refused (the end of the one-line error)."""
    return (f"resume from a checkpoint this dapo wrote, or start a new run from its weights "
            f"(--set model.path={checkpoint / 'model'})")


def unreadable(checkpoint: Path, exc: StateFileError) -> UserError:
    """The one-line error of a state file in ``checkpoint`` that is damaged or holds values the run cannot
    take (:mod:`dapo_cli.resume_state`), with the way on: delete the checkpoint so ``--resume`` takes the one
    before it (named when there is one), or start a fresh run."""
    earlier = sorted(p.name for p in checkpoint.parent.glob("step_*") if p.is_dir() and p.name < checkpoint.name)
    fix = (f"delete {checkpoint.name} so --resume takes {earlier[-1]}, or start a fresh run without --resume" if earlier
           else f"start a fresh run without --resume ({checkpoint.name} is the run's only checkpoint)")
    return UserError(f"cannot resume from checkpoint {checkpoint}: {escape_controls(str(exc))}; {fix}")


def _reason(exc: BaseException) -> str:
    """What torch's weights-only reader met, from its message (``Unsupported global: GLOBAL getattr``)."""
    text = str(exc)
    _, found, rest = text.partition("WeightsUnpickler error:")
    lines = [line.strip() for line in rest.splitlines() if line.strip()] if found else []
    return lines[0].split(" was not an allowed global")[0].rstrip(".") if lines else "not a file of tensors and plain values"
