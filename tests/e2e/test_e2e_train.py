"""`dapo train` end to end on a tiny policy, asserting on what MLflow recorded; kill and resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from fixtures.experiment import experiment_runs, write_experiment
from mlflow import MlflowClient
from typer.testing import CliRunner

from dapo_cli.cli import app

RUN = "grpo+overlong_filtering+clip_higher+overlong_shaping+token_level_loss-s0"
"""The run name of write_config's runs with dynamic sampling off."""

STEP_METRICS = [
    "response_length/mean", "response_length/max", "response_length/min", "response_length/clip_ratio",
    "reward/score_mean", "reward/acc_mean", "rollout/acc", "actor/entropy", "actor/mean_prob", "actor/pg_loss",
    "actor/pg_clipfrac", "actor/clipfrac_high", "actor/clipfrac_low", "actor/ppo_kl", "actor/grad_norm",
    "train/num_gen_batches", "train/kept_group_frac", "train/samples_generated", "overlong/truncated_frac",
    "timing/gen_and_score", "timing/step", "perf/gen_tokens_per_s",
]


def write_config(tmp: Path, model_dir: Path, steps: int) -> Path:
    """A 2-core-friendly experiment: 4 prompts × 4 samples, 16-token responses, 2 mini-batches."""
    cfg = {
        "data": {"train_files": ["synthetic:add-3digit"], "val_files": ["synthetic:add-3digit"],
                 "synthetic_train_size": 64, "synthetic_val_size": 6, "train_batch_size": 4, "max_prompt_length": 32},
        "model": {"path": str(model_dir)},
        "rollout": {"n": 4, "max_response_length": 16},
        "algorithm": {"overlong_buffer": {"len": 8}},
        "trainer": {"total_steps": steps, "ppo_mini_batch_size": 2, "ppo_micro_batch_size": 3, "lr": 1e-3,
                    "lr_warmup_steps": 1, "save_freq": 2, "test_freq": 0, "log_samples_freq": 2},
        "validation": {"k": 2},
    }
    return write_experiment(tmp, cfg, "e2e")


def only_run(tmp: Path):
    client, runs = experiment_runs(tmp, "e2e")
    assert len(runs) == 1
    return client, runs[0]


def last_values(client: MlflowClient, run_id: str, keys: list[str], step: int) -> dict[str, float]:
    out = {}
    for key in keys:
        history = [m for m in client.get_metric_history(run_id, key) if m.step == step]
        out[key] = history[-1].value
    return out


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_two_steps_record_params_metrics_samples_and_checkpoint(workdir, tiny_model_dir):
    config = write_config(workdir, tiny_model_dir, steps=2)
    # The untrained policy answers nothing right, so dynamic sampling (on accuracy) would keep no
    # group; without it, the soft overlong punishment still gives groups different rewards.
    result = CliRunner().invoke(app, ["train", str(config), "--no-dynamic-sampling"])
    assert result.exit_code == 0, result.output
    client, run = only_run(workdir)
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["algorithm.clip_ratio_high"] == "0.28"
    assert params["algorithm.filter_groups.enable"] == "False"
    assert params["rollout.n"] == "4"
    tags = run.data.tags
    assert tags["technique.dynamic_sampling"] == "false" and tags["technique.clip_higher"] == "true"
    assert tags["dapo.variant"] == "grpo+overlong_filtering+clip_higher+overlong_shaping+token_level_loss"
    assert "train" in tags["dapo.command"] and tags["dapo.seed"] == "0"
    for key in STEP_METRICS:
        steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert steps == [1, 2], key
    # the HF engine samples with the trainer's own module: its log-probs are the trainer's, up to
    # batching (a different padding width in the trainer's forward)
    mismatch = last_values(client, run.info.run_id, ["rollout/logprob_diff_mean", "rollout/logprob_diff_max"], 2)
    assert 0.0 <= mismatch["rollout/logprob_diff_mean"] <= mismatch["rollout/logprob_diff_max"] < 1e-4
    # 4 prompts × 4 samples, one generation round per step without dynamic sampling.
    assert last_values(client, run.info.run_id, ["train/samples_generated"], 2)["train/samples_generated"] == 16
    # validation before the first step and after the last (test_freq 0)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val/avg_at_2")] == [0, 2]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "dataset_manifest.json", "checkpoint"} <= artifacts
    assert [a.path for a in client.list_artifacts(run.info.run_id, "samples")] == ["samples/step_000002.json"]
    ckpt = Path(tags["dapo.checkpoint"])
    assert ckpt.name == "model" and (ckpt / "model.safetensors").is_file()
    assert (ckpt.parent / "trainer_state.json").is_file() and (ckpt.parent / "rng" / "rank_00000.safetensors").is_file()
    assert (ckpt.parent / "engine" / "optimizer.safetensors").is_file() and not list(ckpt.parent.rglob("*.pt"))
    resolved = yaml.safe_load((ckpt.parents[2] / "config.yaml").read_text())
    assert resolved["algorithm"]["filter_groups"]["enable"] is False


