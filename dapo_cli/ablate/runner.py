"""Run an ablation plan: one MLflow parent run, one nested child run per variant × seed, resumable.

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
  -m dapo_cli train ...`` (:func:`child_argv`), one after the other, its output streamed.
  With ``ablate.jobs > 1`` (``--jobs N``) every child is decided first, then up to N run at
  once, each as its own ``dapo train`` (or torchrun) process whose output goes to
  ``<ablation>/logs/<child>.log`` (:mod:`dapo_cli.ablate.pool`);
* ``print``: creates (or finds) the same parent and prints one ``dapo train`` (or ``torchrun``)
  command per child instead of running it;
* ``slurm``: submits one job per child through submitit (:mod:`dapo_cli.ablate.slurm`),
  waits for them all, then writes the report.

A child started as a process attaches to the parent through the environment variable
``DAPO_PARENT_RUN_ID`` and gets its ``ablate.*`` tags through ``DAPO_EXTRA_TAGS`` (a JSON
object); ``dapo train`` reads both (:func:`child_env`, :func:`extra_tags_from_env`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dapo_cli.ablate.plan import AblationPlan, Child, child_label, config_hash
from dapo_cli.ablate.report import (
    SUPERSEDED_TAG,
    AblationReport,
    build_report,
    child_runs,
    summary_markdown,
    summary_metrics,
    find_parent,
    mlflow_client,
    write_report,
)
from dapo_cli.config import dump_yaml, flatten
from dapo_cli.errors import COLLAPSED, UserError
from dapo_cli.progress import format_duration
from dapo_cli.tracking import EXTRA_TAGS_ENV, PARENT_RUN_ENV, start_run

TrainFn = Callable[..., dict[str, Any]]
"""``run_train(cfg, *, resume, command, parent_run_id, extra_tags, quiet) -> summary``."""

SpawnFn = Callable[..., int]
"""``run_child(argv, extra_env, *, log_path) -> exit code``: run one child process to its end."""


def _run_train() -> TrainFn:
    from dapo_cli.train import run_train

    return run_train


def _noop(_: str) -> None:
    pass


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
    """The MLflow child runs (of one parent) that belong to ``child``, by their ``dapo.variant``/``dapo.seed`` tags."""
    out = []
    for run in runs:
        tags = run.data.tags
        if tags.get("dapo.variant") == child.variant.name and tags.get("dapo.seed") == str(child.seed):
            run_dir = tags.get("dapo.run_dir")
            out.append(PriorRun(run.info.run_id, run.info.status, bool(run_dir) and (Path(run_dir) / "summary.json").is_file()))
    return out


def has_checkpoint(cfg: Any) -> bool:
    from dapo_cli.checkpoint import CheckpointManager, run_dir_for

    return CheckpointManager(run_dir_for(cfg.trainer.output_dir, cfg.tracking.experiment, cfg.trainer.run_name)).latest() is not None


# ---------------------------------------------------------------- tags and commands


def ablation_dir(plan: AblationPlan) -> Path:
    """``output_dir/experiment/<ablation name>``: the child run dirs and the report."""
    return Path(plan.base.trainer.output_dir) / plan.base.tracking.experiment / plan.name


def parent_tags(plan: AblationPlan, *, command: str, launcher: str) -> dict[str, str]:
    return {
        "ablate.id": plan.ablation_id,
        "ablate.name": plan.name,
        "ablate.mode": plan.mode,
        "ablate.variants": ",".join(v.name for v in plan.variants),
        "ablate.techniques": ",".join(plan.techniques),
        "ablate.seeds": ",".join(str(s) for s in plan.seeds),
        "ablate.config_hash": config_hash(plan.base),
        "ablate.launcher": launcher,
        "ablate.report_dir": str((ablation_dir(plan) / "report").resolve()),
        "dapo.command": command,
    }


def child_tags(plan: AblationPlan, child: Child, parent_id: str) -> dict[str, str]:
    """Tags of a child run besides ``technique.*``/``dapo.*`` (set by run_train); rung = position in the plan.

    Only the parent carries ``ablate.id`` (that is how reruns find it).
    """
    return {
        "ablate.variant": child.variant.name,
        **({"ablate.label": child.variant.label} if child.variant.label else {}),
        "ablate.rung": str(child.index),
        "ablate.seed": str(child.seed),
        "ablate.parent": parent_id,
    }


def train_words(plan: AblationPlan, child: Child, config_path: str | None, sets: Sequence[str]) -> list[str]:
    """``dapo train [CONFIG] --set ... --set trainer.seed=S --set trainer.run_name=R --[no-]toggle ...``.

    Resolved by ``dapo train``, these give exactly :meth:`AblationPlan.child_config`.
    """
    words = ["dapo", "train", *([config_path] if config_path else [])]
    label = f"tracking.run_label={child_label(child.variant, child.seed)}"
    for item in [*sets, f"trainer.seed={child.seed}", f"trainer.run_name={child.run_name}", label]:
        words += ["--set", item]
    for name, on in child.variant.toggles:
        flag = name.replace("_", "-")
        words.append(f"--{flag}" if on else f"--no-{flag}")
    return words


def child_argv(
    plan: AblationPlan,
    child: Child,
    config_path: str | None,
    sets: Sequence[str] = (),
    *,
    resume: bool = False,
    nproc: int | None = None,
    executable: bool = False,
) -> list[str]:
    """The command of one child: :func:`train_words` (+ ``--resume``), under torchrun when ``nproc > 1``.

    ``nproc`` defaults to ``ablate.nproc``. The printed spelling (``executable=False``) is
    ``dapo train ...`` or ``torchrun --standalone --nproc_per_node N -m dapo_cli train ...``;
    the spelling this process executes runs this interpreter (``sys.executable -m dapo_cli`` /
    ``sys.executable -m torch.distributed.run ...``), so the venv's dapo and torch are used.
    """
    n = plan.base.ablate.nproc if nproc is None else nproc
    tail = train_words(plan, child, config_path, sets)[1:] + (["--resume"] if resume else [])
    if n == 1:
        return (["dapo"] if not executable else [sys.executable, "-m", "dapo_cli"]) + tail
    torchrun = ["torchrun"] if not executable else [sys.executable, "-m", "torch.distributed.run"]
    return [*torchrun, "--standalone", "--nproc_per_node", str(n), "-m", "dapo_cli", *tail]


def child_env(parent_id: str, tags: Mapping[str, str]) -> dict[str, str]:
    """What a child process needs on top of the caller's environment: its parent run and its extra tags."""
    return {PARENT_RUN_ENV: parent_id, EXTRA_TAGS_ENV: json.dumps(dict(tags), sort_keys=True)}


