"""Run an ablation plan: one MLflow parent run, one nested child run per variant × seed, resumable.

One driver (:func:`drive`) opens the parent, decides every child and hands the ones to train to a
launcher (:class:`~dapo_cli.ablate.launchers.Launcher`: how a child is started and waited for), then
writes the report. :func:`run_ablation`, :func:`slurm_launch` and :func:`print_launch` pick the launcher.

Layout (``output_dir/experiment`` as for ``dapo train``)::

    runs/dapo-tiny/dapo-tiny-ladder-1a2b3c4d/          the ablation (= the parent run's name)
        grpo-s0/ ... dapo-s0/                          child run dirs (trainer.run_name = <ablation>/<variant>-s<seed>)
        report/                                        report.md, report.json, PNG curves (also parent artifacts)

Rerunning the same command finds the same parent (tag ``ablate.id``, a hash of the resolved
config, mode and variants; not the seeds, so a rerun with more seeds adds to the same parent) and
decides per child (:func:`decide`):

* a child whose MLflow run is FINISHED and whose run dir has ``summary.json`` is skipped;
* else, a run dir with a complete checkpoint is resumed (``run_train(resume=True)``, which
  continues the same MLflow run from the checkpoint);
* else the child starts afresh, and its earlier MLflow runs (FAILED, KILLED, or RUNNING ones
  left by a killed process, none of which reached a checkpoint) are tagged
  ``ablate.superseded=true``: kept for the record, ignored by the report and by later reruns.

Launchers (``ablate.launcher``; ``ablate.nproc`` processes per child):

* ``local``: with ``nproc == 1`` each child trains in this process (``run_train``); with
  ``nproc > 1`` each runs as ``python -m torch.distributed.run --standalone --nproc_per_node N
  -m dapo_cli train ...`` (:func:`~dapo_cli.ablate.child.child_argv`), one after the other, its output streamed
  (:mod:`dapo_cli.ablate.launchers`).
  With ``ablate.jobs > 1`` (``--jobs N``) every child is decided first, then up to N run at
  once, each as its own ``dapo train`` (or torchrun) process whose output goes to
  ``<ablation>/logs/<child>.log`` (:mod:`dapo_cli.ablate.pool`);
* ``print``: creates (or finds) the same parent and prints one ``dapo train`` (or ``torchrun``)
  command per child instead of running it;
* ``slurm``: submits one job per child through submitit (:mod:`dapo_cli.ablate.slurm`),
  waits for them all, then writes the report.

A child started as a process attaches to the parent through the environment variable
``DAPO_PARENT_RUN_ID`` and gets its ``ablate.*`` tags through ``DAPO_EXTRA_TAGS`` (a JSON
object); ``dapo train`` reads both (:mod:`dapo_cli.tracking.tags`: :func:`~dapo_cli.tracking.tags.child_env`,
:func:`~dapo_cli.tracking.tags.extra_tags_from_env`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo_cli.ablate.child import ChildOutcome, SpawnFn, TrainFn, ablation_dir
from dapo_cli.ablate.launchers import (
    AblationClock,
    InProcess,
    Launcher,
    Log,
    OneProcessAtATime,
    Parent,
    PrintCommands,
    no_log,
)
from dapo_cli.ablate.variants import AblationPlan, Child, axes_text, config_hash, same_base
from dapo_cli.ablate.pool import Pool
from dapo_cli.ablate.fit_report import section_tables
from dapo_cli.ablate.report import build_report, summary_markdown, summary_metrics, write_report
from dapo_cli.ablate.results import AblationReport
from dapo_cli.ablate.slurm import ArgvFn, Slurm
from dapo_cli.ablate.store import SUPERSEDED_TAG, child_runs, find_older_parent, find_parent, mlflow_client, variant_of
from dapo_cli.config import dump_saved, flatten
from dapo_cli.errors import UserError
from dapo_cli.tracking import start_run


# ---------------------------------------------------------------- per-child decisions


@dataclass(frozen=True)
class PriorRun:
    """An earlier MLflow run of the same child (same parent, variant and seed, not superseded)."""

    run_id: str
    status: str
    has_summary: bool


def decide(prior: Sequence[PriorRun], has_checkpoint: bool) -> tuple[str, list[str]]:
    """``("skip" | "resume" | "fresh", run ids to tag superseded)`` for one child.

    skip: some prior run is FINISHED with its summary; resume: the run dir has a checkpoint
    (the checkpoint names the MLflow run to continue); fresh: everything prior is superseded.
    """
    if any(p.status == "FINISHED" and p.has_summary for p in prior):
        return "skip", []
    if has_checkpoint:
        return "resume", []
    return "fresh", [p.run_id for p in prior]


def prior_runs(runs: Sequence[Any], child: Child) -> list[PriorRun]:
    """The MLflow child runs (of one parent) that belong to ``child``, by their variant (:func:`variant_of`) and
    ``dapo.seed`` tags."""
    out = []
    for run in runs:
        tags = run.data.tags
        if variant_of(tags) == child.variant.name and tags.get("dapo.seed") == str(child.seed):
            run_dir = tags.get("dapo.run_dir")
            out.append(PriorRun(run.info.run_id, run.info.status, bool(run_dir) and (Path(run_dir) / "summary.json").is_file()))
    return out


def has_checkpoint(cfg: Any) -> bool:
    """True when the child's run dir has a complete checkpoint to resume. Checkpoints whose state files are all
    refused (an older dapo's ``.pt`` that torch's safe reader will not read) are a UserError, not a fresh start
    over them."""
    from dapo_cli.checkpoint import CheckpointManager, run_dir_for
    from dapo_cli.statefiles import REFUSED

    run_dir = run_dir_for(cfg.trainer.output_dir, cfg.tracking.experiment, cfg.trainer.run_name)
    latest, skipped = CheckpointManager(run_dir).newest_complete()
    refused = [why for why in skipped if REFUSED in why]
    if latest is None and refused:
        raise UserError(f"child {cfg.trainer.run_name} cannot be resumed: {refused[0]}; or remove {run_dir} to train it afresh")
    return latest is not None


# ---------------------------------------------------------------- the parent run


def parent_tags(plan: AblationPlan, *, command: str, launcher: str) -> dict[str, str]:
    return {
        "ablate.id": plan.ablation_id,
        "ablate.name": plan.name,
        "ablate.mode": plan.mode,
        "ablate.variants": ",".join(v.name for v in plan.variants),
        "ablate.techniques": ",".join(plan.techniques),
        **({"ablate.axes": axes_text(plan)} if plan.axes else {}),
        "ablate.seeds": ",".join(str(s) for s in plan.seeds),
        "ablate.config_hash": config_hash(plan.base),
        "ablate.launcher": launcher,
        "ablate.report_dir": str((ablation_dir(plan) / "report").resolve()),
        "dapo.command": command,
        **({"ablate.sequential": plan.sequential.to_tag()} if plan.sequential is not None else {}),
    }


@dataclass
class AblationOutcome:
    parent_run_id: str
    children: list[ChildOutcome]
    report: AblationReport | None = None
    files: dict[str, Path] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)
    name: str = ""
    """The ablation's name (an older dapo's, when :func:`continued` found its parent)."""


def _require_mlflow(plan: AblationPlan) -> None:
    if plan.base.tracking.backend != "mlflow":
        raise UserError(
            "dapo ablate records a parent run and its children in MLflow (that is how reruns resume and the report is "
            "built); set tracking.backend=mlflow"
        )


@contextlib.contextmanager
def _parent_run(client: Any, plan: AblationPlan, *, command: str, launcher: str) -> Iterator[tuple[Any, list[Any]]]:
    """Open the ablation's parent run (found by ``ablate.id``, else created) → (tracker, its current child runs).

    A new parent gets the base config and the plan as artifacts; a found one is continued
    (status RUNNING again) and shows the latest command and launcher. It ends FINISHED, or
    FAILED/KILLED with the exception that left the block.
    """
    parent = find_parent(client, plan.base.tracking.experiment, plan.ablation_id)
    tags = parent_tags(plan, command=command, launcher=launcher)
    resume_id = parent.info.run_id if parent is not None else None
    with start_run(plan.base.tracking, plan.name, tags=tags, resume_run_id=resume_id) as tracker:
        if parent is None:
            _record_plan(tracker, plan)
        else:
            tracker.set_tags(tags)
        _log_plan(tracker, plan)
        yield tracker, child_runs(client, parent) if parent is not None else []


def child_where(plan: AblationPlan, i: int, child: Child) -> str:
    """``[i/n] variant seed S``: how the driver's lines name the ``i``-th child."""
    return f"[{i}/{len(plan.children)}] {child.variant.name} seed {child.seed}"


