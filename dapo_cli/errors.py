"""Errors that reach the user as one line and exit code 2.

Raise :class:`UserError` for anything the user can fix (a bad path, a bad config
value, a dataset without answers). The CLI prints ``error: <message>`` and exits 2,
with no traceback. Everything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """A problem with the user's input; the message says what to fix."""
