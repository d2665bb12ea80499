"""The local launcher with ``ablate.jobs > 1``: up to N children at once, each its own ``dapo train`` process.

:func:`dapo_cli.ablate.runner.run_ablation` decides every child first (skip / resume / fresh,
earlier runs superseded), then hands the ones to train to :func:`train_in_parallel`, which

* resolves (builds, if missing) a ``builtin:*`` policy once here, so no two children build the
  cached warm-start at the same time;
* keeps up to ``ablate.jobs`` children running (:func:`run_jobs`), each as
  ``python -m dapo_cli train ...`` (torchrun when ``ablate.nproc > 1``; :func:`~dapo_cli.ablate.child.child_argv`)
  with ``DAPO_PARENT_RUN_ID``/``DAPO_EXTRA_TAGS`` set, its stdout and stderr appended to
  ``<ablation>/logs/<variant>-s<seed>.log`` (two trainers' lines interleaved would be unreadable);
* logs one line when a child starts (with its log) and one when it ends (with its result and
  the ablation's progress and ETA);
* after a failed child starts no new ones, lets the running ones finish, then raises one
  UserError naming every failed child, its exit code and its log.

Each child runs in a session of its own, so a Ctrl-C in the terminal reaches only this
process, which forwards one SIGINT to every running child (each finishes a checkpoint it is
writing, marks its run KILLED and exits 130), waits for them, and re-raises; a second Ctrl-C
while waiting kills them. Rerunning the command resumes them from their last checkpoints.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from dapo_cli.ablate.child import (
    ChildOutcome,
    child_argv,
    child_env,
    child_log_path,
    child_tags,
    exited_finished,
    read_summary,
)
from dapo_cli.ablate.launchers import AblationClock, Log, Parent, child_done, start_line
from dapo_cli.ablate.variants import AblationPlan, Child
from dapo_cli.errors import UserError
from dapo_cli.progress import format_duration

PopenFn = Callable[..., Any]
"""``subprocess.Popen``-like: ``popen(argv, env=..., stdout=..., stderr=..., start_new_session=...)`` → an
object with ``poll()``, ``wait()`` and ``send_signal(sig)``."""


@dataclass(frozen=True)
class Job:
    """One process to run: its argv, its environment on top of ours, where its output goes, and the caller's item."""

    argv: list[str]
    env: dict[str, str]
    log_path: Path
    item: Any = None


@dataclass
class _Running:
    job: Job
    proc: Any
    out: IO[bytes]
    t0: float


def run_jobs(
    jobs: Sequence[Job],
    *,
    limit: int,
    started: Callable[[Job], None],
    ended: Callable[[Job, int, float], bool],
    popen: PopenFn | None = None,
    poll_s: float = 0.2,
) -> list[tuple[Job, int]]:
    """Run ``jobs`` in order, at most ``limit`` at once; the ``(job, exit code)`` of those that failed.

    ``started(job)`` runs when a job is launched, ``ended(job, code, seconds)`` when it exits and
    says whether it succeeded. Once one failed no further job is launched; the running ones finish.
    Any exception here (KeyboardInterrupt above all) sends SIGINT to the running jobs and waits
    for them before it propagates.
    """
    popen = popen or subprocess.Popen
    queue, running, failed = list(jobs), [], []
    try:
        while queue or running:
            while queue and not failed and len(running) < limit:
                running.append(_start(queue.pop(0), popen))
                started(running[-1].job)
            if failed:
                queue.clear()
            ended_now = [r for r in running if r.proc.poll() is not None]
            for r in ended_now:
                running.remove(r)
                r.out.close()
                code = r.proc.poll()
                if not ended(r.job, code, time.perf_counter() - r.t0):
                    failed.append((r.job, code))
            if running and not ended_now:
                time.sleep(poll_s)
    except BaseException:
        _stop(running)
        raise
    return failed


def _start(job: Job, popen: PopenFn) -> _Running:
    job.log_path.parent.mkdir(parents=True, exist_ok=True)
    out = open(job.log_path, "ab")  # noqa: SIM115 - closed when the job ends (or is stopped); appended to on reruns
    try:
        out.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(job.argv)}\n".encode())
        out.flush()
        proc = popen(job.argv, env={**os.environ, **job.env}, stdout=out, stderr=subprocess.STDOUT,
                     start_new_session=True)  # Ctrl-C reaches the parent only; it forwards one SIGINT
    except BaseException:
        out.close()
        raise
    return _Running(job, proc, out, time.perf_counter())


