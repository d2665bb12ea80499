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


OUTAGE_S = 30
"""How long the server is down mid-run (issue 50)."""


@pytest.mark.cluster
def test_a_server_down_for_30_s_mid_run_loses_no_step(tmp_path, tiny_model_dir):
    """The server stops (SIGTERM to its process group) after step 2 is recorded and comes back 30 s later on the same
    port and store. Training goes on meanwhile, checkpoints included; the records wait in order and reach the
    server when it is back (tracking/server.py): every key's history holds each step once, and the per-step keys
    hold steps 1..N."""
    import time

    from tracking_overhead import free_port
    from tracking_overhead import mlflow_server as serve

    steps = 12
    root, work = tmp_path / "server", tmp_path / "work"
    root.mkdir()
    work.mkdir()
    config = write_config(work, tiny_model_dir, steps=steps)
    port = free_port()
    env = {k: v for k, v in clean_env().items() if not k.startswith("MLFLOW_TRACKING_")}
    out, err = (work / "stdout.txt").open("w"), (work / "stderr.txt").open("w")
    with serve(root, timeout=90, port=port, settle=1) as url:
        assert url is not None, (root / "server.log").read_text()[-2000:]
        # a checkpoint every 2 steps: one waits for the steps before it to be on the server, unless the server is down
        proc = subprocess.Popen([sys.executable, "-m", "dapo_cli", "train", str(config), "--no-dynamic-sampling",
                                 "--set", f"tracking.tracking_uri={url}"],
                                cwd=work, env=env, stdout=out, stderr=err)
        client = MlflowClient(url)
        deadline = time.monotonic() + 300
        while True:  # until step 2 is on the server
            experiment = client.get_experiment_by_name("e2e")
            runs = client.search_runs([experiment.experiment_id]) if experiment else []
            recorded = [m.step for m in client.get_metric_history(runs[0].info.run_id, "timing/step")] if runs else []
            if max(recorded, default=0) >= 2:
                break
            assert proc.poll() is None and time.monotonic() < deadline, (work / "stderr.txt").read_text()[-3000:]
            time.sleep(0.2)
        run_id = runs[0].info.run_id
    down_at = time.monotonic()
    time.sleep(OUTAGE_S)
    during = (work / "stderr.txt").read_text()
    saved_during = {p.name for p in (work / "runs" / "e2e").glob("*/checkpoints/step_*")}
    with serve(root, timeout=90, port=port, settle=0) as again:
        assert again == url, (root / "server.log").read_text()[-2000:]
        up_at = time.monotonic()
        assert proc.wait(timeout=300) == 0, (work / "stderr.txt").read_text()[-3000:]
        out.close()
        err.close()
        stderr = (work / "stderr.txt").read_text()
        assert up_at - down_at >= OUTAGE_S
        # what the user saw: one line when the server stopped answering, one when it was back; no traceback
        warnings = [line for line in stderr.splitlines() if "does not answer" in line]
        assert len(warnings) == 1 and warnings[0].startswith(f"warning: the MLflow server {url} does not answer"), stderr[-3000:]
        assert warnings[0] in during and "Traceback" not in stderr
        assert f"step {steps}/{steps} " in during  # training went on to its last step while the server was down
        assert f"step_{steps:06d}" in saved_during  # and its checkpoints did not wait for the server
        assert len([line for line in stderr.splitlines() if "answers again after" in line]) == 1, stderr[-3000:]
        # what the server holds: the run FINISHED, each key's steps once, every per-step key at 1..N
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED"
        histories = {key: [m.step for m in client.get_metric_history(run_id, key)] for key in run.data.metrics}
        assert {key: s for key, s in histories.items() if len(s) != len(set(s))} == {}
        per_step = {key: sorted(s) for key, s in histories.items() if 1 in s}
        assert len(per_step) >= 20 and {k: s for k, s in per_step.items() if s != list(range(1, steps + 1))} == {}
        assert sorted(histories["val/avg_at_2"]) == [0, steps]
        assert (work / "runs" / "e2e").is_dir() and url in (work / "stdout.txt").read_text()
