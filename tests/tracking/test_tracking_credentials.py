"""tracking/credentials.py: a URI's user and password move into MLflow's environment variables at the door, so
no record dapo writes holds them while MLflow's client still sends them (issue 50)."""

from __future__ import annotations

import pytest

from dapo_cli.errors import UserError
from dapo_cli.tracking.credentials import PASSWORD_VAR, URI_VAR, USERNAME_VAR, move_credentials, split_credentials


@pytest.fixture()
def env(monkeypatch):
    for var in (USERNAME_VAR, PASSWORD_VAR, URI_VAR):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@pytest.mark.parametrize("uri, want", [
    ("http://me:s3cret@host:5000", ("http://host:5000", "me", "s3cret")),
    ("https://me:p%40ss%3Aw0rd@host/prefix?x=1", ("https://host/prefix?x=1", "me", "p@ss:w0rd")),  # percent-decoded
    ("HTTP://token@host", ("http://host", "token", None)),  # a user (a token) without a password; the scheme lowered
    ("http://me:@host", ("http://host", "me", "")),  # an empty password is a password
    ("http://me:pw@[::1]:5000", ("http://[::1]:5000", "me", "pw")),
    ("http://host:5000", ("http://host:5000", None, None)),
    ("sqlite:///mlflow.db", ("sqlite:///mlflow.db", None, None)),
    ("file:///tmp/mlruns", ("file:///tmp/mlruns", None, None)),
    ("", ("", None, None)),
])
def test_split_credentials(uri, want):
    assert split_credentials(uri) == want


def test_a_settings_credentials_move_into_the_environment(env):
    import os

    assert move_credentials("http://me:s3cret@host:5000", "--tracking-uri") == "http://host:5000"
    assert (os.environ[USERNAME_VAR], os.environ[PASSWORD_VAR]) == ("me", "s3cret")
    assert URI_VAR not in os.environ


def test_the_environment_uris_credentials_move_too_and_the_variable_keeps_the_bare_uri(env):
    import os

    env.setenv(URI_VAR, "http://me:s3cret@host:5000")
    assert move_credentials("", "tracking.tracking_uri") == ""  # the setting is empty: the variable is used
    assert os.environ[URI_VAR] == "http://host:5000"  # what children and the tracker resolve
    assert (os.environ[USERNAME_VAR], os.environ[PASSWORD_VAR]) == ("me", "s3cret")


def test_the_same_credentials_twice_are_fine_and_different_ones_are_one_line(env):
    env.setenv(USERNAME_VAR, "me")
    env.setenv(PASSWORD_VAR, "s3cret")
    assert move_credentials("http://me:s3cret@host", "--tracking-uri") == "http://host"
    with pytest.raises(UserError, match=r"the password in --tracking-uri differs from \$MLFLOW_TRACKING_PASSWORD") as err:
        move_credentials("http://me:other@host", "--tracking-uri")
    assert "other" not in str(err.value) and "s3cret" not in str(err.value)


def test_a_uri_without_credentials_changes_nothing(env):
    import os

    assert move_credentials("sqlite:///mlflow.db", "--tracking-uri") == "sqlite:///mlflow.db"
    assert USERNAME_VAR not in os.environ and PASSWORD_VAR not in os.environ


def test_mlflows_client_reads_the_moved_credentials(env):
    # what RestStore sends as basic auth comes from these variables (MLflow's documented way to authenticate)
    from mlflow.utils.credentials import read_mlflow_creds

    move_credentials("http://me:s3cret@host:5000", "--tracking-uri")
    creds = read_mlflow_creds()
    assert (creds.username, creds.password) == ("me", "s3cret")


def test_the_module_examples_hold():
    import doctest

    import dapo_cli.tracking.credentials

    result = doctest.testmod(dapo_cli.tracking.credentials)
    assert result.attempted >= 3 and result.failed == 0
