"""Ctrl-C at a safe point: hold SIGINT while something must be written whole (a checkpoint)."""

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
