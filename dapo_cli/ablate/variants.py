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

Either mode takes extra *axes* (``--axis rollout.max_staleness=0,1``, :class:`Axis`): config settings
beside the techniques, each multiplying the variants (technique-major: every value of the axes at one
technique state before the next state). An axis variant is named by its technique state and its
settings, ``dapo@max_staleness=1`` (:func:`axis_suffix`); variants without axes keep their plain names.

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
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dapo_cli.config import TECHNIQUES, Config, flatten, technique_state
from dapo_cli.config.load import from_dict, override_config, parse_override
from dapo_cli.config.schema import PLANNING_SECTIONS, ConfigError
from dapo_cli.config.versions import before_value, declaration, split_version, upgrade
from dapo_cli.config.techniques import TECHNIQUE_KEYS, Techniques, variant_name
from dapo_cli.config.validate import validate
from dapo_cli.errors import UserError

if TYPE_CHECKING:
    from dapo_cli.ablate.sequential import Setup

MAX_CHILDREN = 2000
"""The most children one ablation may plan (variants x axis combinations x seeds, counted before any is built:
each child's config is validated in ~8 ms, and a billion seeds once took the planner past 5 GB)."""
MAX_AXIS_VALUES = 100
"""The most values one ``--axis`` may give (each is typed and validated as ``--set`` would)."""

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

SAFE_COMPONENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+@=-]*$")
"""A run-name path component: no separators, no leading dot (so never ``.`` or ``..``), no spaces
(``@`` and ``=`` only come from axis settings: ``dapo@max_staleness=1``)."""

AXIS_VALUE = re.compile(r"^[A-Za-z0-9._+-]+$")
"""An axis value as variant names spell it (no ``@``, ``=``, separators or spaces)."""

AXIS_OWNERS = {
    "trainer.seed": "--seeds sets it (trainer.seed + 0..N-1 for every variant)",
    "trainer.run_name": "the ablation names every child",
    "tracking.run_label": "the ablation labels every child",
}
"""Keys outside the technique toggles that an axis may not vary, and who sets them instead."""


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

    def children(self) -> list[Child]:
        """Seed-major order: a complete ladder for the first seed before any second seed."""
        return [
            Child(v, seed, i, child_run_name(self.name, v.name, seed))
            for j, seed in enumerate(self.seeds)
            for i, v in enumerate(self.variants)
            if self.wave is None or j < self.wave_from or v.name in self.wave
        ]

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


@dataclass(frozen=True)
class Axis:
    """One ``--axis KEY=V1,V2,...``: a config key and its values, in the order given."""

    key: str
    values: tuple[str, ...]
    """As ``--set key=value`` spells them, canonical (``1.0`` for ``1`` of a float setting)."""
    short: str
    """The key in variant names: its shortest dotted suffix that ends no other schema key (``max_staleness``)."""


def parse_axis(text: str, base: Config, sets: Sequence[str] = ()) -> Axis:
    """``rollout.max_staleness=0,1`` → an :class:`Axis`, its key and values checked against the schema as
    ``--set`` checks them. Refused: a key the technique toggles own (:data:`TECHNIQUE_KEYS`), one of
    :data:`AXIS_OWNERS`, ``ablate.*`` and the planning sections, a key also given with ``--set``, fewer than
    two values, a repeated value, a value a run name cannot hold."""
    if "=" not in text:
        raise UserError(f"--axis '{text}' must look like section.key=V1,V2, e.g. --axis rollout.max_staleness=0,1")
    key, raw = (part.strip() for part in text.split("=", 1))
    keys = list(flatten(base))
    if key not in keys:
        if any(k.startswith(key + ".") for k in keys):
            raise UserError(f"--axis {key}: '{key}' is a section; give one of its keys")
        override_config(base, [f"{key}=0"])  # raises as --set would: unknown config key '...'; did you mean ...?
    why = _axis_owner(key)
    if why:
        raise UserError(f"--axis {key}: {why}")
    clash = [item for item in sets if _overlaps(parse_override(item)[0], key)]
    if clash:
        raise UserError(f"--axis {key} and --set {clash[0].strip()} both set {key}; give it in one of them")
    given = [v.strip() for v in raw.split(",")]
    if len(given) > MAX_AXIS_VALUES:
        raise UserError(f"--axis {key} gives {len(given):,} values; at most {MAX_AXIS_VALUES} (each is a child per variant and seed)")
    if len(given) < 2:
        raise UserError(f"--axis {key} needs at least 2 comma-separated values, got '{raw}'")
    if not all(given):
        raise UserError(f"--axis {key}: an empty value in '{raw}' (two commas in a row, or one at an end); remove it")
    texts = [value_text(flatten(override_config(base, [f"{key}={v}"]))[key]) for v in given]  # typed as --set types
    for v, t in zip(given, texts):
        if not AXIS_VALUE.match(t):
            raise UserError(f"--axis {key}: value '{v}' cannot be part of a run name (letters, digits, . _ + - only)")
    repeated = [t for i, t in enumerate(texts) if t in texts[:i]]
    if repeated:
        raise UserError(f"--axis {key} gives the value {repeated[0]} twice; give each value once")
    return Axis(key=key, values=tuple(texts), short=short_key(key, keys))


