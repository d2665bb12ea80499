"""Signals at safe points: Ctrl-C held while a checkpoint is written whole; a scheduler's stop request (SIGUSR2)
recorded, so a run stops at its next step boundary with a checkpoint."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Run the block with Ctrl-C held; if one came, raise :class:`KeyboardInterrupt` right after it.

    So an interrupted run stops after the checkpoint it was writing, not halfway through it.
    Outside the main thread (where Python cannot set handlers) the block runs unguarded.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum: int, _frame: Any) -> None:
        pending.append(signum)

    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pending:
        if callable(previous) and previous is not signal.default_int_handler:
            previous(signal.SIGINT, None)
        elif previous is not signal.SIG_IGN:
            raise KeyboardInterrupt


STOP_SIGNAL = signal.SIGUSR2
"""The signal that asks a run to stop at the next step boundary with a checkpoint: what a scheduler sends ahead of
a time limit or a preemption (submitit's Slurm jobs ask for ``--signal=USR2@<signal_delay_s>``; Slurm signals every
process of the job step, so the ``dapo train`` under the job's own process gets it too)."""


class StopRequest:
    """Whether :data:`STOP_SIGNAL` came while :func:`stop_requests` was active (``signum``: None until it did)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""


_EARLY = StopRequest()
"""The request :func:`record_stop_requests_early` records into, before the training loop exists."""


def _record_early(signum: int, _frame: Any) -> None:
    _EARLY.signum = signum


def record_stop_requests_early() -> None:
    """From now on, record :data:`STOP_SIGNAL` instead of dying of it; the next :func:`stop_requests` starts with it.

    ``dapo train`` calls this first thing: Slurm may send its warning within seconds of a job's start (its
    checks run about once a minute), while the child is still importing, and the run must then stop at its
    first step boundary with a checkpoint, not die with nothing saved.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(STOP_SIGNAL, _record_early)


@contextlib.contextmanager
def stop_requests() -> Iterator[StopRequest]:
    """Record :data:`STOP_SIGNAL` instead of dying of it (its default action ends the process at once, mid-step).

    The caller looks at the yielded :class:`StopRequest` at its safe points; one recorded early
    (:func:`record_stop_requests_early`) is carried in. Outside the main thread (where Python cannot set
    handlers) nothing is installed and no request ever comes.
    """
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    request.signum, _EARLY.signum = _EARLY.signum, None

    def record(signum: int, _frame: Any) -> None:
        request.signum = signum

    previous = signal.signal(STOP_SIGNAL, record)
    try:
        yield request
    finally:
        signal.signal(STOP_SIGNAL, previous)
