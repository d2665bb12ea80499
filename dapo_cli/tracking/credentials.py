"""A tracking URI's user and password, moved out of the URI into MLflow's own environment variables at the door.

``http://user:secret@host:5000`` works with MLflow's client, but a URI is a value dapo records everywhere: the
run's ``config.yaml`` and ``summary.json``, every checkpoint's ``model/dapo_run.json`` (the file that travels with
the weights), the params, tags and artifacts of the MLflow run, and the ``MLflow UI:`` line it prints. Every reader
of the server would see the password (issue 50). So each command that opens a store calls
:func:`move_credentials` first: the userinfo of an ``http(s)://`` URI (given as a setting or in
``$MLFLOW_TRACKING_URI``) is removed from it and put where MLflow's client reads basic-auth credentials,
``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``. From then on the process and every process it starts
(ablation children, torchrun ranks, the rollout worker, Slurm jobs, which inherit the environment) see only the
bare URI, and still authenticate.

A resumed run reads the bare URI from its ``config.yaml``: set the two variables (or give the URI with its
credentials again) to resume against a server that asks for them.
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit, urlunsplit

from dapo_cli.errors import UserError

USERNAME_VAR = "MLFLOW_TRACKING_USERNAME"
PASSWORD_VAR = "MLFLOW_TRACKING_PASSWORD"
URI_VAR = "MLFLOW_TRACKING_URI"


def split_credentials(uri: str) -> tuple[str, str | None, str | None]:
    """(the URI without its userinfo, the user, the password), percent-decoded; ``(uri, None, None)`` when an
    ``http(s)://`` URI carries none, and for every other scheme (``sqlite:///``, ``file:``, plugins).

    >>> split_credentials("http://me:p%40ss@host:5000/prefix")
    ('http://host:5000/prefix', 'me', 'p@ss')
    >>> split_credentials("https://token@host")
    ('https://host', 'token', None)
    >>> split_credentials("sqlite:///mlflow.db")
    ('sqlite:///mlflow.db', None, None)
    """
    try:
        parts = urlsplit(uri)
    except ValueError:  # check_tracking_uri names what is wrong with it
        return uri, None, None
    if parts.scheme.lower() not in ("http", "https") or "@" not in parts.netloc:
        return uri, None, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    return urlunsplit(parts._replace(netloc=host)), unquote(user), unquote(password) if colon else None


def move_credentials(configured: str, what: str) -> str:
    """``configured`` (a tracking-URI setting, ``what`` names it) without credentials; the credentials it or
    ``$MLFLOW_TRACKING_URI`` carried are now in :data:`USERNAME_VAR` / :data:`PASSWORD_VAR`, and
    ``$MLFLOW_TRACKING_URI`` holds its bare URI. One line (:class:`UserError`) when a URI's user or password
    differs from the variable already set: which one should win is the user's to say."""
    for source, value in ((what, configured), (f"${URI_VAR}", os.environ.get(URI_VAR, ""))):
        bare, user, password = split_credentials(value)
        if user is None:
            continue
        for var, given in ((USERNAME_VAR, user), (PASSWORD_VAR, password)):
            if given is None:
                continue
            held = os.environ.get(var)
            if held is not None and held != given:
                kind = "user" if var == USERNAME_VAR else "password"
                raise UserError(
                    f"the {kind} in {source} differs from ${var}; give the credentials once: in ${USERNAME_VAR} and "
                    f"${PASSWORD_VAR} (then no URI carries them) or in the URI"
                )
            os.environ[var] = given
        if source == what:
            configured = bare
        else:
            os.environ[URI_VAR] = bare
    return configured


def bare_setting(item: str) -> str:
    """A ``KEY=VALUE`` override (``--set``) with the credentials of a URI value removed: what a command line
    passed on to other processes says (``dapo ablate``'s children, printed or started), once
    :func:`move_credentials` has put the credentials in the environment those processes read.

    >>> bare_setting("tracking.tracking_uri=http://me:pw@host:5000")
    'tracking.tracking_uri=http://host:5000'
    >>> bare_setting("trainer.lr=1e-4")
    'trainer.lr=1e-4'
    """
    key, eq, value = item.partition("=")
    return f"{key}{eq}{split_credentials(value)[0]}" if eq else item
