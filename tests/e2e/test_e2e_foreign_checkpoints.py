"""Checkpoint folders from elsewhere run no code: a pickle planted in any state file a checkpoint holds never runs
for `dapo eval` or `dapo train --resume` (the command refuses it with one line, or goes on without the file where
it needs none). Runs of an older dapo still resume: its ``.pt`` state files are read safely, and its config.yaml,
which lacks the keys added since, resumes when their declared values do what that dapo did."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import yaml
from fixtures.experiment import experiment_runs, write_experiment
from foreign_files import as_written_by, live, plant, to_legacy
from safetensors.torch import load_file
from typer.testing import CliRunner

from dapo_cli.cli import app
from dapo_cli.config.versions import SCHEMA_VERSION
from dapo_cli.data.schema import make_row, write_dapo_parquet

RUN = "grpo+overlong_filtering+clip_higher+overlong_shaping+token_level_loss-s0"
PLANTED = ("trainer_state.pt", "engine/optimizer.pt", "rng/rank_00000.pt", "rng/rank_00001.pt",
           "engine/state/mp_rank_00_model_states.pt")
"""Every ``.pt`` a checkpoint of some dapo held (the last one: DeepSpeed's, which dapo never reads itself)."""
runner = CliRunner()


def error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_eval_of_a_folder_from_elsewhere_reads_none_of_its_state_files(tmp_path, tiny_model_dir, monkeypatch) -> None:
    """A plain model in ``model/`` (no dapo_run.json) beside planted state files: the eval runs, unlinked."""
    assert live(tmp_path)
    monkeypatch.chdir(tmp_path)
    folder, marker = tmp_path / "downloaded", tmp_path / "marker"
    shutil.copytree(tiny_model_dir, folder / "model")
    for name in PLANTED:
        plant(folder / name, marker, mlflow_run_id="0" * 32, step=3)
    data = tmp_path / "two.parquet"
    write_dapo_parquet([make_row("What is 1+1?", "2", index=0, template="{problem} Answer:")], data)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for target in (folder / "model", folder):
        result = runner.invoke(app, ["eval", str(target), "--dataset", str(data), "--avg", "2", "--pass-k", "1",
                                     "--max-tokens", "4", "--tracking-uri", uri, "--output", str(tmp_path / "out"), "--json"])
        assert result.exit_code == 0, result.output
        assert not marker.exists()
    client, runs = experiment_runs(tmp_path, "dapo")
    assert len(runs) == 2 and not any(k.startswith("dapo.source_") for r in runs for k in r.data.tags)


def write_config(tmp: Path, model_dir: Path) -> Path:
    """4 prompts × 4 samples, 16-token responses, 2 steps with a checkpoint after each."""
    cfg = {
        "data": {"train_files": ["synthetic:add-3digit"], "val_files": ["synthetic:add-3digit"],
                 "synthetic_train_size": 64, "synthetic_val_size": 4, "train_batch_size": 4, "max_prompt_length": 32},
        "model": {"path": str(model_dir)},
        "rollout": {"n": 4, "max_response_length": 16},
        "algorithm": {"overlong_buffer": {"len": 8}, "filter_groups": {"enable": False}},
        "trainer": {"total_steps": 2, "ppo_mini_batch_size": 2, "ppo_micro_batch_size": 4, "lr": 1e-3,
                    "lr_warmup_steps": 1, "save_freq": 1, "test_freq": 0, "log_samples_freq": 0},
        "validation": {"k": 1},
        "engine": {"device": "cpu", "num_threads": 1},
    }
    return write_experiment(tmp, cfg, "foreign")


@pytest.fixture()
def trained(tmp_path, tiny_model_dir, monkeypatch):
    """A finished 2-step run (checkpoints step 1 and 2) and a way to put its checkpoints back as they were."""
    threads = torch.get_num_threads()
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path, tiny_model_dir)
    assert runner.invoke(app, ["train", str(config)]).exit_code == 0
    root = tmp_path / "runs" / "foreign" / RUN / "checkpoints"
    shutil.copytree(root, tmp_path / "pristine")

    def restore() -> None:
        shutil.rmtree(root)
        shutil.copytree(tmp_path / "pristine", root)

    yield config, root, restore
    torch.set_num_threads(threads)


def resume(config: Path):
    return runner.invoke(app, ["train", str(config), "--resume", "--set", "trainer.total_steps=3"])


@pytest.mark.slow
def test_resume_refuses_planted_state_files_and_resumes_an_older_dapos_checkpoint(trained, tmp_path) -> None:
    config, root, restore = trained
    marker = tmp_path / "marker"
    assert live(tmp_path)
    steps = [root / "step_000001", root / "step_000002"]

    # a planted trainer state in every checkpoint: nothing to resume from; one line says why and what to do
    for ckpt in steps:
        to_legacy(ckpt)
        plant(ckpt / "trainer_state.pt", marker, step=2)
    line = error_line(resume(config))
    assert "has no complete checkpoint (step_000002: trainer_state.pt is refused: torch's safe reader" in line
    assert f"--set model.path={steps[0] / 'model'}" in line and not marker.exists()

    # a planted optimizer state beside a readable trainer state: refused when the engine restores
    restore()
    to_legacy(steps[1])
    plant(steps[1] / "engine" / "optimizer.pt", marker)
    line = error_line(resume(config))
    assert f"error: {steps[1] / 'engine' / 'optimizer.pt'} is refused" in line and not marker.exists()

    # planted files beside this dapo's state files are never opened: the resume goes on
    restore()
    for name in PLANTED:
        plant(steps[1] / name, marker)
    result = resume(config)
    assert result.exit_code == 0, result.output
    assert not marker.exists()
    resumed = load_file(root / "step_000003" / "model" / "model.safetensors")

    # an older dapo's checkpoint (its .pt files, no pickle of anything but plain values) resumes to the same step 3
    restore()
    to_legacy(steps[1])
    result = resume(config)
    assert result.exit_code == 0, result.output
    _, (run,) = experiment_runs(tmp_path, "foreign")
    assert run.info.status == "FINISHED" and run.data.tags["dapo.resumed_from_step"] == "2"
    again = load_file(root / "step_000003" / "model" / "model.safetensors")
    assert resumed.keys() == again.keys() and all(torch.equal(resumed[k], again[k]) for k in again)


@pytest.mark.slow
def test_a_run_whose_config_an_older_dapo_saved_resumes_unless_a_missing_key_changes_it(trained, tmp_path) -> None:
    config, root, _ = trained
    path = root.parent / "config.yaml"
    mine = yaml.safe_load(path.read_text())
    assert mine["schema_version"] == SCHEMA_VERSION
    # saved before engine.shared_prompt_forward existed: that dapo ran the plain forward, this run's default differs
    path.write_text(yaml.safe_dump(as_written_by(mine, "18c86c5")))
    line = error_line(resume(config))
    assert "differs from the run's config.yaml in engine.shared_prompt_forward (not in it: the older dapo that wrote it " \
           "ran as --set engine.shared_prompt_forward=false does)" in line
    # saved before rollout.max_staleness, model.lora, engine.autocast, cluster ...: their defaults do what it did
    older = as_written_by(mine, "4e22362")
    assert "lora" not in older["model"] and "max_staleness" not in older["rollout"] and "schema_version" not in older
    path.write_text(yaml.safe_dump(older))
    result = resume(config)
    assert result.exit_code == 0, result.output
    _, (run,) = experiment_runs(tmp_path, "foreign")
    assert run.info.status == "FINISHED" and run.data.tags["dapo.resumed_from_step"] == "2"
