"""What an ablation runs: variants (technique states) × seeds, named deterministically. Pure.

Two modes, a registry keyed by name (:data:`MODES`):

* ``ladder``: the cumulative progression of the DAPO paper's Table 1 (Yu et al. 2025,
  arXiv:2503.14476), one variant per rung, each adding the next technique of
  :data:`~dapo_cli.config.techniques.TECHNIQUES`::

      rung 0  Naive GRPO                      every technique off            AIME24 avg@32 30
      rung 1  + Overlong Filtering                                                        36
      rung 2  + Clip-Higher                   ε_high 0.28 vs ε_low 0.2                    38
      rung 3  + Soft Overlong Punishment      Eq. 13                                      41
      rung 4  + Token-level Loss              Eq. 12 (token-mean)                         42
      rung 5  + Dynamic Sampling (DAPO)       Eq. 11                                      50

* ``grid``: the full factorial :math:`\\{0,1\\}^m` of ``m`` chosen techniques (all five:
  32 variants); the others stay as in the config.

Either mode takes extra *axes* (``--axis rollout.max_staleness=0,1``, :class:`~dapo_cli.ablate.axes.Axis`,
parsed and named in :mod:`dapo_cli.ablate.axes`): config settings beside the techniques, each multiplying the
variants (technique-major: every value of the axes at one technique state before the next state). An axis
variant is named by its technique state and its settings, ``dapo@max_staleness=1``; variants without axes keep
their plain names.

A variant's name is :func:`~dapo_cli.config.techniques.variant_name` of the technique
state its config really has, so a variant is named by what it trains, not by how it
was asked for. The ablation id hashes the resolved config, the mode and the variants, not the seeds
(:func:`ablation_id`): rerunning the same command, or the same with more seeds, finds the same MLflow parent and
run dirs.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dapo_cli.ablate.axes import Axis, axis_suffix, split_axes
from dapo_cli.config import TECHNIQUES, Config, flatten, technique_state
from dapo_cli.config.load import from_dict, override_config
from dapo_cli.config.schema import PLANNING_SECTIONS, ConfigError
from dapo_cli.config.versions import before_value, declaration, split_version, upgrade
from dapo_cli.config.techniques import (
    BASELINE_LABEL,
    BASELINE_PAPER,
    BASELINE_SHORT,
    TECHNIQUE_TABLE,
    Techniques,
    variant_name,
)
from dapo_cli.config.validate import validate
from dapo_cli.errors import UserError

if TYPE_CHECKING:
    from dapo_cli.ablate.sequential import Setup

MAX_CHILDREN = 2000
"""The most children one ablation may plan (variants x axis combinations x seeds, counted before any is built:
each child's config is validated in ~8 ms, and a billion seeds once took the planner past 5 GB)."""
LADDER_LABELS = (BASELINE_LABEL, *(t.label for t in TECHNIQUE_TABLE))
"""Row names of the DAPO paper's Table 1, rung ``i`` switching on ``TECHNIQUES[:i]`` (from the technique table)."""

LADDER_SHORT = (BASELINE_SHORT, *(t.short for t in TECHNIQUE_TABLE))
"""The rungs as MLflow run labels: distinct within their first few characters (the UI's run list
and chart legends cut names at about 16)."""

PAPER_AIME24_AVG32 = (BASELINE_PAPER, *(t.paper for t in TECHNIQUE_TABLE))
"""AIME 2024 avg@32 (%) of each rung in the paper's Table 1 (Qwen2.5-32B): a reference column only."""

LADDER_NAMES = tuple(variant_name({t: j < i for j, t in enumerate(TECHNIQUES)}) for i in range(len(TECHNIQUES) + 1))
"""Variant names of the ladder rungs: ``grpo``, ``grpo+overlong_filtering``, ..., ``dapo``."""

SAFE_COMPONENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+@=-]*$")
"""A run-name path component: no separators, no leading dot (so never ``.`` or ``..``), no spaces
(``@`` and ``=`` only come from axis settings: ``dapo@max_staleness=1``)."""

