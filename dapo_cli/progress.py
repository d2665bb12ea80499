"""What a user sees while something long runs: progress with an ETA, one line per training step.

Everything here goes to stderr (results are the caller's, on stdout). Two pieces:

* :class:`CountProgress`: progress of a count (warm-start steps, eval samples): a transient
  rich bar with elapsed time and ETA on a terminal, else a plain line every 10% (CI logs,
  ``2>file``);
* :class:`PhaseReporter`: lines of a run made of phases (``--algo direct-advantage``), and a
  transient bar while a phase generates;
* :class:`StepReporter`: the training loop's bar with the running phase, and one summary line
  per step (with the ETA); verbosity -1 (``--quiet``) prints nothing, 1 (``--verbose``) adds
  every metric of the step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

QUIET, NORMAL, VERBOSE = -1, 0, 1
"""Verbosity levels: ``--quiet``, the default, ``--verbose``."""

SUMMARY_KEYS = (
    ("rollout/acc", "acc", "{:.3f}"),
    ("reward/score_mean", "score", "{:+.3f}"),
    ("actor/entropy", "ent", "{:.3f}"),
    ("response_length/mean", "len", "{:.1f}"),
    ("overlong/truncated_frac", "trunc", "{:.2f}"),
    ("train/kept_group_frac", "kept", "{:.2f}"),
    ("train/num_gen_batches", "rounds", "{:.0f}"),
    ("async/version_lag_mean", "lag", "{:.2f}"),  # asynchronous rollouts only
    ("timing/step", "s", "{:.2f}"),
)


def format_duration(seconds: float | None) -> str:
    """``0:42``, ``12:05``, ``1:02:03``; ``?`` when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    total = max(0, int(round(seconds)))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def eta_seconds(done: int, total: int, elapsed: float) -> float | None:
    """Time left at the rate so far (``done`` units in ``elapsed`` s); None before the first unit."""
    if done <= 0 or elapsed <= 0:
        return None
    return max(0, total - done) * elapsed / done


def summary_line(step: int, total: int, metrics: dict[str, float]) -> str:
    """``step 3/60  acc 0.412  score -0.176  ent 0.121 ...`` from a step's metrics."""
    parts = [f"step {step}/{total}"]
    for key, label, fmt in SUMMARY_KEYS:
        if key in metrics:
            parts.append(f"{label} {fmt.format(metrics[key])}")
    return "  ".join(parts)


def detail_line(metrics: dict[str, float]) -> str:
    """Every metric of a step, sorted: ``  actor/entropy=0.121  actor/grad_norm=0.53 ...`` (``--verbose``)."""
    return "  " + "  ".join(f"{key}={value:.4g}" for key, value in sorted(metrics.items()))


