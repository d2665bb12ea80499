"""Errors that reach the user as one line and exit code 2.

Raise :class:`UserError` for anything the user can fix (a bad path, a bad config
value, a dataset without answers). The CLI prints ``error: <message>`` and exits 2,
with no traceback. Everything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """A problem with the user's input; the message says what to fix."""


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
