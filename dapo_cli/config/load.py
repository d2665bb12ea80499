"""Load a config: YAML file → deep-merged ``--set a.b=c`` overrides → typed dataclasses.

Validation is the caller's next step (:func:`dapo_cli.config.load_config` does both), so
``validate.py`` can use this module without this module using it.

Every value is typed from the schema; an unknown key fails with a did-you-mean
suggestion; every problem raises :class:`ConfigError` (a :class:`UserError`, so the
CLI prints one line and exits 2) naming the key and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from dapo_cli.config.schema import Config, ConfigError, flatten, is_section  # noqa: F401 (re-exported)
from dapo_cli.config.versions import SCHEMA_VERSION, VERSION_KEY, split_version
from dapo_cli.fileio import refuse_special

EMBEDDED_EXPERIMENT = "tiny.yaml"
"""The experiment of a command given no CONFIG (``presets/`` links it to ``experiments/``)."""
EMBEDDED_LADDER = "tiny-ladder.yaml"
"""The experiment of ``dapo ablate`` without CONFIG (shipped the same way)."""


def embedded_experiment_path(name: str = EMBEDDED_EXPERIMENT) -> Path:
    """An experiment shipped inside the package: the tiny CPU one (used when no CONFIG is given),
    or :data:`EMBEDDED_LADDER`."""
    return Path(str(resources.files("dapo_cli") / "presets" / name))


def build_config(path: str | Path | None = None, overrides: typing.Sequence[str] = ()) -> Config:
    """YAML + ``--set`` overrides, typed against the schema but not cross-field validated.

    For callers that change the config further before validating it once
    (``dapo train``'s technique toggles).
    """
    source = Path(path) if path is not None else embedded_experiment_path()
    _, data = split_version(read_yaml(source), str(source))  # a run's saved config.yaml records its schema version
    for item in overrides:
        set_dotted(data, *typed_override(item))
    return from_dict(Config, data)


def override_config(cfg: Config, overrides: typing.Sequence[str]) -> Config:
    """``cfg`` with ``a.b=c`` overrides applied as ``--set`` applies them (typed against the schema, unknown
    keys refused with a suggestion), not cross-field validated."""
    data = to_dict(cfg)
    for item in overrides:
        set_dotted(data, *typed_override(item))
    return from_dict(Config, data)


def typed_override(item: str) -> tuple[str, Any]:
    """:func:`parse_override`, a string setting keeping the text as typed (:func:`_as_text`)."""
    key, value = parse_override(item)
    if _leaf_type(key) is str:
        value = _as_text(item.split("=", 1)[1], value)
    return key, value


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the later value without a
    word, so a second ``trainer:`` section would silently replace the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *anchor``: its keys may be overridden here
                continue
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base class reports it
                break
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' is given twice (lines {first} and {line}); keep one", key_node.start_mark)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping; a missing, unreadable or binary file or bad YAML is a ConfigError."""
    refuse_special(path, "config")
    if path.is_dir():
        raise ConfigError(f"config {path} is a directory; give a YAML file (e.g. experiments/tiny.yaml)")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config {path} is not a UTF-8 text file (byte {exc.start}); give a YAML file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path} is not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    except RecursionError:
        raise ConfigError(f"{path} nests its values too deeply to read; a config is a few levels deep") from None
    except ValueError as exc:  # a value PyYAML's constructors refuse: int() past 4,300 digits, a 13th month
        raise ConfigError(f"{path} holds a value that cannot be read ({str(exc).split(';')[0]}); fix or quote it") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of sections (data:, model:, ...), not a {type(data).__name__}")
    return data


def parse_override(item: str) -> tuple[str, Any]:
    """Split ``a.b=c``; the value is parsed as YAML (so ``[1,2]``, ``null``, ``1e-4`` work) and typed later."""
    if "=" not in item:
        raise ConfigError(f"override '{item}' must look like section.key=value, e.g. trainer.lr=1e-4")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override '{item}' has no key before '='")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    except ValueError:  # a value PyYAML's constructors refuse: int() past 4,300 digits, a 13th month
        if raw.strip().lstrip("+-").isdigit():
            raise ConfigError(f"override '{key}=': the value is a number too long to read ({len(raw.strip()):,} "
                              "characters); no setting needs one") from None
        value = raw  # text, as a YAML error leaves it (typed against the schema later)
    except RecursionError:
        raise ConfigError(f"override '{key}=': the value nests too deeply to read") from None
    return key, value


