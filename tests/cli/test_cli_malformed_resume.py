"""Damaged saved state on ``dapo train --resume`` and ``dapo eval --output DIR``: exit 2, one ``error:`` line naming
the file, the field and the fix, no traceback, nothing written (issue 54).

One real two-step training run (a checkpoint after each step) and one real evaluation are made once per module;
each case copies them into its own empty working directory, damages one field of one saved file, and runs the
command through :func:`malformed_harness.run_case`: the directory listing after the command (MLflow store and
run directories included, with their sizes) must equal the listing before it. Which checkpoint ``--resume``
takes is unchanged: files that cannot be read at all are passed over for the checkpoint before them (here every
checkpoint is damaged alike, so none is left), while readable files holding wrong values are refused, naming
the checkpoint to delete.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from malformed_harness import ENV, Case, case, places_for, run_case
from typer.testing import CliRunner

from dapo_cli.cli import app
from dapo_cli.statefiles import read_state, write_state

EXPERIMENT, RUN = "resume", "grpo+overlong_filtering+clip_higher+overlong_shaping+token_level_loss-s0"
RUN_DIR = Path("runs") / EXPERIMENT / RUN
CHECKPOINTS = RUN_DIR / "checkpoints"
LAST = CHECKPOINTS / "step_000002"
RESUME = ("train", "exp.yaml", "--resume", "--set", "trainer.total_steps=3")
AFRESH = "start a fresh run without --resume"
DELETE_LAST = f"delete step_000002 so --resume takes step_000001, or {AFRESH}"
SHORT_EVAL = ("eval", "{model}", "--dataset", "{short}", "--avg", "2", "--max-tokens", "4", "--batch-size", "2", "--output", "out")


def experiment(model: Path) -> dict[str, Any]:
    """Two steps of 2 prompts x 2 samples, 4-token responses, a checkpoint after each step; the store and the run
    directories relative to the working directory, so a copy of the folder is a run of its own."""
    return {
        "data": {"train_files": ["synthetic:add-3digit"], "val_files": [], "synthetic_train_size": 6,
                 "train_batch_size": 2, "max_prompt_length": 32},
        "model": {"path": str(model)},
        "rollout": {"n": 2, "max_response_length": 4},
        "algorithm": {"overlong_buffer": {"len": 2}, "filter_groups": {"enable": False}},
        "trainer": {"total_steps": 2, "ppo_mini_batch_size": 2, "ppo_micro_batch_size": 4, "lr": 1e-3, "lr_warmup_steps": 1,
                    "save_freq": 1, "test_freq": 0, "log_samples_freq": 0, "output_dir": "runs"},
        "engine": {"device": "cpu", "num_threads": 1},
        "tracking": {"experiment": EXPERIMENT, "tracking_uri": "sqlite:///mlflow.db", "log_checkpoint": "none"},
    }


@pytest.fixture(scope="module")
def saved(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """``run``: a folder holding exp.yaml, its finished 2-step run and MLflow store; ``eval``: an ``out/`` whose
    evaluation was killed after 2 of its 3 batches; ``short``: that evaluation's 3-problem dataset."""
    from dapo_cli.data.schema import make_row, write_dapo_parquet

    root, cwd, threads = tmp_path_factory.mktemp("saved-state"), Path.cwd(), torch.get_num_threads()
    run, ev = root / "run", root / "eval"
    run.mkdir()
    ev.mkdir()
    (run / "exp.yaml").write_text(yaml.safe_dump(experiment(models["model"])), encoding="utf-8")
    short = root / "short.parquet"
    write_dapo_parquet([make_row(f"{i}+1=", str(i + 1), index=i, template="{problem}") for i in range(3)], short)
    try:
        os.chdir(run)
        result = CliRunner().invoke(app, ["train", "exp.yaml", "--quiet"], env=ENV)
        assert result.exit_code == 0, result.output
        os.chdir(ev)
        args = [a.format(model=models["model"], short=short) for a in SHORT_EVAL]
        result = CliRunner().invoke(app, [*args, "--no-track", "--quiet"], env=ENV)
        assert result.exit_code == 0, result.output
    finally:
        os.chdir(cwd)
        torch.set_num_threads(threads)
    for name in ("generations.parquet", "summary.json"):
        (ev / "out" / name).unlink()
    partial = ev / "out" / "generations.partial.jsonl"
    partial.write_text("".join(line + "\n" for line in partial.read_text().splitlines()[:3]), encoding="utf-8")
    yield {"run": run, "eval": ev, "short": short}


