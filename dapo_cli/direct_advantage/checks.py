"""Which settings each phase of ``algo: direct-advantage`` depends on (no torch here).

:func:`phase_of_key` tells a resumed run which settings it may change: those of the phase it
restarts at and later ones, never those of phases whose stored data it reuses. The config rules
of the algorithm are in :mod:`dapo_cli.config.validate_direct_advantage`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dapo_cli.config.schema import flatten

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
    "engine.", "rollout.batch_size", "eval.", "ablate.", "cluster.",
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
