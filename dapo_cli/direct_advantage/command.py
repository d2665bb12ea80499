"""The ``dapo train`` side of ``algo: direct-advantage``: option checks, dry-run plan, the run."""

from __future__ import annotations

import os
import shlex
from typing import Any

from dapo_cli.direct_advantage.checks import ALGO_DAPO, ALGO_DIRECT_ADVANTAGE
from dapo_cli.errors import UserError

ALGOS = (ALGO_DAPO, ALGO_DIRECT_ADVANTAGE)


def algo_overrides(sets: list[str] | None, algo: str | None, iterations: int | None, toggles: dict[str, bool | None]) -> list[str]:
    """``--algo`` and ``--iterations`` as ``--set`` overrides (applied after the YAML, validated with it)."""
    if algo is not None and algo not in ALGOS:
        raise UserError(f"--algo {algo}: unknown algorithm; valid: {', '.join(ALGOS)}")
    used = [f"--{k}" if v else f"--no-{k}" for k, v in toggles.items() if v is not None]
    if algo == ALGO_DIRECT_ADVANTAGE and used:
        raise UserError(f"{', '.join(used)}: DAPO technique toggles do not apply to --algo direct-advantage; drop them")
    out = list(sets or [])
    if algo is not None:
        out.append(f"algo={algo}")
    if iterations is not None:
        if iterations < 1:
            raise UserError(f"--iterations {iterations} must be >= 1")
        out.append(f"direct_advantage.iterations={iterations}")
    return out


def train_direct_advantage(
    cfg: Any, *, config: str | None, sets: list[str] | None, resume: bool, from_phase: str | None, dry_run: bool,
    plan_options: dict[str, Any],
) -> None:
    if cfg.algo != ALGO_DIRECT_ADVANTAGE:
        raise UserError("--from-phase only works with algo: direct-advantage (DAPO runs resume from checkpoints with --resume)")
    cluster = [k for k in ("--world-size", "--gpus-per-node", "--gpu-memory-gib") if plan_options.get(k) is not None]
    if cluster:
        raise UserError(f"{', '.join(cluster)}: the cluster plan is DAPO's; --algo direct-advantage --dry-run prints generation counts")
    if dry_run:
        if plan_options.get("--yaml"):
            from dapo_cli.config import dump_yaml

            print(dump_yaml(cfg), end="")
            return
        from dapo_cli.direct_advantage.plan import make_plan, render

        render(make_plan(cfg, config_name=config or "experiments/tiny.yaml (embedded)"), as_json=bool(plan_options.get("--json")))
        return
    used = [k for k in ("--json", "--yaml") if plan_options.get(k)]
    if used:
        raise UserError(f"{', '.join(used)} only work with --dry-run (add --dry-run, or drop them)")
    if resume and from_phase is not None:
        raise UserError("--resume and --from-phase: give one (--from-phase already continues the run)")
    from dapo_cli.tracking.tags import extra_tags_from_env
    from dapo_cli.direct_advantage.launch import run_direct_advantage
    from dapo_cli.tracking import PARENT_RUN_ENV

    words = ["dapo", "train", *([config] if config else [])]
    for item in sets or ():
        words += ["--set", item]
    if resume:
        words.append("--resume")
    if from_phase:
        words += ["--from-phase", from_phase]
    run_direct_advantage(
        cfg, resume=resume, from_phase=from_phase, command=shlex.join(words),
        parent_run_id=os.environ.get(PARENT_RUN_ENV) or None, extra_tags=extra_tags_from_env(),
    )