def _decide_child(client: Any, plan: AblationPlan, runs: Sequence[Any], i: int, child: Child, *,
                  log: Log = no_log, clock: AblationClock | None = None,
                  attached: Callable[[Child], str | None] | None = None) -> ChildOutcome:
    """Decide what to do for the ``i``-th child (:func:`decide`), tag its superseded runs and log both
    (a skip is counted on ``clock``); the outcome carries the child's config. A child not finished whose job
    from an earlier driver is still queued or running (``attached``, the launcher's) is ``attach``: nothing
    of it is superseded, and it is not started again."""
    cfg = plan.child_config(child)
    action, stale = decide(prior_runs(runs, child), has_checkpoint(cfg))
    where = child_where(plan, i, child)
    live = attached(child) if attached is not None and action != "skip" else None
    if live is not None:
        log(f"{where}: still queued or running as {live}")
        return ChildOutcome(child, "attach", [], where=where, cfg=cfg)
    for run_id in stale:
        client.set_tag(run_id, SUPERSEDED_TAG, "true")
    if stale:
        log(f"{where}: superseding {len(stale)} earlier run(s) that never reached a checkpoint")
    if action == "skip":
        if clock is not None:
            clock.skipped()
        log(f"{where}: finished earlier, skipped" + (f"; {clock.line()}" if clock is not None else ""))
    return ChildOutcome(child, action, stale, where=where, cfg=cfg)


