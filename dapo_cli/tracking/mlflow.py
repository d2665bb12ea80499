"""MLflow tracker through ``MlflowClient`` (explicit run ids, no global active run).

Default store: ``sqlite:///mlflow.db`` in the working directory, unless the
config or ``$MLFLOW_TRACKING_URI`` names another (a remote server works unchanged).
A new experiment in a SQLite store keeps its artifacts beside the database
(``<db dir>/mlartifacts/<experiment>/``), not under the working directory.
Metrics of a step go in one ``log_batch`` call: one call per metric costs 4–12 ms
on SQLite and ~60 ms over HTTP.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from dapo_cli.errors import EnvironmentFailure, UserError
from dapo_cli.redact import redact

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
MAX_PARAM_CHARS = 6000
BATCH_PARAMS = 100
BATCH_METRICS = 1000
MAX_LIST_TAG_CHARS = 5000
"""Longest comma-separated list tag (``dapo.evals``) kept; MLflow allows 8000 characters per tag value."""

# log_table downloads the table to append to it; its progress bar would break our step lines.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
# An unreachable tracking server fails in seconds, not minutes: MLflow's defaults (7 retries,
# backoff factor 2, 120 s timeout) took 249 s to report http://127.0.0.1:9 (measured).
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "4")

for _name in ("alembic", "mlflow", "mlflow.store.db.utils"):
    logging.getLogger(_name).setLevel(logging.WARNING)


def resolve_tracking_uri(configured: str) -> str:
    """The config value, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``."""
    return configured or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


_READY: set[str] = set()
"""Stores this process has opened (and so created or migrated) once."""


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` store (relative to the working directory), else None."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        return None
    db = uri[len(prefix) :].split("?", 1)[0]
    return None if not db or db == ":memory:" else Path(db)


SQLITE_MAGIC = b"SQLite format 3\x00"
"""The first 16 bytes of every SQLite database file (https://www.sqlite.org/fileformat.html, 1.3)."""

MLFLOW_TABLES = frozenset({"alembic_version", "experiments", "runs"})
"""Tables every MLflow SQLite store has (its schema migrations create them first)."""


def sqlite_store_problem(db: Path, *, tables: bool = True) -> str | None:
    """What keeps the file ``db`` from being an MLflow store, or None (no file yet, an empty file, or a store).

    Refused before MLflow opens it, because MLflow would otherwise run its schema migrations on whatever
    the URI names: a text file or a corrupt database (a traceback and a stray ``.lock``), a FIFO or a device
    (a hang), another program's SQLite database (66 tables added to it). The checks read the 16-byte header
    and, unless ``tables`` is False, the table names through a read-only connection; nothing is written.
    The table check belongs under the store's lock: a store another process is creating has MLflow's first
    tables and not yet ``alembic_version``, which looks like another program's database for a moment.
    """
    import sqlite3
    import stat

    from dapo_cli.fileio import special_file_problem

    special = special_file_problem(db)
    if special:
        return f"{db} {special}; name a database file"
    try:
        st = db.stat()
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            return None  # missing (created later), a directory (the callers say so), or empty (SQLite's empty database)
        with open(db, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot read {db}: {exc.strerror or exc}"
    if head != SQLITE_MAGIC:
        return f"{db} is not a SQLite database (it does not start with SQLite's header); name a new file or an MLflow store"
    if not tables:
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)) as conn:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error as exc:
        return f"{db} is a damaged SQLite database ({exc}); restore it from a backup or name a new file"
    if tables and not MLFLOW_TABLES <= tables:
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        return (f"{db} is a SQLite database but not an MLflow store (its tables: {shown}); "
                "name a new file or an MLflow store, so that nothing is added to it")
    return None


