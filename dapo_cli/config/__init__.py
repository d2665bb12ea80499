"""Configuration: one dataclass schema, YAML + ``--set`` loading, validation, technique toggles."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dapo_cli.config.load import ConfigError, build_config, dump_saved, dump_yaml, flatten, to_dict
from dapo_cli.config.schema import Config
from dapo_cli.config.techniques import TECHNIQUES, Techniques, apply_techniques, technique_state
from dapo_cli.config import validate as _rules  # the module: ``config.validate`` stays the submodule

__all__ = [
    "Config",
    "ConfigError",
    "TECHNIQUES",
    "Techniques",
    "apply_techniques",
    "dump_saved",
    "dump_yaml",
    "flatten",
    "load_config",
    "technique_state",
    "to_dict",
]


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Resolve a config: the YAML at ``path`` (or the embedded tiny experiment), then overrides, validated."""
    cfg = build_config(path, overrides)
    _rules.validate(cfg)
    return cfg