def _write_report(client: Any, tracker: Any, plan: AblationPlan, *, html: bool) -> tuple[AblationReport, dict[str, Path]]:
    """Rebuild the report from MLflow, write it under the ablation dir and log it to the parent, whose
    overview page then is the answer: per-variant results as metrics, the table as its description."""
    report = build_report(client, client.get_run(tracker.run_id))
    report_dir = ablation_dir(plan) / "report"
    files = write_report(report, report_dir, html_too=html)
    tracker.log_artifact(report_dir, "report")
    tracker.log_metrics(summary_metrics(report), step=0)
    tracker.set_tags({"mlflow.note.content": summary_markdown(report)})
    for name, table in section_tables(report).items():  # rewritten each time: a table file never appends
        tracker.log_dict(table, name)
    return report, files


def continued(plan: AblationPlan, log: Log = no_log) -> AblationPlan:
    """``plan``, or, when no parent run has its id, the same ablation as the older dapo that started it named it.

    An older dapo hashed the config as its schema had it, so its parent has another ``ablate.id``: a parent of
    the same mode and variants whose recorded base config is this one once read as this schema reads it
    (:func:`~dapo_cli.ablate.variants.same_base`) is that ablation. Its id and name are taken, so its parent,
    its children and their run dirs are found: finished children are reused, checkpointed ones resumed.
    """
    _require_mlflow(plan)
    try:
        client = mlflow_client(plan.base.tracking.tracking_uri)
    except UserError:  # no store yet: nothing to continue (and nothing created here)
        return plan
    experiment = plan.base.tracking.experiment
    if find_parent(client, experiment, plan.ablation_id) is not None:
        return plan
    names = ",".join(v.name for v in plan.variants)
    older = find_older_parent(client, experiment, plan.mode, names, lambda saved: same_base(saved, plan.base))
    if older is None:
        return plan
    tags = older.data.tags
    log(f"continuing ablation {tags.get('ablate.name', '?')}, started by an older dapo with this config (ablation id {tags['ablate.id']})")
    return dataclasses.replace(plan, ablation_id=tags["ablate.id"], name=tags.get("ablate.name") or plan.name)


# ---------------------------------------------------------------- the driver


def drive(plan: AblationPlan, launcher: Launcher, *, command: str, html: bool = False, log: Log = no_log) -> AblationOutcome:
    """Open the parent, decide every child in plan order (:func:`decide`; superseded runs tagged), start
    the ones not skipped through ``launcher``, let it finish (wait for them), then, when the launcher
    reports, rebuild the report from MLflow, write it and log it to the parent."""
    _require_mlflow(plan)
    client = mlflow_client(plan.base.tracking.tracking_uri, create=True)
    with _parent_run(client, plan, command=command, launcher=launcher.name) as (tracker, runs):
        clock = AblationClock(len(plan.children), jobs=launcher.jobs) if launcher.jobs is not None else None
        parent = Parent(tracker.run_id, clock)
        outcomes: list[ChildOutcome] = []
        for i, child in enumerate(plan.children, start=1):
            o = _decide_child(client, plan, runs, i, child, log=log, clock=clock, attached=launcher.attached)
            outcomes.append(o)
            if o.action != "skip":
                launcher.start(o, parent)
        launcher.finish(outcomes, parent)
        if not launcher.reports:
            return AblationOutcome(parent.run_id, outcomes, name=plan.name)
        report, files = _write_report(client, tracker, plan, html=html)
    return AblationOutcome(parent.run_id, outcomes, report, files, name=plan.name)


