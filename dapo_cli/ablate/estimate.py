"""``dapo ablate --dry-run``: a rough wall-time estimate of a plan from one timed RL step."""

from __future__ import annotations

import dataclasses
import math
import tempfile
import time
from dataclasses import dataclass

from dapo_cli.ablate.plan import AblationPlan
from dapo_cli.ablate.runner import TrainFn, _run_train


@dataclass(frozen=True)
class Estimate:
    """Wall time of one calibration step (model load + one RL step + checkpoint) and the plan's rough total."""

    variant: str
    step_s: float
    children: int
    steps: int
    jobs: int = 1
    """Children trained at once (``ablate.jobs``): the children run in ``ceil(children / jobs)`` waves."""

    @property
    def total_s(self) -> float:
        """waves × steps × step time, waves = ``ceil(children / jobs)`` (children at once are assumed not to
        slow each other: true when each uses its own cores); validations and extra dynamic-sampling rounds
        are not included."""
        return math.ceil(self.children / max(1, self.jobs)) * self.steps * self.step_s


def calibrate(plan: AblationPlan, *, train: TrainFn | None = None) -> Estimate:
    """Time one RL step of the first child in a temporary dir, without validation or tracking."""
    train = train or _run_train()
    child = plan.children()[0]
    cfg = plan.child_config(child)
    with tempfile.TemporaryDirectory(prefix="dapo-calibrate-") as tmp:
        cfg = dataclasses.replace(
            cfg,
            data=dataclasses.replace(cfg.data, val_files=[]),
            trainer=dataclasses.replace(
                cfg.trainer, total_steps=1, save_freq=0, test_freq=0, log_samples_freq=0, output_dir=tmp, run_name="calibration"
            ),
            tracking=dataclasses.replace(cfg.tracking, backend="null"),
        )
        t0 = time.perf_counter()
        train(cfg, resume=False, command="dapo ablate --dry-run (calibration)", parent_run_id=None, extra_tags=None, quiet=True)
        step_s = time.perf_counter() - t0
    return Estimate(child.variant.name, step_s, len(plan.children()), plan.base.trainer.total_steps, plan.base.ablate.jobs)