def extra_tags_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """The tags in ``$DAPO_EXTRA_TAGS`` (None when unset or empty); anything but a JSON object is a UserError."""
    text = (os.environ if environ is None else environ).get(EXTRA_TAGS_ENV, "").strip()
    if not text:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"${EXTRA_TAGS_ENV} is not valid JSON ({exc.msg}); give an object such as '{{\"team\": \"rl\"}}' or unset it") from None
    if not isinstance(data, dict):
        raise UserError(f"${EXTRA_TAGS_ENV} must be a JSON object of tag names to values, got {type(data).__name__}")
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in data.items()}


def run_child(argv: Sequence[str], extra_env: Mapping[str, str], *, log_path: Path | None = None,
              cwd: str | None = None) -> int:
    """Run one child process to its end (environment = ours + ``extra_env``) and return its exit code.

    Its output streams to ours, or goes to ``log_path`` (``dapo ablate --quiet``). A top-level
    function, so a submitit job can pickle it.
    """
    env = {**os.environ, **extra_env}
    if log_path is None:
        return subprocess.run(list(argv), env=env, cwd=cwd, check=False).returncode
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        return subprocess.run(list(argv), env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, check=False).returncode


# ---------------------------------------------------------------- running


class AblationClock:
    """Overall progress across an ablation's children: how many are done, elapsed time, and an ETA
    from the mean wall time of the children trained so far (skipped ones count as done at once);
    with ``jobs`` children at once: remaining × mean child time / min(jobs, remaining)."""

    def __init__(self, total: int, jobs: int = 1) -> None:
        self.total, self.done, self.trained, self.trained_s = total, 0, 0, 0.0
        self.jobs = max(1, jobs)
        self.t0 = time.perf_counter()

    def skipped(self) -> None:
        self.done += 1

    def finished(self, seconds: float) -> None:
        self.done += 1
        self.trained += 1
        self.trained_s += seconds

    def eta_s(self) -> float | None:
        if self.done >= self.total:
            return 0.0
        left = self.total - self.done
        return self.trained_s / self.trained * left / min(self.jobs, left) if self.trained else None

    def line(self) -> str:
        """``ablation: 2/6 children done, 4:10 elapsed, ETA 8:20``."""
        elapsed = time.perf_counter() - self.t0
        return f"ablation: {self.done}/{self.total} children done, {format_duration(elapsed)} elapsed, ETA {format_duration(self.eta_s())}"


