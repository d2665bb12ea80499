"""A tracking server over HTTP: its refusals named before anything loads, its outages waited out during a run.

Two ways a remote store fails that a local SQLite file does not (issue 50):

* **It refuses the caller.** A server with authentication (``mlflow server --app-name basic-auth``) answers
  401 (no or wrong credentials) or 403 (the user may not read the experiment). MLflow raises that as an
  ``MlflowException`` with ``error_code`` ``UNAUTHENTICATED`` / ``PERMISSION_DENIED``; :func:`check_server`
  asks once, before a command claims a folder or loads a model, and :func:`refusal` turns the answer into one
  line that says where the credentials go (``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``).
* **It stops answering for a while** (restarted, redeployed, a network blip). A training run keeps training:
  :func:`wait_out` retries the failed call every few seconds for up to :data:`OUTAGE_LIMIT_S` and says so
  on stderr, once when the server stops answering and once when it is back. The background tracker's
  queue holds the steps logged meanwhile, in order, and writes them when the server is back, so no step is
  lost and none is written twice (a metric batch retried after a lost answer carries the same timestamps,
  which the store keeps once). Past the limit the run ends as before: one line, exit 5, resumable.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from dapo_cli.errors import UserError
from dapo_cli.redact import redact
from dapo_cli.tracking.credentials import PASSWORD_VAR, USERNAME_VAR

OUTAGE_LIMIT_S = 600.0
"""How long a run waits for a tracking server that stopped answering before it fails (exit 5)."""

RETRY_EVERY_S = (1.0, 2.0, 4.0, 8.0)
"""Pauses between retries during an outage: these, then the last one again until the limit."""

UNAVAILABLE = frozenset({502, 503, 504})
"""HTTP statuses of a server (or the proxy in front of it) that is down or restarting, retried like no answer."""

REFUSED = {"UNAUTHENTICATED": 401, "PERMISSION_DENIED": 403}
"""MLflow's error codes for a server refusing the caller, and the HTTP status each comes from."""

T = TypeVar("T")


def is_server(uri: str) -> bool:
    """True for an ``http(s)://`` store (a tracking server), False for SQLite, files and plugins."""
    try:
        return urlsplit(uri).scheme.lower() in ("http", "https")
    except ValueError:
        return False


def refusal(uri: str, exc: BaseException, experiment: str | None = None) -> str | None:
    """The one-line message for a server refusing the caller (401/403), or None for any other failure."""
    code = getattr(exc, "error_code", "")
    if code not in REFUSED:
        return None
    user = os.environ.get(USERNAME_VAR)
    where = f"${USERNAME_VAR} and ${PASSWORD_VAR}"
    if code == "UNAUTHENTICATED":
        if not user and not os.environ.get(PASSWORD_VAR):
            return (f"the MLflow server {redact(uri)} asks for credentials and none are set (a run's config.yaml and "
                    f"checkpoints keep the URI without them): put the user and password in {where}")
        return (f"the MLflow server {redact(uri)} refused the credentials of user '{user or ''}' (HTTP 401): "
                f"check {where}")
    what = f"experiment '{experiment}'" if experiment else "what this command records"
    return (f"the MLflow server {redact(uri)} refused user '{user or ''}' access to {what} (HTTP 403): ask the "
            f"server's admin for permission, or log in as another user through {where}")


def is_transient(exc: BaseException) -> bool:
    """An ``MlflowException`` from a server that did not answer (refused connection, timeout, or a status in
    :data:`UNAVAILABLE` after MLflow's own retries), as opposed to one that answered no (a 500 is a server's bug
    or a bad request: waiting would not change it)."""
    import requests

    if getattr(exc, "get_http_status_code", lambda: None)() in UNAVAILABLE:
        return True
    seen, current = set(), exc.__cause__ or exc.__context__  # MLflow raises from the requests error, or inside its except
    while current is not None and id(current) not in seen:
        if isinstance(current, requests.RequestException):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def check_server(uri: str, experiment: str | None = None) -> None:
    """The server at ``uri`` answers and lets this user in: reads ``experiment`` (an experiment the user may
    not read is refused here), else lists one experiment. One line (:class:`UserError`) otherwise."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=uri)
    try:
        if experiment:
            client.get_experiment_by_name(experiment)
        else:
            client.search_experiments(max_results=1)
    except MlflowException as exc:
        message = refusal(uri, exc, experiment)
        if message is None:
            detail = " ".join(str(exc).split())[:300]
            message = (f"MLflow store {redact(uri)} does not answer ({redact(detail)}); start it, or point "
                       "tracking.tracking_uri / MLFLOW_TRACKING_URI at one that runs" if is_transient(exc)
                       else f"MLflow store {redact(uri)} failed: {redact(detail)}")
        raise UserError(message) from None


def wait_out(call: Callable[[], T], uri: str, *, limit_s: float | None = None, stop: threading.Event | None = None,
             down: threading.Event | None = None, sleep: Callable[[float], Any] | None = None,
             clock: Callable[[], float] = time.monotonic) -> T:
    """``call()``, retried while the server at ``uri`` does not answer, for up to ``limit_s``
    (:data:`OUTAGE_LIMIT_S`) after the first failure; the last failure is raised past it, or as soon as ``stop``
    is set (the run is ending anyway: a pause is cut short), and any other failure at once. ``down`` is set
    while it waits."""
    down = down or threading.Event()
    try:
        return _wait_out(call, uri, limit_s, stop or threading.Event(), down, sleep, clock)
    finally:
        down.clear()


def _wait_out(call: Callable[[], T], uri: str, limit_s: float | None, stop: threading.Event, down: threading.Event,
              sleep: Callable[[float], Any] | None, clock: Callable[[], float]) -> T:
    from mlflow.exceptions import MlflowException

    sleep = sleep or stop.wait
    limit = OUTAGE_LIMIT_S if limit_s is None else limit_s
    started: float | None = None
    attempt = 0
    while True:
        try:
            result = call()
        except MlflowException as exc:
            if not is_transient(exc):
                raise
            now = clock()
            started = now if started is None else started
            pause = RETRY_EVERY_S[min(attempt, len(RETRY_EVERY_S) - 1)]
            if now - started + pause > limit or stop.is_set():
                raise
            if attempt == 0:
                say(f"warning: the MLflow server {redact(uri)} does not answer; retrying for up to {limit:.0f} s, "
                    "training goes on and its records wait in order")
            attempt += 1
            down.set()
            sleep(pause)
            if stop.is_set():
                raise
            continue
        if started is not None:
            say(f"the MLflow server {redact(uri)} answers again after {clock() - started:.0f} s; "
                "the records that waited are written")
        return result


def say(line: str) -> None:
    """A line on stderr (the training run's log)."""
    print(line, file=sys.stderr, flush=True)
