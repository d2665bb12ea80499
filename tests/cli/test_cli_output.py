"""What `dapo train`, `dapo eval` and `dapo ablate` print where: results on stdout (``--json``: one
object), progress with an ETA and logs on stderr (``--quiet``: none; ``--verbose``: more); Ctrl-C
during training (exit 130, the resume command); the ablation's default experiment and overall ETA."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from fixtures.experiment import experiment_runs, write_experiment
from rich.console import Console
from typer.testing import CliRunner

from dapo_cli.cli import app
from dapo_cli.progress import CountProgress, StepReporter, format_duration

RUN = "grpo+overlong_filtering+clip_higher+overlong_shaping+token_level_loss-s0"
"""The run name of train_config's runs (dynamic sampling off)."""


@pytest.fixture()
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def train_config(tmp: Path, model_dir: Path, steps: int = 2) -> Path:
    """4 prompts × 4 samples of 16 tokens, a checkpoint every step, validation at the start and end."""
    cfg = {
        "data": {"train_files": ["synthetic:add-3digit"], "val_files": ["synthetic:add-3digit"],
                 "synthetic_train_size": 64, "synthetic_val_size": 4, "train_batch_size": 4, "max_prompt_length": 32},
        "model": {"path": str(model_dir)},
        "rollout": {"n": 4, "max_response_length": 16},
        "algorithm": {"overlong_buffer": {"len": 8}},
        "trainer": {"total_steps": steps, "ppo_mini_batch_size": 4, "lr": 1e-3, "lr_warmup_steps": 1, "save_freq": 1,
                    "test_freq": 0, "log_samples_freq": 0},
        "validation": {"k": 2},
    }
    return write_experiment(tmp, cfg, "out")


def only_run(tmp: Path):
    [run] = experiment_runs(tmp, "out")[1]
    return run


def step_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.match(r"step \d+/\d+ ", line)]


# ---------------------------------------------------------------- dapo train


@pytest.mark.slow
def test_train_results_on_stdout_progress_and_steps_on_stderr(workdir: Path, tiny_model_dir: Path) -> None:
    config = train_config(workdir, tiny_model_dir)
    result = CliRunner().invoke(app, ["train", str(config), "--no-dynamic-sampling"])
    assert result.exit_code == 0, result.output
    run = only_run(workdir)
    assert run.info.status == "FINISHED"
    out = result.stdout.splitlines()
    assert f"run dir:    {workdir / 'runs' / 'out' / RUN}" in out
    assert f"MLflow run: {run.info.run_id}" in out
    # the run's charts in the UI's training view: MLflow 3.17 ignores the experiment's kind tag for its mode
    page = f"http://127.0.0.1:5000/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}/model-metrics?workflowType=machine_learning"
    assert f"MLflow UI:  mlflow ui --backend-store-uri sqlite:///{workdir / 'mlflow.db'}, then open {page}" in out
    assert any(line.startswith("held-out accuracy: ") for line in out)
    assert result.output.count("held-out accuracy: ") == 1  # once, with the results (not also as a log line)
    assert any(line.startswith("last step:  acc ") for line in out)
    assert step_lines(result.stdout) == []  # no logs among the results
    steps = step_lines(result.stderr)
    assert [line.split()[1] for line in steps] == ["1/2", "2/2"]
    assert all(re.search(r"  ETA \d+:\d\d$", line) for line in steps), steps
    assert "run dir:" not in result.stderr and "actor/pg_loss=" not in result.stderr


@pytest.mark.slow
def test_train_json_quiet_prints_one_object_and_no_progress(workdir: Path, tiny_model_dir: Path) -> None:
    config = train_config(workdir, tiny_model_dir)
    result = CliRunner().invoke(app, ["train", str(config), "--no-dynamic-sampling", "--json", "--quiet"])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""  # quiet: no progress, no step lines, no notes
    data = json.loads(result.stdout)  # the whole of stdout is one JSON object
    run = only_run(workdir)
    assert data["mlflow_run_id"] == run.info.run_id and data["run_name"] == RUN
    assert data["run_dir"] == str(workdir / "runs" / "out" / RUN)
    assert data["checkpoint"].endswith("checkpoints/step_000002/model")
    assert data["final_val"] == pytest.approx(run.data.metrics["final/val_acc"])
    assert data["last_step_metrics"]["actor/pg_loss"] == pytest.approx(run.data.metrics["actor/pg_loss"])
    assert data == json.loads((Path(data["run_dir"]) / "summary.json").read_text())