@dataclass
class ChildOutcome:
    child: Child
    action: str
    """skip / resume / fresh (trained here) or, with the print launcher, the printed command."""
    superseded: list[str]
    summary: dict[str, Any] | None = None
    where: str = ""
    """``[i/n] variant seed S``, how log lines name the child."""
    cfg: Any = dataclasses.field(default=None, repr=False)
    """The child's resolved config (:meth:`AblationPlan.child_config`)."""


@dataclass
class AblationOutcome:
    parent_run_id: str
    children: list[ChildOutcome]
    report: AblationReport | None = None
    files: dict[str, Path] = dataclasses.field(default_factory=dict)
    commands: list[str] = dataclasses.field(default_factory=list)


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


def _decide_child(client: Any, plan: AblationPlan, runs: Sequence[Any], i: int, child: Child, *,
                  log: Callable[[str], None] = _noop, clock: AblationClock | None = None) -> ChildOutcome:
    """Decide what to do for the ``i``-th child (:func:`decide`), tag its superseded runs and log both
    (a skip is counted on ``clock``); the outcome carries the child's config."""
    cfg = plan.child_config(child)
    action, stale = decide(prior_runs(runs, child), has_checkpoint(cfg))
    for run_id in stale:
        client.set_tag(run_id, SUPERSEDED_TAG, "true")
    where = f"[{i}/{len(plan.children())}] {child.variant.name} seed {child.seed}"
    if stale:
        log(f"{where}: superseding {len(stale)} earlier run(s) that never reached a checkpoint")
    if action == "skip":
        if clock is not None:
            clock.skipped()
        log(f"{where}: finished earlier, skipped" + (f"; {clock.line()}" if clock is not None else ""))
    return ChildOutcome(child, action, stale, where=where, cfg=cfg)


def start_line(o: ChildOutcome, clock: AblationClock, how: str = "") -> str:
    """``[2/6] grpo seed 0: training (abl/grpo-s0)<how>; ablation: ...``: a child starts."""
    what = "resuming from its checkpoint" if o.action == "resume" else "training"
    return f"{o.where}: {what} ({o.child.run_name}){how}; {clock.line()}"


def child_done(o: ChildOutcome, summary: dict[str, Any] | None, seconds: float, clock: AblationClock,
               log: Callable[[str], None]) -> None:
    """Record a child that trained to its end: its summary on the outcome, the clock, one line."""
    o.summary = summary
    clock.finished(seconds)
    log(f"{o.where}: done in {format_duration(seconds)}{child_result(summary)}; {clock.line()}")


def _write_report(client: Any, tracker: Any, plan: AblationPlan, *, html: bool) -> tuple[AblationReport, dict[str, Path]]:
    """Rebuild the report from MLflow, write it under the ablation dir and log it to the parent, whose
    overview page then is the answer: per-variant results as metrics, the table as its description."""
    report = build_report(client, client.get_run(tracker.run_id))
    report_dir = ablation_dir(plan) / "report"
    files = write_report(report, report_dir, html_too=html)
    tracker.log_artifact(report_dir, "report")
    tracker.log_metrics(summary_metrics(report), step=0)
    tracker.set_tags({"mlflow.note.content": summary_markdown(report)})
    return report, files


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
    log: Callable[[str], None] = _noop,
) -> AblationOutcome:
    """Train every missing child, then write the report (also logged to the parent).

    ``ablate.jobs == 1``: one after the other, with ``ablate.nproc == 1`` as ``train(...)`` calls
    here, else as torchrun processes (:func:`child_argv`, run by ``spawn``, default :func:`run_child`)
    whose failure stops the ablation with a UserError naming the child and its exit code.
    ``ablate.jobs > 1``: every child decided first, then up to that many at once as processes
    started by ``popen`` (:func:`dapo_cli.ablate.pool.train_in_parallel`).
    """
    _require_mlflow(plan)
    nproc, jobs = plan.base.ablate.nproc, plan.base.ablate.jobs
    if nproc == 1 and jobs == 1:
        train = train or _run_train()
    spawn = spawn or run_child
    client = mlflow_client(plan.base.tracking.tracking_uri, create=True)
    with _parent_run(client, plan, command=command, launcher="local") as (tracker, runs):
        parent_id = tracker.run_id
        clock = AblationClock(len(plan.children()), jobs=jobs)
        outcomes: list[ChildOutcome] = []
        for i, child in enumerate(plan.children(), start=1):
            o = _decide_child(client, plan, runs, i, child, log=log, clock=clock)
            outcomes.append(o)
            if o.action == "skip" or jobs > 1:
                continue
            log(start_line(o, clock))
            t0, resume = time.perf_counter(), o.action == "resume"
            if nproc == 1:
                assert train is not None
                summary = train(o.cfg, resume=resume, command=shlex.join(train_words(plan, child, config_path, sets)),
                                parent_run_id=parent_id, extra_tags=child_tags(plan, child, parent_id), quiet=quiet)
            else:
                summary = _spawn_child(spawn, plan, child, config_path, sets, parent_id, resume=resume, quiet=quiet, log=log)
            child_done(o, summary, time.perf_counter() - t0, clock, log)
        if jobs > 1:
            from dapo_cli.ablate.pool import train_in_parallel

            train_in_parallel(plan, [o for o in outcomes if o.action != "skip"], config_path=config_path,
                              sets=sets, parent_id=parent_id, clock=clock, log=log, popen=popen, poll_s=poll_s)
        report, files = _write_report(client, tracker, plan, html=html)
    return AblationOutcome(parent_id, outcomes, report, files)


