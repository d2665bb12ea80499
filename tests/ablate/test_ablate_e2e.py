"""`dapo ablate --ladder` for real on the untrained tiny policy: killed mid-way, rerun, nothing trained twice."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures.experiment import write_experiment
from mlflow import MlflowClient
from typer.testing import CliRunner

import dapo_cli.train
from dapo_cli.ablate.variants import make_ablation
from dapo_cli.cli import app
from dapo_cli.config import TECHNIQUES, load_config, technique_state
from dapo_cli.config.techniques import variant_name


def write_config(tmp: Path, model_dir: Path) -> Path:
    """2 prompts × 2 samples of ≤ 8 tokens, 2 steps (checkpoint after each), 4 val problems × 2 samples."""
    return write_experiment(tmp, config_dict(model_dir), "e2e-ablate")


def config_dict(model_dir: Path) -> dict:
    """The experiment :func:`write_config` writes, as a dict."""
    return {
        "data": {"train_files": ["synthetic:add-3digit"], "val_files": ["synthetic:add-3digit"],
                 "synthetic_train_size": 16, "synthetic_val_size": 4, "train_batch_size": 2, "max_prompt_length": 32},
        "model": {"path": str(model_dir)},
        "rollout": {"n": 2, "max_response_length": 8},
        "algorithm": {"overlong_buffer": {"len": 4}, "filter_groups": {"max_num_gen_batches": 2}},
        "trainer": {"total_steps": 2, "ppo_mini_batch_size": 1, "ppo_micro_batch_size": 4, "lr": 1e-3,
                    "lr_warmup_steps": 1, "save_freq": 1, "test_freq": 0, "log_samples_freq": 0},
        "validation": {"k": 2},
        # one thread: on 2 busy shared cores, 2 threads made this tiny model ~6x slower per child (measured)
        "engine": {"device": "cpu", "num_threads": 1},
    }


def count_trains(monkeypatch) -> list[tuple[str, bool]]:
    """``(variant, resume)`` of every child trained from now on (``run_train`` wrapped, still training)."""
    calls: list[tuple[str, bool]] = []
    real = dapo_cli.train.run_train

    def counting(cfg, **kwargs):
        calls.append((variant_name(technique_state(cfg)), kwargs["resume"]))
        return real(cfg, **kwargs)

    monkeypatch.setattr(dapo_cli.train, "run_train", counting)
    return calls


@pytest.fixture()
def restore_threads():
    """run_train sets torch's process-wide thread count from engine.num_threads; give the suite its own back."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_ladder_killed_mid_way_then_rerun_trains_only_what_was_missing(tmp_path, tiny_model_dir, monkeypatch, restore_threads):
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path, tiny_model_dir)
    plan = make_ablation(load_config(config), mode="ladder")
    names = [v.name for v in plan.variants]
    rung2 = tmp_path / "runs" / "e2e-ablate" / plan.name / f"{names[2]}-s0" / "checkpoints" / "latest"

    # 1. a real process, SIGKILLed once rung 2 has its first checkpoint
    proc = subprocess.Popen([sys.executable, "-m", "dapo_cli", "ablate", str(config), "--ladder", "--seeds", "1", "--quiet"],
                            cwd=tmp_path, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not rung2.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-3000:]
    killed_at = rung2.read_text().strip()
    assert killed_at in ("step_000001", "step_000002")

    # 2. the same command again, counting what it trains
    calls = count_trains(monkeypatch)
    result = CliRunner().invoke(app, ["ablate", str(config), "--ladder", "--seeds", "1", "--quiet"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert calls == [(names[2], True), (names[3], False), (names[4], False), (names[5], False)]
    assert "Naive GRPO" in result.output and "+ Dynamic Sampling (DAPO)" in result.output

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("e2e-ablate").experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(parents) == 1 and len(children) == 6 and len(runs) == 7
    assert parents[0].info.status == "FINISHED" and parents[0].data.tags["ablate.variants"] == ",".join(names)
    # the UI's run list and chart legends: short, distinct child names (the paper's rung + seed)
    labels = sorted(r.info.run_name for r in children)
    assert labels == sorted(["GRPO s0", "+OverlongFilter s0", "+ClipHigher s0", "+SoftPunish s0", "+TokenLoss s0", "DAPO s0"])
    assert len({x[:8] for x in labels}) == 6 and max(len(x) for x in labels) <= 18
    # the parent's overview page is the answer: the spec as params, results as metrics, the table as description
    parent = client.get_run(parents[0].info.run_id)
    assert parent.data.params["ablate.mode"] == "ladder" and parent.data.params["rollout.n"] == "2"
    shorts = ["GRPO", "OverlongFilter", "ClipHigher", "SoftPunish", "TokenLoss", "DAPO"]
    assert {f"variants/{i}_{n}.avg_at_2" for i, n in enumerate(shorts)} <= set(parent.data.metrics)
    assert "variants/1_OverlongFilter.delta" in parent.data.metrics
    note = parent.data.tags["mlflow.note.content"]
    assert note.startswith("**Ablation ") and all(f"| {n} |" in note for n in names)
    for run in children:
        tags = run.data.tags
        rung = int(tags["ablate.rung"])
        assert run.info.status == "FINISHED" and tags["ablate.variant"] == names[rung] == tags["dapo.variant"]
        assert {t: tags[f"technique.{t}"] == "true" for t in TECHNIQUES} == {t: j < rung for j, t in enumerate(TECHNIQUES)}
        # every step trained exactly once, validation before the first step and after the last
        assert [m.step for m in client.get_metric_history(run.info.run_id, "train/samples_generated")] == [1, 2]
        assert [m.step for m in client.get_metric_history(run.info.run_id, "val/avg_at_2")] == [0, 2]
        assert (rung == 2) == ("dapo.resumed_from_step" in tags)
    resumed = next(r for r in children if r.data.tags["ablate.rung"] == "2")
    assert resumed.data.tags["dapo.resumed_from_step"] == str(int(killed_at[-6:]))
    report = tmp_path / "runs" / "e2e-ablate" / plan.name / "report" / "report.md"
    table = [line for line in report.read_text().splitlines() if line.startswith("| ") and " | Naive GRPO |" in line
             or line.startswith("| 5 | dapo | + ")]  # the results table's rows (the curve-fit table has no label column)
    assert len(table) == 2

    # 3. and once more: nothing left to train
    calls.clear()
    again = CliRunner().invoke(app, ["ablate", str(config), "--ladder", "--seeds", "1", "--quiet"])
    assert again.exit_code == 0, again.output
    assert calls == []


@pytest.mark.slow
def test_two_children_at_once_as_processes_share_one_sqlite_store(tmp_path, tiny_model_dir, monkeypatch):
    """`dapo ablate --jobs 2`: both children train at the same time as `dapo train` processes, each logging to
    its own file, both writing to one SQLite store; the report lists both."""
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path, tiny_model_dir)
    only = ["grpo", "grpo+overlong_filtering"]
    plan = make_ablation(load_config(config), mode="ladder", only=only)
    args = ["ablate", str(config), "--ladder", "--only", only[0], "--only", only[1], "--jobs", "2"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    logs = tmp_path / "runs" / "e2e-ablate" / plan.name / "logs"
    assert sorted(p.name for p in logs.iterdir()) == sorted(f"{v}-s0.log" for v in only)
    lines = result.output.splitlines()
    starts = [i for i, line in enumerate(lines) if ", output in " in line]
    ends = [i for i, line in enumerate(lines) if ": done in " in line]
    assert len(starts) == 2 and len(ends) == 2 and max(starts) < min(ends), result.output  # both ran at once
    for log in logs.iterdir():
        text = log.read_text()
        assert "database is locked" not in text and "Traceback" not in text, text[-3000:]

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("e2e-ablate").experiment_id])
    parent, = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert parent.info.status == "FINISHED" and len(runs) == 3
    assert sorted((r.data.tags["ablate.variant"], r.info.status) for r in children) == [(v, "FINISHED") for v in only]
    for run in children:  # every step recorded once
        assert [m.step for m in client.get_metric_history(run.info.run_id, "train/samples_generated")] == [1, 2]
        assert [m.step for m in client.get_metric_history(run.info.run_id, "val/avg_at_2")] == [0, 2]
    report = (tmp_path / "runs" / "e2e-ablate" / plan.name / "report" / "report.md").read_text()
    assert all(f"| {v} |" in report for v in only)


