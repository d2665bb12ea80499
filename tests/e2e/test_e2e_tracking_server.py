"""`dapo train` against a real `mlflow server` over HTTP with a password in the tracking URI (issue 50): the run
is recorded on the server, and the password is in no file dapo or the server wrote, nor in what dapo printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from test_e2e_reliability import clean_env  # noqa: E402
from test_e2e_train import write_config  # noqa: E402

PASSWORD = "pw-7f3c9e1d-not-anywhere"


@pytest.fixture()
def mlflow_server(tmp_path):
    """An `mlflow server` on the loopback address with its own SQLite store and artifact folder, until the test
    ends (the tracking benchmark's helper: ``benchmarks/tracking_overhead.mlflow_server``)."""
    from tracking_overhead import mlflow_server as serve

    root = tmp_path / "server"
    root.mkdir()
    with serve(root, timeout=90) as url:
        if url is None:
            pytest.fail(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
        yield url, root


def test_a_password_in_the_uri_is_in_no_record_and_the_run_reaches_the_server(tmp_path, tiny_model_dir, mlflow_server):
    url, server_root = mlflow_server
    work = tmp_path / "work"
    work.mkdir()
    config = write_config(work, tiny_model_dir, steps=2)  # a checkpoint at step 2 (dapo_run.json), uploaded (log_checkpoint final)
    secret_uri = url.replace("http://", f"http://admin:{PASSWORD}@")
    env = {k: v for k, v in clean_env().items() if not k.startswith("MLFLOW_TRACKING_")}
    proc = subprocess.run([sys.executable, "-m", "dapo_cli", "train", str(config), "--no-dynamic-sampling",
                           "--set", f"tracking.tracking_uri={secret_uri}"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert PASSWORD not in proc.stdout and PASSWORD not in proc.stderr
    assert url in proc.stdout + proc.stderr  # where the run is, named by the bare URI
    # every file: the run folder, the checkpoint's dapo_run.json, the server's database and uploaded artifacts
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "dapo_run.json" for p in files) and any(p.name == "server.db" for p in files)
    assert [p for p in files if PASSWORD.encode() in p.read_bytes()] == []
    client = MlflowClient(url)
    runs = client.search_runs([client.get_experiment_by_name("e2e").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert runs[0].data.params["tracking.tracking_uri"] == url
    summary = next(work.rglob("summary.json")).read_text()
    assert f'"tracking_uri": "{url}"' in summary
