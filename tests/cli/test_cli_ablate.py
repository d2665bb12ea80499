"""`dapo ablate` and `dapo report` through the CLI: argument forms, dry runs, the print launcher, the report command."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import typer
from fixtures.experiment import write_experiment
from typer.testing import CliRunner

from dapo_cli.cli import app
from dapo_cli.cli import report as report_cli
from dapo_cli.cli.common import handles_errors

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ablate"))

from ablate_fakes import FakeTrain  # noqa: E402

WIDE = {"COLUMNS": "250"}


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env=WIDE)


def one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def write_config(tmp: Path, model: str = "builtin:tiny", **extra) -> Path:
    cfg = {
        "data": {"synthetic_train_size": 16, "synthetic_val_size": 4, "train_batch_size": 2, "max_prompt_length": 32},
        "model": {"path": model},
        "rollout": {"n": 2, "max_response_length": 8},
        "algorithm": {"overlong_buffer": {"len": 4}},
        "trainer": {"total_steps": 2, "ppo_mini_batch_size": 1},
        "validation": {"k": 4},
        "engine": {"device": "cpu", "num_threads": 1},
        **extra,
    }
    return write_experiment(tmp, cfg, "cli-abl")


@pytest.mark.parametrize("args", [[], ["--ladder", "--grid"]])
def test_exactly_one_of_ladder_or_grid(args: list[str]) -> None:
    assert "exactly one of --ladder" in one_line_error(invoke("ablate", *args))


def test_ladder_dry_run_without_config_uses_the_embedded_ladder_experiment(in_tmp: Path) -> None:
    result = invoke("ablate", "--ladder", "--dry-run", "--no-calibrate")
    assert result.exit_code == 0, result.output
    for name, label, paper in [("grpo", "Naive GRPO", "30"), ("grpo+overlong_filtering", "+ Overlong Filtering", "36"),
                               ("dapo", "+ Dynamic Sampling (DAPO)", "50")]:
        assert re.search(rf"│ {re.escape(label)} \({paper}\) +│ {re.escape(name)} +│", result.output), name
    assert re.search(r"│ +0 │ ·  │ ·  │  ·  │  ·  │ ·  │ Naive GRPO", result.output)  # every technique off
    assert re.search(r"│ +5 │ ✓  │ ✓  │  ✓  │  ✓  │ ✓  │ \+ Dynamic Sampling", result.output)
    assert "ladder, 6 variants × 3 seeds" in result.output  # experiments/tiny-ladder.yaml: ablate.seeds 3
    assert "18 child runs; time estimate skipped (--no-calibrate)" in result.output
    assert "runs/dapo-tiny-ladder/dapo-tiny-ladder-ladder-" in result.output  # experiments/tiny-ladder.yaml's
    assert list(in_tmp.iterdir()) == []  # a dry run writes nothing


def test_ladder_dry_run_with_an_empty_cache_builds_and_trains_nothing_and_says_what_a_real_run_builds(
    in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the default --calibrate, a missing warm-start is named (with its measured cost), not built: the
    calibration, which would build it and train a step, is skipped."""
    import time

    cache = in_tmp / "cache"
    cache.mkdir()
    monkeypatch.setenv("DAPO_CACHE", str(cache))

    def no_training():
        raise AssertionError("a dry run must not train (the calibration would build the warm-start first)")

    monkeypatch.setattr("dapo_cli.ablate.estimate.default_train", no_training)
    t0 = time.perf_counter()
    result = invoke("ablate", "--ladder", "--dry-run")
    assert result.exit_code == 0, result.output
    assert time.perf_counter() - t0 < 60  # seconds, not the 12 minutes of a build
    out = " ".join(result.output.split())  # the console wraps long lines
    # experiments/tiny-ladder.yaml: task arith-medium, 600 SFT steps; 12 min 23 s measured (its header) → about 12 min
    assert "would build: builtin:tiny (task arith-medium, 600 SFT steps) is not cached yet" in out, result.output
    assert "a real run builds it first, about 12 min on 2 cores" in out
    assert "18 child runs; time estimate skipped: it times one step of the policy, which a dry run does not build" in out
    assert list(cache.iterdir()) == []  # nothing built into the cache
    assert sorted(p.name for p in in_tmp.iterdir()) == ["cache"]  # no runs/, no mlflow.db