# ---------------------------------------------------------------- damage, one field of one file per case


def every_checkpoint(damage: Callable[[Path], object]) -> Callable[[Path], None]:
    """Damage each checkpoint of the run alike (an unreadable file is passed over for the one before it)."""
    def apply(cwd: Path) -> None:
        for ckpt in sorted((cwd / CHECKPOINTS).glob("step_*")):
            damage(ckpt)
    return apply


def trainer_state(change: Callable[[dict[str, Any]], object]) -> Callable[[Path], None]:
    def apply(cwd: Path) -> None:
        path = cwd / LAST / "trainer_state.json"
        state = json.loads(path.read_text(encoding="utf-8"))
        change(state)
        path.write_text(json.dumps(state), encoding="utf-8")
    return apply


def state_file(relative: str, change: Callable[[Any], object]) -> Callable[[Path], None]:
    def apply(cwd: Path) -> None:
        state = read_state(cwd / LAST / relative)
        change(state)
        write_state(cwd / LAST / relative, state)
    return apply


def config_text(text: str | bytes | None) -> Callable[[Path], None]:
    def apply(cwd: Path) -> None:
        path = cwd / RUN_DIR / "config.yaml"
        if text is None:
            path.unlink()
        elif isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8")
    return apply


def partial_line(number: int, change: Callable[[Any], object]) -> Callable[[Path], None]:
    def apply(cwd: Path) -> None:
        path = cwd / "out" / "generations.partial.jsonl"
        lines = path.read_text(encoding="utf-8").splitlines()
        value = json.loads(lines[number - 1])
        change(value)
        lines[number - 1] = json.dumps(value)
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return apply


def pop_record(entry: dict[str, Any]) -> None:
    entry["records"].pop()


