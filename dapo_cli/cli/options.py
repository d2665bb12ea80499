"""Config resolution shared by `train`, `ablate`, `config` and `init-model`."""

from __future__ import annotations

from typing import Annotated

import typer

from dapo_cli.config import Config, apply_techniques
from dapo_cli.config.load import build_config
from dapo_cli.config.validate import validate

ConfigArg = Annotated[
    str | None,
    typer.Argument(help="Experiment YAML (default: the embedded tiny CPU experiment, experiments/tiny.yaml)."),
]


def resolve(config: str | None, sets: list[str] | None, **toggles: bool | None) -> Config:
    """YAML → ``--set`` overrides → technique toggles → validation (once, of the final config).

    Validating only at the end lets a toggle make a config valid, e.g.
    ``--set algorithm.overlong_buffer.len=99999 --no-overlong-shaping``.
    """
    cfg = build_config(config, sets or ())
    if any(v is not None for v in toggles.values()):
        cfg = apply_techniques(cfg, **toggles)
    validate(cfg)
    return cfg