def _client(uri: str, *, must_exist: bool = False):
    """An ``MlflowClient`` on ``uri``; a SQLite store is created (schema migration) under a file lock.

    Two processes opening a fresh SQLite store at once otherwise race in MLflow's schema
    migration (alembic: "Online migration expected to match one row"). ``must_exist``: a
    reading command never creates a store; a missing database file is a one-line error.
    """
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    db = sqlite_path(uri)
    if db is not None and must_exist and not db.is_file():
        raise UserError(f"no MLflow store at {db} (from {uri}); point --tracking-uri or MLFLOW_TRACKING_URI at the store your runs are in")
    # MLflow keeps one store per URI text for the process: a relative sqlite:///x.db opened in one working directory
    # would keep writing there after a chdir (a library caller, a test), so the client gets the absolute path
    connect = absolute_tracking_uri(uri) if db is not None else uri
    if db is None or connect in _READY:
        return MlflowClient(tracking_uri=connect)
    import fcntl

    from sqlalchemy.exc import SQLAlchemyError

    problem = sqlite_store_problem(db, tables=False)  # a FIFO or a text file is refused before a lock file is made
    if problem:
        raise UserError(f"MLflow store {redact(uri)}: {problem}")
    lock_file = db.resolve().with_name(db.name + ".lock")
    lock_existed = lock_file.exists()
    try:
        db.resolve().parent.mkdir(parents=True, exist_ok=True)
        with open(lock_file, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            problem = sqlite_store_problem(db)  # under the lock: a store being created by another process is whole now
            if problem:
                if not lock_existed:
                    lock_file.unlink(missing_ok=True)
                raise UserError(f"MLflow store {redact(uri)}: {problem}")
            client = MlflowClient(tracking_uri=connect)
            client.search_experiments(max_results=1)  # creates and migrates the schema, inside the lock
    except (OSError, MlflowException, SQLAlchemyError) as exc:
        if not lock_existed:
            lock_file.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise UserError(f"cannot open the MLflow store {redact(uri)}: {exc.strerror or exc}; "
                            "use a writable directory or another tracking.tracking_uri") from None
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise UserError(f"MLflow store {redact(uri)} failed: {redact(first)}") from None
    _READY.add(connect)
    return client


def open_client(tracking_uri: str, *, create: bool = False) -> Any:
    """An ``MlflowClient`` on the resolved store for reading runs back (``dapo report``): a missing
    SQLite store is an error unless ``create``."""
    return _client(resolve_tracking_uri(tracking_uri), must_exist=not create)


def get_run_or_none(client: Any, run_id: str) -> Any | None:
    """The run with this id, or None when the store has no such run."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException:
        return None


def absolute_tracking_uri(uri: str) -> str:
    """``uri`` resolved (:func:`resolve_tracking_uri`), a relative ``sqlite:///x.db`` made absolute
    (``sqlite:////cwd/x.db``): what a file that outlives this working directory records."""
    uri = resolve_tracking_uri(uri)
    db = sqlite_path(uri)
    if db is None or db.is_absolute():
        return uri
    query = uri.split("?", 1)[1] if "?" in uri else ""
    return f"sqlite:///{db.resolve()}" + (f"?{query}" if query else "")


def run_experiment_name(tracking_uri: str, run_id: str) -> str | None:
    """Name of the experiment holding run ``run_id`` in the store, or None (no store, no such run, store unreachable)."""
    try:
        client = open_client(tracking_uri)
        run = get_run_or_none(client, run_id)
        return None if run is None else client.get_experiment(run.info.experiment_id).name
    except Exception:  # a missing or unreachable store only costs the default experiment
        return None


def sqlite_artifact_location(tracking_uri: str, experiment: str) -> str | None:
    """``file://<db dir>/mlartifacts/<experiment>`` for a ``sqlite:///`` store, else None (the store's default).

    Left to itself, MLflow's SQLite store puts artifacts under ``./mlruns`` of
    whatever directory the process runs in, so runs of one database would scatter
    their artifacts over every working directory they were started from. Beside
    the database they move with it. ``sqlite:///rel.db`` is relative to the
    working directory, ``sqlite:////abs/x.db`` absolute; in-memory stores get None.
    """
    db = sqlite_path(tracking_uri)
    if db is None:
        return None
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", experiment).strip(".") or "experiment"
    return (db.resolve().parent / "mlartifacts" / safe).as_uri()


MLFLOW_UI = "http://127.0.0.1:5000"
"""Where ``mlflow ui`` serves by default."""

TRAINING_VIEW = "workflowType=machine_learning"
"""The query that opens a page in the UI's "Model training" mode. MLflow 3.17's UI takes its mode from
this parameter (else from the last mode picked in that browser, "GenAI" at first) and not from the
experiment's ``mlflow.experimentKind`` tag: without it a training run's page is headed "Evaluations"."""


def run_page(tracking_uri: str, run_id: str, ui: str = MLFLOW_UI) -> str | None:
    """The address of run ``run_id``'s metric charts in ``mlflow ui`` (training view), or None where the
    store does not answer or hold the run."""
    try:
        run = get_run_or_none(open_client(tracking_uri), run_id)
    except Exception:  # an unreachable store only costs the address
        return None
    if run is None:
        return None
    return f"{ui}/#/experiments/{run.info.experiment_id}/runs/{run_id}/model-metrics?{TRAINING_VIEW}"


def ui_lines(tracking_uri: str, run_id: str) -> list[str]:
    """What a command prints about its MLflow run: the id, and how to open its page in the training view."""
    lines = [f"MLflow run: {run_id}"]
    page = run_page(tracking_uri, run_id) if tracking_uri else None
    if page is not None:
        lines.append(f"MLflow UI:  mlflow ui --backend-store-uri {tracking_uri}, then open {page}")
    elif tracking_uri:
        lines[0] += f"  (mlflow ui --backend-store-uri {tracking_uri})"
    return [redact(line) for line in lines]


EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING_KIND = "custom_model_development"
"""What dapo's experiments are: MLflow's UI then opens them in its "Model training" mode (the run
list, its chart view and run comparison), not the GenAI mode (traces, evaluation datasets) it
otherwise guesses for experiments without this tag."""


def experiment_id(client: Any, name: str, artifact_location: str | None = None) -> str:
    """Id of experiment ``name``, created (with ``artifact_location`` if given) if missing; tagged
    ``mlflow.experimentKind`` = model training unless it already has a kind."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        if EXPERIMENT_KIND_TAG not in (exp.tags or {}):
            client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND)
        return exp.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location,
                                        tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING_KIND})
    except Exception:  # created concurrently by another process
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


M = TypeVar("M", bound=Callable[..., Any])


def store_call(method: M) -> M:
    """A tracker method that talks to the store: once the run is open, a tracking server that stops answering
    is waited for (:func:`~dapo_cli.tracking.server.wait_out`: retried for up to ten minutes); past that, or
    the store failing otherwise (a refusal, a database gone or locked), is the machine's failure, not a bug
    and not bad input: one line, exit 5 (:class:`~dapo_cli.errors.EnvironmentFailure`). A full disk under a
    local store stays an ``OSError`` (the CLI names it as such)."""

    @functools.wraps(method)
    def call(self: MlflowTracker, *args: Any, **kwargs: Any) -> Any:
        from mlflow.exceptions import MlflowException

        from dapo_cli.tracking.server import OUTAGE_LIMIT_S, is_server, is_transient, wait_out

        server = is_server(self.tracking_uri)
        try:
            if server:
                return wait_out(lambda: method(self, *args, **kwargs), self.tracking_uri, stop=self.abandoned, down=self.down)
            return method(self, *args, **kwargs)
        except MlflowException as exc:
            detail = " ".join(str(exc).split())[:300]
            waited = f" after no answer for {OUTAGE_LIMIT_S:.0f} s" if server and is_transient(exc) else ""
            raise EnvironmentFailure(
                f"the MLflow store {self.tracking_uri} failed during the run{waited} ({detail}); what was recorded before "
                "stays, and checkpoints are on disk: rerun once the store answers (dapo train --resume continues "
                "from the last complete checkpoint)"
            ) from exc

    return call  # type: ignore[return-value]


class MlflowTracker:
    """Records one MLflow run (new, nested under a parent, or resumed by id)."""

    def __init__(
        self,
        tracking_uri: str,
        experiment: str,
        run_name: str,
        *,
        tags: Mapping[str, Any] | None = None,
        parent_run_id: str | None = None,
        resume_run_id: str | None = None,
    ) -> None:
        import threading

        from mlflow.exceptions import MlflowException

        self.tracking_uri = resolve_tracking_uri(tracking_uri)
        self.abandoned = threading.Event()
        """Set by :meth:`abandon`: a call waiting for the server gives up."""
        self.down = threading.Event()
        """Set while a call waits for a server that does not answer."""
        try:
            self.client = _client(self.tracking_uri)
            if resume_run_id:
                run = self.client.get_run(resume_run_id)
                self.run_id = resume_run_id
                self.client.update_run(resume_run_id, status="RUNNING")
                self._recorded = self._recorded_steps(run)
            else:
                all_tags = {str(k): redact(str(v)) for k, v in (tags or {}).items()}  # dapo.command holds --set values
                if parent_run_id:
                    all_tags["mlflow.parentRunId"] = parent_run_id
                exp_id = experiment_id(
                    self.client, experiment, sqlite_artifact_location(self.tracking_uri, experiment)
                )
                run = self.client.create_run(exp_id, run_name=run_name, tags=all_tags)
                self.run_id = run.info.run_id
        except MlflowException as exc:
            from dapo_cli.tracking.server import refusal

            message = refusal(self.tracking_uri, exc, experiment)
            raise UserError(message or f"MLflow store {redact(self.tracking_uri)} failed: {redact(str(exc).splitlines()[0])}") from None
        self.experiment = experiment

    _recorded: dict[str, int] = {}
    """For a resumed run: the last step already recorded per metric key (steps replayed after a
    checkpoint are recomputed identically and not recorded twice)."""

    def _recorded_steps(self, run: Any) -> dict[str, int]:
        return {key: max((m.step for m in self.client.get_metric_history(self.run_id, key)), default=-1) for key in run.data.metrics}

    @store_call
    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(str(k), _param_value(v)) for k, v in params.items()]
        existing = self.client.get_run(self.run_id).data.params
        items = [p for p in items if p.key not in existing]  # params are immutable; a resumed run keeps them
        for i in range(0, len(items), BATCH_PARAMS):
            self.client.log_batch(self.run_id, params=items[i : i + BATCH_PARAMS])

    @store_call
    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(str(k), redact(str(v))) for k, v in tags.items()])

    @store_call
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        at = int(step or 0)
        items = [
            Metric(str(k), float(v), now, at)
            for k, v in metrics.items()
            if v is not None and math.isfinite(float(v)) and at > self._recorded.get(str(k), -1)
        ]
        for i in range(0, len(items), BATCH_METRICS):
            self.client.log_batch(self.run_id, metrics=items[i : i + BATCH_METRICS])

    @store_call
    def log_artifact(self, path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        p = Path(path)
        if p.is_dir():
            self.client.log_artifacts(self.run_id, str(p), artifact_path)
        else:
            self.client.log_artifact(self.run_id, str(p), artifact_path)

    @store_call
    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    @store_call
    def log_dict(self, obj: Any, artifact_file: str) -> None:
        self.client.log_text(self.run_id, json.dumps(obj, indent=2, sort_keys=True, default=str), artifact_file)

    @store_call
    def log_table(self, rows: Sequence[Mapping[str, Any]], artifact_file: str) -> None:
        """Rows as an MLflow table; a table file the run already holds is not appended to again
        (MLflow appends, so a replayed step would double it)."""
        if not rows or (self._recorded and self._has_artifact(artifact_file)):
            return
        columns = list(rows[0].keys())
        data = {c: [_table_value(r.get(c)) for r in rows] for c in columns}
        self.client.log_table(self.run_id, data=data, artifact_file=artifact_file)

    @store_call
    def log_input(self, name: str, *, digest: str, rows: int, source: str, context: str) -> None:
        """Register a dataset the run used (the UI's Dataset column): name, digest, row count, where from."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        dataset = Dataset(name=name, digest=digest[:36], source_type="local" if "://" not in source else "uri",
                          source=json.dumps({"uri": source}), profile=json.dumps({"num_rows": rows}))
        self.client.log_inputs(self.run_id, [DatasetInput(dataset, [InputTag("mlflow.data.context", context)])])

    def _has_artifact(self, artifact_file: str) -> bool:
        folder = artifact_file.rsplit("/", 1)[0] if "/" in artifact_file else None
        return any(a.path == artifact_file for a in self.client.list_artifacts(self.run_id, folder))

    def flush(self, *, unless_down: bool = False) -> None:
        """Every call above has returned once written: nothing to wait for."""

    def abandon(self) -> None:
        self.abandoned.set()

    @store_call
    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)

    @store_call
    def tag_other_run(
        self, run_id: str, tags: Mapping[str, str], *, append: Mapping[str, str] | None = None
    ) -> dict[str, str] | None:
        """Set ``tags`` on run ``run_id`` of this store and add each ``append`` value to its comma-separated
        list tag (no duplicates, newest last, the oldest dropped beyond :data:`MAX_LIST_TAG_CHARS`);
        ``{run_name, experiment_id, experiment, note}`` of that run (``note``: its description), or
        None when the store has no such run.
        Two processes appending at once may lose one entry (read, then write)."""
        from mlflow.entities import RunTag

        run = get_run_or_none(self.client, run_id)
        if run is None:
            return None
        items = {str(k): redact(str(v))[:MAX_LIST_TAG_CHARS] for k, v in tags.items()}
        for key, value in (append or {}).items():
            values = [v for v in run.data.tags.get(key, "").split(",") if v and v != value] + [str(value)]
            while len(values) > 1 and len(",".join(values)) > MAX_LIST_TAG_CHARS:
                values.pop(0)
            items[key] = ",".join(values)
        self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in items.items()])
        exp = self.client.get_experiment(run.info.experiment_id)
        note = items.get("mlflow.note.content", run.data.tags.get("mlflow.note.content", ""))
        return {"run_name": run.info.run_name or "", "experiment_id": run.info.experiment_id, "experiment": exp.name, "note": note}

    @store_call
    def mark_orphans(self, is_alive: Any) -> list[str]:
        """Runs of this experiment left RUNNING by a dead process (``is_alive(run) -> bool`` says no):
        set to KILLED and tagged ``dapo.orphaned``; their ids."""
        exp = self.client.get_experiment_by_name(self.experiment)
        if exp is None:
            return []
        found = []
        for run in self.client.search_runs([exp.experiment_id], "attributes.status = 'RUNNING'", max_results=500):
            if run.info.run_id != self.run_id and not is_alive(run):
                self.client.set_tag(run.info.run_id, "dapo.orphaned", "true")
                self.client.set_terminated(run.info.run_id, status="KILLED")
                found.append(run.info.run_id)
        return found


def _param_value(value: Any) -> str:
    text = redact(json.dumps(value) if isinstance(value, (list, dict)) else str(value))  # e.g. tracking.tracking_uri
    return text if len(text) <= MAX_PARAM_CHARS else text[: MAX_PARAM_CHARS - 3] + "..."


def _table_value(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