@dataclass(frozen=True)
class Variant:
    """One technique combination: ``toggles`` are what the ablation sets (the rest is the config's)."""

    name: str
    label: str
    """The paper's Table 1 row when the state is a ladder rung (``Naive GRPO``, ``+ Clip-Higher``, ...), else ``""``."""
    toggles: tuple[tuple[str, bool], ...]
    state: tuple[tuple[str, bool], ...]
    """The full technique state of the variant's config, in :data:`TECHNIQUES` order."""
    paper: float | None = None
    """The paper's AIME 2024 avg@32 when the state is a ladder rung, else None."""
    axes: tuple[tuple[str, str], ...] = ()
    """The axis settings of this variant, ``(key, value)`` as ``--set key=value`` spells it, in the axes' order."""

    @property
    def techniques(self) -> Techniques:
        """``toggles`` as the one typed toggle object (the rest None: as in the config)."""
        return Techniques(**dict(self.toggles))

    def toggle_dict(self) -> dict[str, bool]:
        return self.techniques.given()


@dataclass(frozen=True)
class Child:
    """One training run of the ablation: ``variant`` with ``seed``; ``index`` = position of the variant."""

    variant: Variant
    seed: int
    index: int
    run_name: str


@dataclass(frozen=True)
class AblationPlan:
    """The resolved base config and the variants × seeds to train on it."""

    mode: str
    base: Config
    techniques: tuple[str, ...]
    """The techniques the variants set (ladder: all five)."""
    variants: tuple[Variant, ...]
    seeds: tuple[int, ...]
    ablation_id: str
    name: str
    axes: tuple[Axis, ...] = ()
    wave: frozenset[str] | None = None
    """``--seeds auto``: the variants this wave trains beyond the seeds they already have (None: every variant);
    the ablation id and report keep every variant."""
    wave_from: int = 0
    """With :attr:`wave`: seeds below this index are trained for every variant."""
    sequential: Setup | None = None
    """``--seeds auto``: the rule's setup, recorded on the parent (``ablate.sequential``) so a report replays the waves."""

    @functools.cached_property
    def children(self) -> tuple[Child, ...]:
        """Seed-major order: a complete ladder for the first seed before any second seed (computed once per plan)."""
        return tuple(
            Child(v, seed, i, child_run_name(self.name, v.name, seed))
            for j, seed in enumerate(self.seeds)
            for i, v in enumerate(self.variants)
            if self.wave is None or j < self.wave_from or v.name in self.wave
        )

    def child_config(self, child: Child) -> Config:
        """The base config with the variant's toggles and axis settings, the child's seed and run name; validated."""
        cfg = child.variant.techniques.apply(self.base)
        cfg = override_config(cfg, [f"{key}={value}" for key, value in child.variant.axes])
        cfg = dataclasses.replace(
            cfg,
            trainer=dataclasses.replace(cfg.trainer, seed=child.seed, run_name=child.run_name),
            tracking=dataclasses.replace(cfg.tracking, run_label=child_label(child.variant, child.seed)),
        )
        try:
            validate(cfg)
        except UserError as exc:
            raise UserError(f"variant {child.variant.name}: {exc}") from None
        return cfg


# ---------------------------------------------------------------- variants


def _variant(base: Config, toggles: dict[str, bool]) -> Variant:
    techniques = Techniques(**toggles)
    state = technique_state(techniques.apply(base))
    name = variant_name(state)
    rung = LADDER_NAMES.index(name) if name in LADDER_NAMES else None
    return Variant(
        name=name,
        label=LADDER_LABELS[rung] if rung is not None else "",
        toggles=tuple(techniques.given().items()),
        state=tuple((t, state[t]) for t in TECHNIQUES),
        paper=PAPER_AIME24_AVG32[rung] if rung is not None else None,
    )


def ladder_variants(base: Config, techniques: Sequence[str]) -> list[Variant]:
    """Rung ``i`` (0..5) has exactly ``TECHNIQUES[:i]`` on; ``techniques`` must be all five."""
    if tuple(techniques) != TECHNIQUES:
        raise UserError("the ladder always adds all five techniques in the paper's order; use --grid for a subset")
    return [_variant(base, {t: j < i for j, t in enumerate(TECHNIQUES)}) for i in range(len(TECHNIQUES) + 1)]


def grid_variants(base: Config, techniques: Sequence[str]) -> list[Variant]:
    """Every on/off combination of ``techniques`` (2^m variants); fewest techniques first, then ladder order."""
    combos = itertools.product((False, True), repeat=len(techniques))
    ordered = sorted(combos, key=lambda on: (sum(on), [not x for x in on]))
    return [_variant(base, dict(zip(techniques, on))) for on in ordered]


