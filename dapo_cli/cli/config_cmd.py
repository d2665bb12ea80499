"""`dapo config`: print the resolved config as YAML, or the documented schema."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import typer
from rich.table import Table

from dapo_cli.cli.common import Panel, SetOption, console
from dapo_cli.cli.options import ConfigArg, resolve
from dapo_cli.config import dump_yaml
from dapo_cli.config.schema import Config, is_section

EXAMPLES = [
    ("dapo config", "The embedded tiny experiment, fully resolved, as YAML."),
    ("dapo config experiments/tiny.yaml --set trainer.lr=1e-4 > mine.yaml",
     "A resolved copy with one change, to edit and pass to dapo train mine.yaml."),
    ("dapo config --schema", "Every setting with its default and meaning."),
]


def config_command(
    config: ConfigArg = None,
    sets: SetOption = None,
    schema: Annotated[bool, typer.Option("--schema", help="List every setting with its default and meaning.", rich_help_panel=Panel.OUTPUT)] = False,
) -> None:
    """Show the resolved configuration (YAML) or the documented schema."""
    if schema:
        table = Table("key", "default", "meaning", title="dapo configuration schema")
        for key, default, help_text in schema_rows(Config):
            table.add_row(key, repr(default), help_text)
        console.print(table)
        return
    cfg = resolve(config, sets)
    typer.echo(dump_yaml(cfg), nl=False)


def schema_rows(cls: type, prefix: str = "") -> list[tuple[str, Any, str]]:
    """(dotted key, default, help) for every leaf field of the schema."""
    import typing

    rows: list[tuple[str, Any, str]] = []
    hints = typing.get_type_hints(cls)
    instance = cls()
    for f in dataclasses.fields(cls):
        dotted = f"{prefix}.{f.name}" if prefix else f.name
        if is_section(hints[f.name]):
            rows.extend(schema_rows(hints[f.name], dotted))
        else:
            help_text = (f.metadata or {}).get("help", "")
            choices = (f.metadata or {}).get("choices")
            if choices:
                help_text += f" [{' | '.join(choices)}]"
            rows.append((dotted, getattr(instance, f.name), help_text))
    return rows
