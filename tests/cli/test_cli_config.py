"""``dapo config``: the resolved YAML, the documented schema, and one-line errors (exit 2) for bad configs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dapo_cli.cli import app
from dapo_cli.cli.config_cmd import schema_rows
from dapo_cli.config import Config, dump_yaml, flatten, load_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run from an empty directory, so nothing can be read from the repository by accident."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "250"})


def assert_one_line_error(result, *fragments: str) -> str:
    """Exit 2, a single non-empty line ``error: ...`` naming ``fragments``, no traceback."""
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


def test_without_config_prints_the_embedded_tiny_experiment(in_tmp: Path) -> None:
    result = invoke("config")
    assert result.exit_code == 0, result.output
    assert result.output == dump_yaml(load_config(REPO / "experiments" / "tiny.yaml"))
    data = yaml.safe_load(result.output)
    assert data["tracking"]["experiment"] == "dapo-tiny"  # from tiny.yaml, not the schema default "dapo"
    assert data["rollout"]["n"] == 8


def test_config_file_and_overrides(in_tmp: Path) -> None:
    (in_tmp / "exp.yaml").write_text("rollout:\n  n: 4\n  max_response_length: 8192\n", encoding="utf-8")
    result = invoke("config", "exp.yaml", "--set", "rollout.n=6", "-s", "trainer.lr=2e-5")
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(result.output)
    assert data["rollout"]["n"] == 6
    assert data["rollout"]["max_response_length"] == 8192
    assert data["trainer"]["lr"] == 2e-5
    assert data["algorithm"]["clip_ratio_high"] == 0.28  # schema default: exp.yaml does not set it


@pytest.mark.slow
def test_dump_reloads_to_the_same_config(in_tmp: Path) -> None:
    first = invoke("config", "--set", "algorithm.clip_ratio_c=3", "--set", "trainer.run_name=007")
    assert first.exit_code == 0, first.output
    (in_tmp / "dump.yaml").write_text(first.output, encoding="utf-8")
    second = invoke("config", "dump.yaml")
    assert second.exit_code == 0, second.output
    assert second.output == first.output
    assert load_config(in_tmp / "dump.yaml") == load_config(None, ["algorithm.clip_ratio_c=3", "trainer.run_name=007"])


@pytest.mark.slow
def test_schema_lists_every_setting_with_default_and_help(in_tmp: Path) -> None:
    rows = schema_rows(Config)
    flat = flatten(Config())
    assert [key for key, _, _ in rows] == list(flat)
    by_key = {key: (default, help_text) for key, default, help_text in rows}
    assert by_key["algorithm.clip_ratio_high"][0] == 0.28
    assert by_key["engine.name"][1].endswith("[torch | deepspeed]")  # choices appended
    for key, (_, help_text) in by_key.items():
        if not key.startswith("model.tiny."):  # TinyModelConfig documents its fields in comments
            assert help_text.strip(), key

    result = invoke("config", "--schema")
    assert result.exit_code == 0, result.output
    assert "dapo configuration schema" in result.output
    for key in ("algorithm.overlong_buffer.len", "trainer.ppo_mini_batch_size", "model.tiny.hidden_size"):
        assert key in result.output


ERRORS = [
    ("trainer.lrr=1", ["unknown config key 'trainer.lrr'", "did you mean 'trainer.lr'?"]),
    ("algoritm.x=1", ["unknown config key 'algoritm'", "did you mean 'algorithm'?"]),
    ("algorithm.clip_ratio_high=-0.1", ["algorithm.clip_ratio_high=-0.1 must be >= 0"]),
    ("algorithm.overlong_buffer.len=65", ["algorithm.overlong_buffer.len=65", "rollout.max_response_length=64", "lower it"]),
    ("rollout.n=1", ["rollout.n=1", "set rollout.n >= 2"]),
    ("rollout.n=2.5", ["rollout.n must be an integer, got 2.5"]),
    ("algorithm.overlong_filter=maybe", ["algorithm.overlong_filter must be true or false, got 'maybe'"]),
    ("engine.name=jax", ["engine.name='jax' is not one of: torch, deepspeed"]),
    ("data.train_batch_size=12", ["data.train_batch_size=12 must be a multiple of trainer.ppo_mini_batch_size=8"]),
    ("trainer.lr", ["override 'trainer.lr' must look like section.key=value"]),
]


@pytest.mark.parametrize(("override", "fragments"), ERRORS, ids=[o for o, _ in ERRORS])
@pytest.mark.parametrize("command", [["config"], ["train", "--dry-run"]], ids=["config", "train"])
def test_bad_config_is_one_line_exit_2(in_tmp: Path, command: list[str], override: str, fragments: list[str]) -> None:
    # the embedded tiny experiment: rollout.max_response_length 64, ppo_mini_batch_size 8
    assert_one_line_error(invoke(*command, "--set", override), *fragments)


def test_missing_config_file_is_one_line(in_tmp: Path) -> None:
    assert_one_line_error(invoke("config", "nope.yaml"), "config file not found: nope.yaml")


def test_invalid_yaml_is_one_line(in_tmp: Path) -> None:
    (in_tmp / "bad.yaml").write_text("data: 1\n  shuffle: 2\n", encoding="utf-8")
    assert_one_line_error(invoke("config", "bad.yaml"), "bad.yaml is not valid YAML at line 2")


def test_brackets_in_a_message_are_printed_not_read_as_markup(in_tmp: Path) -> None:
    # rich markup would swallow "[bold]" and crash on "[/]"
    line = assert_one_line_error(invoke("config", "odd[/]dir/[bold]x.yaml"))
    assert line == "error: config file not found: odd[/]dir/[bold]x.yaml"


def test_long_messages_are_not_wrapped(in_tmp: Path) -> None:
    result = CliRunner().invoke(app, ["config", "--set", "algorithm.overlong_buffer.len=65"], env={"COLUMNS": "40"})
    assert_one_line_error(result, "lower it or raise max_response_length")
