"""How a child is started and waited for: the small protocol :func:`dapo_cli.ablate.runner.drive` runs over.

The driver opens the parent run, decides every child in plan order (skip / resume / fresh) and
calls the launcher's :meth:`~Launcher.start` for each child not skipped, then its
:meth:`~Launcher.finish` once, then (when :attr:`~Launcher.reports`) writes the report. A launcher
only says how a child runs:

* :class:`InProcess` (``ablate.launcher: local``, ``nproc == 1``, ``jobs == 1``): ``run_train`` here,
  one child after the other;
* :class:`OneProcessAtATime` (``local``, ``nproc > 1``, ``jobs == 1``): each child a torchrun process
  (:func:`~dapo_cli.ablate.child.child_argv`), its output streamed (``--quiet``: to its log);
* :class:`~dapo_cli.ablate.pool.Pool` (``local``, ``jobs > 1``): up to N child processes at once;
* :class:`~dapo_cli.ablate.slurm.Slurm` (``slurm``): one submitit job per child;
* :class:`PrintCommands` (``print``): nothing runs; one shell line per child.

Also here: the overall progress line (:class:`AblationClock`) and the lines a child's start and
end print (:func:`start_line`, :func:`child_done`).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dapo_cli.ablate.child import (
    ChildOutcome,
    SpawnFn,
    TrainFn,
    child_argv,
    child_env,
    child_log_path,
    child_result,
    child_tags,
    default_train,
    exited_finished,
    read_summary,
    run_child,
    train_words,
)
from dapo_cli.ablate.variants import AblationPlan, Child
from dapo_cli.errors import UserError
from dapo_cli.progress import format_duration
from dapo_cli.tracking.tags import PARENT_RUN_ENV

Log = Callable[[str], None]


def no_log(_: str) -> None:
    """A :data:`Log` that drops every line."""


@dataclass(frozen=True)
class Parent:
    """What the driver hands a launcher with each call: the parent run, and the progress clock it started
    when the parent opened (None for a launcher whose :attr:`~Launcher.jobs` is None)."""

    run_id: str
    clock: AblationClock | None


class Launcher(Protocol):
    """What :func:`~dapo_cli.ablate.runner.drive` needs of a way to run children."""

    name: str
    """The parent's ``ablate.launcher`` tag: ``local``, ``slurm`` or ``print``."""
    jobs: int | None
    """Children trained here at once, for the progress clock's ETA; None: nothing is timed here (no clock)."""
    reports: bool
    """Whether the report is written once :meth:`finish` returns."""

    def attached(self, child: Child) -> str | None:
        """A child not finished whose job, from an earlier driver, is still queued or running: what it is (``job 12
        (RUNNING)``); the driver then starts it as ``attach`` (wait for it) instead of deciding it. None: decide it."""

    def start(self, o: ChildOutcome, parent: Parent) -> None:
        """Start (or queue) one decided child that is not skipped; children come in plan order."""

    def finish(self, outcomes: Sequence[ChildOutcome], parent: Parent) -> None:
        """After every child was decided: wait for the started ones; a UserError names failures."""


# ---------------------------------------------------------------- progress


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


def start_line(o: ChildOutcome, clock: AblationClock, how: str = "") -> str:
    """``[2/6] grpo seed 0: training (abl/grpo-s0)<how>; ablation: ...``: a child starts."""
    what = "resuming from its checkpoint" if o.action == "resume" else "training"
    return f"{o.where}: {what} ({o.child.run_name}){how}; {clock.line()}"


def child_done(o: ChildOutcome, summary: dict[str, Any] | None, seconds: float, clock: AblationClock, log: Log) -> None:
    """Record a child that trained to its end: its summary on the outcome, the clock, one line."""
    o.summary = summary
    clock.finished(seconds)
    log(f"{o.where}: done in {format_duration(seconds)}{child_result(summary)}; {clock.line()}")


# ---------------------------------------------------------------- one child at a time, waited for here