MODES: dict[str, Callable[[Config, Sequence[str]], list[Variant]]] = {"ladder": ladder_variants, "grid": grid_variants}
"""Ablation modes by name."""


# ---------------------------------------------------------------- axes


def axes_text(plan: AblationPlan) -> str:
    """``rollout.max_staleness=0,1`` (``;`` between axes): the parent's ``ablate.axes`` tag."""
    return ";".join(f"{a.key}={','.join(a.values)}" for a in plan.axes)


def with_axes(variants: Sequence[Variant], axes: Sequence[Axis]) -> list[Variant]:
    """Every variant × every combination of the axes' values, technique-major; no axes: ``variants`` as they are."""
    if not axes:
        return list(variants)
    combos = list(itertools.product(*(a.values for a in axes)))
    return [
        dataclasses.replace(
            v,
            name=v.name + axis_suffix([(a.short, value) for a, value in zip(axes, combo)]),
            axes=tuple((a.key, value) for a, value in zip(axes, combo)),
        )
        for v in variants
        for combo in combos
    ]


def parse_techniques(text: str | None) -> tuple[str, ...]:
    """``"clip_higher,dynamic_sampling"`` → those names in :data:`TECHNIQUES` order; None or ``all`` → all five."""
    if text is None or text.strip().lower() in ("", "all"):
        return TECHNIQUES
    names = [n.strip().replace("-", "_") for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in TECHNIQUES]
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], TECHNIQUES, n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'? " if close else ""
        quoted = ", ".join(f"'{n}'" for n in unknown)
        raise UserError(f"unknown technique{'s' if len(unknown) > 1 else ''} {quoted}; {hint}valid: {', '.join(TECHNIQUES)}")
    if not names:
        raise UserError(f"no technique named in '{text}'; give a comma-separated list of: {', '.join(TECHNIQUES)}")
    return tuple(t for t in TECHNIQUES if t in names)


def select_variants(variants: Sequence[Variant], only: Sequence[str], skip: Sequence[str]) -> list[Variant]:
    """Keep the ``only`` names (all when empty), then drop the ``skip`` names; unknown names are errors."""
    valid = [v.name for v in variants]
    unknown = [n for n in [*only, *skip] if n not in valid]
    if unknown:
        raise UserError(f"unknown variant(s) {', '.join(unknown)}; this plan has: {', '.join(valid)}")
    chosen = [v for v in variants if (not only or v.name in only) and v.name not in skip]
    if not chosen:
        raise UserError("--only/--skip left no variant to run")
    return chosen


# ---------------------------------------------------------------- names and ids


