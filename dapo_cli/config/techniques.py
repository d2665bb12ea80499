"""The five DAPO techniques: one :class:`Technique` row each (:data:`TECHNIQUE_TABLE`), in the paper's ablation order.

A technique is *derived* from the schema fields it controls, never stored twice:

=====================  ==============================================================
overlong_filtering     ``algorithm.overlong_filter``
clip_higher            ``algorithm.clip_ratio_high > algorithm.clip_ratio_low`` (``AlgorithmConfig.clip_higher``)
overlong_shaping       ``algorithm.overlong_buffer.enable`` (soft overlong punishment)
token_level_loss       ``algorithm.loss_agg_mode == "token-mean"`` (else seq-mean-token-mean)
dynamic_sampling       ``algorithm.filter_groups.enable``
=====================  ==============================================================

Everything else the code says about a technique is in its row too: the ``dapo train`` / ``dapo lint`` flag and its
help, the keys it owns, the ladder rung that adds it (the paper's Table 1 label and AIME 2024 avg@32, the MLflow run
label, the abbreviation of grid labels), the function that implements it, the metric that shows it acting, its row
in ``docs/dapo.md`` and what ``dapo lint`` says when it is off. The CLI, :func:`apply_techniques`, lint, the
ablation plan and its report read the table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dapo_cli.config.schema import AlgorithmConfig, Config

PAPER_CLIP_RATIO_LOW: float = AlgorithmConfig().clip_ratio_low
"""The schema's default epsilon_low (the paper's 0.2): read from ``config/schema.py``, never written again."""
PAPER_CLIP_RATIO_HIGH: float = AlgorithmConfig().clip_ratio_high
"""epsilon_high that clip-higher switches on when the config has it equal to epsilon_low: the schema's default
(the paper's 0.28), read from ``config/schema.py``, never written again."""


def _clip_higher(algo: AlgorithmConfig, on: bool) -> dict[str, object]:
    """Off: epsilon_high = epsilon_low; on: the paper's epsilon_high when the config had none above epsilon_low."""
    if not on:
        return {"clip_ratio_high": algo.clip_ratio_low}
    return {} if algo.clip_higher else {"clip_ratio_high": PAPER_CLIP_RATIO_HIGH}


@dataclass(frozen=True)
class Technique:
    """One DAPO technique, everything the code says about it."""

    name: str
    help: str
    """The ``--[no-]<flag>`` help of ``dapo train`` and ``dapo lint``."""
    keys: tuple[str, ...]
    """The schema fields it is derived from (owned by the toggles: ``--axis`` may not vary them)."""
    is_on: Callable[[AlgorithmConfig], bool]
    changes: Callable[[AlgorithmConfig, bool], dict[str, object]]
    """The ``AlgorithmConfig`` fields to replace to switch it on (True) or off (False)."""
    label: str
    """The paper's Table 1 row of the ladder rung that adds it."""
    paper: float
    """That rung's AIME 2024 avg@32 in the paper (Qwen2.5-32B), a reference column only."""
    short: str
    """That rung's MLflow run label (the UI cuts names at ~16 characters)."""
    abbreviation: str
    """Its part of a grid variant's run label (``grpo+ch+ds``)."""
    implementation: str
    """The function that implements it (dotted, under ``dapo_cli``)."""
    metric: str
    """The logged metric that shows it acting (``docs/dapo.md`` lists the others)."""
    doc: str
    """Its row in the paper-to-code map."""
    lint_key: str = ""
    """The key ``dapo lint``'s ``technique-off`` finding names ("": not warned when off; the paper's best run does
    without overlong filtering)."""
    lint_on: str = ""
    """The value of :attr:`lint_key` that switches it on, in the finding's fix."""
    lint_off: str = ""
    """What that finding says is lost with it off."""

    @property
    def flag(self) -> str:
        """``clip-higher``: the toggle's name on the command line."""
        return self.name.replace("_", "-")


TECHNIQUE_TABLE: tuple[Technique, ...] = (
    Technique(
        "overlong_filtering", "Drop truncated responses from the loss", ("algorithm.overlong_filter",),
        is_on=lambda a: a.overlong_filter, changes=lambda a, on: {"overlong_filter": on},
        label="+ Overlong Filtering", paper=36.0, short="+OverlongFilter", abbreviation="of",
        implementation="algo.overlong.overlong_filter_mask", metric="overlong/filtered_frac", doc="docs/dapo.md#overlong-filtering",
    ),
    Technique(
        "clip_higher", f"Decoupled clip: epsilon_high {PAPER_CLIP_RATIO_HIGH} vs = epsilon_low",
        ("algorithm.clip_ratio_low", "algorithm.clip_ratio_high"),
        is_on=lambda a: a.clip_higher, changes=_clip_higher,
        label="+ Clip-Higher", paper=38.0, short="+ClipHigher", abbreviation="ch",
        implementation="algo.losses.dapo_loss", metric="actor/clipfrac_high", doc="docs/dapo.md#clip-higher",
        lint_key="algorithm.clip_ratio_high", lint_on=str(PAPER_CLIP_RATIO_HIGH),
        lint_off="clip-higher is off (epsilon_high = epsilon_low); DAPO raises epsilon_high to keep the entropy from collapsing (paper §3.1)",
    ),
    Technique(
        "overlong_shaping", "Soft overlong punishment (Eq. 13)", ("algorithm.overlong_buffer.enable",),
        is_on=lambda a: a.overlong_buffer.enable,
        changes=lambda a, on: {"overlong_buffer": dataclasses.replace(a.overlong_buffer, enable=on)},
        label="+ Soft Overlong Punishment", paper=41.0, short="+SoftPunish", abbreviation="sop",
        implementation="algo.overlong.overlong_penalty", metric="reward/shaped_mean", doc="docs/dapo.md#soft-overlong-punishment",
        lint_key="algorithm.overlong_buffer.enable", lint_on="true",
        lint_off="the soft overlong punishment is off: responses near the length limit get no length signal (paper §3.4)",
    ),
    Technique(
        "token_level_loss", "token-mean vs seq-mean-token-mean aggregation", ("algorithm.loss_agg_mode",),
        is_on=lambda a: a.loss_agg_mode == "token-mean",
        changes=lambda a, on: {"loss_agg_mode": "token-mean" if on else "seq-mean-token-mean"},
        label="+ Token-level Loss", paper=42.0, short="+TokenLoss", abbreviation="tll",
        implementation="algo.losses.aggregate_loss", metric="response_length/group_std_mean", doc="docs/dapo.md#token-level-loss",
        lint_key="algorithm.loss_agg_mode", lint_on="token-mean",
        lint_off="the loss is aggregated per sequence, not DAPO's token-level loss: tokens of long responses weigh less (paper §3.3)",
    ),
    Technique(
        "dynamic_sampling", "Keep only groups with mixed accuracy, resample to fill", ("algorithm.filter_groups.enable",),
        is_on=lambda a: a.filter_groups.enable,
        changes=lambda a, on: {"filter_groups": dataclasses.replace(a.filter_groups, enable=on)},
        label="+ Dynamic Sampling (DAPO)", paper=50.0, short="DAPO", abbreviation="ds",
        implementation="algo.sampling.GroupBatchAssembler", metric="train/kept_group_frac", doc="docs/dapo.md#dynamic-sampling",
        lint_key="algorithm.filter_groups.enable", lint_on="true",
        lint_off="dynamic sampling is off: all-correct and all-wrong groups have zero advantage and shrink the effective batch (paper §3.2)",
    ),
)
"""The five techniques in the order of the DAPO paper's Table 1 (each rung adds the next one)."""

TECHNIQUE_BY_NAME: dict[str, Technique] = {t.name: t for t in TECHNIQUE_TABLE}

TECHNIQUES: tuple[str, ...] = tuple(t.name for t in TECHNIQUE_TABLE)
"""The names, in the order of the DAPO paper's Table 1."""

TECHNIQUE_KEYS: tuple[str, ...] = tuple(k for t in TECHNIQUE_TABLE for k in t.keys)
"""The schema fields the techniques are derived from (:func:`technique_state` reads them, :func:`apply_techniques`
writes all but ``clip_ratio_low``): owned by the technique toggles."""

CLI_ORDER: tuple[str, ...] = ("clip_higher", "dynamic_sampling", "token_level_loss", "overlong_shaping", "overlong_filtering")
"""The order `dapo train` and `dapo lint` declare the toggles in (their --help's: the paper's title techniques
first), which a recorded command line and a message listing the given toggles follow."""

BASELINE_LABEL, BASELINE_SHORT, BASELINE_PAPER = "Naive GRPO", "GRPO", 30.0
"""The ladder's first rung, every technique off: its Table 1 row, run label and AIME 2024 avg@32."""


def technique_state(cfg: Config) -> dict[str, bool]:
    """Which techniques ``cfg`` has on."""
    return {t.name: t.is_on(cfg.algorithm) for t in TECHNIQUE_TABLE}


def apply_techniques(cfg: Config, **toggles: bool | None) -> Config:
    """Return a copy of ``cfg`` with the given techniques switched on/off (None = leave as is)."""
    unknown = set(toggles) - set(TECHNIQUES)
    if unknown:
        raise ValueError(f"unknown technique(s) {sorted(unknown)}; valid: {', '.join(TECHNIQUES)}")
    algo = cfg.algorithm
    changes: dict[str, object] = {}
    for t in TECHNIQUE_TABLE:
        if toggles.get(t.name) is not None:
            changes.update(t.changes(algo, bool(toggles[t.name])))
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