def _leaf_type(key: str) -> Any:
    """Schema type of dotted ``key`` (e.g. ``str`` for ``trainer.run_name``), or None if it is no leaf."""
    tp: Any = Config
    for part in key.split("."):
        if not is_section(tp):
            return None
        hints = typing.get_type_hints(tp)
        if part not in hints:
            return None
        tp = hints[part]
    return None if is_section(tp) else tp


def _as_text(raw: str, parsed: Any) -> Any:
    """A string setting keeps what the user typed: ``001``, ``on``, ``1.10`` stay text, not 1, True, 1.1,
    and so does text YAML reads as a mapping (a URI like ``x://::``); a quoted string loses its quotes
    (a list stays a list, and is an error for a string setting)."""
    if parsed is None or isinstance(parsed, (bool, int, float, dict)):  # `null` too: tracking.backend=null
        return raw.strip()
    return parsed


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set ``data[a][b] = value`` for ``key = "a.b"``, creating sections as needed."""
    parts = key.split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"'{'.'.join(parts[: i + 1])}' is a value, not a section; cannot set '{key}'")
        node = child
    node[parts[-1]] = value


def from_dict(cls: type, data: Any, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, typing every value and rejecting unknown keys."""
    if data is None:  # a section left empty in YAML (`trainer:` with every key commented out)
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"'{prefix or 'config'}' must be a mapping of keys, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            raise ConfigError(unknown_key_message(prefix, str(key), names))
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        dotted = f"{prefix}.{f.name}" if prefix else f.name
        tp = hints[f.name]
        value = data[f.name]
        kwargs[f.name] = from_dict(tp, value, dotted) if is_section(tp) else coerce(value, tp, dotted)
        choices = f.metadata.get("choices") if f.metadata else None
        if choices and kwargs[f.name] not in choices:
            raise ConfigError(f"{dotted}={kwargs[f.name]!r} is not one of: {', '.join(choices)}")
    return cls(**kwargs)


def unknown_key_message(prefix: str, key: str, names: list[str]) -> str:
    """``unknown key 'trainer.lrr'; did you mean 'trainer.lr'?`` (or the list of valid keys)."""
    where = f"{prefix}.{key}" if prefix else key
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    if close:
        hint = f"did you mean '{prefix + '.' if prefix else ''}{close[0]}'?"
    else:
        hint = f"valid keys{' in ' + prefix if prefix else ''}: {', '.join(names)}"
    return f"unknown config key '{where}'; {hint}"


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert ``value`` to schema type ``tp`` (bool, int, float, str, list[...], X | None)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.strip().lower() in {"null", "none", "~"}):
            return None
        return coerce(value, args[0], key)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            value = [value]
        return [coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if str(value).strip().lower() in _TRUE:
            return True
        if str(value).strip().lower() in _FALSE:
            return False
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key} must be an integer, got {value!r}") from None
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key} must be a number, got {value!r}") from None
        if not math.isfinite(number):
            raise ConfigError(f"{key}={value} is not a finite number; give a finite value")
        return number
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key} must be a string, got {value!r}")
        return "" if value is None else str(value)
    raise TypeError(f"schema type {tp!r} of {key} is not supported by the loader")


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain nested dicts (for YAML dumps and artifacts)."""
    return dataclasses.asdict(cfg)


def dump_yaml(cfg: Any) -> str:
    """The resolved config as YAML, sections in schema order."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=False)


def dump_saved(cfg: Any) -> str:
    """The config as a run saves it (``config.yaml``): ``schema_version: N`` first (:mod:`dapo_cli.config.versions`),
    then :func:`dump_yaml`. ``build_config`` reads it back like any experiment."""
    return f"{VERSION_KEY}: {SCHEMA_VERSION}\n" + dump_yaml(cfg)
