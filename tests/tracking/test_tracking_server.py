"""tracking/server.py: a server's refusal (401/403) named with where the credentials go, and a server that stops
answering waited out for a bounded time (issue 50); the real server runs in tests/e2e/test_e2e_tracking_server*.py."""

from __future__ import annotations

import pytest
import requests
from mlflow.exceptions import MlflowException, RestException

from dapo_cli.tracking.credentials import PASSWORD_VAR, USERNAME_VAR, bare_setting
from dapo_cli.tracking.server import RETRY_EVERY_S, is_server, is_transient, refusal, wait_out

URI = "http://127.0.0.1:5000"


def no_answer(chained: bool = True) -> MlflowException:
    """What MLflow's REST client raises when the connection is refused: the requests error as its cause
    (``raise ... from``), or only as its context (``set_tag`` raises inside its ``except``)."""
    try:
        raise requests.ConnectionError("Connection refused")
    except requests.ConnectionError as cause:
        try:
            message = f"API request to {URI}/api/2.0/mlflow/runs/log-batch failed with exception"
            if chained:
                raise MlflowException(message) from cause
            raise MlflowException(message)  # noqa: B904 - as MLflow's set_tag does
        except MlflowException as exc:
            return exc


def answered(code: str, status: int) -> RestException:
    return RestException({"error_code": code, "message": f"HTTP {status}"})


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def failing(times: int, exc: BaseException):
    calls = []

    def call():
        calls.append(1)
        if len(calls) <= times:
            raise exc
        return "written"

    return call, calls


def test_a_server_that_comes_back_is_waited_for_and_the_call_written_once_it_answers(capsys):
    clock = FakeClock()
    call, calls = failing(3, no_answer())
    assert wait_out(call, URI, limit_s=60, sleep=clock.sleep, clock=clock) == "written"
    assert len(calls) == 4 and clock.slept == [1.0, 2.0, 4.0]  # RETRY_EVERY_S's first three pauses
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"warning: the MLflow server {URI} does not answer; retrying for up to 60 s")
    assert lines[1].startswith(f"the MLflow server {URI} answers again after 7 s")


def test_past_the_limit_the_last_failure_is_raised():
    clock = FakeClock()
    call, calls = failing(100, no_answer())
    with pytest.raises(MlflowException, match="failed with exception"):
        wait_out(call, URI, limit_s=30, sleep=clock.sleep, clock=clock)
    # 1 + 2 + 4 + 8 + 8 = 23 s slept; one more 8 s pause would end at 31 s > 30
    assert clock.slept == [1.0, 2.0, 4.0, 8.0, 8.0] and len(calls) == 6 and RETRY_EVERY_S[-1] == 8.0


@pytest.mark.parametrize("exc", [answered("UNAUTHENTICATED", 401), answered("PERMISSION_DENIED", 403),
                                 answered("INTERNAL_ERROR", 500), MlflowException("RESOURCE_DOES_NOT_EXIST")])
def test_an_answer_that_says_no_is_raised_at_once(exc):
    clock = FakeClock()
    call, calls = failing(1, exc)
    with pytest.raises(MlflowException):
        wait_out(call, URI, limit_s=600, sleep=clock.sleep, clock=clock)
    assert calls == [1] and clock.slept == []


def test_what_counts_as_no_answer():
    assert is_transient(no_answer()) and is_transient(no_answer(chained=False))
    assert not is_transient(MlflowException("no requests error in its chain"))
    assert is_transient(answered("TEMPORARILY_UNAVAILABLE", 503))
    assert not is_transient(answered("INTERNAL_ERROR", 500))  # a server's bug: waiting would not change it
    assert not is_transient(answered("UNAUTHENTICATED", 401))
    assert [is_server(u) for u in (URI, "HTTPS://h", "sqlite:///m.db", "file:///x", "")] == [True, True, False, False, False]


def test_a_refusal_says_where_the_credentials_go(monkeypatch):
    for var in (USERNAME_VAR, PASSWORD_VAR):
        monkeypatch.delenv(var, raising=False)
    unauthenticated, denied = answered("UNAUTHENTICATED", 401), answered("PERMISSION_DENIED", 403)
    none_set = refusal(URI, unauthenticated)
    assert none_set.startswith(f"the MLflow server {URI} asks for credentials and none are set")
    assert f"${USERNAME_VAR} and ${PASSWORD_VAR}" in none_set
    monkeypatch.setenv(USERNAME_VAR, "bob")
    monkeypatch.setenv(PASSWORD_VAR, "not-in-any-message")
    wrong = refusal("http://bob:not-in-any-message@127.0.0.1:5000", unauthenticated)
    assert wrong == (f"the MLflow server {URI.replace('//', '//***@')} refused the credentials of user 'bob' (HTTP 401): "
                     f"check ${USERNAME_VAR} and ${PASSWORD_VAR}")
    assert refusal(URI, denied, "secret").startswith(f"the MLflow server {URI} refused user 'bob' access to experiment 'secret' (HTTP 403)")
    assert refusal(URI, no_answer()) is None and refusal(URI, answered("INTERNAL_ERROR", 500)) is None


def test_an_overrides_uri_loses_its_credentials_and_nothing_else():
    assert bare_setting("tracking.tracking_uri=http://me:pw@host:5000/x") == "tracking.tracking_uri=http://host:5000/x"
    assert bare_setting("tracking.tracking_uri=sqlite:///a=b.db") == "tracking.tracking_uri=sqlite:///a=b.db"
    assert bare_setting("trainer.lr=1e-4") == "trainer.lr=1e-4" and bare_setting("odd") == "odd"


def test_a_run_that_ends_stops_waiting_at_once():
    """Ctrl-C or a failure during an outage: the tracker is abandoned, and a call waiting for the server gives up
    within its current pause (the real pause is the event's wait, cut short when it is set)."""
    import threading
    import time

    stop = threading.Event()
    call, calls = failing(100, no_answer())
    threading.Timer(0.2, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(MlflowException):
        wait_out(call, URI, limit_s=600, stop=stop)
    assert time.monotonic() - t0 < 0.9 and len(calls) == 1  # woke in the first 1 s pause, no second try
    clock = FakeClock()
    call, calls = failing(100, no_answer())
    with pytest.raises(MlflowException):  # already ended: not even one pause
        wait_out(call, URI, limit_s=600, stop=stop, sleep=clock.sleep, clock=clock)
    assert calls == [1] and clock.slept == []
