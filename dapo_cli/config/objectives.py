"""Which settings each policy loss and each rollout correction reads, resolved in one place.

Each loss has its own paper's defaults, in its own section of the schema (``config/schema.py``): DAPO's clip is
``algorithm.clip_ratio_low`` / ``clip_ratio_high`` / ``clip_ratio_c`` (0.2 / 0.28 / off), GSPO's is
``algorithm.gspo.*`` (3e-4 / 4e-4), CISPO's ``algorithm.cispo.*`` (no lower bound / 3.0), GMPO's ``algorithm.gmpo.*``
(0.4 / 0.4 in log space). :data:`LOSS_SETTINGS` lists
the keys each reads; :func:`loss_args` turns them into the keyword arguments of its function in
:mod:`dapo_cli.algo.objectives` (a key's last part is the argument's name). The rollout corrections of
``algorithm.rollout_is.mode`` the same way (:data:`CORRECTION_SETTINGS`, :func:`correction_args`).
``loss_agg_mode`` and the global counts apply to every loss and are passed by the update.

:func:`ignored_settings` is what ``dapo lint`` reports (rule ``setting-ignored``): a key set away from its default
that the chosen loss or correction does not read.
"""

from __future__ import annotations

from typing import Any

from dapo_cli.config.schema import Config, behaviour_correction, flatten

LOSS_SETTINGS: dict[str, tuple[str, ...]] = {
    "dapo": ("algorithm.clip_ratio_low", "algorithm.clip_ratio_high", "algorithm.clip_ratio_c"),
    "gspo": ("algorithm.gspo.clip_ratio_low", "algorithm.gspo.clip_ratio_high"),
    "cispo": ("algorithm.cispo.clip_ratio_low", "algorithm.cispo.clip_ratio_high"),
    "gmpo": ("algorithm.gmpo.log_clip_low", "algorithm.gmpo.log_clip_high"),
}
"""``algorithm.policy_loss`` → the keys its function reads."""

SEQUENCE_MEAN_LOSSES: tuple[str, ...] = ("gspo", "gmpo")
"""Losses whose paper's objective is a mean over responses of one term each: ``loss_agg_mode:
seq-mean-token-mean`` is that objective, the other modes weight each response's term by its length."""

CORRECTION_SETTINGS: dict[str, tuple[str, ...]] = {
    "token_tis": ("algorithm.rollout_is.cap",),
    "seq_tis": ("algorithm.rollout_is.cap",),
    "geo_mask": ("algorithm.rollout_is.geo_bound",),
    "opsm": ("algorithm.rollout_is.opsm_delta",),
}
"""``algorithm.rollout_is.mode`` → the keys its correction reads."""


def _args(cfg: Config, keys: tuple[str, ...]) -> dict[str, Any]:
    """``{last part of key: value}`` for dotted ``keys`` of ``cfg`` (read once a run, when its objective is built)."""
    out = {}
    for key in keys:
        node: Any = cfg
        for part in key.split("."):
            node = getattr(node, part)
        out[key.rsplit(".", 1)[1]] = node
    return out


def loss_args(cfg: Config) -> dict[str, Any]:
    """The chosen policy loss's own keyword arguments, e.g. ``{"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4}`` for gspo."""
    return _args(cfg, LOSS_SETTINGS[cfg.algorithm.policy_loss])


def correction_args(cfg: Config) -> dict[str, Any]:
    """The chosen rollout correction's own keyword arguments, e.g. ``{"cap": 2.0}`` for token_tis."""
    return _args(cfg, CORRECTION_SETTINGS[cfg.algorithm.rollout_is.mode])


def ignored_settings(cfg: Config) -> list[tuple[str, str, str]]:
    """``(key, why, fix)`` for each loss or correction setting away from its default that this config's choices do
    not read."""
    values, defaults = flatten(cfg), flatten(Config())
    loss, mode = cfg.algorithm.policy_loss, cfg.algorithm.rollout_is.mode
    off = ("no rollout correction runs (algorithm.rollout_is.enable=false, rollout.max_staleness=0)",
           "set algorithm.rollout_is.enable=true for it to act, or drop it")
    out = []
    for name, keys in LOSS_SETTINGS.items():
        for key in keys:
            if key not in LOSS_SETTINGS[loss] and values[key] != defaults[key]:
                out.append((key, f"algorithm.policy_loss={loss} does not read it ({name}'s setting)",
                            f"drop it, or set algorithm.policy_loss={name}"))
    corrected = behaviour_correction(cfg)
    if not corrected and mode != defaults["algorithm.rollout_is.mode"]:
        out.append(("algorithm.rollout_is.mode", *off))
    for key in dict.fromkeys(k for keys in CORRECTION_SETTINGS.values() for k in keys):
        if values[key] == defaults[key]:
            continue
        if not corrected:
            out.append((key, *off))
        elif key not in CORRECTION_SETTINGS[mode]:
            users = [m for m, keys in CORRECTION_SETTINGS.items() if key in keys]
            out.append((key, f"algorithm.rollout_is.mode={mode} does not read it ({' and '.join(users)} do)",
                        f"drop it, or set algorithm.rollout_is.mode={users[0]}"))
    return out
