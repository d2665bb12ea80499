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

A variant's name is :func:`~dapo_cli.config.techniques.variant_name` of the technique
state its config really has, so a variant is named by what it trains, not by how it
was asked for. The ablation id hashes the resolved config, the mode, the variants and
the seeds: rerunning the same command finds the same MLflow parent and run dirs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dapo_cli.config import TECHNIQUES, Config, apply_techniques, technique_state, to_dict
from dapo_cli.config.schema import PLANNING_SECTIONS
from dapo_cli.config.techniques import variant_name
from dapo_cli.config.validate import validate
from dapo_cli.errors import UserError

LADDER_LABELS = (
    "Naive GRPO",
    "+ Overlong Filtering",
    "+ Clip-Higher",
    "+ Soft Overlong Punishment",
    "+ Token-level Loss",
    "+ Dynamic Sampling (DAPO)",
)
"""Row names of the DAPO paper's Table 1, rung ``i`` switching on ``TECHNIQUES[:i]``."""

LADDER_SHORT = ("GRPO", "+OverlongFilter", "+ClipHigher", "+SoftPunish", "+TokenLoss", "DAPO")
"""The rungs as MLflow run labels: distinct within their first few characters (the UI's run list
and chart legends cut names at about 16)."""

PAPER_AIME24_AVG32 = (30.0, 36.0, 38.0, 41.0, 42.0, 50.0)
"""AIME 2024 avg@32 (%) of each rung in the paper's Table 1 (Qwen2.5-32B): a reference column only."""

LADDER_NAMES = tuple(variant_name({t: j < i for j, t in enumerate(TECHNIQUES)}) for i in range(len(TECHNIQUES) + 1))
"""Variant names of the ladder rungs: ``grpo``, ``grpo+overlong_filtering``, ..., ``dapo``."""

SAFE_COMPONENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
"""A run-name path component: no separators, no leading dot (so never ``.`` or ``..``), no spaces."""


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

    def toggle_dict(self) -> dict[str, bool]:
        return dict(self.toggles)


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

    def children(self) -> list[Child]:
        """Seed-major order: a complete ladder for the first seed before any second seed."""
        return [
            Child(v, seed, i, child_run_name(self.name, v.name, seed))
            for seed in self.seeds
            for i, v in enumerate(self.variants)
        ]

    def child_config(self, child: Child) -> Config:
        """The base config with the variant's toggles, the child's seed and run name; validated."""
        cfg = apply_techniques(self.base, **child.variant.toggle_dict())
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
    state = technique_state(apply_techniques(base, **toggles))
    name = variant_name(state)
    rung = LADDER_NAMES.index(name) if name in LADDER_NAMES else None
    return Variant(
        name=name,
        label=LADDER_LABELS[rung] if rung is not None else "",
        toggles=tuple((t, toggles[t]) for t in TECHNIQUES if t in toggles),
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


def looks_like_techniques(text: str) -> bool:
    """True when ``text`` is a comma-separated list of technique names (the ``--grid a,b`` argument)."""
    names = [n.strip().replace("-", "_") for n in text.split(",")]
    return bool(names) and all(n in TECHNIQUES for n in names)


def meant_as_techniques(text: str) -> bool:
    """True when ``text`` (not an existing file) reads as a technique list rather than a config path:
    it has a comma, or it is one bare word (no path separator, no ``.yaml``/``.yml``) that names or
    nearly names a technique. Such a word with unknown names is a technique error, not "config not found"."""
    if looks_like_techniques(text) or "," in text:
        return True
    word = text.strip().replace("-", "_")
    if "/" in word or "\\" in word or word.lower().endswith((".yaml", ".yml", ".json")):
        return False
    import difflib

    return bool(difflib.get_close_matches(word, TECHNIQUES, n=1, cutoff=0.6))


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
    """SHA-256 (16 hex) of the resolved config without its ``ablate`` section (launcher and seeds enter separately)
    and the planning-only sections (:data:`~dapo_cli.config.schema.PLANNING_SECTIONS`, which train nothing)."""
    data = {k: v for k, v in to_dict(cfg).items() if k != "ablate" and k not in PLANNING_SECTIONS}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


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


TECHNIQUE_ABBREVIATIONS = {
    "overlong_filtering": "of", "clip_higher": "ch", "overlong_shaping": "sop", "token_level_loss": "tll", "dynamic_sampling": "ds",
}
"""Short names for MLflow run labels: a UI column or chart legend shows ~16 characters."""


def short_variant(name: str) -> str:
    """A variant name in a few characters: the ladder rung (``GRPO``, ``+ClipHigher``, ``DAPO``) or the
    techniques abbreviated (``grpo+ch+ds``)."""
    if name in LADDER_NAMES:
        return LADDER_SHORT[LADDER_NAMES.index(name)]
    parts = name.split("+")
    return "+".join(TECHNIQUE_ABBREVIATIONS.get(p, p) for p in parts)


def child_label(variant: Variant, seed: int) -> str:
    """The child's MLflow run name: the ladder rung and the seed (``GRPO s0``, ``+ClipHigher s1``, ``DAPO s0``),
    or for a grid variant its techniques abbreviated (``grpo+ch+ds s0``); distinct within an ablation."""
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
) -> AblationPlan:
    """The plan of ``dapo ablate``: ``mode`` variants of ``cfg``, filtered, × ``seeds`` seeds from ``trainer.seed``."""
    if mode not in MODES:
        raise UserError(f"unknown ablation mode '{mode}'; valid: {', '.join(MODES)}")
    if seeds < 1:
        raise UserError(f"--seeds must be >= 1, got {seeds}")
    variants = select_variants(MODES[mode](cfg, techniques), only, skip)
    seed_list = tuple(cfg.trainer.seed + i for i in range(seeds))
    aid = ablation_id(cfg, mode, variants)
    name = f"{safe_component(cfg.tracking.experiment)}-{mode}-{aid[:8]}"
    plan = AblationPlan(
        mode=mode, base=cfg, techniques=tuple(techniques), variants=tuple(variants), seeds=seed_list, ablation_id=aid, name=name
    )
    for child in plan.children():  # every child config must be valid before anything runs
        plan.child_config(child)
    return plan
