"""``dapo ablate --dry-run``: a rough wall-time estimate of a plan from one timed RL step, and what a real
run would build first (:func:`policy_to_build`; a dry run builds nothing, so it times no step then)."""

from __future__ import annotations

import dataclasses
import math
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from dapo_cli.ablate.child import TrainFn, default_train
from dapo_cli.ablate.variants import AblationPlan

LADDER_WARM_START_S = 12 * 60 + 23
"""Measured: building ``experiments/tiny-ladder.yaml``'s warm-start (``dapo init-model``, 600 SFT steps
and the base-accuracy measurement) took 12 min 23 s on 2 cores (that file's header). A dry run scales it by
``model.tiny.sft_steps`` to say what a missing ``builtin:tiny`` would cost."""
LADDER_SFT_STEPS = 600
"""``model.tiny.sft_steps`` of that measurement."""
GGUF_IMPORT = "~1 minute"
"""What :func:`dapo_cli.models.gguf.named_model_dir` says a first import takes."""


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
    train = train or default_train()
    child = plan.children[0]
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
    return Estimate(child.variant.name, step_s, len(plan.children), plan.base.trainer.total_steps, plan.base.ablate.jobs)


def policy_to_build(cfg: Any) -> str | None:
    """What a real run would build or import before training ``cfg`` (an ablation's base config), or None
    when its policy is ready (cached, or a folder or hub id). Looks at the cache only: builds nothing."""
    from dapo_cli.models.gguf import GGUF_PREFIX, IMPORT_CARD, NAMED_GGUF, imported_dir
    from dapo_cli.models.loading import BUILTIN_MODELS, MODEL_CARD, default_cache_dir, tiny_cache_path

    spec, tiny = cfg.model.path, cfg.model.tiny
    if spec in BUILTIN_MODELS:
        path = tiny_cache_path(tiny)
        if (path / MODEL_CARD).is_file():
            return None
        minutes = LADDER_WARM_START_S * tiny.sft_steps / LADDER_SFT_STEPS / 60
        return (f"{spec} (task {tiny.task}, {tiny.sft_steps} SFT steps) is not cached yet ({path}): a real run builds it "
                f"first, about {minutes:.0f} min on 2 cores (12 min 23 s measured for the {LADDER_SFT_STEPS} steps of "
                "experiments/tiny-ladder.yaml's); dapo init-model CONFIG builds it now")
    entry = NAMED_GGUF.get(spec[len(GGUF_PREFIX):]) if spec.startswith(GGUF_PREFIX) else None
    if entry is None:
        return None
    target = imported_dir(default_cache_dir(), entry.sha256, "float32")
    if (target / IMPORT_CARD).is_file():
        return None
    return f"{spec} is not imported yet ({target}): a real run imports it first, {GGUF_IMPORT}"
