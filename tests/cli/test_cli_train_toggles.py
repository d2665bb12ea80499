"""``dapo train --dry-run``: the embedded experiment without CONFIG, and the five technique toggles.

Toggles override the YAML; one that contradicts a ``--set`` of the same command is an error.
Only ``--dry-run`` is exercised here:
real training needs the trainer and is covered by the end-to-end tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from dapo_cli.cli import app
from dapo_cli.config import dump_yaml, load_config, to_dict

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test runs from an empty directory: the embedded experiment must come from the package."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def dry_run(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["train", "--dry-run", "--yaml", *args])
    assert result.exit_code == 0, result.output
    return yaml.safe_load(result.output)


def get(data: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        data = data[part]
    return data


def test_no_config_resolves_the_embedded_tiny_experiment(in_tmp: Path) -> None:
    assert not (in_tmp / "experiments").exists()
    result = CliRunner().invoke(app, ["train", "--dry-run", "--yaml"])
    assert result.exit_code == 0, result.output
    assert result.output == dump_yaml(load_config(REPO / "experiments" / "tiny.yaml"))
    data = yaml.safe_load(result.output)
    assert data["model"]["path"] == "builtin:tiny"
    assert data["data"]["train_files"] == ["synthetic:add-3digit"]
    assert list(in_tmp.iterdir()) == []  # a dry run writes nothing


# toggle -> (dotted key, value with the toggle on, value with it off) for the tiny experiment
# (clip_ratio_low 0.2; every technique on)
TOGGLES = {
    "clip-higher": ("algorithm.clip_ratio_high", 0.28, 0.2),
    "dynamic-sampling": ("algorithm.filter_groups.enable", True, False),
    "token-level-loss": ("algorithm.loss_agg_mode", "token-mean", "seq-mean-token-mean"),
    "overlong-shaping": ("algorithm.overlong_buffer.enable", True, False),
    "overlong-filtering": ("algorithm.overlong_filter", True, False),
}


@pytest.mark.parametrize("toggle", list(TOGGLES))
@pytest.mark.slow
def test_toggle_off_then_on_changes_exactly_its_key(toggle: str) -> None:
    key, on_value, off_value = TOGGLES[toggle]
    base = dry_run()
    assert get(base, key) == on_value  # the tiny experiment runs full DAPO

    off = dry_run(f"--no-{toggle}")
    assert get(off, key) == off_value
    set_off = f"{key}={off_value}"
    assert off == dry_run("--set", set_off)  # same as editing the config: nothing else moves

    # a toggle that contradicts a --set of the same command is an error naming both ...
    clash = CliRunner().invoke(app, ["train", "--dry-run", "--yaml", "--set", set_off, f"--{toggle}"])
    assert clash.exit_code == 2
    assert clash.stderr.startswith(f"error: --{toggle} contradicts --set {set_off}: ") and clash.stderr.count("\n") == 1
    # ... while over the YAML the toggle wins
    config = Path("off.yaml")
    config.write_text(dump_yaml(load_config(None, [set_off])), encoding="utf-8")
    on = dry_run(str(config), f"--{toggle}")
    assert get(on, key) == on_value
    assert on == base


@pytest.mark.parametrize("toggle", list(TOGGLES))
@pytest.mark.slow
def test_toggle_overrides_the_yaml_file(in_tmp: Path, toggle: str) -> None:
    key, on_value, off_value = TOGGLES[toggle]
    exp: dict[str, Any] = {"rollout": {"max_response_length": 64}, "algorithm": {"overlong_buffer": {"len": 16}}}
    node = exp
    *parents, leaf = key.split(".")
    for name in parents:
        node = node.setdefault(name, {})
    node[leaf] = off_value
    (in_tmp / "exp.yaml").write_text(yaml.safe_dump(exp), encoding="utf-8")
    assert get(dry_run("exp.yaml"), key) == off_value
    assert get(dry_run("exp.yaml", f"--{toggle}"), key) == on_value


@pytest.mark.slow
def test_all_toggles_off_is_naive_grpo() -> None:
    off = dry_run(*(f"--no-{t}" for t in TOGGLES))
    for key, _, off_value in TOGGLES.values():
        assert get(off, key) == off_value
    base = dry_run()
    # everything outside the five technique fields is the tiny experiment unchanged
    for key, _, _ in TOGGLES.values():
        *parents, leaf = key.split(".")
        del get(off, ".".join(parents))[leaf]
        del get(base, ".".join(parents))[leaf]
    assert off == base


@pytest.mark.slow
def test_clip_higher_keeps_a_configured_epsilon_high() -> None:
    data = dry_run("--set", "algorithm.clip_ratio_high=0.3", "--clip-higher")
    assert data["algorithm"]["clip_ratio_high"] == 0.3
    data = dry_run("--set", "algorithm.clip_ratio_low=0.1", "--no-clip-higher")
    assert data["algorithm"]["clip_ratio_high"] == 0.1


@pytest.mark.slow
def test_validation_sees_the_config_after_the_toggles() -> None:
    # an overlong buffer longer than L_max is only an error while shaping is on
    data = dry_run("--set", "algorithm.overlong_buffer.len=999", "--no-overlong-shaping")
    assert data["algorithm"]["overlong_buffer"] == {"enable": False, "len": 999, "penalty_factor": 1.0}
    result = CliRunner().invoke(app, ["train", "--dry-run", "--yaml", "--set", "algorithm.overlong_buffer.len=999"])
    assert result.exit_code == 2
    assert result.output.startswith("error: algorithm.overlong_buffer.len=999")


def test_dry_run_output_reloads_to_the_same_config(in_tmp: Path) -> None:
    result = CliRunner().invoke(app, ["train", "--dry-run", "--yaml", "--no-dynamic-sampling", "--set", "trainer.seed=3"])
    assert result.exit_code == 0, result.output
    (in_tmp / "resolved.yaml").write_text(result.output, encoding="utf-8")
    again = load_config(in_tmp / "resolved.yaml")
    assert to_dict(again) == yaml.safe_load(result.output)
    assert again.algorithm.filter_groups.enable is False and again.trainer.seed == 3
