"""Options shared by commands (dapo_cli/cli/options.py): technique toggles declared once, dry-run options typed."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import typer

from dapo_cli.cli import app
from dapo_cli.cli import lint as lint_cmd
from dapo_cli.cli import options as O
from dapo_cli.cli import train as train_cmd
from dapo_cli.config import TECHNIQUES

TOGGLES = {
    "clip_higher": O.ClipHigherToggle,
    "dynamic_sampling": O.DynamicSamplingToggle,
    "token_level_loss": O.TokenLevelLossToggle,
    "overlong_shaping": O.OverlongShapingToggle,
    "overlong_filtering": O.OverlongFilteringToggle,
}


def hints(command: typing.Callable[..., None]) -> dict[str, typing.Any]:
    return typing.get_type_hints(command, include_extras=True)


def flags(command: str) -> dict[str, list[str]]:
    """Parameter name -> its flags, as the click command built from the app has them."""
    click_command = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    return {p.name: [*p.opts, *p.secondary_opts] for p in click_command.params}


def test_a_toggle_per_technique() -> None:
    assert set(TOGGLES) == set(TECHNIQUES)


@pytest.mark.parametrize("command", ["train", "lint"])
@pytest.mark.slow
def test_train_and_lint_take_the_one_declaration_of_each_toggle(command: str) -> None:
    declared = hints({"train": train_cmd.train, "lint": lint_cmd.lint}[command])
    for name, toggle in TOGGLES.items():
        assert declared[name] is toggle
        flag = name.replace("_", "-")
        assert flags(command)[name] == [f"--{flag}", f"--no-{flag}"]


def test_dry_run_flags_name_the_train_options() -> None:
    fields = [f.name for f in dataclasses.fields(O.DryRunOptions)]
    assert list(O.DRY_RUN_FLAGS) == fields
    train_flags = flags("train")
    for name, flag in O.DRY_RUN_FLAGS.items():  # the field is the train parameter of that flag
        assert train_flags[name] == [flag]


def test_given_lists_values_and_switches_on_in_order() -> None:
    assert O.DryRunOptions().given() == []
    assert O.DryRunOptions(as_yaml=True, world_size=0, gpu_memory_gib=40.0).given() == ["world_size", "gpu_memory_gib", "as_yaml"]
    assert O.DryRunOptions(as_json=False, gpus_per_node=None).given() == []
