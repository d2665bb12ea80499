"""Run directories and atomic, resumable checkpoints.

Layout of one run (``trainer.output_dir`` / experiment / run name)::

    runs/dapo-tiny/dapo-s0/
        config.yaml                    the resolved config the run was started with
        checkpoints/step_000020/       one checkpoint, written as .step_000020.tmp/ then renamed
            model/                     save_pretrained policy + tokenizer (loadable by `dapo eval` and plain transformers)
                dapo_run.json          which training run and step the weights are from (MLflow run id, experiment,
                                       store): `dapo eval` links its run to that one
            engine/                    the engine's training state: torch: optimizer.safetensors (optimizer + LR schedule),
                                       with LoRA also adapter/ (PEFT's adapter_config.json + adapter_model.safetensors;
                                       model/ then holds the merged weights); deepspeed: its sharded checkpoint
                                       (module, optimizer partitions per rank, schedule: DeepSpeed's own files)
            rng/rank_00000.safetensors RNG states of every rank (python, torch, CUDA)
            trainer_state.json         data position, step, MLflow run id, world size, validation results
        checkpoints/latest             name of the newest complete checkpoint (written atomically)

A checkpoint directory exists only once complete (every rank has written its part and
rank 0 renamed it into place), and ``latest`` is updated only after it, so a run killed
at any instant resumes from a consistent state.

Nothing dapo reads back from a checkpoint is unpickled (:mod:`dapo_cli.statefiles`): the state
files are JSON and safetensors. Checkpoints written before that format held ``trainer_state.pt``
(with rank 0's RNG state), ``rng/rank_N.pt`` and ``engine/optimizer.pt``; they resume too, read
with torch's weights-only reader, and a file that reader refuses is refused with one line.
DeepSpeed's own files are loaded by DeepSpeed, which unpickles them in full: resume such
a run only from checkpoints you trust (docs/reliability.md).
"""

from __future__ import annotations

import json
import os
import random
import contextlib
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import yaml

from dapo_cli.config.schema import PLANNING_SECTIONS
from dapo_cli.config.versions import split_version, upgrade
from dapo_cli.engine.dist import Collective
from dapo_cli.errors import UserError, failed_write
from dapo_cli.fileio import safetensors_problem, write_json_atomic, write_text_atomic
from dapo_cli.resume_state import TrainerState, check_rng_state, check_trainer_state
from dapo_cli.statefiles import (
    RefusedFile, StateFileError, from_elsewhere, parse_json, read_legacy, read_state, unreadable, write_state,
)

KEEP_CHECKPOINTS = 2
"""Complete checkpoints kept per run (older ones are deleted after a new one lands)."""

ENGINE_DIR = "engine"
"""Subdirectory of a checkpoint holding the training engine's own state."""

LOCK_FILE = ".lock"

TRAINER_STATE = "trainer_state.json"
"""Rank 0's part of a checkpoint: step, data position, MLflow run id, world size (plain JSON)."""
LEGACY_TRAINER_STATE = "trainer_state.pt"
"""The trainer state of checkpoints written before :data:`TRAINER_STATE` (with rank 0's RNG state in it)."""

RUN_INFO_FILE = "dapo_run.json"
"""Beside the weights in ``<checkpoint>/model/``: the training run they came from (see :func:`write_run_info`)."""


def write_run_info(model_dir: Path, info: Mapping[str, Any]) -> None:
    """Record the weights' origin in ``model_dir/dapo_run.json`` (atomically): ``mlflow_run_id``,
    ``experiment``, ``tracking_uri`` (a relative ``sqlite:///`` store made absolute), ``run_name``,
    ``run_dir``, ``step``. It travels with the folder (copied, uploaded to MLflow, downloaded again)."""
    from dapo_cli.tracking.mlflow import absolute_tracking_uri

    uri = str(info.get("tracking_uri") or "")
    record = {**info, "tracking_uri": absolute_tracking_uri(uri) if uri else ""}
    write_json_atomic(model_dir / RUN_INFO_FILE, record)