def run_ablation(
    plan: AblationPlan,
    *,
    command: str,
    config_path: str | None,
    sets: Sequence[str] = (),
    train: TrainFn | None = None,
    spawn: SpawnFn | None = None,
    popen: Callable[..., Any] | None = None,
    poll_s: float = 0.2,
    quiet: bool = False,
    html: bool = False,
    log: Log = no_log,
) -> AblationOutcome:
    """Train every missing child (``ablate.launcher: local``), then write the report (also logged to the parent).

    ``ablate.jobs == 1``: one after the other, with ``ablate.nproc == 1`` as ``train(...)`` calls
    here (:class:`~dapo_cli.ablate.launchers.InProcess`), else as torchrun processes run by ``spawn``
    (:class:`~dapo_cli.ablate.launchers.OneProcessAtATime`) whose failure stops the ablation with a
    UserError naming the child and its exit code. ``ablate.jobs > 1``: every child decided first, then
    up to that many at once as processes started by ``popen`` (:class:`~dapo_cli.ablate.pool.Pool`).
    """
    plan = continued(plan, log)
    where = {"config_path": config_path, "sets": sets, "log": log}
    launcher: Launcher
    if plan.base.ablate.jobs > 1:
        launcher = Pool(plan, popen=popen, poll_s=poll_s, **where)
    elif plan.base.ablate.nproc == 1:
        launcher = InProcess(plan, train=train, quiet=quiet, **where)
    else:
        launcher = OneProcessAtATime(plan, spawn=spawn, quiet=quiet, **where)
    return drive(plan, launcher, command=command, html=html, log=log)


def slurm_launch(
    plan: AblationPlan,
    *,
    command: str,
    config_path: str | None,
    sets: Sequence[str] = (),
    html: bool = False,
    log: Log = no_log,
    argv_for: ArgvFn | None = None,
    poll_s: float | None = None,
    detach: bool = False,
) -> AblationOutcome:
    """Submit one submitit job per missing child (re-attaching to those still queued or running), wait for them
    all, then write the report as :func:`run_ablation` does (:class:`~dapo_cli.ablate.slurm.Slurm`); ``detach``:
    return once submitted."""
    plan = continued(plan, log)
    launcher = Slurm(plan, config_path=config_path, sets=sets, log=log, argv_for=argv_for, poll_s=poll_s, detach=detach)
    return drive(plan, launcher, command=command, html=html, log=log)


def ablation_status(plan: AblationPlan, job_state: Callable[[Child], str | None]) -> tuple[list[str], int]:
    """Where every child of ``plan`` is, read only (nothing is created, tagged or submitted): one line per child
    and how many have finished. Finished: an MLflow run FINISHED with its summary; else what ``job_state`` says of
    its job (the slurm launcher's record and ``sacct``), or that it has not been started."""
    _require_mlflow(plan)
    client = mlflow_client(plan.base.tracking.tracking_uri)
    parent = find_parent(client, plan.base.tracking.experiment, plan.ablation_id)
    if parent is None:
        raise UserError(f"ablation {plan.name} has not been started in this tracking store; run the same command "
                        "without --status to start it")
    runs = child_runs(client, parent)
    lines, done = [], 0
    for i, child in enumerate(plan.children, start=1):
        prior = prior_runs(runs, child)
        where = child_where(plan, i, child)
        if decide(prior, False)[0] == "skip":
            done += 1
            lines.append(f"{where}: finished")
            continue
        job = job_state(child)
        lines.append(f"{where}: {job or 'not started (no job recorded)'}")
    return lines, done


def print_launch(
    plan: AblationPlan, *, command: str, config_path: str | None, sets: Sequence[str] = ()
) -> AblationOutcome:
    """Create (or find) the parent and return one shell line per child still to run (``#`` comment when done)."""
    plan = continued(plan)
    launcher = PrintCommands(plan, config_path=config_path, sets=sets)
    outcome = drive(plan, launcher, command=command)
    outcome.commands = launcher.commands
    return outcome


def _record_plan(tracker: Any, plan: AblationPlan) -> None:
    """The ablation spec and base config as parent params, and the config as an artifact (once, when the
    parent is created; the seeds are in the ``ablate.seeds`` tag and plan.json, which every run rewrites)."""
    tracker.log_params({
        "ablate.mode": plan.mode,
        "ablate.variants": ",".join(v.name for v in plan.variants),
        "ablate.techniques": ",".join(plan.techniques),
        **flatten(plan.base),
    })
    tracker.log_text(dump_saved(plan.base), "ablation_config.yaml")


def _log_plan(tracker: Any, plan: AblationPlan) -> None:
    """``plan.json``: every child of this run's plan (rewritten by each run: more seeds, more children)."""
    tracker.log_dict(
        {
            "mode": plan.mode,
            "seeds": list(plan.seeds),
            "children": [
                {"variant": c.variant.name, "label": c.variant.label, "seed": c.seed, "rung": c.index,
                 "toggles": c.variant.toggle_dict(), "state": dict(c.variant.state), "axes": dict(c.variant.axes),
                 "run_name": c.run_name}
                for c in plan.children
            ],
        },
        "plan.json",
    )
