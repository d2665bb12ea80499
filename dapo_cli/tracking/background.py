"""Per-step records written by one background thread, so a training step never waits on the store.

One ``log_batch`` of a step's ~45 metrics costs ~10 ms on SQLite and ~20 ms over HTTP, a sample
table 50-80 ms (``benchmarks/tracking_overhead.py``): 4.5-10% of a 0.2 s CPU step. MLflow's own
``synchronous=False`` logging takes the metrics call off the step, but its next ``log_table``
then waits for the whole queue. :class:`BackgroundTracker` queues the calls a step makes
(metrics, tables, tags, small text/JSON artifacts) on a single worker thread, which runs them
in the order they were made; every other call (params, artifacts, dataset inputs, the end of
the run, orphan marking) first waits for the queue to drain and then runs on the caller's
thread, so what the store holds at a checkpoint, at the end of a run and on any read-back is
exactly what the synchronous tracker would hold.

A failure in the worker is raised once, on the caller's next call (or at ``finish``), never
lost; after it nothing else queued is written, and ``finish`` closes the run as FAILED.
"""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from dapo_cli.tracking.base import Tracker


class BackgroundTracker:
    """Wraps a :class:`~dapo_cli.tracking.base.Tracker`; the per-step calls return at once.

    Arguments are copied when a call is queued, so the caller may reuse or change its dicts
    and rows. ``flush()`` waits for everything queued so far.
    """

    def __init__(self, inner: Tracker) -> None:
        self.inner = inner
        self.run_id = inner.run_id
        self.tracking_uri = inner.tracking_uri
        self.down = inner.down
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dapo-tracking")
        self._pending: list[Future[None]] = []
        self._lock = threading.Lock()
        self._failed: BaseException | None = None
        self._raised = False

    # -- queued: what a training step logs -------------------------------------------------
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self._queue(self.inner.log_metrics, dict(metrics), step)

    def log_table(self, rows: Sequence[Mapping[str, Any]], artifact_file: str) -> None:
        self._queue(self.inner.log_table, [dict(r) for r in rows], artifact_file)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self._queue(self.inner.set_tags, dict(tags))

    def log_text(self, text: str, artifact_file: str) -> None:
        self._queue(self.inner.log_text, text, artifact_file)

    def log_dict(self, obj: Any, artifact_file: str) -> None:
        self._queue(self.inner.log_dict, copy.deepcopy(obj), artifact_file)

    # -- after the queue has drained: calls whose inputs may change or whose results matter --
    def log_params(self, params: Mapping[str, Any]) -> None:
        self.flush()
        self.inner.log_params(params)

    def log_artifact(self, path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        self.flush()  # the file may be deleted or rewritten right after (checkpoint rotation)
        self.inner.log_artifact(path, artifact_path)

    def log_input(self, name: str, *, digest: str, rows: int, source: str, context: str) -> None:
        self.flush()
        self.inner.log_input(name, digest=digest, rows=rows, source=source, context=context)

    def mark_orphans(self, is_alive: Any) -> list[str]:
        self.flush()
        return self.inner.mark_orphans(is_alive)

    def tag_other_run(self, run_id: str, tags: Mapping[str, str], *, append: Mapping[str, str] | None = None) -> Any:
        self.flush()
        return self.inner.tag_other_run(run_id, tags, append=append)

    def finish(self, status: str = "FINISHED") -> None:
        """Drain the queue, then close the run; a worker failure closes it FAILED and is raised."""
        try:
            self.flush()
        finally:
            self._pool.shutdown(wait=True)
            failed = self._failed is not None and status == "FINISHED"
            self.inner.finish("FAILED" if failed else status)

    def abandon(self) -> None:
        """At once, not queued: the worker may be the one waiting for the server."""
        self.inner.abandon()

    def flush(self, *, unless_down: bool = False) -> None:
        """Wait for every queued call; re-raise the first failure among them. ``unless_down``: return as soon as
        the inner tracker waits for a server that does not answer (``down``), leaving the rest queued."""
        with self._lock:
            pending, self._pending = self._pending, []
        for i, future in enumerate(pending):
            while unless_down and not future.done():
                if self.down.wait(0.05):
                    with self._lock:  # still queued: the next flush waits for them
                        self._pending = [f for f in pending[i:] if not f.done()] + self._pending
                    return
            try:
                future.result()
            except BaseException:  # noqa: BLE001 - _run kept it in self._failed
                pass
        self._raise_failure()

    def _queue(self, call: Callable[..., None], *args: Any) -> None:
        self._raise_failure()
        with self._lock:
            self._pending = [f for f in self._pending if not f.done()]  # done ones left their failure in _failed
            self._pending.append(self._pool.submit(self._run, call, *args))

    def _run(self, call: Callable[..., None], *args: Any) -> None:
        if self._failed is None:  # after a failure, later calls are not written (order matters)
            try:
                call(*args)
            except BaseException as exc:
                self._failed = exc
                raise

    def _raise_failure(self) -> None:
        """Raise the worker's failure once; later calls are then dropped by the worker."""
        if self._failed is not None and not self._raised:
            self._raised = True
            raise self._failed
