"""Every ``dapo`` command has a ``--help`` that says what it is for; unbuilt commands fail in one line."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dapo_cli.cli import app

WIDE = {"COLUMNS": "200"}  # keep rich from wrapping help text mid-phrase


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env=WIDE)


@pytest.mark.slow
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
    for option in ("--ladder", "--grid", "--axis", "--only", "--skip", "--seeds", "--set", "--dry-run", "--no-calibrate", "--launcher",
                   "--html"):
        assert option in text, option
    assert "--axis rollout.max_staleness=0,1" in " ".join(text.split())  # the option's example
    assert "not built" not in text


# ---------------------------------------------------------------- shell conventions (issue 14)

import dataclasses  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
from importlib import metadata  # noqa: E402

import typer  # noqa: E402

from dapo_cli.cli import COMMANDS  # noqa: E402
from dapo_cli.cli.common import examples_epilog  # noqa: E402
from dapo_cli.config.schema import EvalConfig  # noqa: E402

NAMES = [name for name, _, _ in COMMANDS]
EXTRA = {"COLUMNS": "400"}  # one row per option: its help and default on the option's own line


def test_version_prints_the_installed_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"dapo {metadata.version('dapo-cli')}\n"


@pytest.mark.parametrize("command", [None, *NAMES])
@pytest.mark.slow
def test_dash_h_is_help(command: str | None) -> None:
    words = [command] if command else []
    short, long = invoke(*words, "-h"), invoke(*words, "--help")
    assert short.exit_code == long.exit_code == 0, short.output
    assert short.stdout == long.stdout and "Usage: dapo" in short.stdout


def test_shell_completion_scripts(monkeypatch) -> None:
    # Typer's own switch for tests: --show-completion takes the shell by name instead of detecting the parent
    # process's shell (under /bin/sh, as a make recipe with quotes runs, detection finds "sh", which it refuses)
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    result = CliRunner().invoke(app, ["--show-completion", "bash"], prog_name="dapo", env=WIDE)
    assert result.exit_code == 0, result.output
    assert "_DAPO_COMPLETE" in result.stdout and "complete" in result.stdout
    top = invoke("--help").stdout
    assert "--install-completion" in top and "--show-completion" in top


def examples_block(text: str) -> list[str]:
    """The lines after the help's last 'Examples' heading, stripped, blank ones dropped."""
    lines = [line.strip() for line in text.splitlines()]
    start = max(i for i, line in enumerate(lines) if line == "Examples")
    return [line for line in lines[start + 1:] if line]


@pytest.mark.parametrize(("name", "fn", "examples"), COMMANDS, ids=NAMES)
def test_every_help_ends_with_its_examples_one_per_line(name: str, fn, examples) -> None:
    assert 2 <= len(examples) <= 4
    text = CliRunner().invoke(app, [name, "--help"], env=EXTRA).stdout
    block = examples_block(text)
    # command, then what it does, each on a line of its own: not re-wrapped into one paragraph
    assert block == [part for command, what in examples for part in (command, what)]


@pytest.mark.parametrize(("name", "fn", "examples"), COMMANDS, ids=NAMES)
def test_every_example_parses_with_the_current_options(name: str, fn, examples) -> None:
    group = typer.main.get_command(app)
    for command, _ in examples:
        words = shlex.split(command.split(" > ")[0])  # no shell redirection
        assert words[:2] == ["dapo", name]
        group.commands[name].make_context(name, words[2:])  # raises on an unknown option or a bad value


def test_examples_epilog_wants_two_to_four_and_escapes_markup() -> None:
    with pytest.raises(ValueError):
        examples_epilog([("dapo x", "one")])
    with pytest.raises(ValueError):
        examples_epilog([("dapo x", "y")] * 5)
    assert r"dapo \[red]x" in examples_epilog([("dapo [red]x", "a"), ("dapo b", "c")])  # printed, not a style


PANELS = {
    "init-model": {"Config", "Output"},
    "train": {"Config", "Techniques", "Run", "Output", "Cluster plan (--dry-run)", "Algorithm"},
    "eval": {"Data", "Sampling", "Run", "Output", "Tracking"},
    "ablate": {"Techniques", "Run", "Config", "Output"},
    "config": {"Config", "Output"},
    "lint": {"Config", "Techniques", "Output"},
    "prepare-data": {"Data", "Output", "Tracking"},
    "report": {"Output", "Tracking"},
}


@pytest.mark.parametrize("name", list(PANELS))
def test_options_are_grouped_in_panels(name: str) -> None:
    text = invoke(name, "--help").stdout
    panels = set(re.findall(r"╭─ (.+?) ─", text))
    assert PANELS[name] <= panels, panels
    options_panel = text.split("╭─ Options ─", 1)[1].split("╰", 1)[0] if "╭─ Options ─" in text else ""
    assert re.findall(r"--[a-z-]+", options_panel) in ([], ["--help"])  # nothing left ungrouped


def option_rows(text: str) -> dict[str, str]:
    """``--flag`` → its help row (long options only; the first flag of the row)."""
    rows = {}
    for line in text.splitlines():
        match = re.match(r"│ (--[a-z-]+)", line)
        if match:
            rows[match.group(1)] = line
    return rows


@pytest.mark.slow
def test_eval_help_shows_the_schema_defaults() -> None:
    rows = option_rows(CliRunner().invoke(app, ["eval", "--help"], env=EXTRA).stdout)
    schema = EvalConfig()
    for flag, field in [("--dataset", "dataset"), ("--avg", "avg_k"), ("--temperature", "temperature"), ("--top-p", "top_p"),
                        ("--max-tokens", "max_tokens"), ("--engine", "engine"), ("--batch-size", "batch_size"),
                        ("--seed", "seed"), ("--verifier", "verifier")]:
        assert f"[default: {getattr(schema, field)}]" in rows[flag], (flag, rows[flag])
    assert f"[default: ({', '.join(map(str, schema.pass_k))}, those <= K)]" in rows["--pass-k"]
    # every option that takes a value shows a default (on/off flags are off unless given)
    for flag, row in rows.items():
        if "<bool>" not in row:
            assert "[default: " in row, row


def test_eval_accepts_every_engine_the_factory_builds() -> None:
    from dapo_cli.components import ROLLOUT_ENGINES

    choices = next(f.metadata["choices"] for f in dataclasses.fields(EvalConfig) if f.name == "engine")
    assert set(choices) == set(ROLLOUT_ENGINES)
    assert f"<{'|'.join(choices)}>" in option_rows(invoke("eval", "--help").stdout)["--engine"]


def test_ablate_help_names_its_default_experiment() -> None:
    assert "experiments/tiny-ladder.yaml" in CliRunner().invoke(app, ["ablate", "--help"], env=EXTRA).stdout


def test_every_option_that_takes_a_value_shows_its_default() -> None:
    # Typer's convention: on/off flags show none; every option taking a value states what it is when
    # not given (a value, or in words such as "as in the config"), or that it is required.
    import click

    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        ctx = click.Context(command, info_name=name)
        for param in command.params:
            if not isinstance(param, click.Option) or param.is_flag or param.name == "help":
                continue
            record = param.get_help_record(ctx)
            text = record[1] if record else ""
            assert "default:" in text or "required" in text, f"dapo {name} {param.opts[0]}: no default shown"
