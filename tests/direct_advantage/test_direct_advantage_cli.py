"""`dapo train --algo direct-advantage` end to end on the tiny fixture model, asserting on what MLflow
and the run directory hold; a restart from every phase; resume after a crash."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from fixtures.experiment import experiment_runs, write_experiment
from mlflow import MlflowClient
from typer.testing import CliRunner

from dapo_cli.cli import app
from dapo_cli.direct_advantage import PHASES, STAGES
from dapo_cli.direct_advantage import run as da_run

pytestmark = pytest.mark.slow  # each test runs direct-advantage iterations through the CLI

RUN_DIR = Path("runs") / "da-e2e" / "direct-advantage-s0"


def write_config(tmp: Path, model_dir: Path) -> Path:
    """Two problems x 4 samples, 2 chosen, 3 completions per state, 12-token responses (seconds on 2 cores)."""
    cfg = {
        "algo": "direct-advantage",
        "data": {"train_files": ["synthetic:add-3digit"], "val_files": ["synthetic:add-3digit"],
                 "synthetic_train_size": 32, "synthetic_val_size": 4, "max_prompt_length": 32},
        "model": {"path": str(model_dir)},
        "rollout": {"max_response_length": 12},
        "direct_advantage": {
            "problems": 2, "samples_per_problem": 4, "chosen_per_problem": 2, "mc_completions": 3,
            "critic_lr": 1e-3, "critic_batch_size": 8, "critic_micro_batch_size": 8, "critic_holdout": 0.0,
            "terminal_value": "critic", "min_gap": 0.0, "beta": 0.5, "actor_lr": 1e-3, "actor_batch_states": 2,
            "actor_micro_batch_size": 8,
        },
        "validation": {"k": 2},
        "engine": {"device": "cpu"},
    }
    return write_experiment(tmp, cfg, "da-e2e")


def runs(tmp: Path):
    return experiment_runs(tmp, "da-e2e", order_by=["attributes.start_time ASC"])


def artifact_paths(client: MlflowClient, run_id: str, path: str | None = None) -> set[str]:
    out = set()
    for a in client.list_artifacts(run_id, path):
        out |= artifact_paths(client, run_id, a.path) if a.is_dir else {a.path}
    return out


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_model_dir):
    """One complete run, made once; tests copy its directory."""
    tmp = tmp_path_factory.mktemp("da-run")
    config = write_config(tmp, tiny_model_dir)
    result = CliRunner().invoke(app, ["train", str(config), "--algo", "direct-advantage"])
    assert result.exit_code == 0, result.output
    return tmp, result.output


def test_one_iteration_records_every_phase_in_mlflow(finished):
    tmp, output = finished
    assert "held-out greedy accuracy" in output
    client, (run,) = runs(tmp)
    assert run.info.status == "FINISHED"
    assert run.data.tags["dapo.algo"] == "direct-advantage" and run.data.params["algo"] == "direct-advantage"
    assert run.data.params["direct_advantage.beta"] == "0.5"
    metrics = run.data.metrics
    for phase in PHASES:
        for key in ("samples", "tokens", "wall_s"):
            assert f"da/{phase}/{key}" in metrics, f"da/{phase}/{key}"
    assert metrics["da/generate/samples"] == 8 and metrics["da/mc_values/samples"] == 3 * metrics["da/mc_values/states"]
    assert {"da/critic/train_bce", "da/critic/train_bce_floor", "da/critic/train_ece", "da/advantages/states_kept",
            "da/actor/loss_before", "da/actor/loss_after", "final/val_acc", "final/base_val_acc", "da/total/samples"} <= set(metrics)
    greedy = client.get_metric_history(run.info.run_id, "val/greedy/avg_at_1")
    assert sorted(m.step for m in greedy) == [0, 1]  # the reference before, the actor after
    assert [m.step for m in client.get_metric_history(run.info.run_id, "da/actor/loss_after")] == [1]
    files = artifact_paths(client, run.info.run_id)
    assert {f"iter_00/{p}.parquet" for p in PHASES} <= files
    assert {"iter_00/critic/calibration.png", "iter_00/critic_calibration.json", "iter_00/advantage_gaps.json",
            "da/stages.json", "config.yaml", "checkpoint/model.safetensors"} <= files
    run_dir = tmp / RUN_DIR
    for phase in PHASES:
        assert (run_dir / "iter_00" / f"{phase}.parquet").is_file()
    assert (run_dir / "iter_00" / "actor" / "model" / "model.safetensors").is_file()
    generated = pq.read_table(run_dir / "iter_00" / "generate.parquet").to_pylist()
    assert len(generated) == 8 and sum(r["chosen"] for r in generated) <= 4
    assert run.data.tags["dapo.checkpoint"].endswith("iter_00/actor/model")


@pytest.fixture()
def copy_of_run(finished, tmp_path, monkeypatch, tiny_model_dir):
    """The finished run's directory and MLflow store, copied; exp.yaml points at the copies (tracking
    and output paths change nothing a restart reuses)."""
    src, _ = finished
    shutil.copytree(src / "runs", tmp_path / "runs")
    shutil.copy2(src / "mlflow.db", tmp_path / "mlflow.db")
    write_config(tmp_path, tiny_model_dir)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def count_stage_calls(monkeypatch) -> list[str]:
    called: list[str] = []
    for name, fn in list(da_run.STAGE_FUNCTIONS.items()):
        def wrapper(ctx, i, _fn=fn, _name=name):
            called.append(_name)
            return _fn(ctx, i)
        monkeypatch.setitem(da_run.STAGE_FUNCTIONS, name, wrapper)
    return called


@pytest.mark.parametrize("phase", STAGES)
@pytest.mark.slow
def test_restart_from_each_phase_reuses_the_stored_earlier_ones(copy_of_run, monkeypatch, phase):
    tmp = copy_of_run
    before = {p: (tmp / RUN_DIR / "iter_00" / f"{p}.parquet").read_bytes() for p in PHASES}
    called = count_stage_calls(monkeypatch)
    result = CliRunner().invoke(app, ["train", "exp.yaml", "--from-phase", phase])
    assert result.exit_code == 0, result.output
    assert called == list(STAGES[STAGES.index(phase):])
    for p in PHASES[: PHASES.index(phase)] if phase in PHASES else PHASES:
        assert (tmp / RUN_DIR / "iter_00" / f"{p}.parquet").read_bytes() == before[p], p  # reused, not rewritten
    client, (old, new) = runs(tmp)
    assert new.info.status == "FINISHED" and new.data.tags["da.from_phase"] == phase
    assert new.data.tags["da.branched_from"] == old.info.run_id
    for p in PHASES:  # the new run holds every phase: reused ones recorded again, the rest recomputed
        assert f"da/{p}/wall_s" in new.data.metrics
        assert f"iter_00/{p}.parquet" in artifact_paths(client, new.info.run_id, "iter_00")
    assert "val/greedy/avg_at_1" in new.data.metrics


@pytest.mark.slow
def test_changed_settings_of_reused_phases_are_refused_later_ones_allowed(copy_of_run):
    result = CliRunner().invoke(app, ["train", "exp.yaml", "--from-phase", "critic", "--set", "direct_advantage.mc_completions=5"])
    assert result.exit_code == 2 and "direct_advantage.mc_completions (mc_values)" in result.output
    result = CliRunner().invoke(app, ["train", "exp.yaml", "--from-phase", "actor", "--set", "direct_advantage.beta=0.25"])
    assert result.exit_code == 0, result.output
    assert "settings changed since the run started: direct_advantage.beta" in result.output
    assert yaml.safe_load((copy_of_run / RUN_DIR / "config.yaml").read_text())["direct_advantage"]["beta"] == 0.25


@pytest.mark.slow
def test_resume_after_a_crash_continues_in_the_same_mlflow_run(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path, tiny_model_dir)

    def crash(ctx, i):
        raise RuntimeError("killed in the critic phase")

    monkeypatch.setitem(da_run.STAGE_FUNCTIONS, "critic", crash)
    result = CliRunner().invoke(app, ["train", str(config), "--algo", "direct-advantage"])
    assert isinstance(result.exception, RuntimeError), result.output
    _, (run,) = runs(tmp_path)
    assert run.info.status == "FAILED"
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    called = count_stage_calls(monkeypatch)
    again = CliRunner().invoke(app, ["train", str(config), "--resume"])
    assert again.exit_code == 0, again.output
    assert called == ["critic", "advantages", "actor", "evaluate"]
    _, (same,) = runs(tmp_path)
    assert same.info.run_id == run.info.run_id and same.info.status == "FINISHED"
    assert "da/generate/samples" in same.data.metrics and "da/actor/loss_after" in same.data.metrics
    fresh = CliRunner().invoke(app, ["train", str(config), "--set", "trainer.run_name=direct-advantage-s0"])
    assert fresh.exit_code == 2 and "has already started" in fresh.output


@pytest.mark.slow
def test_a_planted_critic_head_never_runs_and_an_older_dapos_head_resumes(copy_of_run):
    """--resume of a run stopped after its critic phase reads the stored critic: a pickle planted as the older
    ``value_head.pt`` is refused with one line (exit 2) unrun; a plain older head is read safely."""
    import torch
    from foreign_files import live, plant

    from dapo_cli.direct_advantage.store import RunStore
    from dapo_cli.statefiles import read_state

    tmp = copy_of_run
    assert live(tmp)
    critic, marker = tmp / RUN_DIR / "iter_00" / "critic", tmp / "marker"
    head = read_state(critic / "value_head.safetensors")
    (critic / "value_head.safetensors").unlink()
    RunStore(tmp / RUN_DIR).forget_from(0, "advantages")  # as if killed once the critic was stored
    plant(critic / "value_head.pt", marker)
    refused = CliRunner().invoke(app, ["train", "exp.yaml", "--resume"])
    lines = [line for line in refused.stderr.splitlines() if line.startswith("error: ")]  # after the copy's notes
    assert refused.exit_code == 2 and len(lines) == 1 and "Traceback" not in refused.output, refused.output
    assert lines[0].startswith(f"error: {critic / 'value_head.pt'} is refused") and "rerun its critic phase (--from-phase critic)" in lines[0]
    assert not marker.exists()
    torch.save(head, critic / "value_head.pt")  # what an older dapo wrote: a plain state dict
    resumed = CliRunner().invoke(app, ["train", "exp.yaml", "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert not marker.exists()