def _stop(running: Sequence[_Running]) -> None:
    """SIGINT to every running job, then wait for them all; a second Ctrl-C while waiting kills them."""
    for r in running:
        if r.proc.poll() is None:
            r.proc.send_signal(signal.SIGINT)
    try:
        for r in running:
            r.proc.wait()
    except KeyboardInterrupt:
        for r in running:
            if r.proc.poll() is None:
                r.proc.kill()
        for r in running:
            r.proc.wait()
        raise
    finally:
        for r in running:
            r.out.close()


def prebuild_models(cfgs: Sequence[Any], log: Callable[[str], None]) -> None:
    """Resolve each distinct ``builtin:*`` or ``gguf:*`` policy of ``cfgs`` once (building the cached warm-start or import if
    missing), so the children that start next all find it instead of building it at the same time."""
    from dapo_cli.models.loading import NAMED_MODEL_PREFIXES
    from dapo_cli.warmstart import ensure_model

    seen: set[tuple[str, str]] = set()
    for cfg in cfgs:
        key = (cfg.model.path, cfg.model.tiny.fingerprint())
        if cfg.model.path.startswith(NAMED_MODEL_PREFIXES) and key not in seen:
            seen.add(key)
            path = ensure_model(cfg.model.path, cfg.model.tiny)
            log(f"policy {cfg.model.path}: {path} (resolved once here, before the children start)")


def train_in_parallel(
    plan: AblationPlan,
    pending: Sequence[ChildOutcome],
    *,
    config_path: str | None,
    sets: Sequence[str],
    parent_id: str,
    clock: AblationClock,
    log: Callable[[str], None],
    popen: PopenFn | None = None,
    poll_s: float = 0.2,
) -> None:
    """Train the ``pending`` children (decided, none skipped), up to ``ablate.jobs`` at once; fills in
    their summaries. A UserError names every failed child once the running ones have ended."""
    if not pending:
        return
    limit = plan.base.ablate.jobs
    prebuild_models([o.cfg for o in pending], log)
    logs = child_log_path(plan, pending[0].child).parent
    log(f"training {len(pending)} child(ren), up to {limit} at once, each as its own process with its output in {logs}")
    jobs = [
        Job(
            child_argv(plan, o.child, config_path, sets, resume=o.action == "resume", executable=True),
            {**child_env(parent_id, child_tags(plan, o.child, parent_id)), "PYTHONUNBUFFERED": "1"},
            child_log_path(plan, o.child),
            o,
        )
        for o in pending
    ]

    def ended(job: Job, code: int, seconds: float) -> bool:
        o: ChildOutcome = job.item
        if not exited_finished(code, o.child, log):
            log(f"{o.where}: failed with exit code {code} after {format_duration(seconds)}, output in {job.log_path}"
                "; no new children start")
            return False
        child_done(o, read_summary(plan, o.child), seconds, clock, log)
        return True

    failed = run_jobs(jobs, limit=limit, started=lambda job: log(start_line(job.item, clock, f", output in {job.log_path}")),
                      ended=ended, popen=popen, poll_s=poll_s)
    if failed:
        named = "; ".join(f"{job.item.child.run_name} (exit code {code}, log {job.log_path})" for job, code in failed)
        raise UserError(f"{len(failed)} child(ren) failed: {named}; rerun the same command to resume the ablation")


class Pool:
    """The :class:`~dapo_cli.ablate.launchers.Launcher` for ``ablate.jobs > 1``: every child is decided
    first, then :meth:`finish` trains the ones not skipped, up to ``ablate.jobs`` at once."""

    name, reports = "local", True

    def __init__(self, plan: AblationPlan, *, config_path: str | None, sets: Sequence[str], log: Log,
                 popen: PopenFn | None = None, poll_s: float = 0.2) -> None:
        self.plan, self.config_path, self.sets, self.log, self.popen, self.poll_s = plan, config_path, sets, log, popen, poll_s
        self.jobs: int | None = plan.base.ablate.jobs

    def attached(self, child: Child) -> str | None:
        return None  # its processes are this driver's

    def start(self, o: ChildOutcome, parent: Parent) -> None:
        pass  # queued: they all start in finish, once every child is decided

    def finish(self, outcomes: Sequence[ChildOutcome], parent: Parent) -> None:
        assert parent.clock is not None
        train_in_parallel(self.plan, [o for o in outcomes if o.action != "skip"], config_path=self.config_path,
                          sets=self.sets, parent_id=parent.run_id, clock=parent.clock, log=self.log, popen=self.popen,
                          poll_s=self.poll_s)