@pytest.mark.slow
def test_grid_forms(in_tmp: Path) -> None:
    full = invoke("ablate", "--grid", "--dry-run", "--no-calibrate", "--seeds", "2")
    assert full.exit_code == 0, full.output
    assert "grid, 32 variants × 2 seeds" in full.output and "64 child runs" in full.output
    config = write_config(in_tmp)
    for args in (["--grid", "dynamic_sampling,clip-higher"], [str(config), "--grid", "clip_higher,dynamic_sampling"],
                 ["--grid", "clip_higher,dynamic_sampling", str(config)]):
        sub = invoke("ablate", *args, "--dry-run", "--no-calibrate", "--skip", "dapo", "--seeds", "1")
        assert sub.exit_code == 0, sub.output
        assert "grid, 3 variants × 1 seeds" in sub.output, args
    assert "'clip_higher' lists techniques" in one_line_error(invoke("ablate", "--ladder", "clip_higher"))
    assert "unknown variant(s) nope; this plan has: grpo, grpo+overlong_filtering," in one_line_error(
        invoke("ablate", "--ladder", "--only", "nope", "--dry-run"))
    assert "unexpected argument 'b.yaml'" in one_line_error(invoke("ablate", "a.yaml", "b.yaml", "--ladder"))
    assert "config file not found: missing.yaml" in one_line_error(invoke("ablate", "missing.yaml", "--ladder"))


@pytest.mark.slow
def test_dry_run_calibrates_on_one_step_and_leaves_nothing_behind(in_tmp: Path, tiny_model_dir: Path) -> None:
    import torch

    threads = torch.get_num_threads()
    config = write_config(in_tmp, str(tiny_model_dir))
    try:
        result = invoke("ablate", str(config), "--ladder", "--only", "grpo", "--only", "dapo", "--dry-run")
    finally:
        torch.set_num_threads(threads)
    assert result.exit_code == 0, result.output
    match = re.search(r"2 child runs; one step of grpo took ([0-9.]+) s .* ≈ ([0-9.]+) min for 2 × 2 steps", result.output)
    assert match, result.output
    assert float(match.group(2)) == pytest.approx(2 * 2 * float(match.group(1)) / 60, abs=0.06)  # printed rounded
    assert sorted(p.name for p in in_tmp.iterdir()) == ["exp.yaml"]  # no runs/, no mlflow.db


@pytest.mark.slow
def test_print_launcher_emits_one_train_command_per_child(in_tmp: Path) -> None:
    config = write_config(in_tmp)
    result = invoke("ablate", str(config), "--ladder", "--launcher", "print", "--set", "trainer.lr=0.001", "--seeds", "2")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 12
    pid = lines[0].split()[0].removeprefix("DAPO_PARENT_RUN_ID=")
    assert re.fullmatch(r"[0-9a-f]{32}", pid)
    assert all(line.startswith(f"DAPO_PARENT_RUN_ID={pid} dapo train {config} --set trainer.lr=0.001 --set trainer.seed=") for line in lines)
    assert lines[0].endswith("--no-overlong-filtering --no-clip-higher --no-overlong-shaping --no-token-level-loss --no-dynamic-sampling")
    assert "trainer.seed=1" in lines[6] and lines[11].endswith("--dynamic-sampling")
    assert f"dapo report {pid}" in result.stderr
    assert not (in_tmp / "runs").exists()  # nothing trained here
    # ablate.nproc=2: the same ablation (same parent), each child under torchrun
    again = invoke("ablate", str(config), "--ladder", "--launcher", "print", "--set", "trainer.lr=0.001", "--seeds", "2",
                   "--set", "ablate.nproc=2")
    assert again.exit_code == 0, again.output
    torchrun = again.stdout.splitlines()
    assert len(torchrun) == 12 and all(line.startswith(
        f"DAPO_PARENT_RUN_ID={pid} torchrun --standalone --nproc_per_node 2 -m dapo_cli train {config} --set trainer.lr=0.001 "
        "--set ablate.nproc=2 --set trainer.seed=") for line in torchrun)
    assert [line.split(" -m dapo_cli ", 1)[1] for line in torchrun] == [
        line.split(" dapo ", 1)[1].replace("--set trainer.lr=0.001", "--set trainer.lr=0.001 --set ablate.nproc=2") for line in lines]