@pytest.mark.slow
def test_train_verbose_adds_every_metric_of_every_step(workdir: Path, tiny_model_dir: Path) -> None:
    config = train_config(workdir, tiny_model_dir, steps=1)
    result = CliRunner().invoke(app, ["train", str(config), "--no-dynamic-sampling", "--verbose"])
    assert result.exit_code == 0, result.output
    detail = [line for line in result.stderr.splitlines() if "actor/pg_loss=" in line]
    assert len(detail) == 1 and "timing/step=" in detail[0] and "reward/score_mean=" in detail[0]


def test_quiet_and_verbose_together_is_a_usage_error(workdir: Path) -> None:
    for command in (["train"], ["eval", "builtin:tiny"]):
        result = CliRunner().invoke(app, [*command, "--quiet", "--verbose"])
        assert result.exit_code == 2
        assert result.stderr == "error: give one of --quiet or --verbose, not both\n"


def test_train_json_with_dry_run_is_still_the_plan(workdir: Path) -> None:
    result = CliRunner().invoke(app, ["train", "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    assert "batch" in json.loads(result.stdout)


@pytest.mark.slow
def test_ctrl_c_exits_130_with_the_resume_command(workdir: Path, tiny_model_dir: Path) -> None:
    from dapo_cli.checkpoint import RunLock

    config = train_config(workdir, tiny_model_dir, steps=40)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "400"}
    proc = subprocess.Popen([sys.executable, "-m", "dapo_cli", "train", str(config), "--no-dynamic-sampling"],
                            cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if line.startswith("step 1/40 "):
            break
    assert seen and seen[-1].startswith("step 1/40 "), "".join(seen)
    latest = workdir / "runs" / "out" / RUN / "checkpoints" / "latest"
    while not latest.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)  # step 1's checkpoint (a SIGINT while it is written waits for its end)
    proc.send_signal(signal.SIGINT)
    stdout, rest = proc.communicate(timeout=120)
    stderr = "".join(seen) + rest
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr and stdout == ""
    assert f"resume with: dapo train {config} --no-dynamic-sampling --resume\n" in stderr
    run = only_run(workdir)
    assert run.info.status == "KILLED"
    run_dir = workdir / "runs" / "out" / RUN
    assert not RunLock.is_held(run_dir)  # released: --resume can claim it
    ckpts = run_dir / "checkpoints"
    assert not list(ckpts.glob(".step_*"))  # no half-written checkpoint
    assert (ckpts / "latest").read_text().strip().startswith("step_")
    assert not (run_dir / "summary.json").exists()


def test_sigint_deferred_holds_ctrl_c_to_the_end_of_the_block() -> None:
    from dapo_cli.signals import sigint_deferred

    finished = False
    with pytest.raises(KeyboardInterrupt):
        with sigint_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            finished = True  # the block ran to its end
    assert finished
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    with sigint_deferred():  # no Ctrl-C: nothing raised
        pass


# ---------------------------------------------------------------- dapo eval


@pytest.fixture()
def eval_data(workdir: Path) -> Path:
    """4 synthetic problems as DAPO parquet."""
    out = workdir / "four.parquet"
    result = CliRunner().invoke(app, ["prepare-data", "--synthetic", "add-3digit", "--n", "4", "-o", str(out), "--no-track"])
    assert result.exit_code == 0, result.output
    return out


def eval_args(model: Path, data: Path) -> list[str]:
    return ["eval", str(model), "--dataset", str(data), "--avg", "2", "--max-tokens", "8", "--no-track"]


@pytest.mark.slow
def test_eval_json_on_stdout_plain_progress_lines_on_stderr(tiny_model_dir: Path, eval_data: Path) -> None:
    # --batch-size 2: one problem (K=2) per generate call, so progress advances 4 times (the default: once)
    result = CliRunner().invoke(app, [*eval_args(tiny_model_dir, eval_data), "--json", "--batch-size", "2"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["metrics"]["num_problems"] == 4 and data["metrics"]["num_samples"] == 8
    assert 0.0 <= data["metrics"]["avg@2"] <= 1.0 and data["mlflow_run_id"] is None
    assert data["settings"]["temperature"] == 1.0  # EvalConfig's
    # stderr is not a terminal: a plain line at each 10% mark (one problem = 2 of 8 samples = 25% per batch)
    lines = [line for line in result.stderr.splitlines() if line.startswith("sampling: ")]
    assert [line.split()[1] for line in lines] == ["25%", "50%", "75%", "100%"]
    assert all(re.search(r"samples/s, \d+:\d\d elapsed, ETA \d+:\d\d", line) for line in lines), lines
    assert lines[-1].endswith("ETA 0:00")


@pytest.mark.slow
def test_eval_quiet_prints_only_the_results(tiny_model_dir: Path, eval_data: Path) -> None:
    result = CliRunner().invoke(app, [*eval_args(tiny_model_dir, eval_data), "--quiet", "--engine", "hf"])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    assert "avg@2" in result.stdout and "per problem" in result.stdout


def test_count_progress_plain_lines_every_tenth_with_eta() -> None:
    buffer = io.StringIO()
    with CountProgress("warm-start", unit="steps", console=Console(file=buffer, width=200)) as bar:
        bar.start(95)
        for _ in range(95):
            bar.advance(1, info="loss 0.5")
    lines = buffer.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == [f"{p}%" for p in (10, 21, 31, 42, 52, 63, 73, 84, 94, 100)]
    assert lines[0].startswith("warm-start: 10% (10/95 steps), ") and lines[0].endswith(", loss 0.5")
    quiet = io.StringIO()
    with CountProgress("x", unit="steps", enabled=False, console=Console(file=quiet)) as bar:
        bar.start(3)
        bar.advance(3)
    assert quiet.getvalue() == ""


def test_step_reporter_verbosity_levels() -> None:
    metrics = {"rollout/acc": 0.5, "timing/step": 1.0, "actor/pg_loss": -0.25}
    printed = {}
    for level in (-1, 0, 1):
        buffer = io.StringIO()
        with StepReporter(2, verbosity=level, console=Console(file=buffer, width=200)) as reporter:
            reporter.phase(1, "generate")
            reporter.step_done(1, metrics)
            reporter.note("a note")
        printed[level] = [line for line in buffer.getvalue().splitlines() if line]
    assert printed[-1] == []
    assert len(printed[0]) == 2 and printed[0][0].startswith("step 1/2  acc 0.500") and "ETA" in printed[0][0]
    assert printed[1][:1] == printed[0][:1] and printed[1][1] == "  actor/pg_loss=-0.25  rollout/acc=0.5  timing/step=1"
    assert format_duration(3725) == "1:02:05" and format_duration(None) == "?"


# ---------------------------------------------------------------- dapo ablate


def test_ablate_without_config_runs_the_embedded_ladder_experiment(workdir: Path) -> None:
    from dapo_cli.config.load import EMBEDDED_LADDER, embedded_experiment_path

    result = CliRunner().invoke(app, ["ablate", "--ladder", "--dry-run", "--no-calibrate"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    ladder = yaml.safe_load((Path(__file__).resolve().parents[2] / "experiments" / "tiny-ladder.yaml").read_text())
    assert f"{ladder['trainer']['total_steps']} steps per child" in result.stdout
    assert f"run dirs runs/{ladder['tracking']['experiment']}/" in result.stdout
    assert embedded_experiment_path(EMBEDDED_LADDER).read_text() == (Path(__file__).resolve().parents[2] / "experiments" / "tiny-ladder.yaml").read_text()
    assert list(workdir.iterdir()) == []


@pytest.mark.slow
def test_ablate_logs_overall_progress_with_eta(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ablate"))
    from ablate_fakes import FakeTrain

    from dapo_cli.ablate.variants import make_ablation
    from dapo_cli.ablate.runner import run_ablation
    from dapo_cli.config.load import build_config

    monkeypatch.setattr("dapo_cli.ablate.report.plot_curves", lambda report, out_dir: {"step": [], "samples": []})
    cfg = build_config(None, [f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", "tracking.experiment=abl",
                              f"trainer.output_dir={tmp_path / 'runs'}", "trainer.total_steps=2", "validation.k=4"])
    plan = make_ablation(cfg, mode="ladder", only=["grpo", "dapo"])
    lines: list[str] = []
    run_ablation(plan, command="x", config_path=None, train=FakeTrain(), log=lines.append)
    assert lines[0].endswith("; ablation: 0/2 children done, 0:00 elapsed, ETA ?")
    done = [line for line in lines if ": done in " in line]
    assert len(done) == 2 and done[0].startswith("[1/2] grpo seed 0: done in ")
    assert re.search(r"ablation: 1/2 children done, \d+:\d\d elapsed, ETA \d+:\d\d$", done[0])
    assert done[1].endswith("ETA 0:00")
    lines.clear()
    run_ablation(plan, command="x", config_path=None, train=FakeTrain(), log=lines.append)  # a rerun skips both
    assert lines[-1].endswith("finished earlier, skipped; ablation: 2/2 children done, 0:00 elapsed, ETA 0:00")
