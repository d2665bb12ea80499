"""Configuration: one dataclass schema, YAML + ``--set`` loading, validation, technique toggles."""

from dapo_cli.config.load import ConfigError, dump_yaml, flatten, load_config, to_dict
from dapo_cli.config.schema import Config
from dapo_cli.config.techniques import TECHNIQUES, apply_techniques, technique_state

__all__ = [
    "Config",
    "ConfigError",
    "TECHNIQUES",
    "apply_techniques",
    "dump_yaml",
    "flatten",
    "load_config",
    "technique_state",
    "to_dict",
]