def read_run_info(model_dir: Path) -> dict[str, Any]:
    """``model_dir/dapo_run.json``, or ``{}`` when absent or unreadable (a plain save_pretrained folder)."""
    try:
        info = json.loads((model_dir / RUN_INFO_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: nested past json's recursion
        return {}
    return info if isinstance(info, dict) else {}


def run_dir_for(output_dir: str, experiment: str, run_name: str) -> Path:
    return Path(output_dir) / experiment / run_name


class RunLock:
    """An exclusive ``flock`` on ``<run dir>/.lock``, held while a process trains the run.

    The kernel releases it when the process dies (kill -9 included), so a lock that can be
    taken means nobody is training the run now.
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> bool:
        """True when this process now holds the lock; False when another process does."""
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def holder(self) -> str:
        """The pid written by the holder (for messages), or '?'."""
        try:
            return self.path.read_text(encoding="utf-8").strip() or "?"
        except OSError:
            return "?"

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @staticmethod
    def is_held(run_dir: Path) -> bool:
        """True when some live process holds ``run_dir``'s lock (probes without keeping it)."""
        if not (run_dir / LOCK_FILE).is_file():
            return False
        probe = RunLock(run_dir)
        if probe.acquire():
            probe.release()
            return False
        return True


def claim_run_dir(output_dir: str, experiment: str, stem: str, *, exact: bool) -> tuple[str, Path, RunLock, bool]:
    """Make a run directory this process's: ``(name, dir, held lock, created here)``.

    ``exact``: the directory is ``stem`` itself (``trainer.run_name`` or ``--resume``); it may
    exist, but not be held by another process. Otherwise the first of ``stem``, ``stem-2``, …
    that this process creates with an exclusive ``mkdir`` (two runs started together never get
    the same directory).
    """
    base = Path(output_dir) / experiment
    base.mkdir(parents=True, exist_ok=True)
    candidates = [stem] if exact else [stem, *(f"{stem}-{i}" for i in range(2, 100_000))]
    for name in candidates:
        run_dir = base / name
        run_dir.parent.mkdir(parents=True, exist_ok=True)  # an ablation child's name is <ablation>/<variant>
        try:
            run_dir.mkdir()
            created = True
        except FileExistsError:
            if not exact:
                continue
            created = False
        lock = RunLock(run_dir)
        if lock.acquire():
            return name, run_dir, lock, created
        if exact:
            raise UserError(f"run {run_dir} is being trained by another process (pid {lock.holder()}); wait for it or pick another trainer.run_name")
    raise UserError(f"no free run name under {base} for '{stem}'; set trainer.run_name")


def latest_run_name(output_dir: str, experiment: str, stem: str, marker: str = "checkpoints/latest") -> str | None:
    """The newest run named ``stem`` or ``stem-K`` that has started (for ``--resume``): the one whose
    ``marker`` file (a DAPO run's checkpoint pointer, a direct-advantage run's state file) is newest."""
    base = Path(output_dir) / experiment
    if not base.is_dir():
        return None
    candidates = [
        d for d in base.iterdir()
        if d.is_dir() and (d.name == stem or (d.name.startswith(stem + "-") and d.name[len(stem) + 1 :].isdigit()))
        and (d / marker).is_file()
    ]
    if not candidates:
        return None
    return max(candidates, key=lambda d: (d / marker).stat().st_mtime).name


@contextlib.contextmanager
def machine_failures(path: Path) -> Iterator[None]:
    """A write under ``path`` that the machine failed (a full disk, a read-only file system) raises
    :class:`~dapo_cli.errors.EnvironmentFailure` (one line, exit 5); other failures pass unchanged."""
    try:
        yield
    except Exception as exc:
        failure = failed_write(path, exc)
        if failure is None:
            raise
        raise failure from exc


def rng_state() -> dict[str, Any]:
    """Python and torch RNG states (CUDA too when present)."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def rng_file(checkpoint: Path, rank: int, suffix: str = ".safetensors") -> Path:
    """Where rank ``rank``'s RNG state lies in ``checkpoint`` (``.pt``: a checkpoint of an older dapo)."""
    return checkpoint / "rng" / f"rank_{rank:05d}{suffix}"


def read_trainer_state(checkpoint: Path) -> dict[str, Any]:
    """``checkpoint``'s trainer state: :data:`TRAINER_STATE`, else an older dapo's :data:`LEGACY_TRAINER_STATE`
    (read safely, :func:`~dapo_cli.statefiles.read_legacy`). A damaged file is a StateFileError, a refused one
    a UserError."""
    path = checkpoint / TRAINER_STATE
    if not path.exists():
        state = read_legacy(checkpoint / LEGACY_TRAINER_STATE, fix=from_elsewhere(checkpoint))
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, ValueError) as exc:  # ValueError: UnicodeDecodeError, a binary file
            raise StateFileError(f"{TRAINER_STATE} is unreadable ({type(exc).__name__})") from None
        state = parse_json(text, f"{TRAINER_STATE} is")
    if not isinstance(state, dict):
        raise StateFileError(f"{path.name} holds no trainer state")
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class CheckpointManager:
    """Writes and finds the checkpoints of one run directory."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.root = run_dir / "checkpoints"

    def save(
        self, step: int, *, dist: Collective, write: Any, trainer_state: dict[str, Any],
        run_info: Mapping[str, Any] | None = None,
    ) -> Path:
        """Write checkpoint ``step`` atomically; every rank calls it.

        Rank 0 creates ``.step_N.tmp``; every rank calls ``write(tmp)`` (the engine's shards, the
        model export) and saves its RNG state; rank 0 adds ``trainer_state.pt`` and (given
        ``run_info``) ``model/dapo_run.json`` with the step, renames the directory into place and
        updates ``latest``. Barriers keep the ranks in step.
        """
        name = f"step_{step:06d}"
        final = self.root / name
        tmp = self.root / f".{name}.tmp"
        if dist.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        with machine_failures(tmp):
            write(tmp)
            write_state(rng_file(tmp, dist.rank), rng_state())
        dist.barrier()
        if dist.is_main:
            with machine_failures(tmp):
                write_json_atomic(tmp / TRAINER_STATE, {**trainer_state, "step": step})
                if run_info is not None and (tmp / "model").is_dir():
                    write_run_info(tmp / "model", {**run_info, "step": step})
            if final.exists():
                old = self.root / f".{name}.old"
                shutil.rmtree(old, ignore_errors=True)
                os.replace(final, old)
                os.replace(tmp, final)
                shutil.rmtree(old)
            else:
                os.replace(tmp, final)
            write_text_atomic(self.root / "latest", name + "\n")
            self._prune(keep=name)
        dist.barrier()
        return final

    @staticmethod
    def rank_rng_state(path: Path, rank: int, state: dict[str, Any]) -> dict[str, Any]:
        """The RNG state rank ``rank`` saved in checkpoint ``path``, whose trainer state is ``state``. An
        older dapo's checkpoint kept rank 0's in ``state["rng"]``, the others' in ``rng/rank_N.pt``."""
        own, legacy = rng_file(path, rank), rng_file(path, rank, ".pt")
        try:
            if own.exists():
                found, file = read_state(own), own.relative_to(path).as_posix()
            elif rank and legacy.is_file():
                found, file = read_legacy(legacy, fix=from_elsewhere(path)), legacy.relative_to(path).as_posix()
            elif "rng" in state:
                found, file = state["rng"], f"{LEGACY_TRAINER_STATE}: rng"
            else:
                raise StateFileError(f"{own.relative_to(path)} is missing")
            check_rng_state(found, file)
        except StateFileError as exc:
            raise unreadable(path, exc) from None
        return found

    def _prune(self, keep: str) -> None:
        done = sorted(d for d in self.root.glob("step_*") if d.is_dir())
        for d in done[:-KEEP_CHECKPOINTS]:
            if d.name != keep:
                shutil.rmtree(d, ignore_errors=True)

    def latest(self) -> Path | None:
        """The newest complete checkpoint (see :meth:`newest_complete`), or None."""
        return self.newest_complete()[0]

    def newest_complete(self) -> tuple[Path | None, list[str]]:
        """(the newest checkpoint that passes :func:`checkpoint_problem`, why each newer one was passed over)."""
        skipped: list[str] = []
        for path in sorted((d for d in self.root.glob("step_*") if d.is_dir()), reverse=True):
            problem = checkpoint_problem(path)
            if problem is None:
                return path, skipped
            skipped.append(f"{path.name}: {problem}")
        return None, skipped

    def clean_stale(self) -> list[str]:
        """Remove what killed checkpoint writes left behind (``.step_N.tmp``, ``.step_N.old``); their names."""
        removed = []
        for leftover in sorted(self.root.glob(".step_*")):
            if leftover.name.endswith((".tmp", ".old")):
                shutil.rmtree(leftover, ignore_errors=True)
                removed.append(leftover.name)
        return removed

    def load_state(self, path: Path) -> dict[str, Any]:
        try:
            return read_trainer_state(path)
        except StateFileError as exc:  # a corrupt file is the user's to remove
            raise unreadable(path, exc) from None

    @staticmethod
    def checked_state(path: Path, state: dict[str, Any], *, total_steps: int, num_prompts: int) -> TrainerState:
        """Checkpoint ``path``'s trainer state ``state``, every field checked (:func:`check_trainer_state`: a
        wrong one is :func:`unreadable`'s one line), its step at most ``total_steps`` (the resume's
        ``trainer.total_steps``: a run is extended by raising it, never shortened below its checkpoint)."""
        file = TRAINER_STATE if (path / TRAINER_STATE).exists() else LEGACY_TRAINER_STATE
        number = path.name.removeprefix("step_")
        try:
            saved = check_trainer_state(state, file, checkpoint_step=int(number) if number.isascii() and number.isdigit() else None,
                                        num_prompts=num_prompts)
        except StateFileError as exc:
            raise unreadable(path, exc) from None
        if saved.step > total_steps:
            raise UserError(f"--resume: {path} is step {saved.step}, past trainer.total_steps={total_steps}; "
                            f"resume with --set trainer.total_steps={saved.step} or more")
        return saved


def checkpoint_problem(path: Path) -> str | None:
    """Why checkpoint ``path`` cannot be resumed from (None: it can).

    Checks what a crash, a full disk or a copy gone wrong leaves: every part present, the
    trainer state readable (an older dapo's ``trainer_state.pt`` by torch's weights-only reader: one
    it refuses is named with the refusal), and each ``*.safetensors`` file exactly as long as its
    header says. Such a checkpoint is passed over for the one before it. Files that read but hold wrong
    values are not judged here: the resume refuses them, naming the field (:mod:`dapo_cli.resume_state`).
    """
    state_file = TRAINER_STATE if (path / TRAINER_STATE).exists() else LEGACY_TRAINER_STATE
    for part in (state_file, "model/config.json", ENGINE_DIR):
        if not (path / part).exists():
            return f"{TRAINER_STATE} is missing" if part == LEGACY_TRAINER_STATE else f"{part} is missing"
    try:
        read_trainer_state(path)
    except StateFileError as exc:
        return str(exc)
    except RefusedFile as exc:
        return f"{state_file} {exc.reason}"
    if state_file == TRAINER_STATE and not rng_file(path, 0).exists():
        return f"{rng_file(path, 0).relative_to(path)} is missing"
    weights = sorted((path / "model").glob("*.safetensors"))
    if not weights:
        return "model/ holds no *.safetensors weights"
    for file in [*weights, *sorted((path / "rng").glob("*.safetensors"))]:
        problem = safetensors_problem(file)
        if problem:
            return f"{file.relative_to(path)} {problem}"
    return None


# ---------------------------------------------------------------- what a resume may change


def config_differences(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested config dicts."""
    keys = sorted(set(saved) | set(current), key=str)  # a damaged config.yaml may hold keys that are no strings
    diffs: list[str] = []
    for k in keys:
        a, b = saved.get(k), current.get(k)
        dotted = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs.extend(config_differences(a, b, dotted))
        elif a != b:
            diffs.append(dotted)
    return diffs


RESUMABLE_CHANGES = {"trainer.total_steps"}
"""Config keys a resumed run may change (extend a finished run)."""


def resume_blockers(saved: Any, current: dict[str, Any]) -> list[str]:
    """The settings that forbid resuming a run whose ``config.yaml`` holds ``saved`` (as YAML loads it) with the
    config ``current``: every key that differs, but the :data:`RESUMABLE_CHANGES` and the planning-only sections.

    A config saved by an older dapo lacks the keys added since: each is compared at the value that does
    what that dapo did (:func:`~dapo_cli.config.versions.upgrade`); where ``current`` differs, the entry
    says which ``--set`` resumes it. A key nothing can fill is named as missing. A config from a newer dapo
    is a ConfigError.
    """
    version, data = split_version(saved, "the run's config.yaml")
    upgraded, filled, missing = upgrade(data, version)

    def free(key: str) -> bool:
        return key in RESUMABLE_CHANGES or key.split(".")[0] in PLANNING_SECTIONS

    out = [f"{k} (not in it, and no value is known to do what the dapo that wrote it did)" for k in missing if not free(k)]
    for d in config_differences(upgraded, current):
        if free(d) or d in missing:
            continue
        value = yaml.safe_dump(filled.get(d), default_flow_style=True).strip().removesuffix("...").strip()
        out.append(f"{d} (not in it: the older dapo that wrote it ran as --set {d}={value} does)" if d in filled else d)
    return out
