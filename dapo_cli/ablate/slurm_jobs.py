"""What an ablation's Slurm jobs are, kept where a rerun finds them, and what each job runs.

A driver on a login node can die (a dropped SSH session, ``kill -9``, ``--detach`` on purpose) while its
jobs train on. So every submission is written down at once in ``<ablation>/slurm-jobs.json`` (child run
name → Slurm job id and submitit folder; :class:`JobRecord`), and a later ``dapo ablate`` of the same
ablation asks Slurm (``sacct``, through submitit) where each recorded job is: one still queued or running
is waited for again (re-attached), never submitted twice (:func:`live_state`).

A job runs :class:`ChildJob`: the child's ``dapo train`` as a subprocess. It is checkpointable in
submitit's sense: on Slurm's warning signal (``--signal=USR2@<signal_delay_s>``, sent ahead of the time
limit) submitit calls :meth:`ChildJob.checkpoint`, which waits while the child (signalled too) ends its
step and saves a checkpoint (exit :data:`~dapo_cli.errors.PREEMPTED`); the job is then requeued, up to
``ablate.slurm.max_requeues`` times, and each new start reads the child's run dir: nothing to run when it
finished, its ``--resume`` command when it has a checkpoint, else its first command.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dapo_cli.errors import COLLAPSED, PREEMPTED, UserError
from dapo_cli.fileio import load_json, write_json_atomic

RECORD_NAME = "slurm-jobs.json"

ACTIVE_STATES = frozenset({
    "PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING", "SUSPENDED",
    "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "PREEMPTED", "RESV_DEL_HOLD",
})
"""Slurm job states (``sacct``'s State, first word) of a job that has not ended: still queued, running, or
about to run again. Everything else (COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, ...)
has ended."""


class ChildFailed(RuntimeError):
    """A child's command exited non-zero inside its job (re-raised by submitit in ``job.result()``)."""


# ---------------------------------------------------------------- the record


@dataclass(frozen=True)
class RecordedJob:
    job_id: str
    folder: str


class JobRecord:
    """``<ablation>/slurm-jobs.json``: the Slurm job each child was last submitted as. Rewritten whole (temp
    file, then rename) after every submission, so a driver killed between two submissions loses none."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.jobs: dict[str, RecordedJob] = {}
        if path.is_file():
            data = load_json(path.read_text(encoding="utf-8"))
            jobs = data.get("jobs") if isinstance(data, dict) else None
            if not isinstance(jobs, dict) or not all(
                    isinstance(v, dict) and isinstance(v.get("job_id"), str) and isinstance(v.get("folder"), str)
                    for v in jobs.values()):
                raise UserError(f"{path} is not a dapo job record (jobs: {{child: {{job_id, folder}}}}); "
                                "remove it to submit every unfinished child again")
            self.jobs = {name: RecordedJob(v["job_id"], v["folder"]) for name, v in jobs.items()}

    def add(self, name: str, job_id: str, folder: str) -> None:
        self.jobs[name] = RecordedJob(str(job_id), str(Path(folder).resolve()))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.path, {"jobs": {k: {"job_id": v.job_id, "folder": v.folder} for k, v in sorted(self.jobs.items())}})


def slurm_state(job: Any) -> str:
    """The job's state as Slurm reports it now (``sacct``, forced past submitit's cache); first word only
    (``CANCELLED by 0`` → ``CANCELLED``); ``UNKNOWN`` when Slurm has no record of it."""
    state = job.watcher.get_state(job.job_id, mode="force")
    return (state.split() or ["UNKNOWN"])[0].upper()


def queue_state(job_id: str) -> str | None:
    """The job's state as Slurm's controller holds it now (``squeue``, first word), or None when the controller
    no longer lists it or cannot be asked. The controller is current where the accounting record (``sacct``,
    what submitit reads) lags: between a requeue's two attempts sacct can show the attempt that ended (seen as
    FAILED under load) while the controller already holds the job again, pending."""
    try:
        out = subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    words = out.stdout.split()
    return words[0].upper() if out.returncode == 0 and words else None


def live_state(submitit: Any, recorded: RecordedJob) -> tuple[Any, str]:
    """``(submitit job, state)`` for a recorded job: the job handle to wait on, and whether it is still
    active (:data:`ACTIVE_STATES`). sacct's state, unless it reads as ended and the controller
    (:func:`queue_state`) still lists the job: then the controller's (a requeued job between its attempts is
    re-attached to, not submitted again)."""
    job = submitit.SlurmJob(folder=recorded.folder, job_id=recorded.job_id)
    state = slurm_state(job)
    return job, state if state in ACTIVE_STATES else (queue_state(recorded.job_id) or state)


# ---------------------------------------------------------------- what a job runs


def stop_and_reap(proc: subprocess.Popen[bytes]) -> None:
    """Send ``proc`` SIGUSR2 (Slurm signals the whole job step; this covers a signal sent to the job's process
    alone) and wait until it has exited, from inside a signal handler.

    The handler runs while :meth:`ChildJob.__call__` waits for the child, which may hold the Popen's wait lock:
    ``proc.wait()`` here could wait for that lock forever. So the child is reaped with ``os.waitpid``; a child
    already reaped is gone, which is all this needs (what it left is read from its run dir).
    """
    if proc.returncode is not None:
        return
    try:
        os.kill(proc.pid, signal.SIGUSR2)
        os.waitpid(proc.pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


class ChildJob:
    """The job's callable: run the child's command (``argv``, environment ours + ``extra_env``, in ``cwd``) to
    its end; its exit code, :class:`ChildFailed` when it failed (any non-zero code but the collapse guard's; a
    signal that stops a child which had written ``summary.json`` is no failure: its run is complete).

    :meth:`checkpoint` makes it requeueable: submitit calls it in the job's process on Slurm's warning
    signal; it stops the child (which saves a checkpoint at the step it is in) and returns this job again,
    marked ``requeued``. A requeued job decides from the child's run dir (``run_dir``, relative to ``cwd``)
    what to run: nothing when the child finished (``summary.json``; the warning can come as it ends), its
    ``--resume`` command (``resume_argv``) when a checkpoint is there, else ``argv`` again.
    """

    def __init__(self, name: str, argv: Sequence[str], resume_argv: Sequence[str], extra_env: Mapping[str, str],
                 cwd: str, run_dir: str, *, requeued: bool = False) -> None:
        self.name, self.argv, self.resume_argv = name, list(argv), list(resume_argv)
        self.extra_env, self.cwd, self.run_dir, self.requeued = dict(extra_env), cwd, run_dir, requeued
        self._proc: subprocess.Popen[bytes] | None = None

    def __getstate__(self) -> dict[str, Any]:  # the running process stays behind when submitit pickles the job again
        return {k: v for k, v in self.__dict__.items() if k != "_proc"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._proc = None

    def command(self) -> list[str] | None:
        """What this start of the job runs: ``argv`` on the first start; after a requeue, None when the child
        finished, ``resume_argv`` when it has a complete checkpoint, else ``argv``."""
        if not self.requeued:
            return self.argv
        from dapo_cli.checkpoint import CheckpointManager

        if self.run_finished():
            return None
        return self.resume_argv if CheckpointManager(Path(self.cwd) / self.run_dir).latest() is not None else self.argv

    def run_finished(self) -> bool:
        """The child wrote ``summary.json``, its last act: its run is complete, whatever ends its process after."""
        return (Path(self.cwd) / self.run_dir / "summary.json").is_file()

    def __call__(self) -> int:
        argv = self.command()
        if argv is None:
            print(f"dapo ablate child {self.name}: finished before the job was requeued", flush=True)
            return 0
        print(f"dapo ablate child {self.name}: {shlex.join(argv)}", flush=True)  # the first line of the job's log
        self._proc = subprocess.Popen(argv, env={**os.environ, **self.extra_env}, cwd=self.cwd)
        code = self._proc.wait()
        if (code < 0 or code == PREEMPTED) and self.run_finished():  # the signal came as the finished child exited
            print(f"dapo ablate child {self.name}: finished its run before the signal stopped it (exit {code})", flush=True)
            return 0
        if code == PREEMPTED:  # stopped by a stop request that did not reach this process: nothing requeues it here
            raise ChildFailed(f"child {self.name} stopped on a scheduler's signal (exit {PREEMPTED}) and was not requeued; "
                              "its checkpoint is kept")
        if code < 0:  # Slurm signals every process of the job: scancel, or the time limit with no checkpoint taken
            raise ChildFailed(f"child {self.name} was stopped by {signal.Signals(-code).name} (scancel, or the job's time "
                              "limit); its newest checkpoint is kept")
        if code not in (0, COLLAPSED):  # a collapsed child finished and is recorded: not a failure
            raise ChildFailed(f"child {self.name} exited with code {code}")
        return code

    def checkpoint(self) -> Any:
        """On the warning signal: stop the child (it saves the step it is in) and wait for it, then this job
        again as submitit's ``DelayedSubmission``, to be requeued (:meth:`command` decides what it runs)."""
        import submitit

        if self._proc is not None:
            stop_and_reap(self._proc)
        print(f"dapo ablate child {self.name}: requeued", flush=True)
        return submitit.helpers.DelayedSubmission(ChildJob(self.name, self.argv, self.resume_argv, self.extra_env,
                                                           self.cwd, self.run_dir, requeued=True))