def artifact_file(client: MlflowClient, run_id: str, path: str) -> Path:
    """Where the local artifact store keeps run ``run_id``'s artifact ``path``."""
    from urllib.parse import urlparse

    uri = client.get_run(run_id).info.artifact_uri
    return Path(urlparse(uri).path if uri.startswith("file:") else uri) / path


@pytest.mark.slow
def test_an_older_dapos_ablation_resumes_its_unfinished_child_safely_and_reuses_the_finished_one(tmp_path, tiny_model_dir, monkeypatch, restore_threads):
    """Made older after the fact: another ablate.id (an older schema's hash), the base config and the children's
    config.yaml as that dapo wrote them (no schema_version, none of the keys added since), the unfinished child's
    checkpoints in its .pt format. A pickle planted there is refused unrun; the plain ones resume."""
    import yaml
    from foreign_files import as_written_by, live, plant, to_legacy

    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path, tiny_model_dir)
    only = ["grpo", "grpo+overlong_filtering"]
    args = ["ablate", str(config), "--ladder", "--only", only[0], "--only", only[1], "--quiet"]
    assert CliRunner().invoke(app, args).exit_code == 0
    plan = make_ablation(load_config(config), mode="ladder", only=only)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (parent,) = client.search_runs([client.get_experiment_by_name("e2e-ablate").experiment_id], "tags.`ablate.id` != ''")
    client.set_tag(parent.info.run_id, "ablate.id", "0123456789ab")
    base = artifact_file(client, parent.info.run_id, "ablation_config.yaml")
    base.write_text(yaml.safe_dump(as_written_by(yaml.safe_load(base.read_text()), "4e22362")))
    runs = tmp_path / "runs" / "e2e-ablate" / plan.name
    for variant in only:
        saved = runs / f"{variant}-s0" / "config.yaml"
        saved.write_text(yaml.safe_dump(as_written_by(yaml.safe_load(saved.read_text()), "4e22362")))
    unfinished = runs / f"{only[1]}-s0"
    (unfinished / "summary.json").unlink()
    for ckpt in sorted((unfinished / "checkpoints").glob("step_*")):
        to_legacy(ckpt)
    pristine = tmp_path / "pristine"
    shutil.copytree(unfinished / "checkpoints", pristine)

    assert live(tmp_path)
    marker = tmp_path / "marker"
    for ckpt in sorted((unfinished / "checkpoints").glob("step_*")):
        plant(ckpt / "trainer_state.pt", marker, step=2)
    refused = CliRunner().invoke(app, args)
    lines = [line for line in refused.stderr.splitlines() if line.startswith("error: ")]
    assert refused.exit_code == 2 and len(lines) == 1 and "trainer_state.pt is refused" in lines[0], refused.output
    assert not marker.exists()

    shutil.rmtree(unfinished / "checkpoints")
    shutil.copytree(pristine, unfinished / "checkpoints")
    calls = count_trains(monkeypatch)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert calls == [(only[1], True)] and (unfinished / "summary.json").is_file()  # the finished child reused
    runs_now = client.search_runs([client.get_experiment_by_name("e2e-ablate").experiment_id])
    assert len(runs_now) == 3 and client.get_run(parent.info.run_id).data.tags["ablate.id"] == "0123456789ab"