def _axis_owner(key: str) -> str:
    """Why an axis may not vary ``key`` ("" when it may)."""
    if any(_overlaps(key, owned) for owned in TECHNIQUE_KEYS):
        return "the technique toggles own it (it decides a technique's state); vary the technique with --grid instead"
    if key in AXIS_OWNERS:
        return AXIS_OWNERS[key]
    section = key.split(".", 1)[0]
    if section == "ablate":
        return "ablate.* configures the ablation itself, not its children"
    if section in PLANNING_SECTIONS:
        return f"{section}.* changes no run's results (it only plans --dry-run)"
    return ""


def _overlaps(a: str, b: str) -> bool:
    """True when dotted keys ``a`` and ``b`` are the same or one is a section holding the other."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def value_text(value: Any) -> str:
    """A typed setting as ``--set`` would give it back: ``true``, ``null``, ``0.5``, ``1``, text as is."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    return str(value)


def short_key(key: str, keys: Sequence[str]) -> str:
    """The shortest dotted suffix of ``key`` that no other of ``keys`` ends with."""
    parts = key.split(".")
    for n in range(1, len(parts)):
        suffix = ".".join(parts[-n:])
        if not any(k != key and k.endswith("." + suffix) for k in keys):
            return suffix
    return key


def axis_suffix(settings: Sequence[tuple[str, str]]) -> str:
    """``@max_staleness=1@temperature=0.7``: what a variant's name adds for its axis settings (short keys)."""
    return "".join(f"@{short}={value}" for short, value in settings)


def split_axes(name: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """``dapo@max_staleness=1`` → (``dapo``, ``(("max_staleness", "1"),)``); a name without axes → (name, ())."""
    head, *rest = name.split("@")
    return head, tuple((short, value) for short, _, value in (part.partition("=") for part in rest))


def axis_twins(names: Sequence[str]) -> list[tuple[str, str, str]]:
    """``(variant, twin, axis)`` for each variant and each axis at which it does not hold the axis's first value (in
    ``names``' order): the twin has the same techniques and other settings, with that axis at its first value.
    ``["dapo@adv_estimator=grpo", "dapo@adv_estimator=dr_grpo"]`` → ``[("dapo@adv_estimator=dr_grpo",
    "dapo@adv_estimator=grpo", "adv_estimator")]``. The twin need not be in ``names`` (``--skip`` can drop it)."""
    firsts: dict[int, str] = {}
    for name in names:
        for j, (_, value) in enumerate(split_axes(name)[1]):
            firsts.setdefault(j, value)
    out = []
    for name in names:
        techniques, settings = split_axes(name)
        for j, (axis, value) in enumerate(settings):
            if value != firsts[j]:
                out.append((name, techniques + axis_suffix([(a, firsts[j] if i == j else v) for i, (a, v) in enumerate(settings)]), axis))
    return out


def parse_axes(texts: Sequence[str], base: Config, sets: Sequence[str] = ()) -> tuple[Axis, ...]:
    """Every ``--axis`` (:func:`parse_axis`); a key given twice is refused."""
    axes = [parse_axis(text, base, sets) for text in texts]
    keys = [a.key for a in axes]
    twice = [k for i, k in enumerate(keys) if k in keys[:i]]
    if twice:
        raise UserError(f"--axis {twice[0]} is given twice; give all its values in one --axis {twice[0]}=V1,V2")
    return tuple(axes)


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


TECHNIQUE_ABBREVIATIONS = {
    "overlong_filtering": "of", "clip_higher": "ch", "overlong_shaping": "sop", "token_level_loss": "tll", "dynamic_sampling": "ds",
}
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
    for child in plan.children():  # every child config must be valid before anything runs
        plan.child_config(child)
    return plan
