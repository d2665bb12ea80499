"""One child of an ablation: its run dir, its tags, its ``dapo train`` command and environment, and its outcome.

Every launcher starts a child from these: in this process (:func:`default_train` with the child's
config and :func:`child_tags`), or as a process running :func:`child_argv` with :func:`child_env`
on top of our environment (:func:`run_child`). A process's exit code says whether its run finished
(:func:`exited_finished`); its ``summary.json`` says how (:func:`read_summary`, :func:`child_result`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dapo_cli.ablate.variants import AblationPlan, Child, child_label
from dapo_cli.errors import COLLAPSED
from dapo_cli.tracking.credentials import bare_setting
from dapo_cli.tracking.tags import child_env

__all__ = [
    "ChildOutcome", "SpawnFn", "TrainFn", "ablation_dir", "child_argv", "child_env", "child_log_path", "child_result",
    "child_tags", "default_train", "exited_finished", "read_summary", "run_child", "train_words",
]

TrainFn = Callable[..., dict[str, Any]]
"""``run_train(cfg, *, resume, command, parent_run_id, extra_tags, quiet) -> summary``."""

SpawnFn = Callable[..., int]
"""``run_child(argv, extra_env, *, log_path) -> exit code``: run one child process to its end."""


def default_train() -> TrainFn:
    """:func:`dapo_cli.train.run_train`, imported when a child first trains in this process."""
    from dapo_cli.train import run_train

    return run_train


@dataclass
class ChildOutcome:
    """What became of one child in this run of the driver: decided, then (when trained here) its summary."""

    child: Child
    action: str
    """skip / resume / fresh (trained here) or, with the print launcher, the printed command."""
    superseded: list[str]
    summary: dict[str, Any] | None = None
    where: str = ""
    """``[i/n] variant seed S``, how log lines name the child."""
    cfg: Any = dataclasses.field(default=None, repr=False)
    """The child's resolved config (:meth:`AblationPlan.child_config`)."""


# ---------------------------------------------------------------- where and how it is tagged


def ablation_dir(plan: AblationPlan) -> Path:
    """``output_dir/experiment/<ablation name>``: the child run dirs and the report."""
    return Path(plan.base.trainer.output_dir) / plan.base.tracking.experiment / plan.name


def child_log_path(plan: AblationPlan, child: Child) -> Path:
    """``<ablation>/logs/<variant>-s<seed>.log``: where a child process's output goes when not streamed."""
    return ablation_dir(plan) / "logs" / f"{child.run_name.rsplit('/', 1)[-1]}.log"


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


# ---------------------------------------------------------------- its command


def train_words(plan: AblationPlan, child: Child, config_path: str | None, sets: Sequence[str]) -> list[str]:
    """``dapo train [CONFIG] --set ... [--set AXIS=V ...] --set trainer.seed=S --set trainer.run_name=R --[no-]toggle ...``.

    Resolved by ``dapo train``, these give exactly :meth:`AblationPlan.child_config`. A tracking URI's user and
    password are left out of the words (they are printed, logged and recorded): the child reads them from
    ``$MLFLOW_TRACKING_USERNAME`` / ``$MLFLOW_TRACKING_PASSWORD`` (``tracking/credentials.py``).
    """
    words = ["dapo", "train", *([config_path] if config_path else [])]
    label = f"tracking.run_label={child_label(child.variant, child.seed)}"
    axes = [f"{key}={value}" for key, value in child.variant.axes]
    for item in [*map(bare_setting, sets), *axes, f"trainer.seed={child.seed}", f"trainer.run_name={child.run_name}", label]:
        words += ["--set", item]
    words += child.variant.techniques.flags()
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


# ---------------------------------------------------------------- its outcome


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


def child_result(summary: dict[str, Any] | None) -> str:
    """``, held-out 0.312 → 0.455, run dir runs/...`` from a child's summary (empty without one)."""
    if not summary:
        return ""
    base, final = summary.get("base_val"), summary.get("final_val")
    acc = f", held-out {base:.3f} → {final:.3f}" if base is not None and final is not None else ""
    return f"{acc}, run dir {summary.get('run_dir', '?')}"
