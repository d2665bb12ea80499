"""Credentials kept out of everything dapo prints or records: one function for every message, param and tag.

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
