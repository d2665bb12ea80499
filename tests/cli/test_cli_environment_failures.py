"""The machine failing a command whose input was valid: a full disk during a checkpoint, a tracking store
that stops answering mid-run. One ``error:`` line, exit 5 (``errors.ENVIRONMENT``), no traceback, the MLflow
run marked FAILED, and no half-written checkpoint left behind."""

from __future__ import annotations

import errno
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dapo_cli.cli import app
from dapo_cli.errors import ENVIRONMENT, EnvironmentFailure, environment_failure

ENV = {"MLFLOW_TRACKING_URI": None, "DAPO_PARENT_RUN_ID": None, "DAPO_EXTRA_TAGS": None, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}


# ---------------------------------------------------------------- recognising the machine's failures


def test_an_os_error_of_a_full_disk_anywhere_in_the_chain_is_the_machines():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/runs/x/.step_000002.tmp/optimizer.pt")
        except OSError as inner:
            raise RuntimeError("PytorchStreamWriter failed writing file data/0") from inner
    except RuntimeError as exc:
        failure = environment_failure(exc)
    assert isinstance(failure, EnvironmentFailure) and failure.exit_code == ENVIRONMENT == 5
    assert str(failure).startswith("no space left on device writing /runs/x/.step_000002.tmp/optimizer.pt; free space")
    assert "--resume" in str(failure)


def test_a_rust_io_error_text_is_recognised():
    class SafetensorError(Exception):  # safetensors raises its own type, with io::Error's text
        pass

    failure = environment_failure(SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, "
                                                  "message: \"No space left on device\" }) No space left on device (os error 28)"))
    assert failure is not None and str(failure).startswith("no space left on device (SafetensorError: ")


@pytest.mark.parametrize("exc", [ValueError("bad"), OSError(errno.ENOENT, "No such file"), KeyError("x"), RuntimeError("os error 2")])
def test_bugs_and_other_errors_keep_their_traceback(exc):
    assert environment_failure(exc) is None


# ---------------------------------------------------------------- through `dapo train`


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs (root only; skipped where mounting is not permitted): room for a run directory's
    lock and config, not for a checkpoint."""
    target = tmp_path / "small"
    target.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs mount(8)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(target)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


def train_args(model: Path, tmp_path: Path, *extra: str) -> list[str]:
    return [
        "train", "--set", f"model.path={model}", "--set", "trainer.total_steps=2", "--set", "trainer.save_freq=1",
        "--set", "trainer.test_freq=0", "--set", "data.train_batch_size=2", "--set", "rollout.n=2",
        "--set", "trainer.ppo_mini_batch_size=2", "--set", "rollout.max_response_length=8", "--set", "algorithm.overlong_buffer.len=4", "--no-dynamic-sampling",
        "--set", "validation.max_tokens=4", "--set", "data.synthetic_val_size=2",
        "--set", f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", "--set", "tracking.experiment=env", *extra,
    ]


def run_status(tmp_path: Path) -> str:
    from dapo_cli.tracking.mlflow import open_client

    client = open_client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("env")
    (run,) = client.search_runs([exp.experiment_id])
    return run.info.status


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_is_one_line_exit_5_and_leaves_no_partial_checkpoint(tiny_model_dir, tmp_path, small_disk):
    result = CliRunner().invoke(app, train_args(tiny_model_dir, tmp_path, "--set", f"trainer.output_dir={small_disk}/runs"), env=ENV)
    assert result.exit_code == ENVIRONMENT, result.output
    (line,) = error_lines(result.stderr)
    assert "no space left on device" in line and "--resume" in line, line
    assert "Traceback" not in result.stderr
    assert run_status(tmp_path) == "FAILED"
    leftovers = [p.name for p in small_disk.rglob(".step_*")]
    assert leftovers == []  # the unfinished .step_000001.tmp was removed


@pytest.mark.slow
def test_a_tracking_store_lost_mid_run_is_one_line_exit_5(tiny_model_dir, tmp_path, monkeypatch):
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    real = MlflowClient.log_batch
    calls = {"metrics": 0}

    def failing(self, run_id, metrics=(), params=(), tags=(), **kw):
        if metrics:
            calls["metrics"] += 1
            if calls["metrics"] >= 2:  # step 1's metrics are stored, then the server goes away
                raise MlflowException("API request to http://tracking:5000/api/2.0/mlflow/runs/log-batch failed: Connection refused")
        return real(self, run_id, metrics=metrics, params=params, tags=tags, **kw)

    monkeypatch.setattr(MlflowClient, "log_batch", failing)
    result = CliRunner().invoke(app, train_args(tiny_model_dir, tmp_path, "--set", f"trainer.output_dir={tmp_path}/runs"), env=ENV)
    assert result.exit_code == ENVIRONMENT, result.output
    (line,) = error_lines(result.stderr)
    assert "the MLflow store" in line and "failed during the run" in line and "Connection refused" in line, line
    assert "Traceback" not in result.stderr
