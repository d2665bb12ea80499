"""algo / direct_advantage settings: defaults, the rules that tie them to the DAPO sections, the CLI
options, and the --dry-run plan (no weights)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dapo_cli.cli import app
from dapo_cli.config import Config, ConfigError, load_config
from dapo_cli.direct_advantage.checks import phase_of_key

REPO = Path(__file__).resolve().parents[2]
TINY_DA = REPO / "experiments" / "tiny-direct-advantage.yaml"


def test_default_algo_is_dapo_and_the_section_holds_the_papers_values():
    cfg = Config()
    assert cfg.algo == "dapo"
    da = cfg.direct_advantage
    assert (da.samples_per_problem, da.chosen_per_problem, da.mc_completions) == (32, 6, 16)
    assert (da.critic_lr, da.critic_epochs, da.critic_batch_size) == (5e-6, 1, 512)
    assert (da.beta, da.min_gap, da.actor_lr, da.iterations) == (0.01, 0.1, 5e-7, 1)
    assert da.step_delimiter == "\n"


def test_the_tiny_experiment_loads():
    cfg = load_config(TINY_DA)
    assert cfg.algo == "direct-advantage" and cfg.direct_advantage.problems == 64


def test_direct_advantage_rejects_dapo_algorithm_settings(tmp_path):
    with pytest.raises(ConfigError, match=r"does not use the DAPO algorithm section.*algorithm.clip_ratio_high=0.3"):
        load_config(TINY_DA, ["algorithm.clip_ratio_high=0.3"])
    with pytest.raises(ConfigError, match="algorithm.overlong_buffer.len=16"):  # the embedded DAPO experiment sets it
        load_config(None, ["algo=direct-advantage"])


def test_dapo_rejects_direct_advantage_settings():
    with pytest.raises(ConfigError, match=r"direct_advantage.beta=0.5 is a direct-advantage setting but algo=dapo"):
        load_config(None, ["direct_advantage.beta=0.5"])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("direct_advantage.beta=0", "beta=0.0 must be > 0"),
        ("direct_advantage.chosen_per_problem=40", "chosen_per_problem=40 must be in 1..samples_per_problem=16"),
        ("direct_advantage.min_gap=-0.1", "min_gap=-0.1 must be >= 0"),
        ("direct_advantage.critic_holdout=1", r"critic_holdout=1.0 must be in \[0, 1\)"),
        ("rollout.engine=vllm", "not supported yet"),
    ],
)
def test_bad_direct_advantage_values_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(TINY_DA, [override])


def test_the_dapo_overlong_check_does_not_apply_to_direct_advantage():
    cfg = load_config(TINY_DA, ["rollout.max_response_length=32"])  # < the default overlong buffer (4096)
    assert cfg.rollout.max_response_length == 32


@pytest.mark.parametrize(
    ("key", "phase"),
    [
        ("data.train_files", "generate"), ("trainer.seed", "generate"), ("direct_advantage.samples_per_problem", "generate"),
        ("direct_advantage.mc_completions", "mc_values"), ("direct_advantage.critic_lr", "critic"),
        ("direct_advantage.min_gap", "advantages"), ("direct_advantage.beta", "actor"), ("direct_advantage.actor_lr", "actor"),
        ("validation.k", "evaluate"), ("tracking.experiment", None), ("direct_advantage.iterations", None),
        ("something.new", "generate"),
    ],
)
def test_each_setting_belongs_to_the_phase_that_reads_it(key, phase):
    assert phase_of_key(key) == phase


def invoke(*args: str):
    return CliRunner().invoke(app, ["train", *args])


def test_dapo_toggles_are_refused_with_direct_advantage():
    result = invoke(str(TINY_DA), "--algo", "direct-advantage", "--clip-higher")
    assert result.exit_code == 2 and "--clip-higher: DAPO technique toggles do not apply" in result.output


def test_unknown_algo_and_dapo_only_restart_are_refused():
    assert "unknown algorithm" in invoke("--algo", "ppo").output
    result = invoke("--from-phase", "critic", "--dry-run")
    assert result.exit_code == 2 and "--from-phase only works with algo: direct-advantage" in result.output


@pytest.mark.slow
def test_dry_run_prints_generation_counts_without_loading_weights(monkeypatch):
    from dapo_cli import warmstart
    from dapo_cli.models import loading

    monkeypatch.setattr(loading, "resolve_model", lambda *a, **k: pytest.fail("the plan must load no model"))
    monkeypatch.setattr(warmstart, "ensure_model", lambda *a, **k: pytest.fail("the plan must build no model"))
    result = invoke(str(TINY_DA), "--algo", "direct-advantage", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "direct-advantage plan" in result.output and "1.02 k" in result.output  # 64 problems x 16 samples
    result = invoke(str(TINY_DA), "--algo", "direct-advantage", "--dry-run", "--json", "--iterations", "3",
                    "--set", "direct_advantage.expected_steps=0")
    plan = json.loads(result.output)
    assert plan["iterations"] == 3 and [r["steps"] for r in plan["per_iteration"]] == [4, 8, 16, 32]
    first = plan["per_iteration"][0]
    assert first["generate_samples"] == 64 * 16
    assert first["mc_states_max"] == 64 * (1 + 4 * 3) and first["mc_samples_max"] == 64 * 13 * 16
    steps = [r["mc_step_generations_approx"] for r in plan["per_iteration"]]
    assert steps[3] / steps[0] == pytest.approx(32 * 33 / (4 * 5))  # quadratic in the number of steps


def test_cluster_plan_options_are_dapos():
    result = invoke(str(TINY_DA), "--dry-run", "--world-size", "8")
    assert result.exit_code == 2 and "the cluster plan is DAPO's" in result.output
