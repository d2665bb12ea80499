"""The five DAPO techniques as booleans over the config, in the paper's ablation order.

A technique is *derived* from the schema fields it controls, never stored twice:

=====================  ==============================================================
overlong_filtering     ``algorithm.overlong_filter``
clip_higher            ``algorithm.clip_ratio_high > algorithm.clip_ratio_low`` (``AlgorithmConfig.clip_higher``)
overlong_shaping       ``algorithm.overlong_buffer.enable`` (soft overlong punishment)
token_level_loss       ``algorithm.loss_agg_mode == "token-mean"`` (else seq-mean-token-mean)
dynamic_sampling       ``algorithm.filter_groups.enable``
=====================  ==============================================================
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from dapo_cli.config.schema import AlgorithmConfig, Config

TECHNIQUES = ("overlong_filtering", "clip_higher", "overlong_shaping", "token_level_loss", "dynamic_sampling")
"""In the order of the DAPO paper's Table 1 (each rung adds the next one)."""

TECHNIQUE_KEYS = (
    "algorithm.overlong_filter",
    "algorithm.clip_ratio_low",
    "algorithm.clip_ratio_high",
    "algorithm.overlong_buffer.enable",
    "algorithm.loss_agg_mode",
    "algorithm.filter_groups.enable",
)
"""The schema fields the techniques are derived from (:func:`technique_state` reads them, :func:`apply_techniques`
writes all but ``clip_ratio_low``): owned by the technique toggles."""

PAPER_CLIP_RATIO_LOW: float = AlgorithmConfig().clip_ratio_low
"""The schema's default epsilon_low (the paper's 0.2): read from ``config/schema.py``, never written again."""
PAPER_CLIP_RATIO_HIGH: float = AlgorithmConfig().clip_ratio_high
"""epsilon_high that clip-higher switches on when the config has it equal to epsilon_low: the schema's default
(the paper's 0.28), read from ``config/schema.py``, never written again."""


def technique_state(cfg: Config) -> dict[str, bool]:
    """Which techniques ``cfg`` has on."""
    algo = cfg.algorithm
    return {
        "overlong_filtering": algo.overlong_filter,
        "clip_higher": algo.clip_higher,
        "overlong_shaping": algo.overlong_buffer.enable,
        "token_level_loss": algo.loss_agg_mode == "token-mean",
        "dynamic_sampling": algo.filter_groups.enable,
    }


def apply_techniques(cfg: Config, **toggles: bool | None) -> Config:
    """Return a copy of ``cfg`` with the given techniques switched on/off (None = leave as is)."""
    unknown = set(toggles) - set(TECHNIQUES)
    if unknown:
        raise ValueError(f"unknown technique(s) {sorted(unknown)}; valid: {', '.join(TECHNIQUES)}")
    algo = cfg.algorithm
    changes: dict[str, object] = {}
    if toggles.get("overlong_filtering") is not None:
        changes["overlong_filter"] = toggles["overlong_filtering"]
    if toggles.get("clip_higher") is not None:
        on = toggles["clip_higher"]
        if not on:
            changes["clip_ratio_high"] = algo.clip_ratio_low
        elif not algo.clip_higher:
            changes["clip_ratio_high"] = PAPER_CLIP_RATIO_HIGH
    if toggles.get("overlong_shaping") is not None:
        changes["overlong_buffer"] = dataclasses.replace(algo.overlong_buffer, enable=toggles["overlong_shaping"])
    if toggles.get("token_level_loss") is not None:
        changes["loss_agg_mode"] = "token-mean" if toggles["token_level_loss"] else "seq-mean-token-mean"
    if toggles.get("dynamic_sampling") is not None:
        changes["filter_groups"] = dataclasses.replace(algo.filter_groups, enable=toggles["dynamic_sampling"])
    return dataclasses.replace(cfg, algorithm=dataclasses.replace(algo, **changes))


@dataclass(frozen=True)
class Techniques:
    """The five technique toggles as one typed object: True switches a technique on, False off, None leaves the
    config as it is. ``dapo train`` / ``dapo lint`` build it from their ``--[no-]<technique>`` flags, an ablation
    variant from its rung; :meth:`apply` writes it into a config (:func:`apply_techniques`), :meth:`of` reads a
    config's full state (:func:`technique_state`), :meth:`flags` spells it as those flags."""

    overlong_filtering: bool | None = None
    clip_higher: bool | None = None
    overlong_shaping: bool | None = None
    token_level_loss: bool | None = None
    dynamic_sampling: bool | None = None

    @classmethod
    def of(cls, cfg: Config) -> Techniques:
        """Every technique as ``cfg`` has it (none left None)."""
        return cls(**technique_state(cfg))

    def given(self, order: Sequence[str] = TECHNIQUES) -> dict[str, bool]:
        """``{technique: on}`` for the toggles that are set, in ``order`` (default: the paper's)."""
        return {name: on for name in order if (on := getattr(self, name)) is not None}

    def apply(self, cfg: Config) -> Config:
        """A copy of ``cfg`` with the set toggles written (:func:`apply_techniques`)."""
        return apply_techniques(cfg, **self.given())

    def flags(self, order: Sequence[str] = TECHNIQUES) -> list[str]:
        """The set toggles as ``dapo train`` flags, e.g. ``["--no-clip-higher"]``, in ``order``."""
        return [toggle_flag(name, on) for name, on in self.given(order).items()]


def toggle_flag(name: str, on: bool) -> str:
    """``clip_higher``, False → ``--no-clip-higher``: a technique's ``dapo train`` / ``dapo lint`` flag."""
    flag = name.replace("_", "-")
    return f"--{flag}" if on else f"--no-{flag}"


def variant_name(state: dict[str, bool]) -> str:
    """Short stable name of a technique combination, e.g. ``dapo`` / ``grpo`` / ``grpo+clip_higher``."""
    on = [t for t in TECHNIQUES if state[t]]
    if len(on) == len(TECHNIQUES):
        return "dapo"
    return "+".join(["grpo", *on])