CKPT = f"cannot resume from checkpoint {LAST}"
CONFIG = f"--resume: cannot use the run's saved config: {RUN_DIR / 'config.yaml'}"
PARTIAL = os.path.join("out", "generations.partial.jsonl")
RESUME_CASES: list[tuple[Case, Callable[[Path], None]]] = [
    # ------------------------------------------------------------ the run's config.yaml
    (case("config-missing", *RESUME, expect=f"--resume: cannot use the run's saved config: config file not found: {RUN_DIR}"),
     config_text(None)),
    (case("config-binary", *RESUME, expect=f"config {RUN_DIR / 'config.yaml'} is not a UTF-8 text file (byte 1); put back"),
     config_text(b"\x1f\x8b\x08\x00\xff\xfe\x00\x80" * 16)),
    (case("config-bad-yaml", *RESUME, expect=f"{CONFIG} is not valid YAML at line 2"), config_text("data: [1,\n")),
    (case("config-5000-digits", *RESUME, expect=f"{CONFIG} holds a value that cannot be read (Exceeds the limit (4300 digits)"),
     config_text("trainer:\n  total_steps: " + "9" * 5000 + "\n")),
    (case("config-nested", *RESUME, expect=f"{CONFIG} nests its values too deeply to read; put back the config.yaml"),
     config_text("data: " + "[" * 5000 + "]" * 5000 + "\n")),
    # ------------------------------------------------------------ trainer_state.json
    (case("state-step-string", *RESUME, expect=f"{CKPT}: trainer_state.json: step is '2', not a whole number; {DELETE_LAST}"),
     trainer_state(lambda s: s.update(step="2"))),
    (case("state-step-negative", *RESUME, expect="trainer_state.json: step is -1; it must be >= 0"),
     trainer_state(lambda s: s.update(step=-1))),
    (case("state-stream-list", *RESUME, expect="trainer_state.json: stream is [0, 4], not an object of fields"),
     trainer_state(lambda s: s.update(stream=[0, 4]))),
    (case("state-missing-key", *RESUME, expect=f"{CKPT}: trainer_state.json lacks barren_steps; {DELETE_LAST}"),
     trainer_state(lambda s: s.pop("barren_steps"))),
    (case("state-position-past-the-data", *RESUME,
          expect="trainer_state.json: stream.position is 99; it must be in [0, 6] (the run has 6 training prompts)"),
     trainer_state(lambda s: s["stream"].update(position=99))),
    (case("state-5000-digits", *RESUME, expect="has no complete checkpoint (step_000002: trainer_state.json is unreadable "
                                               "(a number of more than 4,300 digits); step_000001: trainer_state.json"),
     every_checkpoint(lambda ckpt: (ckpt / "trainer_state.json").write_text('{"step": ' + "9" * 5000 + "}"))),
    (case("state-nested", *RESUME, expect="trainer_state.json is unreadable (nested too deeply to read)"),
     every_checkpoint(lambda ckpt: (ckpt / "trainer_state.json").write_text("[" * 100_000 + "]" * 100_000))),
    (case("state-past-total-steps", "train", "exp.yaml", "--resume", "--set", "trainer.total_steps=1",
          expect=f"--resume: {LAST} is step 2, past trainer.total_steps=1; resume with --set trainer.total_steps=2 or more"),
     lambda cwd: None),
    # ------------------------------------------------------------ rng/rank_00000.safetensors
    (case("rng-torch-shape", *RESUME, expect=f"{CKPT}: rng/rank_00000.safetensors: torch holds 100 bytes; this torch's "
                                             f"generator state is {torch.get_rng_state().numel()}; {DELETE_LAST}"),
     state_file("rng/rank_00000.safetensors", lambda s: s.update(torch=torch.zeros(100, dtype=torch.uint8)))),
    (case("rng-torch-dtype", *RESUME, expect="rng/rank_00000.safetensors: torch is a torch.int64 tensor of shape"),
     state_file("rng/rank_00000.safetensors", lambda s: s.update(torch=s["torch"].long()))),
    (case("rng-python", *RESUME, expect="rng/rank_00000.safetensors: python[1] is 10 words; Python's random keeps a tuple of 625"),
     state_file("rng/rank_00000.safetensors", lambda s: s.update(python=(3, s["python"][1][:10], None)))),
    # ------------------------------------------------------------ engine/optimizer.safetensors
    (case("optimizer-moment-shape", *RESUME, expect=f"{CKPT}: engine/optimizer.safetensors: optimizer.state[0].exp_avg has "
                                                    f"shape [3, 3]; the model's parameter has"),
     state_file("engine/optimizer.safetensors", lambda s: s["optimizer"]["state"][0].update(exp_avg=torch.zeros(3, 3)))),
    (case("optimizer-parameter-count", *RESUME, expect="optimizer.param_groups[0].params lists 1 parameters; this model trains"),
     state_file("engine/optimizer.safetensors", lambda s: s["optimizer"]["param_groups"][0].update(params=[0]))),
    (case("optimizer-lr-string", *RESUME, expect="optimizer.param_groups[0].lr is 'fast', not a finite number"),
     state_file("engine/optimizer.safetensors", lambda s: s["optimizer"]["param_groups"][0].update(lr="fast"))),
    (case("scheduler-epoch", *RESUME, expect="engine/optimizer.safetensors: scheduler.last_epoch is -4; it must be >= 0"),
     state_file("engine/optimizer.safetensors", lambda s: s["scheduler"].update(last_epoch=-4))),
]

EVAL_CASES: list[tuple[Case, Callable[[Path], None]]] = [
    (case("partial-header-not-json", *SHORT_EVAL, expect=f"{PARTIAL}: line 1 is corrupt (not valid JSON: line 1 column 1"),
     lambda cwd: (cwd / PARTIAL).write_text("nope\n" + "".join(
         line + "\n" for line in (cwd / PARTIAL).read_text().splitlines()[1:]))),
    (case("partial-header-keys", *SHORT_EVAL, expect=f"{PARTIAL}: line 1 is not its settings header"),
     partial_line(1, lambda h: h.update(extra=1))),
    (case("partial-other-settings", *SHORT_EVAL, "--seed", "1",
          expect=f"{PARTIAL}: line 1 says it holds generations made with other settings (seed: 0 then, 1 now)"),
     lambda cwd: None),
    (case("partial-record-type", *SHORT_EVAL, expect=f"{PARTIAL}: line 2, record 1: acc is 'yes', not of type bool; delete it "
                                                     "or use another --output DIR"),
     partial_line(2, lambda e: e["records"][0].update(acc="yes"))),
    (case("partial-batch-out-of-range", *SHORT_EVAL, expect=f"{PARTIAL}: line 3 is batch 7; this evaluation's batches are 0..2"),
     partial_line(3, lambda e: e.update(batch=7))),
    (case("partial-problem-out-of-batch", *SHORT_EVAL,
          expect=f"{PARTIAL}: line 2 holds sample 0 of problem '2'; batch 0 is samples 0..1 of problem(s) '0'"),
     partial_line(2, lambda e: e["records"][0].update(problem_id="2"))),
    (case("partial-sample-count", *SHORT_EVAL, expect=f"{PARTIAL}: line 3 holds 1 samples; batch 1 is 1 problem(s) x 2 samples"),
     partial_line(3, pop_record)),
]