@pytest.mark.slow
def test_report_command_reads_the_ablation_back(in_tmp: Path) -> None:
    from dapo_cli.ablate.variants import make_ablation
    from dapo_cli.ablate.runner import run_ablation
    from dapo_cli.config import load_config

    config = write_config(in_tmp)
    plan = make_ablation(load_config(config), mode="grid", techniques=("clip_higher",))
    fake = FakeTrain({("grpo+overlong_filtering+overlong_shaping+token_level_loss+dynamic_sampling", 0): [4, 4, 0],
                      ("dapo", 0): [4, 4, 4]})
    outcome = run_ablation(plan, command="dapo ablate --grid clip_higher", config_path=str(config), train=fake)
    cli = typer.Typer()
    cli.command("report")(handles_errors(report_cli.report))
    cli.command("ablate")(handles_errors(lambda: None))  # two commands, so `report` is a subcommand as in `dapo`
    uri = f"sqlite:///{in_tmp / 'mlflow.db'}"
    out = in_tmp / "rep"
    result = CliRunner().invoke(cli, ["report", outcome.parent_run_id, "--tracking-uri", uri, "--output", str(out),
                                      "--html", "--attach"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    # baseline (clip-higher off) 8/12 correct = 66.7; dapo 12/12 = 100.0, Δ +33.3 over the 3 paired problems
    assert re.search(r"│ +0 │ grpo\+overlong_filtering\+overlong_shaping\+token_level_loss\+dynamic_sampling +│ +— +│ +— │ +66\.7 │", result.output)
    assert re.search(r"│ +1 │ dapo +│ \+ Dynamic Sampling \(DAPO\) │ +50 │ +100\.0 │.*│ \+33\.3 │", result.output)
    assert (out / "report.md").is_file() and (out / "report.html").is_file()
    from mlflow import MlflowClient

    logged = {a.path for a in MlflowClient(uri).list_artifacts(outcome.parent_run_id, "report")}
    assert "report/report.html" in logged  # --attach: only that run of `dapo report` wrote the HTML
    bad = CliRunner().invoke(cli, ["report", "nope", "--tracking-uri", uri], env=WIDE)
    assert "no ablation parent run, ablation name or experiment named 'nope'" in one_line_error(bad)


@pytest.mark.slow
def test_a_failing_torchrun_child_is_a_one_line_error(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []

    def failing(argv, extra_env, *, log_path=None):
        seen.append(argv)
        return 5

    monkeypatch.setattr("dapo_cli.ablate.launchers.run_child", failing)
    config = write_config(in_tmp)
    result = invoke("ablate", str(config), "--ladder", "--only", "grpo", "--set", "ablate.nproc=2")
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [result.stderr.splitlines()[-1]], result.stderr  # after the progress lines: one error line, the last
    assert re.fullmatch(r"error: child cli-abl-ladder-[0-9a-f]{8}/grpo-s0 failed with exit code 5; rerun the same command to resume it",
                        errors[0]), errors
    assert seen and seen[0][1:7] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m"]


@pytest.mark.slow
def test_jobs_below_one_is_a_one_line_error_before_anything_runs(in_tmp: Path) -> None:
    config = write_config(in_tmp)
    expected = "error: ablate.jobs=0 must be >= 1 (--jobs N: children trained at once; 1: one after another)"
    assert one_line_error(invoke("ablate", str(config), "--ladder", "--jobs", "0")) == expected
    assert one_line_error(invoke("ablate", str(config), "--ladder", "--set", "ablate.jobs=0")) == expected
    assert one_line_error(invoke("ablate", str(config), "--ladder", "--set", "ablate.jobs=3", "--jobs", "-1")).startswith(
        "error: ablate.jobs=-1 must be >= 1")  # --jobs overrides the config
    assert not (in_tmp / "mlflow.db").exists() and not (in_tmp / "runs").exists()


def test_slurm_launcher_without_submitit_is_a_one_line_error(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "submitit", None)  # `import submitit` raises ImportError
    config = write_config(in_tmp)
    line = one_line_error(invoke("ablate", str(config), "--ladder", "--launcher", "slurm"))
    assert line == "error: launcher slurm needs submitit: pip install 'dapo-cli[slurm]'"
    assert "slurm" in one_line_error(invoke("ablate", str(config), "--ladder", "--set", "ablate.launcher=nope"))


@pytest.mark.slow
def test_train_reads_the_parent_run_and_extra_tags_of_a_child_process(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`dapo train` as a child of `dapo ablate` (DAPO_PARENT_RUN_ID, DAPO_EXTRA_TAGS) with a stand-in trainer."""
    import json
    import types

    from dapo_cli.tracking.tags import child_env

    calls = []
    stub = types.ModuleType("dapo_cli.train")
    stub.run_train = lambda cfg, **kwargs: calls.append((cfg, kwargs)) or {}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "dapo_cli.train", stub)
    tags = {"ablate.variant": "dapo", "ablate.rung": "5", "ablate.seed": "0", "ablate.parent": "p" * 32}
    result = CliRunner().invoke(app, ["train", "--set", "trainer.total_steps=1", "--resume"], env=child_env("p" * 32, tags))
    assert result.exit_code == 0, result.output
    (cfg, kwargs), = calls
    assert kwargs["extra_tags"] == tags and kwargs["parent_run_id"] == "p" * 32 and kwargs["resume"] is True
    assert cfg.trainer.total_steps == 1
    calls.clear()
    plain = CliRunner().invoke(app, ["train"], env={"DAPO_PARENT_RUN_ID": None, "DAPO_EXTRA_TAGS": None})
    assert plain.exit_code == 0, plain.output
    assert calls[0][1]["extra_tags"] is None and calls[0][1]["parent_run_id"] is None
    bad = CliRunner().invoke(app, ["train"], env={"DAPO_EXTRA_TAGS": json.dumps(["not", "an", "object"])})
    assert "DAPO_EXTRA_TAGS must be a JSON object of tag names to values, got list" in one_line_error(bad)


@pytest.mark.slow
def test_an_axis_multiplies_the_dry_run_plan_and_its_printed_commands(in_tmp: Path) -> None:
    config = write_config(in_tmp)
    dry = invoke("ablate", str(config), "--grid", "dynamic_sampling", "--axis", "rollout.max_staleness=0,1", "--seeds", "2",
                 "--dry-run", "--no-calibrate")
    assert dry.exit_code == 0, dry.output
    assert "grid, 4 variants × 2 seeds" in dry.output and "8 child runs" in dry.output
    assert "max_staleness = rollout.max_staleness" in dry.output  # the axis column's legend
    for rung, (ds, value, name) in enumerate([("·", "0", "grpo+overlong_filtering+clip_higher+overlong_shaping+token_level_loss@max_staleness=0"),
                                              ("·", "1", "grpo+overlong_filtering+clip_higher+overlong_shaping+token_level_loss@max_staleness=1"),
                                              ("✓", "0", "dapo@max_staleness=0"), ("✓", "1", "dapo@max_staleness=1")]):
        assert re.search(rf"│ +{rung} │ ✓  │ ✓  │  ✓  │  ✓  │ {ds}  │ +{value} +│ .*│ {re.escape(name)} +│", dry.output), name
    assert sorted(p.name for p in in_tmp.iterdir()) == ["exp.yaml"]  # a dry run writes nothing
    # the ladder takes an axis too: each rung once per value
    ladder = invoke("ablate", str(config), "--ladder", "--axis", "rollout.max_staleness=0,1", "--seeds", "1", "--dry-run",
                    "--no-calibrate")
    assert ladder.exit_code == 0, ladder.output
    assert "ladder, 12 variants × 1 seeds" in ladder.output and "│ grpo@max_staleness=1 " in ladder.output
    # print launcher: each command sets the axis value, and the child's ablate.* tags name its axis variant
    printed = invoke("ablate", str(config), "--grid", "dynamic_sampling", "--axis", "rollout.max_staleness=0,1", "--launcher", "print",
                     "--seeds", "1")
    assert printed.exit_code == 0, printed.output
    lines = printed.stdout.splitlines()
    assert len(lines) == 4
    assert all(f"--set rollout.max_staleness={v} --set trainer.seed=0" in line for line, v in zip(lines, "0101"))
    assert """DAPO_EXTRA_TAGS='{"ablate.label": "+ Dynamic Sampling (DAPO)", "ablate.parent": """ in lines[3]
    assert '"ablate.variant": "dapo@max_staleness=1"}' in lines[3] and "'tracking.run_label=DAPO@ms=1 s0'" in lines[3]


def test_an_axis_on_a_technique_key_or_the_seed_is_a_one_line_error(in_tmp: Path) -> None:
    assert "--axis algorithm.filter_groups.enable: the technique toggles own it" in one_line_error(
        invoke("ablate", "--grid", "--axis", "algorithm.filter_groups.enable=true,false", "--dry-run", "--no-calibrate"))
    assert "--axis trainer.seed: --seeds sets it" in one_line_error(
        invoke("ablate", "--ladder", "--axis", "trainer.seed=0,1", "--dry-run", "--no-calibrate"))
    assert list(in_tmp.iterdir()) == []
