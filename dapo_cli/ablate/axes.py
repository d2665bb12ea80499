"""``--axis KEY=V1,V2``: config settings beside the techniques that multiply an ablation's variants, and how
variant names spell them. Pure.

An axis variant is named by its technique state and its settings, ``dapo@max_staleness=1`` (:func:`axis_suffix`;
the short key is the shortest dotted suffix that ends no other schema key, :func:`short_key`);
:func:`split_axes` reads a name back, and :func:`axis_twins` pairs each variant with its twin at each axis's first
value (what the report's axis comparisons and the sequential rule's comparisons read). The plan that multiplies
the variants is :func:`dapo_cli.ablate.variants.with_axes`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dapo_cli.config import Config, flatten
from dapo_cli.config.load import override_config, parse_override
from dapo_cli.config.schema import PLANNING_SECTIONS
from dapo_cli.config.techniques import TECHNIQUE_KEYS
from dapo_cli.errors import UserError

MAX_AXIS_VALUES = 100
"""The most values one ``--axis`` may give (each is typed and validated as ``--set`` would)."""

AXIS_VALUE = re.compile(r"^[A-Za-z0-9._+-]+$")
"""An axis value as variant names spell it (no ``@``, ``=``, separators or spaces)."""

AXIS_OWNERS = {
    "trainer.seed": "--seeds sets it (trainer.seed + 0..N-1 for every variant)",
    "trainer.run_name": "the ablation names every child",
    "tracking.run_label": "the ablation labels every child",
}
"""Keys outside the technique toggles that an axis may not vary, and who sets them instead."""


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
