"""What dapo shows of text from elsewhere: credentials kept out (:func:`redact`) and control characters made
visible (:func:`escape_controls`), one function each for every message, table cell, param and tag.

A tracking URI may carry a user and password (``http://user:secret@host:5000``); MLflow's own exceptions quote
the URL they failed on. :func:`redact` replaces the userinfo of every URL in a text with ``***``, so an error line,
a printed hint, an MLflow param or tag shows ``http://***@host:5000``. The credentials themselves still reach
MLflow's client (the unredacted URI is what connects); MLflow also reads them from ``MLFLOW_TRACKING_USERNAME``
and ``MLFLOW_TRACKING_PASSWORD``, which never appear in a URI at all.
"""

from __future__ import annotations

import re

_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^\s/?#@]+)@")
"""``scheme://userinfo@``: the userinfo is everything up to the first ``@`` before the path (RFC 3986 3.2.1)."""

REDACTED = "***"


def redact(text: str) -> str:
    """``text`` with the userinfo (user, or user:password) of every URL in it replaced by ``***``.

    >>> redact("MLflow store http://me:pw@host:5000 failed: API request to http://me:pw@host:5000/api failed")
    'MLflow store http://***@host:5000 failed: API request to http://***@host:5000/api failed'
    >>> redact("sqlite:///mlflow.db and user@example.org stay as they are")
    'sqlite:///mlflow.db and user@example.org stay as they are'
    """
    return _USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)


def escape_controls(text: str) -> str:
    """``text`` with every non-printable character (ESC, BEL, a newline, a bidi override) written as its Python
    escape (``\\x1b``, ``\\n``, ``\\u202e``), so dataset text, model output or a file name cannot clear the
    screen, retitle the window or plant a hyperlink (OSC 8) when printed; printable text is unchanged.

    >>> escape_controls("ok \\x1b[2J\\x1b]8;;http://x\\x07link")
    'ok \\\\x1b[2J\\\\x1b]8;;http://x\\\\x07link'
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else c.encode("unicode_escape").decode("ascii") for c in text)


def shown(value: object, limit: int = 60) -> str:
    """``repr(value)`` as an error message may quote a value read from a file: control characters escaped
    (:func:`escape_controls`) and at most ``limit`` characters, since a damaged field may hold a megabyte of
    text or a 4,000-digit number; an int too long for Python to convert is named, not shown."""
    try:
        text = escape_controls(repr(value))
    except ValueError:  # int() past sys.get_int_max_str_digits()
        return "a number too long to show"
    return text if len(text) <= limit else text[: limit - 3] + "..."
