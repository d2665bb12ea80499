"""Which training run an evaluated checkpoint came from, and the MLflow links between the two runs.

A checkpoint that ``dapo train`` wrote carries ``model/dapo_run.json``
(:data:`~dapo_cli.checkpoint.RUN_INFO_FILE`): the training run's MLflow id, experiment, store and
step; checkpoints written before that file existed have the id and step in their trainer state
(read as ``--resume`` reads it, never unpickled: :func:`~dapo_cli.checkpoint.read_trainer_state`).
``builtin:tiny``, a plain ``save_pretrained`` folder or a hub id have neither: their eval runs
are recorded as before, in ``--experiment`` (default ``dapo``).

With a source run, ``dapo eval``

* records into the user's store (``--tracking-uri``, ``$MLFLOW_TRACKING_URI``, else ``./mlflow.db``), never
  into the store the checkpoint names (a checkpoint is a file from elsewhere: it may name another program's
  database or a server), and says so when the two differ; when the user's store holds the training run, the
  eval run goes to its experiment (unless ``--experiment``) and the links below are made;
* tags the eval run ``dapo.source_run_id``, ``dapo.source_experiment``, ``dapo.source_step``,
  ``dapo.source_run_name`` and gives it a description (``mlflow.note.content``, Markdown the run
  page renders) linking to the training run's page;
* appends the eval run's id to the training run's ``dapo.evals`` tag (comma-separated, newest
  last), sets ``dapo.last_eval`` to a one-line result, and lists the evals with links in the
  training run's description, unless that description is someone else's text (only an empty
  one or one that begins with :data:`EVALS_HEADING` is written).

Why tags rather than nesting the eval under the training run (``mlflow.parentRunId``): a run has
one parent, and an ablation child already has its ablation's parent run; nesting there would
also put evals among the children that ``dapo ablate`` resumes and ``dapo report`` aggregates.
Tags are shown on both run pages and as run-list columns, but as plain text; the run page's
description is the one place the UI renders Markdown links, hence the two descriptions.
``tags.dapo.source_run_id = '<id>'`` in the run list's search box lists every eval of a run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dapo_cli.checkpoint import LEGACY_TRAINER_STATE, TRAINER_STATE, read_run_info, read_trainer_state
from dapo_cli.errors import UserError
from dapo_cli.statefiles import StateFileError

EVALS_HEADING = "**Evaluations** (dapo eval of this run's checkpoints, newest first):"
"""First line of the training-run description ``dapo eval`` maintains."""
MAX_LISTED_EVALS = 20


@dataclass(frozen=True)
class SourceRun:
    """The ``dapo train`` run (and step) a checkpoint was saved by."""

    run_id: str
    step: int | None
    experiment: str = ""
    tracking_uri: str = ""
    run_name: str = ""


def read_source(model: str) -> SourceRun | None:
    """The training run of the resolved checkpoint folder ``model`` (``<ckpt>/model`` or a
    ``save_pretrained`` dir), or None when nothing records one (hub id, ``builtin:tiny``'s cache, a
    plain folder, a run tracked with ``tracking.backend: null``)."""
    path = Path(model)
    if not path.is_dir():
        return None
    info = read_run_info(path)
    if not info and path.name == "model" and any((path.parent / f).is_file() for f in (TRAINER_STATE, LEGACY_TRAINER_STATE)):
        info = _trainer_state_info(path.parent)
    run_id = str(info.get("mlflow_run_id") or "")
    if not run_id:
        return None
    step = info.get("step")
    return SourceRun(
        run_id=run_id,
        step=int(step) if isinstance(step, int) else None,
        experiment=str(info.get("experiment") or ""),
        tracking_uri=str(info.get("tracking_uri") or ""),
        run_name=str(info.get("run_name") or ""),
    )


def _trainer_state_info(checkpoint: Path) -> dict[str, Any]:
    """Run id and step from a checkpoint written before ``dapo_run.json`` existed ({} if unreadable or refused)."""
    try:
        state = read_trainer_state(checkpoint)
    except (StateFileError, UserError):  # a damaged or refused state file only costs the link
        return {}
    return {"mlflow_run_id": state.get("mlflow_run_id", ""), "step": state.get("step")}


def resolve_tracking(tracking_uri: str, experiment: str | None, source: SourceRun | None, backend: str) -> tuple[str, str]:
    """(store, experiment) of the eval run: the user's store (``--tracking-uri``, else ``$MLFLOW_TRACKING_URI``,
    else the default ``sqlite:///mlflow.db``), never the one the checkpoint records: a file from elsewhere does
    not choose where records go (:func:`recorded_elsewhere` tells the user where the training run was).

    The experiment: ``--experiment``, else the one holding the training run when the user's store has it
    (renamed experiments included), else the default ``dapo``.
    """
    from dapo_cli.config.schema import TrackingConfig

    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "")
    if experiment:
        return uri, experiment
    found = None
    if source is not None and backend != "null":
        from dapo_cli.tracking.mlflow import run_experiment_name

        found = run_experiment_name(uri, source.run_id)
    return uri, found or TrackingConfig().experiment


def recorded_elsewhere(uri: str, source: SourceRun | None) -> str | None:
    """A line for the user when the checkpoint records its training run in a store other than ``uri`` (the
    eval's): where it says, credentials redacted, and how to record the eval there on purpose; else None."""
    from dapo_cli.redact import redact
    from dapo_cli.tracking.mlflow import absolute_tracking_uri, resolve_tracking_uri

    if source is None or not source.tracking_uri or absolute_tracking_uri(source.tracking_uri) == absolute_tracking_uri(uri):
        return None
    theirs = redact(source.tracking_uri)
    return (f"the checkpoint says its training run {source.run_id} was recorded in {theirs}; this eval is recorded in "
            f"{redact(resolve_tracking_uri(uri))} (give --tracking-uri {theirs} to record it beside the training run)")


def source_tags(source: SourceRun | None) -> dict[str, str]:
    """Tags of the eval run that name its training run (none without one)."""
    if source is None:
        return {}
    tags = {"dapo.source_run_id": source.run_id, "dapo.source_experiment": source.experiment}
    if source.step is not None:
        tags["dapo.source_step"] = str(source.step)
    if source.run_name:
        tags["dapo.source_run_name"] = source.run_name
    return {k: v for k, v in tags.items() if v}


def source_label(source: SourceRun | None) -> str:
    """``<training run name>@<step>`` for the eval run's name (``DAPO s0@60``); ``""`` without both."""
    if source is None or not source.run_name or source.step is None:
        return ""
    return f"{source.run_name}@{source.step}"


def link_runs(tracker: Any, source: SourceRun | None, headline: str, name_of_eval: str) -> bool:
    """Tie the eval run of ``tracker`` (named ``name_of_eval``) and its training run together (see the
    module docstring); ``headline``: the result in a few words (``aime-2024 avg@32 = 0.4375``).
    False when the store holds no such training run (the eval run keeps its ``dapo.source_*`` tags)."""
    if source is None:
        return False
    found = tracker.tag_other_run(
        source.run_id, {"dapo.last_eval": f"{tracker.run_id}: {headline}"}, append={"dapo.evals": tracker.run_id}
    )
    step = f" at step {source.step}" if source.step is not None else ""
    if found is None:
        tracker.set_tags({"mlflow.note.content": f"Evaluation of a checkpoint of run `{source.run_id}`{step} "
                                                 f"(not in this store): {headline}"})
        return False
    name = found["run_name"] or source.run_id
    link = f"[{name}](#/experiments/{found['experiment_id']}/runs/{source.run_id})"
    tracker.set_tags({"mlflow.note.content": f"Evaluation of the checkpoint of training run {link}{step} "
                                             f"(experiment `{found['experiment']}`): {headline}"})
    note = evals_note(found["note"], f"[{name_of_eval}](#/runs/{tracker.run_id}){step}: {headline}")
    if note is not None:
        tracker.tag_other_run(source.run_id, {"mlflow.note.content": note})
    return True


def evals_note(current: str, line: str) -> str | None:
    """The training run's description with ``line`` listed first; None when the description is
    someone else's (neither empty nor begun with :data:`EVALS_HEADING`)."""
    if current.strip() and not current.startswith(EVALS_HEADING):
        return None
    listed = [item for item in current.splitlines()[1:] if item.startswith("- ")]
    return "\n".join([EVALS_HEADING, "", f"- {line}", *listed[: MAX_LISTED_EVALS - 1]]) + "\n"