class RateColumn(ProgressColumn):
    """Units per second of this session (units already done at the start not counted)."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        speed = task.speed
        return Text(f"? {self.unit}/s" if speed is None else f"{speed:.2f} {self.unit}/s", style="progress.data.speed")


class CountProgress:
    """Progress of ``total`` units on stderr: a rich bar with ETA on a terminal, else a plain line every 10%.

    ``with CountProgress("warm-start", unit="steps") as bar: bar.start(600); bar.advance(1, info="loss 0.8")``.
    Units already done when it starts (a resumed eval) count as done but not into the rate.
    ``every``: the share of ``total`` between plain lines (0: a line at every advance, on a
    terminal too: ``--verbose``); ``enabled=False`` shows nothing (``--quiet``).
    """

    def __init__(self, description: str, *, unit: str, enabled: bool = True, console: Console | None = None,
                 every: float = 0.1) -> None:
        self.description = description
        self.unit = unit
        self.enabled = enabled
        self.console = console or Console(stderr=True)
        self.every = every
        self.live = enabled and self.console.is_terminal
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), RateColumn(unit),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
            console=self.console, transient=True, disable=not self.live,
        )
        self.task: Any = None
        self.total = self.done = self.first = 0
        self.t0 = time.perf_counter()
        self.next_mark = 0

    def __enter__(self) -> CountProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def start(self, total: int, completed: int = 0) -> None:
        self.total, self.done, self.first = total, completed, completed
        self.t0 = time.perf_counter()
        self.next_mark = self._mark_after(completed)
        self.task = self.progress.add_task(self.description, total=total, completed=completed, info="")

    def advance(self, n: int = 1, info: str = "") -> None:
        self.done += n
        if self.task is not None:
            self.progress.update(self.task, advance=n, info=info)
        lines_due = self.every <= 0 or not self.live
        if self.enabled and lines_due and self.total > 0 and self.done >= self.next_mark:
            self.progress.console.print(self.line(info), highlight=False, markup=False, soft_wrap=True)
            self.next_mark = self._mark_after(self.done)

    def line(self, info: str = "") -> str:
        """``warm-start: 30% (180/600 steps), 4.29 steps/s, 0:42 elapsed, ETA 1:38, loss 0.812``."""
        elapsed = time.perf_counter() - self.t0
        new = self.done - self.first
        eta = eta_seconds(new, self.total - self.first, elapsed)
        rate = f"{new / elapsed:.2f}" if new > 0 and elapsed > 0 else "?"
        pct = 100 * self.done // max(1, self.total)
        text = (f"{self.description}: {pct}% ({self.done}/{self.total} {self.unit}), {rate} {self.unit}/s, "
                f"{format_duration(elapsed)} elapsed, ETA {format_duration(eta)}")
        return f"{text}, {info}" if info else text

    def _mark_after(self, done: int) -> int:
        """The first count past ``done`` at a multiple of ``every`` × total (the next plain line)."""
        step = max(1, math.ceil(self.total * max(0.0, self.every)))
        return min(self.total, (done // step + 1) * step)


class PhaseReporter:
    """Lines on stderr, and a transient count bar on a terminal while a phase runs (``quiet``: nothing)."""

    def __init__(self, quiet: bool, console: Console | None = None) -> None:
        self.quiet = quiet
        self.console = console or Console(stderr=True)

    def note(self, text: str) -> None:
        if not self.quiet:
            self.console.print(text, highlight=False, soft_wrap=True)

    def bar(self, label: str) -> tuple[Progress, Callable[[int, int], None]]:
        """A bar to use as a context manager, and ``update(done, total)`` to move it."""
        progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=self.console, transient=True, disable=self.quiet or not self.console.is_terminal,
        )
        task = progress.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        return progress, update


class StepReporter:
    """The training run's stderr: a progress bar with the running phase; per-step lines with the ETA;
    notes. ``verbosity``: -1 nothing, 0 one line per step, 1 also every metric of the step."""

    def __init__(self, total_steps: int, *, verbosity: int = NORMAL, console: Console | None = None) -> None:
        self.total = total_steps
        self.verbosity = verbosity
        self.quiet = verbosity <= QUIET
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
            disable=self.quiet,
        )
        self.task = self.progress.add_task("train", total=total_steps)
        self.t0 = time.perf_counter()
        self.first_step: int | None = None

    def __enter__(self) -> StepReporter:
        self.progress.start()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def phase(self, step: int, name: str) -> None:
        if self.first_step is None and step > 0:  # the ETA counts from the first step, not the validation at 0
            self.first_step, self.t0 = step, time.perf_counter()
        self.progress.update(self.task, description=f"step {step}: {name}")

    def step_done(self, step: int, metrics: dict[str, float]) -> None:
        self.progress.update(self.task, completed=step)
        first = self.first_step if self.first_step is not None else step
        eta = eta_seconds(step - first + 1, self.total - first + 1, time.perf_counter() - self.t0)
        self.note(f"{summary_line(step, self.total, metrics)}  ETA {format_duration(eta)}")
        if self.verbosity >= VERBOSE:
            self.note(detail_line(metrics))

    def note(self, text: str) -> None:
        if not self.quiet:
            self.progress.console.print(text, highlight=False, markup=False, soft_wrap=True)
