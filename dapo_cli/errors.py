"""Errors that reach the user as one line: bad input (exit 2), a run stopped for a reason (3, 4), and
the machine failing a command that had valid input (5).

Raise :class:`UserError` for anything the user can fix (a bad path, a bad config
value, a dataset without answers). The CLI prints ``error: <message>`` and exits 2,
with no traceback. A full disk, a path that cannot be written or a tracking store lost in the middle of
a command is :class:`EnvironmentFailure` (exit 5): :func:`environment_failure` recognises the first two
in any exception's chain, the tracker raises the third. Everything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class UserError(Exception):
    """A problem with the user's input; the message says what to fix."""


class UnknownName(UserError, ValueError):
    """A name a registry has no entry for; the message lists the valid ones. A :class:`UserError` (one line, exit 2)
    and a ValueError (what a bad argument to a look-up raises)."""


LISTED_IN_PARENS = " (valid: {})"
"""How :func:`unknown_name` lists the valid names by default: ``unknown task 'x' (valid: a, b)``."""
LISTED_AS_NAMES = "; valid names: {}"
"""The other listing the messages use: ``unknown verifier 'x'; valid names: a, b``."""


def unknown_name(what: str, name: object, valid: Iterable[str], *, listed: str = LISTED_IN_PARENS) -> UnknownName:
    """The error for ``name`` not among ``valid``: ``unknown WHAT 'NAME'`` then the valid names as ``listed`` puts them."""
    return UnknownName(f"unknown {what} '{name}'" + listed.format(", ".join(valid)))


def look_up(table: Mapping[str, T], name: str, what: str, *, listed: str = LISTED_IN_PARENS) -> T:
    """``table[name]``, or :func:`unknown_name`'s error listing ``table``'s names: the one way a registry is read."""
    try:
        return table[name]
    except KeyError:
        raise unknown_name(what, name, table, listed=listed) from None


class RunStopped(Exception):
    """A training run that stopped for a reason the user must act on (its input was valid).

    The CLI prints ``error: <message>`` and exits with ``exit_code``: :data:`COLLAPSED` or
    :data:`NON_FINITE` (never 2, which means bad input).
    """

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


COLLAPSED = 3
"""Exit code of a run stopped by the collapse guard (steps in a row without an informative group)."""

NON_FINITE = 4
"""Exit code of a run whose parameters became NaN/Inf (the last good checkpoint is kept)."""

PREEMPTED = 6
"""Exit code of a run stopped by a scheduler's stop request (SIGUSR2: Slurm's time-limit warning) after it saved a
checkpoint at the step it had finished: ``dapo train --resume`` continues it (the slurm launcher's jobs do, requeued)."""

ENVIRONMENT = 5
"""Exit code of a command the machine failed although its input was valid: a full disk, a path it may not
write, a tracking store that stopped answering. Fix the machine and rerun (``dapo train --resume``
continues from the last complete checkpoint)."""


class EnvironmentFailure(RunStopped):
    """The machine failed the command (see :data:`ENVIRONMENT`); the message says what happened and what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ENVIRONMENT)


FAILING_ERRNOS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}
"""OS errors that mean the machine, not the code, failed a write."""

RERUN = "free space or fix the path (or point trainer.output_dir / --output elsewhere), then rerun; dapo train --resume continues from the last complete checkpoint"


def environment_failure(exc: BaseException) -> EnvironmentFailure | None:
    """``exc`` as an :class:`EnvironmentFailure` when the machine caused it, else None (a bug: keep the traceback).

    Looks through ``exc``'s chain (``__cause__`` / ``__context__``) for an ``OSError`` with one of
    :data:`FAILING_ERRNOS`, or for that error's text in a library's own exception (safetensors reports a
    full disk as ``SafetensorError: ... No space left on device (os error 28)``).
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, EnvironmentFailure):
            return current
        if isinstance(current, OSError) and current.errno in FAILING_ERRNOS:
            where = f" writing {current.filename}" if current.filename else ""
            return EnvironmentFailure(f"{FAILING_ERRNOS[current.errno]}{where}; {RERUN}")
        text = str(current)
        for code, what in FAILING_ERRNOS.items():
            if f"(os error {code})" in text:  # Rust's io::Error text (safetensors, tokenizers)
                detail = " ".join(text.split())[:200]
                return EnvironmentFailure(f"{what} ({type(current).__name__}: {detail}); {RERUN}")
        current = current.__cause__ or current.__context__
    return None


LOW_SPACE_BYTES = 16 * 2**20
"""Free space under which a failed write is taken for a full disk (the write that failed used up the rest)."""


def failed_write(path: Path, exc: BaseException) -> EnvironmentFailure | None:
    """A write under ``path`` that raised ``exc``: the machine's failure when ``exc``'s chain says so
    (:func:`environment_failure`), or when the file system under ``path`` is (nearly) full. torch's
    writer reports a full disk with no ``OSError`` at all (``RuntimeError: [enforce fail at
    inline_container.cc] . unexpected pos 56128 vs 56016``); call this before removing what the write
    left, while the space is still taken."""
    found = environment_failure(exc)
    if found is not None:
        return found
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is None:
        return None
    try:
        stat = os.statvfs(existing)
    except OSError:
        return None
    if stat.f_bavail * stat.f_frsize >= LOW_SPACE_BYTES:
        return None
    detail = " ".join(str(exc).split())[:200]
    return EnvironmentFailure(f"no space left on device writing {path} ({type(exc).__name__}: {detail}); {RERUN}")
