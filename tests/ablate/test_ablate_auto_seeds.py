"""`dapo ablate --seeds auto` (``cli/ablate.run_auto``) on fake children: waves, decisions, resumption, dry run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ablate_fakes import FakeTrain  # noqa: E402
from fixtures.experiment import write_experiment  # noqa: E402

from dapo_cli.ablate.variants import make_ablation  # noqa: E402
from dapo_cli.cli import ablate as ablate_cli  # noqa: E402
from dapo_cli.config import load_config  # noqa: E402

BASE = "grpo+overlong_filtering+overlong_shaping+token_level_loss+dynamic_sampling"  # clip-higher off


@pytest.fixture(autouse=True)
def no_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dapo_cli.ablate.report.plot_curves", lambda report, out_dir: {"step": [], "samples": []})


@pytest.mark.slow
def test_a_clear_difference_is_decided_before_the_last_wave_and_the_rerun_trains_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = write_experiment(tmp_path, {
        "data": {"synthetic_train_size": 16, "synthetic_val_size": 4, "train_batch_size": 2, "max_prompt_length": 32},
        "rollout": {"n": 2, "max_response_length": 8}, "algorithm": {"overlong_buffer": {"len": 4}},
        "trainer": {"total_steps": 2, "ppo_mini_batch_size": 1}, "validation": {"k": 4},
        "engine": {"device": "cpu", "num_threads": 1}}, "auto")
    plan = make_ablation(load_config(config), mode="grid", techniques=("clip_higher",), seeds=6)
    # DAPO 12 of 12 right on every seed, the baseline 4, 5, 6 of 12: Δ = 66.7, 58.3, 50.0 points (3 problems x k 4)
    scripted = {(BASE, s): [c, 4, 0] for s, c in zip(range(6), [0, 1, 2, 0, 1, 2])}
    scripted.update({("dapo", s): [4, 4, 4] for s in range(6)})
    fake = FakeTrain(scripted)
    out = Console(width=200, record=True)
    monkeypatch.setattr(ablate_cli, "console", out)
    outcome = ablate_cli.run_auto(plan, False, 6, 3.0, command="dapo ablate --grid clip_higher --seeds auto",
                                  config_path=str(config), sets=[], train=fake, quiet=True)
    text = out.export_text()
    # 3 pairs: mean 58.3, sd 8.3; look 1 of 4 (3, 4, 5, 6 seeds) spends α(1/2) = 2 − 2Φ(1.96·√2) = .0056:
    # t(1 − .0028, 2) ≈ 13.3, half ≈ 13.3 · 8.3/√3 ≈ 64 > 58.3 → open; look 2 (4 seeds) decides it
    assert sorted(set(fake.calls)) == sorted({(v, s, False) for v in (BASE, "dapo") for s in range(len(fake.calls) // 2)})
    assert "dapo − " + BASE + ": different at wave" in text and "for the fixed design" in text
    assert "against 12 for the fixed design" in text
    run = int(text.split("children run: ")[1].split(",")[0])
    assert run == len(fake.calls) < 12
    assert outcome.report is not None
    # the report replays the waves from the parent's recorded setup and the children: the run's decision, its wave
    md = outcome.files["markdown"].read_text()
    assert "## Waves (sequential seeds)" in md and "## Decisions (sequential seeds)" in md
    wave = text.split(": different at wave ")[1].split(" ")[0]
    assert f"| dapo | {BASE} | different | {wave} |" in md
    assert f"children so far | {run} of 12 |" in md or f"| {run} of 12 |" in md
    # ... and each section is a table artifact of the parent (pandas' split form, as mlflow.log_table writes) and
    # in report.json
    import json

    import mlflow

    client = mlflow.MlflowClient(load_config(config).tracking.tracking_uri)
    names = {a.path for a in client.list_artifacts(outcome.parent_run_id, "tables")}
    assert {"tables/waves-sequential-seeds.json", "tables/decisions-sequential-seeds.json", "tables/power.json"} <= names
    table = json.loads(Path(client.download_artifacts(outcome.parent_run_id, "tables/decisions-sequential-seeds.json",
                                                      str(tmp_path))).read_text())
    assert table["columns"][:4] == ["variant", "vs", "decision", "wave"]
    assert ["dapo", BASE, "different", wave] == table["data"][0][:4]
    saved = json.loads(outcome.files["json"].read_text())
    assert saved["fit_tables"]["tables/decisions-sequential-seeds.json"] == table
    # each child's own fit, with the numbers the table only counts: 2 steps give at most 3 validations
    assert len(saved["child_fits"]) == len(fake.calls)
    assert {(c["why"], c["detail"].split(" validations")[1]) for c in saved["child_fits"]} == {("too few points", ", a fit needs 5")}
    before = len(fake.calls)
    out.export_text(clear=True)
    ablate_cli.run_auto(plan, False, 6, 3.0, command="dapo ablate --grid clip_higher --seeds auto",
                        config_path=str(config), sets=[], train=fake, quiet=True)
    assert len(fake.calls) == before  # resumed: every child of every wave was finished
    assert out.export_text().splitlines()[1:] == text.splitlines()[1:]  # and the same waves and decisions


@pytest.mark.slow
def test_dry_run_prints_the_plan_and_its_worst_case(tmp_path: Path, monkeypatch) -> None:
    from typer.testing import CliRunner

    from dapo_cli.cli import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["ablate", "--ladder", "--dry-run", "--no-calibrate", "--seeds", "auto",
                                      "--max-seeds", "6", "--equivalence", "3"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "6 variants × 6 seeds" in result.output and "Lan–DeMets" in result.output
    assert "worst case (nothing decided before the last look): 36 children (6 variants x 6 seeds)" in result.output
    bad = CliRunner().invoke(app, ["ablate", "--ladder", "--dry-run", "--seeds", "many"], env={"COLUMNS": "250"})
    assert bad.exit_code == 2 and "--seeds must be a positive number or auto" in bad.output
