"""Config rules of ``algo: direct-advantage`` and which settings each phase depends on (no torch here).

:func:`check_config` is called by :func:`dapo_cli.config.validate.validate`; every message
names the key and the fix. :func:`phase_of_key` tells a resumed run which settings it may
change: those of the phase it restarts at and later ones, never those of phases whose stored
data it reuses.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dapo_cli.config.load import ConfigError, flatten

ALGO_DAPO = "dapo"
ALGO_DIRECT_ADVANTAGE = "direct-advantage"
LOCAL_ROLLOUT_ENGINES = ("fast", "hf")
"""Rollout engines that sample with an in-process module (the phases load one model after another)."""

PHASE_KEYS: dict[str, tuple[str, ...]] = {
    "generate": (
        "data.", "model.", "reward.", "trainer.seed", "rollout.temperature", "rollout.top_p", "rollout.top_k",
        "rollout.max_response_length", "rollout.engine", "direct_advantage.problems",
        "direct_advantage.samples_per_problem", "direct_advantage.chosen_per_problem",
    ),
    "mc_values": (
        "direct_advantage.mc_completions", "direct_advantage.completer", "direct_advantage.step_delimiter",
        "direct_advantage.max_states_per_solution",
    ),
    "critic": (
        "direct_advantage.critic_", "direct_advantage.weight_decay", "trainer.grad_clip",
        "direct_advantage.terminal_value",  # also decides whether the critic learns finished solutions
    ),
    "advantages": ("direct_advantage.min_gap",),
    "actor": ("direct_advantage.beta", "direct_advantage.actor_"),
    "evaluate": ("validation.", "direct_advantage.validate_sampled"),
}
"""Dotted-key prefixes of the settings each stage reads (the longest matching prefix wins)."""

FREE_KEYS: tuple[str, ...] = (
    "tracking.", "trainer.output_dir", "trainer.run_name", "direct_advantage.iterations", "direct_advantage.expected_steps",
    "engine.", "rollout.batch_size", "eval.", "ablate.",
)
"""Settings that change no stored result (where it is recorded, how fast, how many iterations)."""


def phase_of_key(key: str) -> str | None:
    """The stage whose stored data depend on setting ``key`` (None: a free setting). Unknown keys
    count as ``generate`` (the strictest)."""
    if any(key == k or (k.endswith(".") and key.startswith(k)) for k in FREE_KEYS):
        return None
    best, length = "generate", -1
    for stage, prefixes in PHASE_KEYS.items():
        for p in prefixes:
            hit = key.startswith(p) if p.endswith((".", "_")) else key == p
            if hit and len(p) > length:
                best, length = stage, len(p)
    return best


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def non_default(section: Any, prefix: str) -> list[str]:
    """``key=value`` for every leaf of ``section`` that differs from its schema default."""
    default = flatten(type(section)())
    current = flatten(section)
    return [f"{prefix}.{k}={current[k]!r}" for k in current if current[k] != default[k]]


def check_config(cfg: Any) -> None:
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


def settings_changed(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Dotted keys whose values differ between two flattened configs."""
    keys = sorted(set(saved) | set(current))
    return [k for k in keys if saved.get(k) != current.get(k)]


def flat_dict(cfg: Any) -> dict[str, Any]:
    """A config (dataclass) or its nested-dict dump, flattened to dotted keys."""
    if dataclasses.is_dataclass(cfg):
        return flatten(cfg)
    out: dict[str, Any] = {}

    def walk(node: dict[str, Any], prefix: str) -> None:
        for k, v in node.items():
            dotted = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict):
                walk(v, dotted)
            else:
                out[dotted] = v

    walk(cfg, "")
    return out
