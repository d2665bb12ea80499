"""``dapo ablate --launcher slurm``: one submitit job per child, waited for here.

submitit (Facebook Research) writes each job's sbatch script, pickled call and logs under
``ablate.slurm.folder``; ``ablate.slurm.cluster: local`` swaps Slurm for its LocalExecutor
(each job a local process), which is how the tests run this path. :class:`Slurm` is the
:class:`~dapo_cli.ablate.launchers.Launcher`: it submits each child the driver does not skip, and
waits for them all in :meth:`Slurm.finish` (or, ``--detach``, does not). A job runs
:class:`~dapo_cli.ablate.slurm_jobs.ChildJob`: the child's command (:func:`~dapo_cli.ablate.child.child_argv`)
as a subprocess, with ``DAPO_PARENT_RUN_ID`` and ``DAPO_EXTRA_TAGS`` set, in the directory
``dapo ablate`` was started from; on Slurm's warning signal it checkpoints and is requeued. Each
submission is recorded (``<ablation>/slurm-jobs.json``), so a rerun re-attaches to jobs still queued or
running instead of submitting them again. Only this module and :mod:`~dapo_cli.ablate.slurm_jobs` import
submitit, and only when the slurm launcher runs.

Before the parent run opens, :func:`probe_sbatch` asks Slurm to accept a child's job shape
(``sbatch --test-only``): a login node whose ``sbatch`` cannot reach its controller, an unknown
partition or a shape over the limits is one error line, with nothing opened or written. A
submission that fails later removes the files submitit wrote for it and cancels the jobs this
command already submitted.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dapo_cli.ablate.child import ChildOutcome, ablation_dir, child_argv, child_env, child_tags
from dapo_cli.ablate.launchers import Parent
from dapo_cli.ablate.slurm_jobs import ACTIVE_STATES, RECORD_NAME, ChildFailed, ChildJob, JobRecord, live_state, queue_state
from dapo_cli.ablate.variants import AblationPlan, Child
from dapo_cli.errors import UserError
from dapo_cli.redact import escape_controls, redact

ArgvFn = Callable[[Child, bool], list[str]]
"""``(child, resume) -> argv`` of a child's job (default: :func:`~dapo_cli.ablate.child.child_argv`, the executed spelling)."""

INSTALL_HINT = "launcher slurm needs submitit: pip install 'dapo-cli[slurm]'"


def require_submitit() -> Any:
    """The ``submitit`` module, or a UserError saying how to install it."""
    try:
        import submitit
    except ImportError:
        raise UserError(INSTALL_HINT) from None
    return submitit


def check_resources(ablate: Any) -> None:
    """Refuse job shapes the child command cannot use (``ablate`` is an ``AblateConfig``)."""
    slurm = ablate.slurm
    if slurm.nodes != 1:
        raise UserError(
            f"ablate.slurm.nodes={slurm.nodes}: a child runs on one node (torchrun --standalone); "
            "set ablate.slurm.nodes=1 and use ablate.nproc for more processes per child"
        )
    if slurm.gpus_per_node and ablate.nproc > slurm.gpus_per_node:
        raise UserError(
            f"ablate.nproc={ablate.nproc} > ablate.slurm.gpus_per_node={slurm.gpus_per_node}: each process needs "
            "its own GPU; raise gpus_per_node or lower nproc"
        )


def executor_parameters(slurm: Any, name: str) -> dict[str, Any]:
    """``update_parameters`` arguments for one child's job (``slurm`` is a ``SlurmConfig``)."""
    params: dict[str, Any] = {
        "name": name,
        "nodes": slurm.nodes,
        "tasks_per_node": 1,  # one task per job: the child (torchrun starts its own processes)
        "gpus_per_node": slurm.gpus_per_node,
        "cpus_per_task": slurm.cpus_per_task,
        "timeout_min": slurm.timeout_min,
        # Slurm's warning ahead of the time limit (sbatch --signal=USR2@N): the child checkpoints, the job is requeued
        "slurm_signal_delay_s": slurm.signal_delay_s,
    }
    if slurm.partition:
        params["slurm_partition"] = slurm.partition
    if slurm.mem_gb > 0:
        params["mem_gb"] = slurm.mem_gb
    return params


PROBE_TIMEOUT_S = 30.0
"""How long :func:`probe_sbatch` waits for ``sbatch --test-only`` (a controller that does not answer in this time
would not take the real submissions either)."""

