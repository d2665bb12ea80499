"""BackgroundTracker: per-step calls return at once, land in order, and are all written by the
time a checkpoint, an artifact or the end of the run needs them."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dapo_cli.tracking import start_run
from dapo_cli.tracking.background import BackgroundTracker


class Recorder:
    """A tracker that records every call; ``gate`` (when set) holds the worker inside log_metrics."""

    run_id = "run-1"
    tracking_uri = "memory://"

    def __init__(self, fail_on_step: int | None = None) -> None:
        self.down = threading.Event()
        self.calls: list[tuple[Any, ...]] = []
        self.gate: threading.Event | None = None
        self.fail_on_step = fail_on_step
        self.writer_threads: set[str] = set()

    def _note(self, *call: Any) -> None:
        self.writer_threads.add(threading.current_thread().name)
        self.calls.append(call)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if self.gate is not None:
            assert self.gate.wait(10)
        if step == self.fail_on_step:
            raise RuntimeError(f"store refused step {step}")
        self._note("metrics", dict(metrics), step)

    def log_table(self, rows: Any, artifact_file: str) -> None:
        self._note("table", [dict(r) for r in rows], artifact_file)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self._note("tags", dict(tags))

    def log_text(self, text: str, artifact_file: str) -> None:
        self._note("text", text, artifact_file)

    def log_dict(self, obj: Any, artifact_file: str) -> None:
        self._note("dict", obj, artifact_file)

    def log_params(self, params: Mapping[str, Any]) -> None:
        self.calls.append(("params", dict(params)))

    def log_artifact(self, path: Any, artifact_path: str | None = None) -> None:
        self.calls.append(("artifact", str(path)))

    def log_input(self, name: str, **kw: Any) -> None:
        self.calls.append(("input", name))

    def mark_orphans(self, is_alive: Any) -> list[str]:
        self.calls.append(("orphans",))
        return []

    def flush(self, *, unless_down: bool = False) -> None:
        pass

    def abandon(self) -> None:
        self.calls.append(("abandon",))

    def finish(self, status: str = "FINISHED") -> None:
        self.calls.append(("finish", status))


@pytest.mark.slow
def test_a_checkpoints_flush_does_not_wait_for_a_server_that_is_down() -> None:
    """flush(unless_down=True) (before a checkpoint) returns once the worker waits for a server that does not
    answer; what is queued stays queued, in order, and the next plain flush waits for all of it."""
    inner = Recorder()
    inner.gate = threading.Event()
    tracker = BackgroundTracker(inner)
    tracker.log_metrics({"a": 1.0}, step=1)  # the worker holds this write: the server "does not answer"
    tracker.log_metrics({"a": 2.0}, step=2)
    inner.down.set()
    t0 = time.perf_counter()
    tracker.flush(unless_down=True)
    assert time.perf_counter() - t0 < 1.0 and inner.calls == []
    inner.down.clear()
    inner.gate.set()  # the server answers again
    tracker.flush()
    assert [c[2] for c in inner.calls if c[0] == "metrics"] == [1, 2]
    tracker.finish()


@pytest.mark.slow
def test_metrics_return_before_the_write_and_flush_waits_for_it() -> None:
    inner = Recorder()
    inner.gate = threading.Event()
    tracker = BackgroundTracker(inner)
    t0 = time.perf_counter()
    tracker.log_metrics({"a": 1.0}, step=1)  # the worker is now blocked inside the write
    assert time.perf_counter() - t0 < 1.0
    assert inner.calls == []  # not written yet: the caller did not wait
    threading.Timer(0.2, inner.gate.set).start()
    tracker.flush()
    assert inner.calls == [("metrics", {"a": 1.0}, 1)]
    assert inner.writer_threads == {"dapo-tracking_0"}  # written by the worker thread, not the caller's
    tracker.finish()


def test_calls_land_in_the_order_made_and_arguments_are_copied() -> None:
    inner = Recorder()
    tracker = BackgroundTracker(inner)
    metrics = {"loss": 0.5}
    rows = [{"response": "12"}]
    for step in range(1, 6):
        metrics["loss"] = step / 10
        tracker.log_metrics(metrics, step=step)  # the same dict, changed after each call
        rows[0]["response"] = f"r{step}"
        tracker.log_table(rows, f"samples/step_{step}.json")
    tracker.set_tags({"done": "yes"})
    tracker.finish()
    expected: list[tuple[Any, ...]] = []
    for step in range(1, 6):
        expected += [("metrics", {"loss": step / 10}, step), ("table", [{"response": f"r{step}"}], f"samples/step_{step}.json")]
    assert inner.calls == [*expected, ("tags", {"done": "yes"}), ("finish", "FINISHED")]


@pytest.mark.slow
def test_artifacts_params_inputs_and_orphans_wait_for_the_queue() -> None:
    inner = Recorder()
    inner.gate = threading.Event()
    tracker = BackgroundTracker(inner)
    tracker.log_metrics({"a": 1.0}, step=7)
    threading.Timer(0.2, inner.gate.set).start()
    tracker.log_artifact("ckpt/step_7/model")  # must not run before step 7's metrics are written
    tracker.log_params({"lr": 1e-6})
    tracker.log_input("aime24", digest="d", rows=960, source="x", context="evaluation")
    tracker.mark_orphans(lambda run: True)
    kinds = [c[0] for c in inner.calls]
    assert kinds == ["metrics", "artifact", "params", "input", "orphans"]
    tracker.finish("KILLED")
    assert inner.calls[-1] == ("finish", "KILLED")


def test_a_failed_write_is_raised_once_later_writes_are_dropped_and_the_run_ends_failed() -> None:
    inner = Recorder(fail_on_step=2)
    tracker = BackgroundTracker(inner)
    tracker.log_metrics({"a": 1.0}, step=1)
    tracker.log_metrics({"a": 2.0}, step=2)  # fails in the worker
    tracker.log_metrics({"a": 3.0}, step=3)  # queued behind it: must not be written (order)
    with pytest.raises(RuntimeError, match="store refused step 2"):
        tracker.flush()
    tracker.log_metrics({"a": 4.0}, step=4)  # after the failure: dropped, not raised again
    tracker.finish()
    assert inner.calls == [("metrics", {"a": 1.0}, 1), ("finish", "FAILED")]


@pytest.mark.slow
def test_start_run_wraps_on_request_and_mlflow_holds_every_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = SimpleNamespace(backend="mlflow", tracking_uri=uri, experiment="bg")
    with start_run(cfg, "bg-run", background=True) as tracker:
        assert isinstance(tracker, BackgroundTracker)
        for step in range(1, 21):
            tracker.log_metrics({"reward/score_mean": step / 20, "timing/step": 0.1}, step=step)
        tracker.log_table([{"response": "7"}], "samples/step_000020.json")
        run_id = tracker.run_id
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    history = client.get_metric_history(run_id, "reward/score_mean")
    assert [m.step for m in history] == list(range(1, 21))
    assert [m.value for m in history] == [s / 20 for s in range(1, 21)]
    assert [a.path for a in client.list_artifacts(run_id, "samples")] == ["samples/step_000020.json"]
