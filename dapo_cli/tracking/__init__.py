"""Experiment tracking behind a small protocol: MLflow (default) or nothing.

    with start_run(cfg.tracking, run_name="grpo-seed0", tags={...}) as tracker:
        tracker.log_params(flatten(cfg))
        tracker.log_metrics({"reward/score_mean": 0.1}, step=1)

The run ends FINISHED, or FAILED on an exception (KILLED on Ctrl-C), so the UI
never shows a crashed run as still running.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from dapo_cli.tracking.base import NullTracker, Tracker
from dapo_cli.tracking.tags import EXTRA_TAGS_ENV, PARENT_RUN_ENV


@contextlib.contextmanager
def start_run(
    cfg: Any,
    run_name: str,
    *,
    tags: Mapping[str, Any] | None = None,
    parent_run_id: str | None = None,
    resume_run_id: str | None = None,
    background: bool = False,
) -> Iterator[Tracker]:
    """Open a run on ``cfg`` (a ``TrackingConfig``) and close it with the right status.

    ``background``: per-step calls are written by a worker thread
    (:class:`~dapo_cli.tracking.background.BackgroundTracker`); the training loop asks for it.
    """
    tracker: Tracker
    if cfg.backend == "null":
        tracker = NullTracker()
    else:
        from dapo_cli.tracking.mlflow import MlflowTracker

        tracker = MlflowTracker(
            cfg.tracking_uri,
            cfg.experiment,
            run_name,
            tags=tags,
            parent_run_id=parent_run_id,
            resume_run_id=resume_run_id,
        )
        if background:
            from dapo_cli.tracking.background import BackgroundTracker

            tracker = BackgroundTracker(tracker)
    try:
        yield tracker
    except KeyboardInterrupt:
        close_failed_run(tracker, "KILLED")
        raise
    except BaseException:
        close_failed_run(tracker, "FAILED")
        raise
    else:
        tracker.finish("FINISHED")


def close_failed_run(tracker: Tracker, status: str) -> None:
    """Mark a run that ended by an exception; a store that fails this too (it may be why the run ended)
    must not replace that exception with its own, nor hold it up waiting for a server that does not answer."""
    tracker.abandon()
    try:
        tracker.finish(status)
    except Exception:  # noqa: BLE001 - the original exception is on its way to the user
        pass


__all__ = ["EXTRA_TAGS_ENV", "PARENT_RUN_ENV", "NullTracker", "Tracker", "start_run"]