LOCAL_HINT = "or set ablate.slurm.cluster=local to run the jobs as processes here"


def probe_argv(sbatch: str, slurm: Any) -> list[str]:
    """``sbatch --test-only`` with a child's job shape (the options :func:`executor_parameters` gives submitit)."""
    argv = [sbatch, "--test-only", "--job-name=dapo-ablate-probe", f"--nodes={slurm.nodes}", "--ntasks-per-node=1",
            f"--cpus-per-task={slurm.cpus_per_task}", f"--time={slurm.timeout_min}"]
    if slurm.partition:
        argv.append(f"--partition={slurm.partition}")
    if slurm.gpus_per_node:
        argv.append(f"--gpus-per-node={slurm.gpus_per_node}")
    if slurm.mem_gb > 0:
        argv.append(f"--mem={slurm.mem_gb}G")
    return [*argv, "--wrap=true"]


def probe_sbatch(slurm: Any, *, run: Callable[..., Any] = subprocess.run) -> None:
    """Refuse, before anything opens, a Slurm that would not take a child's job (``slurm`` is a ``SlurmConfig``).

    ``sbatch --test-only`` validates the job shape against the controller (partition, limits, account) and
    submits nothing. Refused: ``sbatch`` or ``srun`` missing from PATH, the probe failing (its last stderr line quoted,
    escaped and with credentials redacted), or no answer within :data:`PROBE_TIMEOUT_S`.
    """
    missing = [tool for tool in ("sbatch", "srun") if shutil.which(tool) is None]  # submitit needs both
    if missing:
        raise UserError(f"ablate.slurm.cluster=slurm but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                        f"not on PATH; run dapo ablate on a Slurm login node, {LOCAL_HINT}")
    sbatch = str(shutil.which("sbatch"))
    argv = probe_argv(sbatch, slurm)
    shown = shlex.join(["sbatch", *argv[1:]])
    try:
        done = run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise UserError(f"`{shown}` did not answer in {PROBE_TIMEOUT_S:.0f} s: is the Slurm controller up? {LOCAL_HINT}") from None
    except OSError as exc:
        raise UserError(f"cannot run {sbatch}: {exc.strerror or exc}; {LOCAL_HINT}") from None
    if done.returncode != 0:
        said = [line.strip() for line in (done.stderr or done.stdout or "").splitlines() if line.strip()]
        reason = escape_controls(redact(said[-1])) if said else f"exit code {done.returncode}"
        raise UserError(f"Slurm refused a child's job shape (`{shown}`): {reason}; "
                        f"check ablate.slurm.partition, gpus_per_node, cpus_per_task, mem_gb and timeout_min, {LOCAL_HINT}")


def make_executor(submitit: Any, slurm: Any) -> Any:
    """submitit's executor (a job reaching its time limit is requeued up to ``max_requeues`` times), named: left to choose, ``AutoExecutor`` falls back to local processes wherever
    ``srun`` is missing, which would train a cluster ablation on the login node."""
    return submitit.AutoExecutor(folder=slurm.folder, cluster=slurm.cluster, slurm_max_num_timeout=slurm.max_requeues)


def _folder_entries(folder: Path) -> set[Path]:
    return set(folder.iterdir()) if folder.is_dir() else set()


def submit(executor: Any, slurm: Any, name: str, argv: Sequence[str], extra_env: Mapping[str, str],
           resume_argv: Sequence[str] | None = None, run_dir: str = "") -> Any:
    """Submit one child (a :class:`~dapo_cli.ablate.slurm_jobs.ChildJob` running ``argv``; requeued after a stop
    on Slurm's warning signal, it reads ``run_dir`` to run ``resume_argv`` or nothing); returns its submitit job. A submission that fails is a UserError with the scheduler's
    last line, and the pickle and script submitit wrote for it are removed (the folder too, if it made it)."""
    folder = Path(slurm.folder)
    existed, before = folder.is_dir(), _folder_entries(folder)
    executor.update_parameters(**executor_parameters(slurm, name))
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # submitit echoes a failed sbatch's stderr; the error line quotes it
            return executor.submit(ChildJob(name, argv, resume_argv or argv, extra_env, os.getcwd(), run_dir))
    except Exception as exc:
        for path in _folder_entries(folder) - before:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
        if not existed and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
        said = [line.strip() for line in str(exc).splitlines() if line.strip()]
        reason = escape_controls(redact(said[-1])) if said else type(exc).__name__
        raise UserError(f"submitting {name} failed: {reason}; rerun the same command once Slurm takes jobs") from None


_RULE = "-" * 22


def failure_reason(exc: BaseException) -> str:
    """One line for a failed job's error.

    submitit's error text is ``... with trace:`` / rule / the job's traceback / rule / where the
    logs are: the traceback's last line (the exception, a ChildFailed message unprefixed), else
    the text's first line (a job that timed out or was cancelled produced no result).
    """
    text = str(exc)
    parts = text.split(_RULE)
    trace = [line.strip() for line in parts[1].splitlines() if line.strip()] if len(parts) >= 3 else []
    if trace:
        return trace[-1].split(f"{ChildFailed.__name__}: ", 1)[-1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def ended(submitit: Any, job: Any, *, queue: Callable[[str], str | None] = queue_state) -> bool:
    """Whether ``job`` has ended: it wrote its result file, or submitit counts it ended (its sacct state) and,
    for a Slurm job without a result file, Slurm's controller (``queue``: :func:`queue_state`) does not hold it
    as active. A requeued job's accounting record can read as ended for a moment between its attempts; submitit
    then never asks sacct about it again, so each later look asks the controller until the job truly ends."""
    if not job.done():
        return False
    if job.paths.result_pickle.exists() or not isinstance(job, submitit.SlurmJob):
        return True
    return queue(job.job_id) not in ACTIVE_STATES


def wait(
    submitit: Any, jobs: Sequence[tuple[str, Any]], *, poll_s: float, log: Callable[[str], None],
    queue: Callable[[str], str | None] = queue_state,
) -> list[str]:
    """Wait for every ``(child name, job)``, looking every ``poll_s`` seconds (:func:`ended`); log each job's id
    and state as it ends; the failures' descriptions.

    Interrupted (Ctrl-C) or failing here, the jobs still queued or running are cancelled, so a
    rerun never finds a child that is still training elsewhere.
    """
    names = {id(job): name for name, job in jobs}
    failed: list[str] = []
    done: set[int] = set()
    try:
        while len(done) < len(jobs):
            for _, job in jobs:
                if id(job) in done or not ended(submitit, job, queue=queue):
                    continue
                done.add(id(job))
                exc = job.exception()
                reason = failure_reason(exc) if exc is not None else ""
                # submitit's cached state may predate the result file that ended the wait: a job without an error finished
                log(f"job {job.job_id} ({names[id(job)]}): " + (f"{job.state}, failed: {reason}" if exc is not None else "finished"))
                if exc is not None:
                    failed.append(f"{names[id(job)]} (job {job.job_id}: {reason})")
            if len(done) < len(jobs):
                time.sleep(poll_s)
    except BaseException:
        for name, job in jobs:
            if id(job) not in done:
                log(f"cancelling job {job.job_id} ({name})")
                job.cancel(check=False)
        raise
    return failed


def child_run_dir(plan: AblationPlan, child: Child) -> Path:
    """The child's run dir, as its ``dapo train`` names it (relative to where ``dapo ablate`` runs, unless
    ``trainer.output_dir`` is absolute)."""
    from dapo_cli.checkpoint import run_dir_for

    return run_dir_for(plan.base.trainer.output_dir, plan.base.tracking.experiment, child.run_name)


def job_state_reader(plan: AblationPlan) -> Callable[[Child], str | None]:
    """For :func:`~dapo_cli.ablate.runner.ablation_status`: what Slurm says of each child's recorded job (``job 12:
    RUNNING``; ``job 12: CANCELLED (ended unfinished; the rerun resumes or restarts it)``), None without one."""
    record = JobRecord(ablation_dir(plan) / RECORD_NAME)
    submitit = require_submitit() if record.jobs else None

    def state(child: Child) -> str | None:
        recorded = record.jobs.get(child.run_name)
        if recorded is None:
            return None
        _, now = live_state(submitit, recorded)
        ended = "" if now in ACTIVE_STATES else " (ended unfinished; the rerun resumes or restarts it)"
        return f"job {recorded.job_id}: {now}{ended}"

    return state


class Slurm:
    """One submitit job per child not skipped; :meth:`finish` waits for them all. Failed jobs stop the
    ablation (after every job has ended) with a UserError naming them; rerunning the command resumes or
    restarts just those. ``poll_s``: seconds between state checks (default ``ablate.slurm.poll_s`` on Slurm,
    0.5 with ``cluster: local``). Refuses at construction when submitit is missing or the job shape is wrong.

    On Slurm (``cluster: slurm``) every submission is recorded in ``<ablation>/slurm-jobs.json``
    (:class:`~dapo_cli.ablate.slurm_jobs.JobRecord`) and :meth:`attached` finds a child's job from an
    earlier driver that is still queued or running, so the rerun waits for it instead of submitting it again.
    ``detach``: submit and return; nothing is waited for and no report is written (``--status`` or the
    rerun does that). Ctrl-C while waiting cancels the jobs; a driver that dies (``kill -9``, a closed
    login session: SIGHUP) leaves them running for the rerun to re-attach to."""

    name, jobs = "slurm", None

    def __init__(self, plan: AblationPlan, *, config_path: str | None, sets: Sequence[str],
                 log: Callable[[str], None], argv_for: ArgvFn | None = None, poll_s: float | None = None,
                 detach: bool = False) -> None:
        self.submitit = require_submitit()
        check_resources(plan.base.ablate)
        self.plan, self.log, self.settings = plan, log, plan.base.ablate.slurm
        on_slurm = self.settings.cluster == "slurm"
        if detach and not on_slurm:
            raise UserError("--detach needs jobs that outlive this command: ablate.slurm.cluster=slurm (local jobs are "
                            "processes of the driver)")
        if on_slurm:
            probe_sbatch(self.settings)
        self.detach, self.reports = detach, not detach
        self.poll_s = poll_s if poll_s is not None else (self.settings.poll_s if on_slurm else 0.5)
        self.argv_for = argv_for or (lambda c, resume: child_argv(plan, c, config_path, sets, resume=resume, executable=True))
        self.executor = make_executor(self.submitit, self.settings)
        self.record = JobRecord(ablation_dir(plan) / RECORD_NAME) if on_slurm else None
        self.submitted: list[tuple[str, Any]] = []
        self._live: dict[str, Any] = {}

    def attached(self, child: Child) -> str | None:
        """``job N (STATE)`` when the record names a job of ``child`` that Slurm says is still queued or running
        (it is waited for, not submitted again); None otherwise."""
        recorded = self.record.jobs.get(child.run_name) if self.record is not None else None
        if recorded is None:
            return None
        job, state = live_state(self.submitit, recorded)
        if state not in ACTIVE_STATES:
            return None
        self._live[child.run_name] = job
        return f"job {job.job_id} ({state})"

    def start(self, o: ChildOutcome, parent: Parent) -> None:
        child = o.child
        if o.action == "attach":
            job = self._live[child.run_name]
            self.log(f"{o.where}: re-attached to job {job.job_id}, submitted by an earlier dapo ablate")
            self.submitted.append((child.run_name, job))
            return
        try:
            job = submit(self.executor, self.settings, child.run_name, self.argv_for(child, o.action == "resume"),
                         child_env(parent.run_id, child_tags(self.plan, child, parent.run_id)),
                         resume_argv=self.argv_for(child, True), run_dir=str(child_run_dir(self.plan, child)))
        except UserError:
            if not self.detach:
                for name, queued in self.submitted:  # nobody would wait for them: a rerun must not find them training
                    self.log(f"cancelling job {queued.job_id} ({name})")
                    queued.cancel(check=False)
            raise
        if self.record is not None:
            self.record.add(child.run_name, job.job_id, self.settings.folder)
        self.log(f"{o.where}: submitted job {job.job_id}{' (resuming)' if o.action == 'resume' else ''}")
        self.submitted.append((child.run_name, job))

    def finish(self, outcomes: Sequence[ChildOutcome], parent: Parent) -> None:
        folder = self.settings.folder
        if self.detach:
            self.log(f"detached: {len(self.submitted)} job(s) queued or running (logs in {folder}); the same command "
                     "with --status shows where they are, and writes the report once all are done")
            return
        if self.submitted:
            self.log(f"waiting for {len(self.submitted)} job(s); logs in {folder}")
        failed = wait(self.submitit, self.submitted, poll_s=self.poll_s, log=self.log)
        if failed:
            raise UserError(f"{len(failed)} of {len(self.submitted)} job(s) failed: {'; '.join(failed)}; "
                            f"logs in {folder}; rerun the same command to resume them")
