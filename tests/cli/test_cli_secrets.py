"""A tracking URI's password never reaches the terminal (issue 54): the commands that open a store, pointed at a
server that is not there with credentials in the URI, print one ``error:`` line naming the server without them
(the credentials move into MLflow's variables at the door, issue 50: ``tracking/credentials.py``)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dapo_cli.cli import app

URI = "http://someone:s3cr3t-pw@127.0.0.1:9"  # the discard port: nothing listens


@pytest.mark.parametrize("args", [
    ["prepare-data", "--synthetic", "add-3digit", "--n", "4", "-o", "out", "--tracking-uri", URI],
    ["report", "some-ablation", "--tracking-uri", URI],
], ids=["prepare-data", "report"])
def test_an_unreachable_store_with_a_password_is_named_without_it(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = {"MLFLOW_TRACKING_URI": None, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "COLUMNS": "200"}
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "MLflow store http://127.0.0.1:9 " in errors[0], result.stderr
    assert "s3cr3t" not in result.output and "s3cr3t" not in result.stderr and "someone" not in result.stderr
    assert list(tmp_path.iterdir()) == []