class _OneAtATime:
    """Each child runs to its end inside :meth:`start`, timed and logged; :meth:`run` says how."""

    name, reports, jobs = "local", True, 1

    def __init__(self, plan: AblationPlan, *, config_path: str | None, sets: Sequence[str], quiet: bool, log: Log) -> None:
        self.plan, self.config_path, self.sets, self.quiet, self.log = plan, config_path, sets, quiet, log

    def attached(self, child: Child) -> str | None:
        return None  # a child trained here ends with this process

    def run(self, o: ChildOutcome, parent_id: str) -> dict[str, Any] | None:
        raise NotImplementedError

    def start(self, o: ChildOutcome, parent: Parent) -> None:
        assert parent.clock is not None
        self.log(start_line(o, parent.clock))
        t0 = time.perf_counter()
        summary = self.run(o, parent.run_id)
        child_done(o, summary, time.perf_counter() - t0, parent.clock, self.log)

    def finish(self, outcomes: Sequence[ChildOutcome], parent: Parent) -> None:
        pass


class InProcess(_OneAtATime):
    """``run_train`` in this process (``train``, default :func:`~dapo_cli.ablate.child.default_train`)."""

    def __init__(self, plan: AblationPlan, *, train: TrainFn | None = None, config_path: str | None,
                 sets: Sequence[str], quiet: bool, log: Log) -> None:
        super().__init__(plan, config_path=config_path, sets=sets, quiet=quiet, log=log)
        self.train = train or default_train()

    def run(self, o: ChildOutcome, parent_id: str) -> dict[str, Any] | None:
        plan, child = self.plan, o.child
        return self.train(o.cfg, resume=o.action == "resume", command=shlex.join(train_words(plan, child, self.config_path, self.sets)),
                          parent_run_id=parent_id, extra_tags=child_tags(plan, child, parent_id), quiet=self.quiet)


class OneProcessAtATime(_OneAtATime):
    """Each child a torchrun process run by ``spawn`` (default :func:`~dapo_cli.ablate.child.run_child`);
    a failed one stops the ablation with a UserError naming it and its exit code."""

    def __init__(self, plan: AblationPlan, *, spawn: SpawnFn | None = None, config_path: str | None,
                 sets: Sequence[str], quiet: bool, log: Log) -> None:
        super().__init__(plan, config_path=config_path, sets=sets, quiet=quiet, log=log)
        self.spawn = spawn or run_child

    def run(self, o: ChildOutcome, parent_id: str) -> dict[str, Any] | None:
        plan, child, resume = self.plan, o.child, o.action == "resume"
        argv = child_argv(plan, child, self.config_path, self.sets, resume=resume, executable=True)
        log_path = child_log_path(plan, child) if self.quiet else None
        shown = shlex.join(child_argv(plan, child, self.config_path, self.sets, resume=resume))
        self.log(f"  {shown}" + (f"  (output: {log_path})" if log_path else ""))
        code = self.spawn(argv, child_env(parent_id, child_tags(plan, child, parent_id)), log_path=log_path)
        if not exited_finished(code, child, self.log):
            where = f" (output: {log_path})" if log_path else ""
            raise UserError(f"child {child.run_name} failed with exit code {code}{where}; rerun the same command to resume it")
        return read_summary(plan, child)


# ---------------------------------------------------------------- nothing runs: the commands


class PrintCommands:
    """One shell line per child (``DAPO_PARENT_RUN_ID=... dapo train ...``, ``# done: ...`` when finished),
    in :attr:`commands` and as each outcome's ``action``; no report.

    An axis variant's line also sets ``DAPO_EXTRA_TAGS`` (its ``ablate.*`` tags): the trainer's own
    ``dapo.variant`` names the technique state alone, so its ``ablate.variant`` tells the report and
    reruns which axis setting it trained."""

    name, reports, jobs = "print", False, None

    def __init__(self, plan: AblationPlan, *, config_path: str | None, sets: Sequence[str]) -> None:
        self.plan, self.config_path, self.sets = plan, config_path, sets
        self.commands: list[str] = []

    def attached(self, child: Child) -> str | None:
        return None

    def start(self, o: ChildOutcome, parent: Parent) -> None:
        pass

    def finish(self, outcomes: Sequence[ChildOutcome], parent: Parent) -> None:
        for o in outcomes:
            words = child_argv(self.plan, o.child, self.config_path, self.sets, resume=o.action == "resume")
            env = child_env(parent.run_id, child_tags(self.plan, o.child, parent.run_id)) if o.child.variant.axes else {
                PARENT_RUN_ENV: parent.run_id}
            line = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), shlex.join(words)])
            self.commands.append(f"# done: {o.child.run_name}" if o.action == "skip" else line)
            o.action = self.commands[-1]
