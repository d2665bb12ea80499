"""Config rules of ``algo: direct-advantage`` (values only: no torch, no files, no packages).

:func:`check_direct_advantage` is called by :func:`dapo_cli.config.validate.validate` for every
config; every message names the key and the fix.
"""

from __future__ import annotations

from typing import Any

from dapo_cli.config.schema import ALGO_DIRECT_ADVANTAGE, LOCAL_ROLLOUT_ENGINES, Config, flatten, require


def non_default(section: Any, prefix: str) -> list[str]:
    """``key=value`` for every leaf of ``section`` that differs from its schema default."""
    default = flatten(type(section)())
    current = flatten(section)
    return [f"{prefix}.{k}={current[k]!r}" for k in current if current[k] != default[k]]


def check_direct_advantage(cfg: Config) -> None:
    """Rules for ``algo`` and the ``direct_advantage`` section (called for every config)."""
    if cfg.algo != ALGO_DIRECT_ADVANTAGE:
        changed = non_default(cfg.direct_advantage, "direct_advantage")
        require(
            not changed,
            f"{changed[0] if changed else ''} is a direct-advantage setting but algo={cfg.algo}; "
            "set algo: direct-advantage (or --algo direct-advantage), or remove the direct_advantage section",
        )
        return
    changed = non_default(cfg.algorithm, "algorithm")
    require(
        not changed,
        f"algo: direct-advantage does not use the DAPO algorithm section, but it sets {', '.join(changed[:3])}"
        f"{' ...' if len(changed) > 3 else ''}; remove the algorithm section (experiments/tiny-direct-advantage.yaml "
        "is a starting point) or train with algo: dapo",
    )
    da = cfg.direct_advantage
    require(da.iterations >= 1, f"direct_advantage.iterations={da.iterations} must be >= 1")
    require(da.problems >= 0, f"direct_advantage.problems={da.problems} must be >= 0 (0: every training problem)")
    require(da.samples_per_problem >= 1, f"direct_advantage.samples_per_problem={da.samples_per_problem} must be >= 1 (paper: 32)")
    require(
        1 <= da.chosen_per_problem <= da.samples_per_problem,
        f"direct_advantage.chosen_per_problem={da.chosen_per_problem} must be in 1..samples_per_problem={da.samples_per_problem} (paper: 6 of 32)",
    )
    require(da.mc_completions >= 1, f"direct_advantage.mc_completions={da.mc_completions} must be >= 1 (paper: 16)")
    require(bool(da.step_delimiter), "direct_advantage.step_delimiter is empty; give the text that ends a step, e.g. \"\\n\"")
    require(da.max_states_per_solution >= 0, "direct_advantage.max_states_per_solution must be >= 0 (0: every prefix)")
    for name in ("critic_lr", "actor_lr", "beta"):
        require(getattr(da, name) > 0, f"direct_advantage.{name}={getattr(da, name)} must be > 0")
    for name in ("critic_epochs", "critic_batch_size", "critic_micro_batch_size", "actor_epochs", "actor_batch_states", "actor_micro_batch_size"):
        require(getattr(da, name) >= 1, f"direct_advantage.{name}={getattr(da, name)} must be >= 1")
    require(0.0 <= da.critic_holdout < 1.0, f"direct_advantage.critic_holdout={da.critic_holdout} must be in [0, 1)")
    require(da.min_gap >= 0.0, f"direct_advantage.min_gap={da.min_gap} must be >= 0 (paper: 0.1)")
    require(da.weight_decay >= 0.0, f"direct_advantage.weight_decay={da.weight_decay} must be >= 0")
    require(da.expected_steps >= 0, "direct_advantage.expected_steps must be >= 0 (0: a table over several step counts)")
    require(
        cfg.engine.name == "torch",
        f"algo: direct-advantage runs on the torch engine (one process); engine.name={cfg.engine.name} is not supported yet",
    )
    require(
        cfg.rollout.engine in LOCAL_ROLLOUT_ENGINES,
        f"algo: direct-advantage samples in-process (rollout.engine: {' or '.join(LOCAL_ROLLOUT_ENGINES)}); "
        f"rollout.engine={cfg.rollout.engine} is not supported yet",
    )