def config_hash(cfg: Config) -> str:
    """SHA-256 (16 hex) of the resolved config without its ``ablate`` section (launcher and seeds enter separately),
    the planning-only sections (:data:`~dapo_cli.config.schema.PLANNING_SECTIONS`, which train nothing) and every
    key added to the schema (:data:`~dapo_cli.config.versions.ADDED_KEYS`) that is at the value doing what dapo
    did before it: a key the schema gains later at such a value leaves the hash, and so the ablation id, as it was."""
    defaults = flatten(Config())
    data = {
        key: value for key, value in flatten(cfg).items()
        if key.split(".")[0] != "ablate" and key.split(".")[0] not in PLANNING_SECTIONS
        and (declaration(key) is None or value != before_value(key, defaults))
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def same_base(saved: Any, cfg: Config) -> bool:
    """True when ``saved`` (a base config as YAML loads it, maybe written by an older dapo) is ``cfg``'s: read as
    this schema reads it (:func:`~dapo_cli.config.versions.upgrade`: each key it lacks at the value doing what
    that dapo did, none left unfilled), it has ``cfg``'s :func:`config_hash`."""
    try:
        version, data = split_version(saved)
        upgraded, _, missing = upgrade(data, version)
        older = from_dict(Config, upgraded)
    except ConfigError:  # a key this schema no longer has, a newer dapo's config
        return False
    relevant = [k for k in missing if k.split(".")[0] != "ablate" and k.split(".")[0] not in PLANNING_SECTIONS]
    return not relevant and config_hash(older) == config_hash(cfg)


def ablation_id(cfg: Config, mode: str, variants: Sequence[Variant]) -> str:
    """SHA-256 (12 hex) of config hash + mode + variant names: the key of the MLflow parent run.

    The seeds are not in it: ``--seeds 5`` after ``--seeds 3`` finds the same parent (the base seed
    ``trainer.seed`` is in the config hash), skips the finished seeds and trains the new ones."""
    payload = json.dumps([config_hash(cfg), mode, [v.name for v in variants]])
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def safe_component(text: str) -> str:
    """``text`` with every character outside ``[A-Za-z0-9._+-]`` replaced by ``-`` (a safe path component)."""
    out = re.sub(r"[^A-Za-z0-9._+-]+", "-", text).strip("-.")
    return out or "ablation"


TECHNIQUE_ABBREVIATIONS = {t.name: t.abbreviation for t in TECHNIQUE_TABLE}
"""Short names for MLflow run labels: a UI column or chart legend shows ~16 characters."""


def short_variant(name: str) -> str:
    """A variant name in a few characters: the ladder rung (``GRPO``, ``+ClipHigher``, ``DAPO``) or the
    techniques abbreviated (``grpo+ch+ds``), then any axis settings with their keys abbreviated (``DAPO@ms=1``)."""
    techniques, settings = split_axes(name)
    if techniques in LADDER_NAMES:
        short = LADDER_SHORT[LADDER_NAMES.index(techniques)]
    else:
        short = "+".join(TECHNIQUE_ABBREVIATIONS.get(p, p) for p in techniques.split("+"))
    return short + axis_suffix([(abbreviate_key(key), value) for key, value in settings])


def abbreviate_key(key: str) -> str:
    """An axis key in a run label: the initials of its last part's words (``max_staleness`` → ``ms``), or
    a one-word part's first four letters (``temperature`` → ``temp``)."""
    words = key.rsplit(".", 1)[-1].split("_")
    return "".join(w[:1] for w in words) if len(words) > 1 else words[0][:4]


def child_label(variant: Variant, seed: int) -> str:
    """The child's MLflow run name: the ladder rung and the seed (``GRPO s0``, ``+ClipHigher s1``, ``DAPO s0``),
    or for a grid variant its techniques abbreviated (``grpo+ch+ds s0``), each with its axis settings
    (``DAPO@ms=1 s0``); distinct within an ablation unless two axes' keys abbreviate alike."""
    return f"{short_variant(variant.name)} s{seed}"


def child_run_name(ablation: str, variant: str, seed: int) -> str:
    """``<ablation>/<variant>-s<seed>``: the MLflow run name and the run dir under ``output_dir/experiment``."""
    parts = [ablation, f"{variant}-s{seed}"]
    for part in parts:
        if not SAFE_COMPONENT.match(part):
            raise UserError(f"run name component {part!r} is not path-safe (allowed: letters, digits, . _ + -)")
    return "/".join(parts)


def make_ablation(
    cfg: Config,
    *,
    mode: str,
    techniques: Sequence[str] = TECHNIQUES,
    only: Sequence[str] = (),
    skip: Sequence[str] = (),
    seeds: int = 1,
    axes: Sequence[Axis] = (),
) -> AblationPlan:
    """The plan of ``dapo ablate``: ``mode`` variants of ``cfg`` × the ``axes``' values, filtered, × ``seeds``
    seeds from ``trainer.seed``."""
    if mode not in MODES:
        raise UserError(f"unknown ablation mode '{mode}'; valid: {', '.join(MODES)}")
    if seeds < 1:
        raise UserError(f"--seeds must be >= 1, got {seeds}")
    base_variants = MODES[mode](cfg, techniques)
    combos = math.prod(len(a.values) for a in axes)
    count = len(base_variants) * combos * seeds  # counted before any child is built
    if count > MAX_CHILDREN:
        raise UserError(f"this ablation is {count:,} children ({len(base_variants)} variants x "
                        f"{combos:,} axis combinations x {seeds:,} seeds); at most "
                        f"{MAX_CHILDREN:,}: give fewer seeds, axis values or techniques")
    variants = select_variants(with_axes(base_variants, axes), only, skip)
    seed_list = tuple(cfg.trainer.seed + i for i in range(seeds))
    aid = ablation_id(cfg, mode, variants)
    name = f"{safe_component(cfg.tracking.experiment)}-{mode}-{aid[:8]}"
    plan = AblationPlan(
        mode=mode, base=cfg, techniques=tuple(techniques), variants=tuple(variants), seeds=seed_list, ablation_id=aid, name=name,
        axes=tuple(axes),
    )
    for child in plan.children:  # every child config must be valid before anything runs
        plan.child_config(child)
    return plan