def child_result(summary: dict[str, Any] | None) -> str:
    """``, held-out 0.312 → 0.455, run dir runs/...`` from a child's summary (empty without one)."""
    if not summary:
        return ""
    base, final = summary.get("base_val"), summary.get("final_val")
    acc = f", held-out {base:.3f} → {final:.3f}" if base is not None and final is not None else ""
    return f"{acc}, run dir {summary.get('run_dir', '?')}"


def _spawn_child(
    spawn: SpawnFn, plan: AblationPlan, child: Child, config_path: str | None, sets: Sequence[str], parent_id: str, *,
    resume: bool, quiet: bool, log: Callable[[str], None],
) -> dict[str, Any] | None:
    """Run one child as a torchrun process; its ``summary.json`` when it wrote one, a UserError when it failed."""
    argv = child_argv(plan, child, config_path, sets, resume=resume, executable=True)
    log_path = child_log_path(plan, child) if quiet else None
    log(f"  {shlex.join(child_argv(plan, child, config_path, sets, resume=resume))}" + (f"  (output: {log_path})" if log_path else ""))
    code = spawn(argv, child_env(parent_id, child_tags(plan, child, parent_id)), log_path=log_path)
    if not exited_finished(code, child, log):
        where = f" (output: {log_path})" if log_path else ""
        raise UserError(f"child {child.run_name} failed with exit code {code}{where}; rerun the same command to resume it")
    return read_summary(plan, child)


def child_log_path(plan: AblationPlan, child: Child) -> Path:
    """``<ablation>/logs/<variant>-s<seed>.log``: where a child process's output goes when not streamed."""
    return ablation_dir(plan) / "logs" / f"{child.run_name.rsplit('/', 1)[-1]}.log"


def exited_finished(code: int, child: Child, log: Callable[[str], None]) -> bool:
    """A child's exit code means its run finished: 0, or :data:`COLLAPSED` (the collapse guard; logged)."""
    if code == COLLAPSED:
        log(f"  {child.run_name}: stopped by the collapse guard (exit {COLLAPSED}); see its dapo.stopped tag")
    return code in (0, COLLAPSED)


def read_summary(plan: AblationPlan, child: Child) -> dict[str, Any] | None:
    """The ``summary.json`` a child process wrote in its run dir (None without one)."""
    from dapo_cli.checkpoint import run_dir_for

    summary = run_dir_for(plan.base.trainer.output_dir, plan.base.tracking.experiment, child.run_name) / "summary.json"
    return json.loads(summary.read_text()) if summary.is_file() else None


ArgvFn = Callable[[Child, bool], list[str]]
"""``(child, resume) -> argv`` of a child's job (default: :func:`child_argv`, the executed spelling)."""