def copy_into(source: Path, cwd: Path) -> None:
    for item in source.iterdir():
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, cwd / item.name)


@pytest.fixture
def cwd(case_dir: Path) -> Path:
    """The case's working directory (conftest's ``case_dir``)."""
    return case_dir


def places(c: Case, request: pytest.FixtureRequest, models: dict[str, Path], dataset: Path, saved: dict[str, Path]) -> dict[str, str]:
    return {**places_for(c, request, models, dataset), "short": str(saved["short"])}


@pytest.mark.slow
@pytest.mark.parametrize(("c", "damage"), RESUME_CASES, ids=[c.id for c, _ in RESUME_CASES])
def test_damaged_saved_state_of_a_run_is_one_error_line_before_the_run_opens(
    c: Case, damage: Callable[[Path], None], request: pytest.FixtureRequest, models: dict[str, Path], dataset: Path,
    saved: dict[str, Path], cwd: Path,
) -> None:
    copy_into(saved["run"], cwd)
    damage(cwd)
    run_case(c, places(c, request, models, dataset, saved), cwd)


@pytest.mark.slow
@pytest.mark.parametrize(("c", "damage"), EVAL_CASES, ids=[c.id for c, _ in EVAL_CASES])
def test_a_damaged_partial_evaluation_is_one_error_line_and_nothing_is_written(
    c: Case, damage: Callable[[Path], None], request: pytest.FixtureRequest, models: dict[str, Path], dataset: Path,
    saved: dict[str, Path], cwd: Path,
) -> None:
    copy_into(saved["eval"], cwd)
    damage(cwd)
    run_case(c, places(c, request, models, dataset, saved), cwd)  # tracked (no --no-track): no store appears either


@pytest.mark.slow
def test_moments_of_the_wrong_shape_leave_the_mlflow_run_as_it_was(
    request: pytest.FixtureRequest, models: dict[str, Path], dataset: Path, saved: dict[str, Path], cwd: Path,
) -> None:
    """Before issue 54 these moments were taken, training started, AdamW crashed in the first step and the
    MLflow run was left FAILED; now the store is not opened for writing at all (run_case: its size is unchanged)."""
    from mlflow import MlflowClient

    c, damage = next(pair for pair in RESUME_CASES if pair[0].id == "optimizer-moment-shape")
    copy_into(saved["run"], cwd)
    damage(cwd)
    client = MlflowClient("sqlite:///mlflow.db")
    experiment_id = client.get_experiment_by_name(EXPERIMENT).experiment_id

    def runs() -> list[tuple[str, str]]:
        return [(r.info.run_id, r.info.status) for r in client.search_runs([experiment_id])]

    before = runs()
    assert [status for _, status in before] == ["FINISHED"]
    run_case(c, places(c, request, models, dataset, saved), cwd)
    assert runs() == before


@pytest.mark.slow
def test_the_saved_state_resumes_when_nothing_is_damaged(saved: dict[str, Path], cwd: Path) -> None:
    """The checks refuse only what is wrong: the state the fixture saved resumes and trains its third step."""
    copy_into(saved["run"], cwd)
    result = CliRunner().invoke(app, [*RESUME, "--quiet"], env=ENV)
    assert result.exit_code == 0, result.output
    assert (cwd / CHECKPOINTS / "step_000003" / "trainer_state.json").is_file()
