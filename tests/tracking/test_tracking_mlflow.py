"""Tracking against a real MLflow SQLite store in a temporary directory.

Creating the store's tables takes seconds, so one store serves the whole module
(each test uses its own experiment). The module runs from an empty working
directory, to catch anything MLflow would write relative to it.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("mlflow")

from dapo_cli.config import Config, flatten  # noqa: E402
from dapo_cli.errors import UserError  # noqa: E402
from dapo_cli.tracking import NullTracker, start_run  # noqa: E402
from dapo_cli.tracking.mlflow import (  # noqa: E402
    DEFAULT_TRACKING_URI,
    MAX_PARAM_CHARS,
    MlflowTracker,
    _param_value,
    open_client,
    resolve_tracking_uri,
    sqlite_artifact_location,
)


def download_artifact(tracking_uri: str, run_id: str, path: str) -> Path:
    """One artifact of a run, fetched into a fresh temporary directory."""
    client = open_client(tracking_uri)
    return Path(client.download_artifacts(run_id, path, tempfile.mkdtemp(prefix="dapo-test-artifact-")))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """A SQLite store in ``<tmp>/db/``; the tests run from ``<tmp>/cwd/``."""
    root = tmp_path_factory.mktemp("tracking")
    (root / "db").mkdir()
    (root / "cwd").mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root / "cwd")
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        uri = f"sqlite:///{root / 'db' / 'mlflow.db'}"  # absolute path: sqlite:////...
        from mlflow import MlflowClient

        yield SimpleNamespace(root=root, uri=uri, client=MlflowClient(tracking_uri=uri))


def cfg(store: SimpleNamespace, experiment: str) -> SimpleNamespace:
    """A ``TrackingConfig``-like object (the tracker reads only these three fields)."""
    return SimpleNamespace(backend="mlflow", tracking_uri=store.uri, experiment=experiment)


@pytest.mark.slow
def test_params_tags_metrics_artifacts_and_table(store: SimpleNamespace) -> None:
    params = flatten(Config())
    with start_run(cfg(store, "basic"), "run-a", tags={"dapo.variant": "dapo", "seed": 0}) as tracker:
        run_id = tracker.run_id
        tracker.log_params(params)
        tracker.set_tags({"dapo.stage": "train"})
        tracker.log_dict({"b": [1, 2], "a": "x"}, "config/resolved.json")
        tracker.log_text("hello\n", "notes/readme.txt")
        tracker.log_table(
            [{"prompt": "1+1", "score": 1.0, "acc": True, "ids": [1, 2]}, {"prompt": "2+2", "score": -1.0, "acc": False, "ids": None}],
            "samples/step_1.json",
        )
        tracker.log_table([], "samples/empty.json")  # nothing to log: no artifact
    run = store.client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "run-a"
    # params: the flattened config, every value as text (lists as JSON)
    assert run.data.params == {k: _param_value(v) for k, v in params.items()}
    assert run.data.params["algorithm.clip_ratio_high"] == "0.28"
    assert run.data.params["eval.pass_k"] == "[1, 8, 32]"
    assert run.data.params["algorithm.clip_ratio_c"] == "None"
    assert run.data.tags["dapo.variant"] == "dapo"
    assert run.data.tags["seed"] == "0"
    assert run.data.tags["dapo.stage"] == "train"

    assert json.loads(download_artifact(store.uri, run_id, "config/resolved.json").read_text()) == {"a": "x", "b": [1, 2]}
    assert download_artifact(store.uri, run_id, "notes/readme.txt").read_text() == "hello\n"
    table = json.loads(download_artifact(store.uri, run_id, "samples/step_1.json").read_text())
    assert table["columns"] == ["prompt", "score", "acc", "ids"]
    assert table["data"] == [["1+1", 1.0, True, "[1, 2]"], ["2+2", -1.0, False, None]]
    names = {f.path for f in store.client.list_artifacts(run_id, "samples")}
    assert names == {"samples/step_1.json"}


@pytest.mark.slow
def test_artifacts_live_beside_the_database_not_in_the_working_directory(store: SimpleNamespace) -> None:
    with start_run(cfg(store, "where/artifacts go"), "run") as tracker:
        tracker.log_text("x", "a.txt")
        run_id = tracker.run_id
    exp = store.client.get_experiment_by_name("where/artifacts go")
    expected = store.root / "db" / "mlartifacts" / "where_artifacts_go"
    assert exp.artifact_location == expected.as_uri()
    assert (expected / run_id / "artifacts" / "a.txt").read_text() == "x"
    assert list((store.root / "cwd").iterdir()) == []  # no ./mlruns, no ./mlartifacts


@pytest.mark.slow
def test_one_batched_call_per_step_lands_every_metric_at_its_step(store: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    with start_run(cfg(store, "metrics"), "run") as tracker:
        calls: list[dict[str, Any]] = []
        original = tracker.client.log_batch

        def spy(run_id: str, **kwargs: Any) -> None:
            calls.append(kwargs)
            original(run_id, **kwargs)

        monkeypatch.setattr(tracker.client, "log_batch", spy)
        for step in (1, 2, 3):
            tracker.log_metrics(
                {"reward/score_mean": 0.5 * step, "actor/clipfrac_high": 0.01 * step, "response/len_mean": 10 * step},
                step=step,
            )
        tracker.log_metrics({"actor/loss": float("nan"), "actor/kl": None, "actor/entropy": 1.5}, step=4)  # type: ignore[dict-item]
        run_id = tracker.run_id
    assert len(calls) == 4  # one call per step, never one per metric
    assert [len(c["metrics"]) for c in calls] == [3, 3, 3, 1]  # non-finite and None values are dropped
    history = store.client.get_metric_history(run_id, "reward/score_mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 1.0), (3, 1.5)]
    history = store.client.get_metric_history(run_id, "response/len_mean")
    assert [(m.step, m.value) for m in history] == [(1, 10.0), (2, 20.0), (3, 30.0)]
    assert [(m.step, m.value) for m in store.client.get_metric_history(run_id, "actor/entropy")] == [(4, 1.5)]
    assert store.client.get_metric_history(run_id, "actor/loss") == []


def test_child_run_is_nested_under_its_parent(store: SimpleNamespace) -> None:
    with start_run(cfg(store, "ablation"), "ladder") as parent:
        with start_run(cfg(store, "ablation"), "grpo-seed0", parent_run_id=parent.run_id, tags={"variant": "grpo"}) as child:
            child_id = child.run_id
        parent_id = parent.run_id
    child_run = store.client.get_run(child_id)
    assert child_run.data.tags["mlflow.parentRunId"] == parent_id
    assert child_run.data.tags["variant"] == "grpo"
    assert child_run.info.status == "FINISHED"
    assert "mlflow.parentRunId" not in store.client.get_run(parent_id).data.tags


@pytest.mark.slow
def test_resume_keeps_params_and_status_follows_the_resumed_session(store: SimpleNamespace) -> None:
    with pytest.raises(RuntimeError):
        with start_run(cfg(store, "resume"), "run") as first:
            first.log_params({"trainer.lr": 1e-4, "trainer.seed": 0})
            first.log_metrics({"m": 1.0}, step=1)
            raise RuntimeError("preempted")
    run_id = first.run_id
    assert store.client.get_run(run_id).info.status == "FAILED"

    with start_run(cfg(store, "resume"), "ignored-name", resume_run_id=run_id) as again:
        assert again.run_id == run_id
        assert store.client.get_run(run_id).info.status == "RUNNING"
        # params are immutable in MLflow: a resumed run keeps its originals and may add new ones
        again.log_params({"trainer.lr": 5e-4, "trainer.total_steps": 60})
        again.log_metrics({"m": 2.0}, step=2)
    run = store.client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {"trainer.lr": "0.0001", "trainer.seed": "0", "trainer.total_steps": "60"}
    assert [(m.step, m.value) for m in store.client.get_metric_history(run_id, "m")] == [(1, 1.0), (2, 2.0)]
    assert len(store.client.search_runs([store.client.get_experiment_by_name("resume").experiment_id])) == 1


@pytest.mark.slow
def test_a_resumed_run_does_not_record_replayed_steps_twice(store: SimpleNamespace) -> None:
    # killed after logging steps 1-3 (its checkpoint was step 1): the resumed run replays 2-3
    with start_run(cfg(store, "replay"), "run") as first:
        for step in (1, 2, 3):
            first.log_metrics({"loss": float(step), "acc": 0.5}, step=step)
        first.log_table([{"a": 1}], "samples/step_000002.json")
    with start_run(cfg(store, "replay"), "run", resume_run_id=first.run_id) as again:
        for step in (2, 3, 4):
            again.log_metrics({"loss": float(step), "acc": 0.5, "new": 1.0}, step=step)
        again.log_table([{"a": 1}], "samples/step_000002.json")  # replayed: already there
        again.log_table([{"a": 2}], "samples/step_000004.json")
    history = store.client.get_metric_history(first.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]
    assert [m.step for m in store.client.get_metric_history(first.run_id, "new")] == [2, 3, 4]  # a key new to the run
    table = json.loads(download_artifact(store.uri, first.run_id, "samples/step_000002.json").read_text())
    assert table["data"] == [[1]]  # not appended to a second time


@pytest.mark.slow
def test_two_processes_creating_one_sqlite_store_at_once_both_succeed(tmp_path: Path) -> None:
    import subprocess
    import sys

    uri = f"sqlite:///{tmp_path / 'fresh.db'}"
    code = (
        "import sys; from types import SimpleNamespace as S; from dapo_cli.tracking import start_run\n"
        f"with start_run(S(backend='mlflow', tracking_uri={uri!r}, experiment='race'), sys.argv[1]) as t:\n"
        "    t.log_metrics({'m': 1.0}, step=1)\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, f"run{i}"], stderr=subprocess.PIPE, text=True) for i in range(3)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    assert len(client.search_runs([client.get_experiment_by_name("race").experiment_id])) == 3


def test_reading_never_creates_a_store(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no MLflow store at"):
        open_client(f"sqlite:///{tmp_path / 'absent.db'}")
    assert not (tmp_path / "absent.db").exists()


def test_resuming_an_unknown_run_is_a_user_error(store: SimpleNamespace) -> None:
    with pytest.raises(UserError, match=f"MLflow store {store.uri} failed"):
        MlflowTracker(store.uri, "resume", "x", resume_run_id="0" * 32)


def test_exception_ends_the_run_failed_and_propagates(store: SimpleNamespace) -> None:
    with pytest.raises(ValueError, match="boom"):
        with start_run(cfg(store, "failures"), "crash") as tracker:
            raise ValueError("boom")
    assert store.client.get_run(tracker.run_id).info.status == "FAILED"
    with pytest.raises(KeyboardInterrupt):
        with start_run(cfg(store, "failures"), "ctrl-c") as tracker:
            raise KeyboardInterrupt
    assert store.client.get_run(tracker.run_id).info.status == "KILLED"


def test_long_param_values_are_truncated() -> None:
    assert _param_value("x" * MAX_PARAM_CHARS) == "x" * MAX_PARAM_CHARS
    long = _param_value("x" * (MAX_PARAM_CHARS + 1))
    assert len(long) == MAX_PARAM_CHARS and long.endswith("...")
    assert _param_value({"a": [1]}) == '{"a": [1]}'
    assert _param_value(None) == "None"


def test_null_tracker_accepts_everything(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with start_run(SimpleNamespace(backend="null", tracking_uri="", experiment="x"), "run", tags={"a": 1}) as tracker:
        assert isinstance(tracker, NullTracker)
        assert tracker.run_id == ""
        tracker.log_params(flatten(Config()))
        tracker.set_tags({"a": 1})
        tracker.log_metrics({"a": 1.0, "b": math.nan}, step=3)
        tracker.log_metrics({})
        tracker.log_artifact(tmp_path / "does-not-exist.txt", "x")
        tracker.log_text("t", "t.txt")
        tracker.log_dict({"a": object()}, "d.json")
        tracker.log_table([{"a": 1}], "t.json")
    with pytest.raises(ValueError):
        with start_run(SimpleNamespace(backend="null", tracking_uri="", experiment="x"), "run"):
            raise ValueError
    assert list(tmp_path.iterdir()) == []


def test_tracking_uri_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert resolve_tracking_uri("") == DEFAULT_TRACKING_URI == "sqlite:///mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://server:5000")
    assert resolve_tracking_uri("") == "http://server:5000"
    assert resolve_tracking_uri("sqlite:///x.db") == "sqlite:///x.db"  # the config wins


def test_sqlite_artifact_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    # sqlite:///rel.db is relative to the working directory; sqlite:////abs.db absolute
    assert sqlite_artifact_location("sqlite:///mlflow.db", "dapo") == (tmp_path / "mlartifacts" / "dapo").as_uri()
    assert sqlite_artifact_location("sqlite:///runs/m.db", "dapo-tiny") == (tmp_path / "runs" / "mlartifacts" / "dapo-tiny").as_uri()
    assert sqlite_artifact_location("sqlite:////srv/ml/m.db?timeout=5", "e") == "file:///srv/ml/mlartifacts/e"
    assert sqlite_artifact_location("sqlite:////srv/m.db", "../../etc x") == "file:///srv/mlartifacts/_.._etc_x"  # no separator survives
    assert sqlite_artifact_location("sqlite:///:memory:", "e") is None
    assert sqlite_artifact_location("sqlite://", "e") is None
    assert sqlite_artifact_location("http://server:5000", "e") is None
    assert sqlite_artifact_location("file:///tmp/mlruns", "e") is None


def test_params_and_tags_never_hold_a_uris_password(store: SimpleNamespace) -> None:
    # tracking.tracking_uri is a param of every run; a tag may quote a URL too
    with start_run(cfg(store, "redacted"), "run") as tracker:
        tracker.log_params({"tracking.tracking_uri": "http://me:secret@mlflow.example:5000", "trainer.lr": 1e-4})
        tracker.set_tags({"note": "copied from https://me:secret@host/run"})
        run_id = tracker.run_id
    run = store.client.get_run(run_id)
    assert run.data.params["tracking.tracking_uri"] == "http://***@mlflow.example:5000"
    assert run.data.params["trainer.lr"] == "0.0001"
    assert run.data.tags["note"] == "copied from https://***@host/run"



def test_sqlite_store_problem_reads_the_header_and_the_table_names_and_writes_nothing(tmp_path: Path) -> None:
    import hashlib
    import sqlite3

    from dapo_cli.tracking.mlflow import sqlite_store_problem

    (tmp_path / "empty.db").write_bytes(b"")  # SQLite's empty database: MLflow creates its schema in it
    assert sqlite_store_problem(tmp_path / "missing.db") is None and sqlite_store_problem(tmp_path / "empty.db") is None
    (tmp_path / "text.db").write_text("hello\n")
    assert "is not a SQLite database (it does not start with SQLite's header)" in sqlite_store_problem(tmp_path / "text.db")
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        for i in range(7):
            conn.execute(f"CREATE TABLE t{i} (x)")
    conn.close()
    before = hashlib.sha256(other.read_bytes()).hexdigest()
    assert sqlite_store_problem(other).startswith(f"{other} is a SQLite database but not an MLflow store (its tables: t0, t1, t2, t3, t4, ...)")
    assert hashlib.sha256(other.read_bytes()).hexdigest() == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "empty.db", "other.db", "text.db"]  # no journal, no lock
    store = tmp_path / "store.db"
    from dapo_cli.tracking.mlflow import open_client

    open_client(f"sqlite:///{store}", create=True)  # a real MLflow store passes
    assert sqlite_store_problem(store) is None
    (tmp_path / "damaged.db").write_bytes(b"SQLite format 3\x00" + b"\xff" * 2000)
    assert "is a damaged SQLite database" in sqlite_store_problem(tmp_path / "damaged.db")


def test_a_store_another_process_is_creating_is_waited_for_not_refused(tmp_path: Path) -> None:
    # CI caught two `dapo train` started together on a fresh store: one exited 2 with "not an MLflow store (its
    # tables: experiments, metrics, params, runs, tags)". MLflow creates those tables first and alembic_version
    # after, all while the first process holds the store's lock; the second read the table names before taking
    # the lock. Here this test is that first process: it holds the lock over a half-made store, and the opener
    # must wait for the lock, then find the finished store.
    import fcntl
    import os
    import sqlite3
    import threading

    from dapo_cli.tracking.mlflow import open_client

    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as conn:
        for table in ("experiments", "metrics", "params", "runs", "tags"):
            conn.execute(f"CREATE TABLE {table} (x)")
    conn.close()
    outcome: list[object] = []
    with open(tmp_path / "mlflow.db.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        opener = threading.Thread(target=lambda: outcome.append(_outcome(lambda: open_client(f"sqlite:///{db}", create=True))))
        opener.start()
        opener.join(timeout=1.0)
        assert opener.is_alive() and outcome == [], outcome  # waiting on the lock, not refused before it
        finished = tmp_path / "made" / "mlflow.db"
        open_client(f"sqlite:///{finished}", create=True)  # the "other process" finishes its migration
        os.replace(finished, db)
    opener.join(timeout=60)
    assert len(outcome) == 1 and not isinstance(outcome[0], BaseException), outcome
    assert [e.name for e in outcome[0].search_experiments()] == ["Default"]


def test_another_programs_database_is_refused_under_the_lock_and_leaves_no_lock_file(tmp_path: Path) -> None:
    import sqlite3

    from dapo_cli.errors import UserError
    from dapo_cli.tracking.mlflow import open_client

    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY)")
    conn.close()
    with pytest.raises(UserError, match=r"other\.db is a SQLite database but not an MLflow store \(its tables: users\)"):
        open_client(f"sqlite:///{other}", create=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]


def _outcome(call: Any) -> object:
    try:
        return call()
    except BaseException as exc:  # noqa: BLE001 - the test reads what the thread raised
        return exc


def test_a_relative_sqlite_store_is_the_one_in_the_current_directory_after_a_chdir(tmp_path, monkeypatch) -> None:
    # MLflow keeps one store per URI text for the whole process: opened as sqlite:///mlflow.db in a/, the same
    # text in b/ kept reading and writing a/mlflow.db (an eval in one test wrote into another test's store)
    from mlflow import MlflowClient

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        open_client("sqlite:///mlflow.db", create=True).create_experiment(f"made-in-{name}")
    for name, other in (("a", "b"), ("b", "a")):
        names = {e.name for e in MlflowClient(f"sqlite:///{tmp_path / name / 'mlflow.db'}").search_experiments()}
        assert f"made-in-{name}" in names and f"made-in-{other}" not in names
