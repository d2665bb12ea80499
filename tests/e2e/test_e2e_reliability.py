"""`dapo train` under concurrency, kills, orphaned runs and a policy that goes non-finite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from dapo_cli.cli import app

sys.path.insert(0, str(Path(__file__).parent))

from test_e2e_train import RUN, write_config  # noqa: E402


def clean_env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "MLFLOW_TRACKING_URI"):
        env.pop(var, None)
    return env


def test_two_trains_started_together_on_a_fresh_store_get_distinct_runs(tmp_path, tiny_model_dir):
    config = write_config(tmp_path, tiny_model_dir, steps=2)
    cmd = [sys.executable, "-m", "dapo_cli", "train", str(config), "--no-dynamic-sampling"]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    runs_dir = tmp_path / "runs" / "e2e"
    assert sorted(d.name for d in runs_dir.iterdir()) == [RUN, f"{RUN}-2"]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("e2e").experiment_id])
    assert len(runs) == 2 and {r.info.status for r in runs} == {"FINISHED"}
    assert {r.data.tags["dapo.run_dir"] for r in runs} == {str((runs_dir / n).resolve()) for n in (RUN, f"{RUN}-2")}
    for run in runs:  # each run's checkpoint is its own and complete
        ckpt = Path(run.data.tags["dapo.checkpoint"])
        assert ckpt.parents[2] == Path(run.data.tags["dapo.run_dir"]) and (ckpt / "model.safetensors").is_file()


def test_resume_cleans_a_killed_checkpoint_write_and_a_dead_runs_status(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path, tiny_model_dir, steps=2)
    assert CliRunner().invoke(app, ["train", str(config), "--no-dynamic-sampling"]).exit_code == 0
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("e2e").experiment_id])
    # what a kill -9 in the middle of the step-4 checkpoint leaves: a temp dir, and a RUNNING run
    leftover = tmp_path / "runs" / "e2e" / RUN / "checkpoints" / ".step_000004.tmp"
    (leftover / "model").mkdir(parents=True)
    client.update_run(run.info.run_id, status="RUNNING")
    dead = client.create_run(run.info.experiment_id, run_name="killed-early", tags={"dapo.run_dir": str(tmp_path / "gone")})
    result = CliRunner().invoke(app, ["train", str(config), "--no-dynamic-sampling", "--resume", "--set", "trainer.total_steps=3"])
    assert result.exit_code == 0, result.output
    assert not leftover.exists() and "removed 1 unfinished checkpoint write(s): .step_000004.tmp" in result.output
    assert client.get_run(run.info.run_id).info.status == "FINISHED"  # continued, not marked orphaned
    orphan = client.get_run(dead.info.run_id)
    assert orphan.info.status == "KILLED" and orphan.data.tags["dapo.orphaned"] == "true"


def test_a_policy_that_goes_non_finite_stops_with_its_own_exit_code(tmp_path, tiny_model_dir, monkeypatch):
    from dapo_cli.engine.torch import TorchEngine

    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path, tiny_model_dir, steps=4)
    calls = {"n": 0}
    real = TorchEngine.params_finite

    def finite_until_step_3(self):
        calls["n"] += 1
        return real(self) and calls["n"] < 3  # checked once per step, and before each checkpoint

    monkeypatch.setattr(TorchEngine, "params_finite", finite_until_step_3)
    result = CliRunner().invoke(app, ["train", str(config), "--no-dynamic-sampling", "--set", "trainer.save_freq=1"])
    assert result.exit_code == 4, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "parameters became non-finite in the update of step 2" in errors[0]
    assert "the last good checkpoint is" in errors[0] and "step_000001" in errors[0]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("e2e").experiment_id])
    assert run.info.status == "FAILED" and run.data.tags["dapo.stopped"] == "non_finite"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "timing/step")] == [1]


def test_reading_a_store_that_does_not_exist_creates_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["report", "some-ablation", "--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}"])
    assert result.exit_code == 2 and "no MLflow store at" in result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("uri", ["http://127.0.0.1:9"])
def test_an_unreachable_tracking_server_fails_fast_with_one_line(tmp_path, tiny_model_dir, uri):
    import time

    config = write_config(tmp_path, tiny_model_dir, steps=1)
    env = {**clean_env(), "MLFLOW_TRACKING_URI": uri}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "dapo_cli", "train", str(config), "--set", "tracking.tracking_uri="],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and uri in errors[0] and "Traceback" not in proc.stderr
    assert elapsed < 60  # MLflow's own retry defaults took 249 s here


def test_a_run_stopped_by_the_collapse_guard_exits_3_and_says_why(tmp_path, tiny_model_dir, monkeypatch):
    # the untrained policy answers nothing right: with dynamic sampling no group is ever kept
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path, tiny_model_dir, steps=6)
    result = CliRunner().invoke(app, ["train", str(config), "--set", "trainer.collapse_patience=2",
                                      "--set", "algorithm.filter_groups.max_num_gen_batches=1"])
    assert result.exit_code == 3, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "stopped at step 2: 2 steps in a row without an informative group" in errors[0]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("e2e").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["dapo.stopped"] == "collapse"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "timing/step")] == [1, 2]


def test_a_schedulers_stop_request_checkpoints_the_step_and_resume_logs_every_step_once(tmp_path, tiny_model_dir, monkeypatch):
    """SIGUSR2 (Slurm's time-limit warning, as submitit asks for it) in step 2 of 4 with save_freq 0: the run ends
    step 2, saves step_000002 (not due otherwise), exits 6 (PREEMPTED) with the resume command, the MLflow run is
    KILLED; `--resume` continues the same run at step 3, so each metric holds steps 1..4 exactly once."""
    import signal

    from dapo_cli.train import loop

    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path, tiny_model_dir, steps=4)
    real = loop.record_step

    def signalled_in_step_2(s, tracker, step, *args, **kwargs):
        if step == 2:
            os.kill(os.getpid(), signal.SIGUSR2)  # arrives mid-step: recorded, the step goes on
        return real(s, tracker, step, *args, **kwargs)

    monkeypatch.setattr(loop, "record_step", signalled_in_step_2)
    args = ["train", str(config), "--no-dynamic-sampling", "--set", "trainer.save_freq=0"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 6, result.output
    assert "stopped by SIGUSR2 (a scheduler's warning: time limit or preemption) after step 2" in result.output
    assert "step_000002 is kept in" in result.output and "resume with: dapo train" in result.output
    checkpoints = tmp_path / "runs" / "e2e" / RUN / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("step_*")) == ["step_000002"]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("e2e").experiment_id])
    assert run.info.status == "KILLED"
    from dapo_cli.signals import _record_early

    assert signal.getsignal(signal.SIGUSR2) is _record_early  # the loop's handler is gone; the command's stays (its process)
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)

    monkeypatch.setattr(loop, "record_step", real)
    result = CliRunner().invoke(app, [*args, "--resume"])
    assert result.exit_code == 0, result.output
    (again,) = client.search_runs([client.get_experiment_by_name("e2e").experiment_id])
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    for key in ("timing/step", "actor/pg_loss", "response_length/mean"):
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, key)) == [1, 2, 3, 4], key


def test_a_stop_request_during_start_up_is_kept_for_the_loop(monkeypatch):
    """Slurm may warn a job seconds after its start, while `dapo train` still imports: the signal is recorded from the
    command's first line and the loop's stop_requests() starts with it (and takes it, so a later loop starts clean)."""
    import signal

    from dapo_cli.signals import record_stop_requests_early, stop_requests

    previous = signal.getsignal(signal.SIGUSR2)
    try:
        record_stop_requests_early()
        os.kill(os.getpid(), signal.SIGUSR2)  # the process lives on: recorded, not its default action
        with stop_requests() as stop:
            assert stop.name == "SIGUSR2"
        with stop_requests() as stop:
            assert stop.signum is None
    finally:
        signal.signal(signal.SIGUSR2, previous)