def test_killed_run_resumes_to_the_same_metrics(workdir, tiny_model_dir, tmp_path_factory):
    steps = 4
    keys = ["actor/pg_loss", "actor/entropy", "reward/score_mean", "response_length/mean", "actor/grad_norm"]
    # 1. Uninterrupted reference run in its own folder.
    ref_dir = tmp_path_factory.mktemp("reference")
    ref_cfg = write_config(ref_dir, tiny_model_dir, steps)
    assert CliRunner().invoke(app, ["train", str(ref_cfg), "--no-dynamic-sampling"]).exit_code == 0
    ref_client, ref_run = only_run(ref_dir)
    reference = last_values(ref_client, ref_run.info.run_id, keys, steps)

    # 2. The same run, SIGKILLed once its step-2 checkpoint exists, then resumed.
    config = write_config(workdir, tiny_model_dir, steps)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dapo_cli", "train", str(config), "--no-dynamic-sampling"],
        cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    latest = workdir / "runs" / "e2e" / "grpo+overlong_filtering+clip_higher+overlong_shaping+token_level_loss-s0" / "checkpoints" / "latest"
    deadline = time.monotonic() + 240
    while not latest.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert latest.read_text().strip() == "step_000002"

    result = CliRunner().invoke(app, ["train", str(config), "--no-dynamic-sampling", "--resume"])
    assert result.exit_code == 0, result.output
    client, run = only_run(workdir)  # the same MLflow run continued
    assert run.info.status == "FINISHED"
    assert run.data.tags["dapo.resumed_from_step"] == "2"
    resumed = last_values(client, run.info.run_id, keys, steps)
    for key in keys:
        assert resumed[key] == pytest.approx(reference[key], rel=1e-5, abs=1e-7), key
    # the history equals the uninterrupted run's: steps replayed after the checkpoint are not
    # recorded twice (the kill came after step 2's checkpoint, maybe after steps 3-4 were logged)
    for key in [*keys, "timing/step"]:
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == list(range(1, steps + 1)), key
    tables = {a.path: a.file_size for a in client.list_artifacts(run.info.run_id, "samples")}
    ref_tables = {a.path: a.file_size for a in ref_client.list_artifacts(ref_run.info.run_id, "samples")}
    assert tables.keys() == ref_tables.keys() == {"samples/step_000002.json", "samples/step_000004.json"}
    assert tables["samples/step_000002.json"] == ref_tables["samples/step_000002.json"]  # not appended to twice


def test_resume_without_a_checkpoint_is_a_one_line_error(workdir, tiny_model_dir):
    config = write_config(workdir, tiny_model_dir, steps=2)
    result = CliRunner().invoke(app, ["train", str(config), "--resume"])
    assert result.exit_code == 2
    assert "no checkpoint" in result.output and "Traceback" not in result.output


def test_the_mlflow_run_names_its_code_data_and_label(workdir, tiny_model_dir):
    config = write_config(workdir, tiny_model_dir, steps=1)
    result = CliRunner().invoke(app, ["train", str(config), "--no-dynamic-sampling", "--set", "tracking.run_label=short one",
                                      "--set", "tracking.log_checkpoint=every", "--set", "trainer.save_freq=1"])
    assert result.exit_code == 0, result.output
    client, run = only_run(workdir)
    assert run.info.run_name == "short one" and run.data.tags["dapo.run_name"] == RUN
    # run from a temporary directory, the commit is still the checkout's the package came from
    assert len(run.data.tags["dapo.git_commit"].split("+")[0]) == 40
    inputs = {(d.dataset.name, [t.value for t in d.tags][0]) for d in run.inputs.dataset_inputs}
    assert inputs == {("synthetic:add-3digit", "training"), ("synthetic:add-3digit", "validation")}
    assert json.loads(run.inputs.dataset_inputs[0].dataset.profile)["num_rows"] in (64, 6)
    assert [a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")] == ["checkpoints/step_000001"]
