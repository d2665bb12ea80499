"""Options and config resolution shared by the commands (`train`, `lint`, `ablate`, `config`, `init-model`).

The technique toggles are declared here once, from the technique table (``config/techniques.py``); `dapo train`
and `dapo lint` take the same flags with the same help.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Annotated

import typer

from dapo_cli.cli.common import Panel
from dapo_cli.config import Config, flatten
from dapo_cli.config.load import ConfigError, build_config, parse_override
from dapo_cli.config.techniques import CLI_ORDER, TECHNIQUE_BY_NAME, Techniques, toggle_flag  # noqa: F401 (CLI_ORDER, toggle_flag re-exported)
from dapo_cli.config.validate import validate
from dapo_cli.tracking import PARENT_RUN_ENV

ConfigArg = Annotated[
    str | None,
    typer.Argument(help="Experiment YAML (default: the embedded tiny CPU experiment, experiments/tiny.yaml)."),
]



def _toggle(name: str) -> object:
    """The ``--<flag>/--no-<flag>`` option of technique ``name``, its help from the technique table."""
    t = TECHNIQUE_BY_NAME[name]
    return typer.Option(f"--{t.flag}/--no-{t.flag}", help=f"{t.help}.", show_default="as in the config", rich_help_panel=Panel.TECHNIQUES)


ClipHigherToggle = Annotated[bool | None, _toggle("clip_higher")]
DynamicSamplingToggle = Annotated[bool | None, _toggle("dynamic_sampling")]
TokenLevelLossToggle = Annotated[bool | None, _toggle("token_level_loss")]
OverlongShapingToggle = Annotated[bool | None, _toggle("overlong_shaping")]
OverlongFilteringToggle = Annotated[bool | None, _toggle("overlong_filtering")]
"""The toggles `dapo train` and `dapo lint` declare, in :data:`~dapo_cli.config.techniques.CLI_ORDER`."""


@dataclass(frozen=True)
class DryRunOptions:
    """What `dapo train --dry-run` is asked for beside the config: the cluster to plan for, the output form.

    None: not given (the plan's defaults apply). The CLI maps its flags onto these fields
    (:data:`DRY_RUN_FLAGS`); code below the CLI reads the fields, never the flags.
    """

    world_size: int | None = None
    gpus_per_node: int | None = None
    gpu_memory_gib: float | None = None
    as_json: bool = False
    as_yaml: bool = False

    def given(self) -> list[str]:
        """The fields given (a value, or switched on), in declaration order."""
        return [f.name for f in fields(self) if getattr(self, f.name) is not None and getattr(self, f.name) is not False]


DRY_RUN_FLAGS = {"world_size": "--world-size", "gpus_per_node": "--gpus-per-node", "gpu_memory_gib": "--gpu-memory-gib",
                 "as_json": "--json", "as_yaml": "--yaml"}
"""The `dapo train` flag of each :class:`DryRunOptions` field, for messages."""


def resolve(config: str | None, sets: list[str] | None, techniques: Techniques = Techniques()) -> Config:
    """YAML → ``--set`` overrides → technique toggles → validation (once, of the final config).

    Validating only at the end lets a toggle make a config valid, e.g.
    ``--set algorithm.overlong_buffer.len=99999 --no-overlong-shaping``. A toggle that would
    overwrite a value given with ``--set`` in the same command is an error
    (:func:`check_toggles_keep_sets`), except in an ablation child (``$DAPO_PARENT_RUN_ID``
    set), whose variant toggles are meant to override the ablation's ``--set``.
    """
    cfg = build_config(config, sets or ())
    if techniques.given():
        toggled = techniques.apply(cfg)
        if not os.environ.get(PARENT_RUN_ENV):
            check_toggles_keep_sets(cfg, toggled, sets or (), techniques)
        cfg = toggled
    validate(cfg)
    return cfg


def check_toggles_keep_sets(before: Config, after: Config, sets: list[str] | tuple[str, ...], techniques: Techniques) -> None:
    """Every value a ``--set`` gave is still there after the technique toggles; else a ConfigError
    naming both, e.g. ``--no-clip-higher contradicts --set algorithm.clip_ratio_high=0.28``.

    Which fields a toggle writes is :func:`~dapo_cli.config.techniques.apply_techniques`'s
    business; this compares the resolved values, so it follows that function wherever it goes.
    """
    old, new = flatten(before), flatten(after)
    for item in sets:
        key = parse_override(item)[0]
        changed = [k for k in old if (k == key or k.startswith(key + ".")) and old[k] != new[k]]
        if not changed:
            continue
        leaf = changed[0]
        culprits = [
            toggle_flag(name, on)
            for name, on in techniques.given(CLI_ORDER).items()
            if flatten(Techniques(**{name: on}).apply(before))[leaf] != old[leaf]
        ]
        flag = culprits[0] if culprits else "a technique toggle"
        raise ConfigError(
            f"{flag} contradicts --set {item.strip()}: the toggle sets {leaf}={new[leaf]!r} instead of {old[leaf]!r}; "
            "drop one of them"
        )
