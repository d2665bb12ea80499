"""`dapo train` with asynchronous rollouts (``rollout.max_staleness``, the worker process) end to end:
exactness at staleness 0, the staleness metrics, kill -9 and resume, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from fixtures.experiment import experiment_runs, write_experiment
from safetensors.torch import load_file
from typer.testing import CliRunner

from dapo_cli.cli import app

RUN = "dapo-s0"
STEPS = 4


def write_config(tmp: Path, model_dir: Path, *, steps: int = STEPS, **rollout: object) -> Path:
    """4 prompts × 4 samples, 16-token responses, 2 mini-batches; dynamic sampling on the shaped score (the
    untrained policy answers nothing right, so accuracy would keep no group: the length penalty varies)."""
    cfg = {
        "data": {"train_files": ["synthetic:add-3digit"], "val_files": ["synthetic:add-3digit"],
                 "synthetic_train_size": 64, "synthetic_val_size": 6, "train_batch_size": 4, "max_prompt_length": 32},
        "model": {"path": str(model_dir)},
        "rollout": {"n": 4, "max_response_length": 16, "worker_threads": 1, **rollout},
        "algorithm": {"overlong_buffer": {"len": 8}, "filter_groups": {"metric": "score", "max_num_gen_batches": 4}},
        "trainer": {"total_steps": steps, "ppo_mini_batch_size": 2, "ppo_micro_batch_size": 3, "lr": 1e-3,
                    "lr_warmup_steps": 1, "save_freq": 2, "test_freq": 0, "log_samples_freq": 0},
        "validation": {"k": 2},
        "engine": {"num_threads": 1},
    }
    return write_experiment(tmp, cfg, "async")


def train(config: Path, *args: str) -> None:
    result = CliRunner().invoke(app, ["train", str(config), *args])
    assert result.exit_code == 0, result.output


def histories(tmp: Path) -> tuple[dict[str, list[tuple[int, float]]], object]:
    client, runs = experiment_runs(tmp, "async")
    assert len(runs) == 1
    run = runs[0]
    return {
        key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)) for key in run.data.metrics
    }, run


def final_weights(tmp: Path, step: int = STEPS) -> dict[str, torch.Tensor]:
    return load_file(tmp / "runs" / "async" / RUN / "checkpoints" / f"step_{step:06d}" / "model" / "model.safetensors")


@pytest.mark.slow
def test_staleness_0_in_the_worker_process_is_bit_identical_to_the_inline_loop(tiny_model_dir, tmp_path_factory):
    # The same run twice: rollouts generated in this process between updates (the synchronous loop), and by
    # the worker process fed the weights after every optimizer step with max_staleness 0. Every metric but
    # timings, and every weight of the final checkpoint, must be equal bit for bit.
    inline, process = tmp_path_factory.mktemp("inline"), tmp_path_factory.mktemp("process")
    train(write_config(inline, tiny_model_dir))
    train(write_config(process, tiny_model_dir, worker="process"))
    a, _ = histories(inline)
    b, _ = histories(process)
    timing = ("timing/", "perf/", "async/")
    compared = sorted(k for k in a if not k.startswith(timing))
    assert "actor/pg_loss" in compared and "rollout/logprob_diff_mean" in compared
    assert sorted(k for k in b if not k.startswith(timing)) == compared
    for key in compared:
        assert a[key] == b[key], key
    assert b["async/version_lag_max"] == [(s, 0.0) for s in range(1, STEPS + 1)]  # staleness 0: on-policy only
    assert max(v for _, v in a["train/num_gen_batches"]) >= 1
    wa, wb = final_weights(inline), final_weights(process)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name


@pytest.mark.slow
def test_one_step_off_trains_with_dynamic_sampling_and_records_the_staleness(tiny_model_dir, tmp_path):
    train(write_config(tmp_path, tiny_model_dir, max_staleness=1))
    h, run = histories(tmp_path)
    assert run.info.status == "FINISHED"
    assert run.data.params["rollout.max_staleness"] == "1"
    for key in ("async/version_lag_mean", "async/version_lag_max", "async/stale_groups_dropped", "train/num_gen_batches",
                "timing/trainer_wait_rollouts", "timing/worker_generate", "timing/worker_wait_weights", "timing/weight_sync",
                "rollout/is_weight_mean", "actor/pg_loss"):
        assert [s for s, _ in h[key]] == list(range(1, STEPS + 1)), key
    lags = [v for _, v in h["async/version_lag_max"]]
    assert lags[0] == 0.0  # step 1's round is requested when step 1 asks for it
    assert all(lag <= 1 for lag in lags) and max(lags) == 1.0  # later steps train on the rounds drawn ahead
    assert all(0 <= v <= 1 for _, v in h["async/version_lag_mean"])
    # a round drawn ahead that a step did not need (it filled its batch with fewer) is 2 versions old one step
    # later: dropped whole, 4 groups at a time
    assert all(v % 4 == 0 for _, v in h["async/stale_groups_dropped"])
    assert all(0 < v <= 2.0 for _, v in h["rollout/is_weight_mean"])  # the decoupled objective's weights (cap 2)


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc)."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out.extend(int(c) for c in text)
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pids: list[int], seconds: float = 30) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def start(config: Path, cwd: Path, *args: str, new_session: bool = False) -> subprocess.Popen:
    """``dapo train`` in a subprocess; ``new_session``: in a process group of its own, as a terminal starts it."""
    return subprocess.Popen(
        [sys.executable, "-m", "dapo_cli", "train", str(config), *args], cwd=cwd, start_new_session=new_session,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


def rounds_through(h: dict[str, list[tuple[int, float]]], step: int, per_round: int = 4) -> int:
    """Prompts the trained-on and dropped rounds of steps 1..step drew from the stream."""
    examined = sum(v for s, v in h["train/num_gen_batches"] if s <= step) * per_round
    return int(examined + sum(v for s, v in h["async/stale_groups_dropped"] if s <= step))


@pytest.mark.slow
def test_kill_9_then_resume_trains_no_sample_twice_and_none_from_after_the_checkpoint(tiny_model_dir, tmp_path):
    steps = 6
    config = write_config(tmp_path, tiny_model_dir, steps=steps, max_staleness=1)
    proc = start(config, tmp_path)
    latest = tmp_path / "runs" / "async" / RUN / "checkpoints" / "latest"
    deadline = time.monotonic() + 240
    workers: list[int] = []
    while not latest.is_file() and proc.poll() is None and time.monotonic() < deadline:
        workers = children(proc.pid) or workers
        time.sleep(0.02)
    workers = children(proc.pid) or workers
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert latest.read_text().strip() == "step_000002"
    assert workers, "the run had no worker process"
    assert wait_gone(workers) == []  # the orphaned worker (and multiprocessing's helper) exit by themselves

    state = json.loads((latest.parent / "step_000002" / "trainer_state.json").read_text())
    train(config, "--resume")
    h, run = histories(tmp_path)
    assert run.info.status == "FINISHED" and run.data.tags["dapo.resumed_from_step"] == "2"
    for key in ("actor/pg_loss", "async/version_lag_max", "train/num_gen_batches"):
        assert [s for s, _ in h[key]] == list(range(1, steps + 1)), key  # each step recorded once
    # The checkpoint's stream points just past the rounds steps 1-2 used, not past the round the killed run
    # had drawn ahead for step 3: that round is drawn again after the resume, and nothing is skipped.
    assert state["stream"] == {"epoch": 0, "position": rounds_through(h, 2)}
    final = json.loads((latest.parent / f"step_{steps:06d}" / "trainer_state.json").read_text())
    assert final["stream"] == {"epoch": 0, "position": rounds_through(h, steps)}
    # Step 3 trains on rounds sampled with the checkpoint's weights (version 2): lag 0, nothing newer exists.
    assert dict(h["async/version_lag_max"])[3] == 0.0


@pytest.mark.slow
def test_ctrl_c_stops_the_trainer_and_its_worker(tiny_model_dir, tmp_path):
    config = write_config(tmp_path, tiny_model_dir, steps=200, max_staleness=1)
    proc = start(config, tmp_path, new_session=True)
    latest = tmp_path / "runs" / "async" / RUN / "checkpoints" / "latest"
    deadline = time.monotonic() + 240
    while not latest.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    workers = children(proc.pid)
    assert workers
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: every process of the group gets SIGINT
    proc.wait(timeout=60)
    assert proc.returncode == 130, proc.stderr.read().decode()[-2000:]
    assert wait_gone(workers, 15) == []
    _, run = histories(tmp_path)
    assert run.info.status == "KILLED"
