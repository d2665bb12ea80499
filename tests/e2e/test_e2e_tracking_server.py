"""`dapo train` against a real `mlflow server` over HTTP with a password in the tracking URI (issue 50): the run
is recorded on the server, and the password is in no file dapo or the server wrote, nor in what dapo printed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow import MlflowClient

sys.path.insert(0, str(Path(__file__).parent))

from test_e2e_reliability import clean_env  # noqa: E402
from test_e2e_train import write_config  # noqa: E402

PASSWORD = "pw-7f3c9e1d-not-anywhere"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def mlflow_server(tmp_path):
    """An `mlflow server` on the loopback address with its own SQLite store and artifact folder, until the test ends."""
    port, root = free_port(), tmp_path / "server"
    root.mkdir()
    cmd = [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
           "--backend-store-uri", f"sqlite:///{root / 'server.db'}", "--artifacts-destination", str(root / "artifacts"),
           "--workers", "1"]
    proc = subprocess.Popen(cmd, cwd=root, env=clean_env(), stdout=subprocess.DEVNULL, stderr=open(root / "server.log", "w"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
        time.sleep(0.5)
    yield url, root
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


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
