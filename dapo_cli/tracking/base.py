"""The tracking protocol: what a run records, whatever the backend.

``MlflowTracker`` (``tracking/mlflow.py``) is the real one; ``NullTracker`` records
nothing and lets code log unconditionally (no ``if tracker:`` checks).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class Tracker(Protocol):
    """One run's record: params, tags, per-step metrics, artifacts and tables."""

    run_id: str
    tracking_uri: str
    """Where the run is stored (the resolved MLflow URI); empty when nothing is stored."""
    down: threading.Event
    """Set while a call waits for a tracking server that does not answer (:func:`~dapo_cli.tracking.server.wait_out`)."""

    def log_params(self, params: Mapping[str, Any]) -> None: ...

    def set_tags(self, tags: Mapping[str, Any]) -> None: ...

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """All metrics of one step in one batched call."""
        ...

    def log_artifact(self, path: str | os.PathLike[str], artifact_path: str | None = None) -> None: ...

    def log_text(self, text: str, artifact_file: str) -> None: ...

    def log_dict(self, obj: Any, artifact_file: str) -> None: ...

    def log_table(self, rows: Sequence[Mapping[str, Any]], artifact_file: str) -> None:
        """A list of same-keyed rows as an MLflow table (JSON artifact shown in the UI)."""
        ...

    def flush(self, *, unless_down: bool = False) -> None:
        """Everything logged so far is in the store (a background tracker waits for its queue). ``unless_down``:
        return at once instead while the tracking server does not answer (what is queued stays queued)."""
        ...

    def finish(self, status: str = "FINISHED") -> None: ...

    def abandon(self) -> None:
        """The run is ending by an exception (Ctrl-C, a failure): stop waiting for a tracking server that
        does not answer (:func:`~dapo_cli.tracking.server.wait_out`), so the ending is not held up by it."""
        ...

    def tag_other_run(
        self, run_id: str, tags: Mapping[str, str], *, append: Mapping[str, str] | None = None
    ) -> dict[str, str] | None:
        """Set ``tags`` on another run of this store and add each ``append`` value to that run's
        comma-separated list tag; that run's ``run_name``, ``experiment_id``, ``experiment`` and ``note``
        (its description), or None when the store has no such run."""
        ...

    def mark_orphans(self, is_alive: Any) -> list[str]:
        """Close runs of the experiment that a dead process left RUNNING (``is_alive(run)`` False); their ids."""
        ...

    def log_input(self, name: str, *, digest: str, rows: int, source: str, context: str) -> None:
        """Register a dataset the run used (``context``: training / validation / evaluation)."""
        ...


class NullTracker:
    """A tracker that records nothing (``tracking.backend: null``)."""

    run_id = ""
    tracking_uri = ""
    down = threading.Event()  # never set: nothing to wait for

    def log_params(self, params: Mapping[str, Any]) -> None:
        pass

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        pass

    def log_artifact(self, path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        pass

    def log_text(self, text: str, artifact_file: str) -> None:
        pass

    def log_dict(self, obj: Any, artifact_file: str) -> None:
        pass

    def log_table(self, rows: Sequence[Mapping[str, Any]], artifact_file: str) -> None:
        pass

    def flush(self, *, unless_down: bool = False) -> None:
        pass

    def finish(self, status: str = "FINISHED") -> None:
        pass

    def abandon(self) -> None:
        pass

    def tag_other_run(
        self, run_id: str, tags: Mapping[str, str], *, append: Mapping[str, str] | None = None
    ) -> dict[str, str] | None:
        return None

    def mark_orphans(self, is_alive: Any) -> list[str]:
        return []

    def log_input(self, name: str, *, digest: str, rows: int, source: str, context: str) -> None:
        pass