def slurm_launch(
    plan: AblationPlan,
    *,
    command: str,
    config_path: str | None,
    sets: Sequence[str] = (),
    html: bool = False,
    log: Callable[[str], None] = _noop,
    argv_for: ArgvFn | None = None,
    poll_s: float | None = None,
) -> AblationOutcome:
    """Submit one submitit job per missing child, wait for them all, then write the report as :func:`run_ablation` does.

    Failed jobs stop the ablation (after every job has ended) with a UserError naming them;
    rerunning the command resumes or restarts just those. ``poll_s``: seconds between state
    checks (default 30 on Slurm, 0.5 with ``cluster: local``).
    """
    from dapo_cli.ablate import slurm as jobs

    _require_mlflow(plan)
    submitit = jobs.require_submitit()
    jobs.check_resources(plan.base.ablate)
    settings = plan.base.ablate.slurm
    poll = poll_s if poll_s is not None else (30.0 if settings.cluster == "slurm" else 0.5)
    argv_for = argv_for or (lambda c, resume: child_argv(plan, c, config_path, sets, resume=resume, executable=True))
    client = mlflow_client(plan.base.tracking.tracking_uri, create=True)
    outcomes: list[ChildOutcome] = []
    submitted: list[tuple[str, Any]] = []
    with _parent_run(client, plan, command=command, launcher="slurm") as (tracker, runs):
        parent_id = tracker.run_id
        executor = jobs.make_executor(submitit, settings)
        for i, child in enumerate(plan.children(), start=1):
            o = _decide_child(client, plan, runs, i, child, log=log)
            outcomes.append(o)
            if o.action == "skip":
                continue
            job = jobs.submit(executor, settings, child.run_name, argv_for(child, o.action == "resume"),
                              child_env(parent_id, child_tags(plan, child, parent_id)))
            log(f"{o.where}: submitted job {job.job_id}{' (resuming)' if o.action == 'resume' else ''}")
            submitted.append((child.run_name, job))
        if submitted:
            log(f"waiting for {len(submitted)} job(s); logs in {settings.folder}")
        failed = jobs.wait(submitit, submitted, poll_s=poll, log=log)
        if failed:
            raise UserError(f"{len(failed)} of {len(submitted)} job(s) failed: {'; '.join(failed)}; "
                            f"logs in {settings.folder}; rerun the same command to resume them")
        report, files = _write_report(client, tracker, plan, html=html)
    return AblationOutcome(parent_id, outcomes, report, files)


def print_launch(
    plan: AblationPlan, *, command: str, config_path: str | None, sets: Sequence[str] = ()
) -> AblationOutcome:
    """Create (or find) the parent and return one shell line per child still to run (``#`` comment when done)."""
    _require_mlflow(plan)
    client = mlflow_client(plan.base.tracking.tracking_uri, create=True)
    lines: list[str] = []
    outcomes: list[ChildOutcome] = []
    with _parent_run(client, plan, command=command, launcher="print") as (tracker, runs):
        parent_id = tracker.run_id
        for i, child in enumerate(plan.children(), start=1):
            o = _decide_child(client, plan, runs, i, child)
            words = child_argv(plan, child, config_path, sets, resume=o.action == "resume")
            line = f"{PARENT_RUN_ENV}={parent_id} {shlex.join(words)}"
            lines.append(f"# done: {child.run_name}" if o.action == "skip" else line)
            outcomes.append(dataclasses.replace(o, action=lines[-1]))
    return AblationOutcome(parent_id, outcomes, commands=lines)


def _record_plan(tracker: Any, plan: AblationPlan) -> None:
    """The ablation spec and base config as parent params, and the config as an artifact (once, when the
    parent is created; the seeds are in the ``ablate.seeds`` tag and plan.json, which every run rewrites)."""
    tracker.log_params({
        "ablate.mode": plan.mode,
        "ablate.variants": ",".join(v.name for v in plan.variants),
        "ablate.techniques": ",".join(plan.techniques),
        **flatten(plan.base),
    })
    tracker.log_text(dump_yaml(plan.base), "ablation_config.yaml")


def _log_plan(tracker: Any, plan: AblationPlan) -> None:
    """``plan.json``: every child of this run's plan (rewritten by each run: more seeds, more children)."""
    tracker.log_dict(
        {
            "mode": plan.mode,
            "seeds": list(plan.seeds),
            "children": [
                {"variant": c.variant.name, "label": c.variant.label, "seed": c.seed, "rung": c.index,
                 "toggles": c.variant.toggle_dict(), "state": dict(c.variant.state), "run_name": c.run_name}
                for c in plan.children()
            ],
        },
        "plan.json",
    )
