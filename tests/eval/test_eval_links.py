"""`dapo eval` of a training checkpoint: the eval run links to the training run (tags both ways,
the training run's store and experiment by default), the generations table MLflow previews,
and checkpoints without a training run evaluate as before. Asserts on what MLflow holds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("mlflow")

from mlflow import MlflowClient  # noqa: E402

from dapo_cli.checkpoint import (
    RUN_INFO_FILE,
    CheckpointManager,
    read_run_info,
    write_run_info,
)
from dapo_cli.cli import app
from dapo_cli.data.schema import make_row, write_dapo_parquet
from dapo_cli.engine.dist import SingleProcess
from dapo_cli.eval.links import EVALS_HEADING, evals_note, read_source
from dapo_cli.eval.table import TABLE_COLUMNS, TABLE_FILE, clip, generations_rows
from dapo_cli.tracking.mlflow import MlflowTracker

runner = CliRunner()
EVAL = ["--avg", "2", "--pass-k", "1", "--max-tokens", "6", "--batch-size", "4"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path):
    """A store holding one finished training run, its step-20 checkpoint (with ``dapo_run.json``),
    a two-problem dataset, and an empty working directory the evals run from."""
    root = tmp_path_factory.mktemp("links")
    uri = f"sqlite:///{root / 'store' / 'mlflow.db'}"
    train = MlflowTracker(uri, "train-exp", "dapo-s0", tags={"dapo.command": "train"})
    train.finish()
    model = root / "runs" / "dapo-s0" / "checkpoints" / "step_000020" / "model"
    shutil.copytree(tiny_model_dir, model)
    write_run_info(model, {"mlflow_run_id": train.run_id, "experiment": "train-exp", "tracking_uri": uri,
                           "run_name": "dapo-s0", "run_dir": str(root / "runs" / "dapo-s0"), "step": 20})
    data = root / "two.parquet"
    short = "{problem} Answer:"  # the tiny test policy has 128 positions
    write_dapo_parquet([make_row("What is 1+1?", "2", index=0, template=short), make_row("What is 2+3?", "5", index=1, template=short)], data)
    (root / "cwd").mkdir()
    return SimpleNamespace(root=root, uri=uri, train_id=train.run_id, ckpt=model.parent, model=model, data=data,
                           client=train.client)


@pytest.fixture
def in_cwd(world, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(world.root / "cwd")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return world.root / "cwd"


def evaluate(world, target: Path, *extra: str) -> str:
    """Run `dapo eval` and return the MLflow run id it printed."""
    result = runner.invoke(app, ["eval", str(target), "--dataset", str(world.data), *EVAL, *extra], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.stdout.rsplit("MLflow run: ", 1)[1].split()[0]


def read_table(client, run_id: str, tmp: Path) -> tuple[list[str], list[list]]:
    data = json.loads(Path(client.download_artifacts(run_id, TABLE_FILE, str(tmp))).read_text())
    return data["columns"], data["data"]


@pytest.mark.slow
def test_eval_of_a_training_checkpoint_links_both_runs(world, in_cwd: Path, tmp_path: Path) -> None:
    # the user's store holds the training run (no --experiment): the eval goes to its experiment, linked
    first = evaluate(world, world.ckpt, "--tracking-uri", world.uri)
    assert not (in_cwd / "mlflow.db").exists()  # not the default ./mlflow.db
    run = world.client.get_run(first)
    exp = world.client.get_experiment(run.info.experiment_id)
    assert exp.name == "train-exp" and run.info.experiment_id == world.client.get_run(world.train_id).info.experiment_id
    tags = run.data.tags
    assert run.info.run_name == "eval-dapo-s0@20-two-avg2" and tags["dapo.command"] == "eval"
    assert tags["dapo.source_run_id"] == world.train_id
    assert tags["dapo.source_step"] == "20"
    assert tags["dapo.source_experiment"] == "train-exp" and tags["dapo.source_run_name"] == "dapo-s0"
    # the description the run page renders links to the training run's page
    assert f"[dapo-s0](#/experiments/{exp.experiment_id}/runs/{world.train_id}) at step 20" in tags["mlflow.note.content"]
    train_tags = world.client.get_run(world.train_id).data.tags
    assert train_tags["dapo.evals"] == first
    # ... and the training run's (empty) description lists its evals, linked
    assert train_tags["mlflow.note.content"].splitlines()[:3] == [
        EVALS_HEADING, "", f"- [eval-dapo-s0@20-two-avg2](#/runs/{first}) at step 20: " + train_tags["dapo.last_eval"].split(": ", 1)[1]]
    assert train_tags["dapo.last_eval"].startswith(f"{first}: two.parquet avg@2 = ")
    # the run list's search finds every eval of the training run
    found = world.client.search_runs([exp.experiment_id], f"tags.`dapo.source_run_id` = '{world.train_id}'")
    assert [r.info.run_id for r in found] == [first]

    # a second eval, given as the model/ folder, into an explicit experiment: that wins, the links stay
    second = evaluate(world, world.model, "--experiment", "elsewhere", "--tracking-uri", world.uri)
    run2 = world.client.get_run(second)
    assert world.client.get_experiment(run2.info.experiment_id).name == "elsewhere"
    assert run2.data.tags["dapo.source_run_id"] == world.train_id and run2.data.tags["dapo.source_step"] == "20"
    train_tags = world.client.get_run(world.train_id).data.tags
    assert train_tags["dapo.evals"] == f"{first},{second}"
    listed = [line for line in train_tags["mlflow.note.content"].splitlines() if line.startswith("- ")]
    assert [line.split("(#/runs/")[1][:32] for line in listed] == [second, first]  # newest first

    # the generations table: one row per sample (2 problems × K 2) with the documented columns
    columns, rows = read_table(world.client, first, tmp_path)
    assert tuple(columns) == TABLE_COLUMNS and len(rows) == 4
    by_col = [dict(zip(columns, r)) for r in rows]
    assert [(r["problem_id"], r["sample"]) for r in by_col] == [("0", 0), ("0", 1), ("1", 0), ("1", 1)]
    assert {r["ground_truth"] for r in by_col} == {"2", "5"} and all(r["length"] <= 6 for r in by_col)
    assert "What is 1+1?" in by_col[0]["problem"]
    assert tags["dapo.generations_table"].startswith(f"{TABLE_FILE}: 4 of 4 samples (--table-rows 1000)")
    # MLflow's UI lists it as a table artifact (what makes the Artifacts tab preview it)
    logged = json.loads(tags["mlflow.loggedArtifacts"])
    assert {"path": TABLE_FILE, "type": "table"} in logged


@pytest.mark.slow
def test_a_checkpoint_naming_another_store_never_writes_there(world, in_cwd: Path, tmp_path: Path) -> None:
    # dapo_run.json is a file from elsewhere: its tracking_uri names another program's SQLite database, then a
    # server with a password. Plain `dapo eval CKPT` records into the user's default ./mlflow.db, says where the
    # checkpoint claims its run was (credentials redacted), and leaves the named database byte for byte.
    import sqlite3

    other = tmp_path / "other" / "app.db"
    other.parent.mkdir()
    with sqlite3.connect(other) as db:
        db.execute("create table notes (body text)")
        db.execute("insert into notes values ('not mlflow')")
    before = other.read_bytes()
    model = tmp_path / "ckpt" / "model"
    shutil.copytree(world.model, model)
    for named in (f"sqlite:///{other}", "http://someone:s3cr3t@127.0.0.1:9"):
        write_run_info(model, {"mlflow_run_id": world.train_id, "experiment": "train-exp", "tracking_uri": named,
                               "run_name": "dapo-s0", "run_dir": str(tmp_path), "step": 20})
        result = runner.invoke(app, ["eval", str(model), "--dataset", str(world.data), *EVAL], env={"COLUMNS": "400"})
        assert result.exit_code == 0, result.output
        assert "s3cr3t" not in result.output
        shown = named.replace("someone:s3cr3t", "***")
        assert f"the checkpoint says its training run {world.train_id} was recorded in {shown}" in " ".join(result.output.split())
        run_id = result.stdout.rsplit("MLflow run: ", 1)[1].split()[0]
        client = MlflowClient(f"sqlite:///{in_cwd / 'mlflow.db'}")
        run = client.get_run(run_id)  # in the user's store, default experiment, still naming its source
        assert client.get_experiment(run.info.experiment_id).name == "dapo"
        assert run.data.tags["dapo.source_run_id"] == world.train_id
    assert other.read_bytes() == before and sorted(p.name for p in other.parent.iterdir()) == ["app.db"]


@pytest.mark.slow
def test_table_rows_caps_the_table_and_says_so(world, in_cwd: Path, tmp_path: Path) -> None:
    run_id = evaluate(world, world.ckpt, "--table-rows", "3", "--tracking-uri", world.uri)
    _, rows = read_table(world.client, run_id, tmp_path)
    assert len(rows) == 3
    assert world.client.get_run(run_id).data.tags["dapo.generations_table"].startswith(f"{TABLE_FILE}: 3 of 4 samples")
    none = evaluate(world, world.ckpt, "--table-rows", "0", "--tracking-uri", world.uri)
    assert TABLE_FILE not in {a.path for a in world.client.list_artifacts(none, "eval")}
    bad = runner.invoke(app, ["eval", str(world.ckpt), "--dataset", str(world.data), *EVAL, "--table-rows", "-1"])
    assert bad.exit_code == 2 and bad.stderr.strip() == "error: --table-rows must be 0 or more (got -1)"


@pytest.mark.slow
def test_a_checkpoint_without_metadata_evaluates_as_before(world, in_cwd: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    assert read_run_info(tiny_model_dir) == {} and read_source(str(tiny_model_dir)) is None
    run_id = evaluate(world, tiny_model_dir, "--tracking-uri", world.uri)
    run = world.client.get_run(run_id)
    assert world.client.get_experiment(run.info.experiment_id).name == "dapo"  # the default experiment
    assert not any(k.startswith("dapo.source_") for k in run.data.tags) and "mlflow.note.content" not in run.data.tags
    assert len(read_table(world.client, run_id, tmp_path)[1]) == 4


def test_an_older_checkpoint_links_through_its_trainer_state(world, tmp_path: Path) -> None:
    ckpt = tmp_path / "step_000007"
    (ckpt / "model").mkdir(parents=True)
    torch.save({"mlflow_run_id": world.train_id, "step": 7}, ckpt / "trainer_state.pt")
    source = read_source(str(ckpt / "model"))
    assert source is not None and (source.run_id, source.step, source.experiment) == (world.train_id, 7, "")
    from dapo_cli.eval.links import resolve_tracking

    # the experiment comes from the store (the file names none)
    assert resolve_tracking(world.uri, None, source, "mlflow") == (world.uri, "train-exp")
    assert resolve_tracking(world.uri, "mine", source, "mlflow") == (world.uri, "mine")
    missing = SimpleNamespace(**{**vars(source), "tracking_uri": f"sqlite:///{tmp_path / 'gone.db'}"})
    assert resolve_tracking("", None, missing, "null") == ("", "dapo")  # a vanished store is not used


def test_checkpoint_save_writes_run_info_next_to_the_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)

    def write(directory: Path) -> None:
        (directory / "model").mkdir()
        (directory / "engine").mkdir()

    info = {"mlflow_run_id": "a" * 32, "experiment": "e", "tracking_uri": "sqlite:///rel.db", "run_name": "r", "run_dir": "d"}
    saved = CheckpointManager(tmp_path / "run").save(3, dist=SingleProcess(), write=write, trainer_state={}, run_info=info)
    recorded = json.loads((saved / "model" / RUN_INFO_FILE).read_text())
    # the relative store is made absolute: the file outlives the working directory
    assert recorded == {**info, "step": 3, "tracking_uri": f"sqlite:///{tmp_path / 'rel.db'}"}
    bare = CheckpointManager(tmp_path / "run2").save(1, dist=SingleProcess(), write=write, trainer_state={})
    assert not (bare / "model" / RUN_INFO_FILE).exists()


def test_table_rows_are_bounded() -> None:
    assert clip("abcdef", 6) == "abcdef" and clip("abcdefgh", 3) == "abc… [+5 chars]"
    record = SimpleNamespace(problem_id="p", sample_index=0, response="x" * 5000, pred="1", acc=True, score=1.0,
                             ground_truth="1", length=9, truncated=False)
    rows = generations_rows([record] * 5, {"p": "a  b\nc"}, max_rows=2, max_chars=100)
    assert len(rows) == 2 and rows[0]["response"] == "x" * 100 + "… [+4900 chars]" and rows[0]["problem"] == "a b c"
    assert generations_rows([record], {}, max_rows=0) == []


def test_a_description_someone_wrote_is_left_alone() -> None:
    assert evals_note("My notes on this run", "- x") is None
    first = evals_note("", "[a](#/runs/1): avg 0.5")
    assert first == f"{EVALS_HEADING}\n\n- [a](#/runs/1): avg 0.5\n"
    many = first
    for i in range(30):
        many = evals_note(many, f"e{i}")
    lines = many.splitlines()
    assert lines[2] == "- e29" and len(lines) == 2 + 20  # the newest 20
