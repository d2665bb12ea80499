"""Every ``dapo`` command has a ``--help`` that says what it is for; unbuilt commands fail in one line."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dapo_cli.cli import app

WIDE = {"COLUMNS": "200"}  # keep rich from wrapping help text mid-phrase


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env=WIDE)


def test_top_level_help_lists_every_command() -> None:
    result = invoke("--help")
    assert result.exit_code == 0, result.output
    assert "DAPO experiments" in result.output
    for command in ("prepare-data", "init-model", "train", "eval", "ablate", "config"):
        assert command in result.output


def test_no_arguments_shows_the_help() -> None:
    result = invoke()
    assert "Usage: dapo [OPTIONS] COMMAND" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("command", "purpose"),
    [
        ("prepare-data", "parquet"),
        ("train", "Train a policy with DAPO"),
        ("eval", "avg@K"),
        ("ablate", "ablation"),
        ("config", "resolved configuration"),
        ("init-model", "tiny character-level policy"),
    ],
)
def test_command_help_states_its_purpose(command: str, purpose: str) -> None:
    result = invoke(command, "--help")
    assert result.exit_code == 0, result.output
    assert f"Usage: dapo {command}" in result.output
    assert purpose.lower() in result.output.lower()


def test_train_help_lists_every_technique_toggle_both_ways() -> None:
    text = invoke("train", "--help").output
    for name in ("clip-higher", "dynamic-sampling", "token-level-loss", "overlong-shaping", "overlong-filtering"):
        assert f"--{name}" in text and f"--no-{name}" in text
    for option in ("--set", "--dry-run", "--resume"):
        assert option in text


def test_ablate_help_lists_its_modes_filters_and_launchers() -> None:
    text = invoke("ablate", "--help").output
    assert "[CONFIG] [TECHNIQUES]" in text
    for option in ("--ladder", "--grid", "--only", "--skip", "--seeds", "--set", "--dry-run", "--no-calibrate", "--launcher", "--html"):
        assert option in text, option
    assert "not built" not in text
