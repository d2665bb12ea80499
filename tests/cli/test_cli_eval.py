"""`dapo eval` through the CLI: the tiny model on the real AIME file, MLflow, resume, compare, bad inputs."""

from __future__ import annotations

import functools
import importlib.util
import itertools
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dapo_cli.cli import app
from dapo_cli.data.schema import make_row, write_dapo_parquet
from dapo_cli.eval.generations import CHECKPOINT_FILE, SampleRecord, write_generations
from dapo_cli.models import load_policy
from dapo_cli.models.tokenizer import format_prompt

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
AIME = DATA / "aime-2024.parquet"
needs_data = pytest.mark.skipif(not AIME.is_file(), reason=f"shared data not found at {DATA}")
runner = CliRunner()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained tiny char-level policy like tests/conftest.py's, with room for an AIME prompt
    (~810 characters) plus the response: eval refuses prompts that overrun the context."""
    from dapo_cli.config.tiny import TinyModelConfig
    from dapo_cli.models import build_char_tokenizer, save_policy
    from dapo_cli.models.tiny import build_tiny_model_for

    cfg = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_position_embeddings=1024)
    tokenizer = build_char_tokenizer()
    out = tmp_path_factory.mktemp("tiny-model-1024")
    save_policy(build_tiny_model_for(cfg, tokenizer), tokenizer, out)
    return out


def error_line(result) -> str:
    """The single line a user error prints (exit 2)."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@needs_data
@pytest.mark.slow
def test_eval_refuses_prompts_over_the_context_before_a_run_is_opened(model_dir: Path, tmp_path: Path) -> None:
    # AIME prompts are ~810 characters (one token each for the char tokenizer) + 300 new tokens
    # > the fixture's 1024 positions: refused before anything generates, and no MLflow run is left
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = runner.invoke(app, ["eval", str(model_dir), "--dataset", str(AIME), "--avg", "2", "--max-tokens", "300",
                                 "--tracking-uri", uri, "--experiment", "too-long", "--output", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    [line] = [x for x in result.stderr.splitlines() if x.startswith("error: ")]  # after the "loading ..." log line
    assert "Traceback" not in result.stderr
    assert "exceeds the model's context of 1024 positions" in line and "lower max_tokens to at most" in line
    assert MlflowClient(tracking_uri=uri).get_experiment_by_name("too-long") is None
    assert not (tmp_path / "out" / "generations.parquet").exists()


@needs_data
@pytest.mark.slow
def test_eval_tiny_model_on_aime_records_mlflow(model_dir: Path, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "out"
    args = ["eval", str(model_dir), "--dataset", str(AIME), "--avg", "4", "--max-tokens", "32", "--batch-size", "120"]
    result = runner.invoke(app, [*args, "--pass-k", "1", "--pass-k", "4", "--output", str(out), "--tracking-uri", uri, "--experiment", "eval-e2e"])
    assert result.exit_code == 0, result.output
    assert "960 rows → 30 problems (32 copies each)" in result.stdout

    summary = json.loads((out / "summary.json").read_text())
    metrics = summary["metrics"]
    generations = pq.read_table(out / "generations.parquet").to_pylist()
    # 30 distinct problems × 4 samples, not 960 × 4
    assert len(generations) == 120 and metrics["num_samples"] == 120 and metrics["num_problems"] == 30
    assert {r["problem_id"] for r in generations} == {str(i) for i in range(30)}
    assert all(r["length"] <= 32 for r in generations)
    avg = sum(r["acc"] for r in generations) / len(generations)
    assert metrics["avg@4"] == pytest.approx(avg, abs=1e-12)
    assert metrics["truncation_rate"] == pytest.approx(sum(r["truncated"] for r in generations) / 120, abs=1e-12)
    assert set(metrics) >= {"avg@4", "pass@1", "pass@4", "maj@4", "avg@4_stderr", "avg@4_ci95_low", "avg@4_ci95_high"}

    client = MlflowClient(tracking_uri=uri)
    [run] = client.search_runs([client.get_experiment_by_name("eval-e2e").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.metrics["avg_at_4"] == pytest.approx(metrics["avg@4"], abs=1e-12)
    assert run.data.metrics["num_samples"] == 120
    assert run.data.params["avg_k"] == "4" and run.data.params["max_tokens"] == "32"
    assert run.data.params["temperature"] == "1.0" and run.data.params["top_p"] == "0.7"  # EvalConfig defaults
    assert {a.path for a in client.list_artifacts(run.info.run_id, "eval")} == {
        "eval/generations.parquet", "eval/summary.json", "eval/generations.json",  # the last: the UI's table
    }
    assert "per_problem.json" in {a.path for a in client.list_artifacts(run.info.run_id)}
    artifact = client.download_artifacts(run.info.run_id, "eval/generations.parquet", str(tmp_path))
    assert pq.read_table(artifact).to_pylist() == generations
    table = json.loads(Path(client.download_artifacts(run.info.run_id, "eval/generations.json", str(tmp_path))).read_text())
    assert len(table["data"]) == 120 and table["columns"][:2] == ["problem_id", "sample"]  # every sample (<= 1000)


@needs_data
@pytest.mark.slow
def test_eval_resumes_only_the_missing_problems(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    # --batch-size 2 = one problem (K=2) per batch; resume with the default batch size: tests/eval/test_eval_speed.py
    args = ["eval", str(model_dir), "--dataset", str(AIME), "--avg", "2", "--max-tokens", "8", "--limit", "2", "--batch-size", "2",
            "--no-track"]
    first = runner.invoke(app, [*args, "--output", str(out)])
    assert first.exit_code == 0, first.output
    complete = pq.read_table(out / "generations.parquet").to_pylist()

    # simulate a kill after the first batch (problem 0): keep the header and batch 0 only
    checkpoint = out / CHECKPOINT_FILE
    lines = checkpoint.read_text().splitlines()
    assert [json.loads(line).get("batch") for line in lines] == [None, 0, 1]
    checkpoint.write_text("\n".join(lines[:2]) + "\n")
    (out / "generations.parquet").unlink()

    second = runner.invoke(app, [*args, "--output", str(out)])
    assert second.exit_code == 0, second.output
    assert "resumed: 1 problems were already done" in second.stdout
    assert "4/4" in second.stderr
    # batch b samples with seed + b, so the resumed run equals the uninterrupted one
    assert pq.read_table(out / "generations.parquet").to_pylist() == complete

    other = runner.invoke(app, [*args, "--output", str(out), "--seed", "1"])
    assert "holds generations made with other settings (seed: 0 then, 1 now)" in error_line(other)


def ticking(step: float):
    """A clock that moves ``step`` seconds at every reading: each timed generate call lasts exactly ``step``."""
    counter = itertools.count()
    return lambda: step * next(counter)


@pytest.fixture()
def short_set(tmp_path: Path) -> Path:
    """5 problems whose prompts fit the tiny model's 128 positions."""
    path = tmp_path / "short.parquet"
    write_dapo_parquet([make_row(f"{i}+1=", str(i + 1), index=i, template="{problem}") for i in range(5)], path)
    return path


@pytest.mark.slow
def test_eval_prints_and_logs_its_generation_speed(tiny_model_dir: Path, short_set: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow import MlflowClient

    import dapo_cli.eval.run as run_module

    monkeypatch.setattr(run_module, "run_eval", functools.partial(run_module.run_eval, clock=ticking(0.5)))
    uri, out = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "out"
    args = ["eval", str(tiny_model_dir), "--dataset", str(short_set), "--avg", "2", "--max-tokens", "6", "--batch-size", "4"]
    result = runner.invoke(app, [*args, "--output", str(out), "--tracking-uri", uri, "--experiment", "speed"])
    assert result.exit_code == 0, result.output
    tokens = sum(r["length"] for r in pq.read_table(out / "generations.parquet").to_pylist())
    # 2 problems (4 sequences) per call: 3 calls of 0.5 s = 1.5 s for 10 samples and their tokens
    client = MlflowClient(tracking_uri=uri)
    [run] = client.search_runs([client.get_experiment_by_name("speed").experiment_id])
    speed = {k: v for k, v in run.data.metrics.items() if k.startswith("eval/")}
    # the fast engine's prefill: every problem's prompt read once (its call's); what its prefix cache served
    # (here little: the tiny model's template adds nothing before the problems, which differ from their first token)
    _, tokenizer = load_policy(tiny_model_dir)
    read = sum(len(tokenizer(format_prompt(tokenizer, [{"role": "user", "content": f"{i}+1="}]), add_special_tokens=False)["input_ids"])
               for i in range(5))
    run_ = speed.pop("eval/prefill_tokens")
    assert speed.pop("eval/prompt_tokens") == read and 0 < run_ <= read
    assert speed == {"eval/gen_samples": 10, "eval/gen_tokens": tokens, "eval/gen_seconds": 1.5,
                     "eval/samples_per_s": 10 / 1.5, "eval/gen_tokens_per_s": tokens / 1.5}
    line = (f"generation: 10 samples, {tokens} tokens in 1.5 s: 6.67 samples/s, {tokens / 1.5:.1f} tokens/s; "
            f"prefill: {int(run_)} of {read} prompt tokens computed ({1 - run_ / read:.1%} served by the prefix cache)")
    assert line in result.stdout.splitlines()

    # --json carries the same numbers; --quiet prints the results without the speed line
    monkeypatch.setattr(run_module, "run_eval", functools.partial(run_module.run_eval.func, clock=ticking(0.5)))
    data = json.loads(runner.invoke(app, [*args, "--no-track", "--json"]).stdout)
    assert data["speed"] == {**speed, "eval/prompt_tokens": read, "eval/prefill_tokens": run_, "eval/gen_tokens": data["speed"]["eval/gen_tokens"],
                             "eval/gen_tokens_per_s": data["speed"]["eval/gen_tokens"] / 1.5}
    quiet = runner.invoke(app, [*args, "--no-track", "--quiet"])
    assert quiet.exit_code == 0 and "avg@2" in quiet.stdout and "generation:" not in quiet.stdout


def test_an_output_dir_of_the_old_defaults_exits_2_with_one_line(tiny_model_dir: Path, short_set: Path, tmp_path: Path) -> None:
    from dapo_cli.eval.run import EvalOptions, GenerationCheckpoint, eval_settings, resolve_checkpoint

    # what the old defaults (--engine hf, --batch-size 0 = one problem per call) wrote for --avg 4 on 5 problems
    opts = EvalOptions(checkpoint=str(tiny_model_dir), dataset=str(short_set), k=4, pass_k=(1,), temperature=1.0,
                       top_p=0.7, max_tokens=20480, verifier="math_dapo", engine="fast", batch_size=0, seed=0)
    settings = {**eval_settings(opts, resolve_checkpoint(str(tiny_model_dir)), short_set, 5), "engine": "hf", "batch_problems": 1}
    GenerationCheckpoint(tmp_path / "out", settings)
    result = runner.invoke(app, ["eval", str(tiny_model_dir), "--dataset", str(short_set), "--avg", "4", "--output",
                                 str(tmp_path / "out"), "--no-track"])
    assert error_line(result) == (
        f"error: {tmp_path / 'out' / CHECKPOINT_FILE}: line 1 says it holds generations made with other settings (batch_problems: "
        "1 then, 16 now; engine: 'hf' then, 'fast' now); use another --output DIR (or delete the file to start afresh)"
    )
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [CHECKPOINT_FILE]


def test_compare_prints_the_paired_difference(tmp_path: Path) -> None:
    # A beats B by 1/2 on problem 0 and ties on 1 → diff 0.25; resample means 0.5, 0.25, 0
    for name, acc0 in (("a", [True, True]), ("b", [True, False])):
        records = [SampleRecord("0", j, "r", "1", acc0[j], 1.0, "1", 1, False) for j in range(2)]
        records += [SampleRecord("1", j, "r", "1", False, -1.0, "1", 1, False) for j in range(2)]
        write_generations(records, tmp_path / f"{name}.parquet")
    result = runner.invoke(app, ["eval", "--compare", str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")])
    assert result.exit_code == 0, result.output
    assert "+0.2500" in result.stdout and "[+0.0000, +0.5000]" in result.stdout
    assert "2 common problems" in result.stdout


def test_missing_checkpoint_exits_2_with_one_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["eval", str(tmp_path / "nope"), "--no-track"])
    assert "checkpoint not found" in error_line(result)


def test_dataset_without_ground_truth_exits_2(model_dir: Path, tmp_path: Path) -> None:
    row = make_row("What is 1+1?", "2", index=0)
    row["reward_model"]["ground_truth"] = ""
    write_dapo_parquet([row], tmp_path / "no-answers.parquet")
    result = runner.invoke(app, ["eval", str(model_dir), "--dataset", str(tmp_path / "no-answers.parquet"), "--no-track"])
    assert "has no reward_model.ground_truth" in error_line(result)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--avg", "0"], "--avg must be at least 1 (got 0)"),
        (["--avg", "4", "--pass-k", "8"], "--pass-k values must lie in 1..4"),
        (["--dataset", "aime25"], "registered names: aime24, dapo-math-17k"),
        (["--verifier", "nope"], "unknown verifier 'nope'; valid names: math_dapo"),
        pytest.param(
            ["--engine", "vllm"],
            "pip install 'dapo-cli[vllm]'",
            marks=pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed"),
        ),
    ],
)
def test_bad_inputs_exit_2_with_one_line(model_dir: Path, tmp_path: Path, extra: list[str], message: str) -> None:
    write_dapo_parquet([make_row("What is 1+1?", "2", index=0)], tmp_path / "set.parquet")
    args = ["eval", str(model_dir), "--dataset", str(tmp_path / "set.parquet"), "--no-track", *extra]
    if extra[0] == "--dataset":
        args = ["eval", str(model_dir), "--no-track", *extra]
    assert message in error_line(runner.invoke(app, args))


def test_a_checkpoint_without_weights_is_refused_before_anything_loads(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    write_dapo_parquet([make_row("What is 1+1?", "2", index=0)], tmp_path / "set.parquet")
    result = runner.invoke(app, ["eval", str(tmp_path / "ckpt"), "--dataset", str(tmp_path / "set.parquet"), "--no-track"])
    assert "ckpt: it holds no weights" in error_line(result)


def test_report_prints_untrusted_text_literally(capsys: pytest.CaptureFixture[str]) -> None:
    from dapo_cli.cli.eval import print_report
    from dapo_cli.eval.run import EvalReport, EvalResult

    # rich markup in a model's answer or a problem text must neither crash nor style the output
    row = {"problem_id": "0", "correct": 1, "samples": 2, "accuracy": 0.5, "majority": "[/]", "majority_correct": False,
           "ground_truth": "[bold]7", "problem": "What is [red]x[/red]?"}
    result = EvalResult(metrics={"avg@2": 0.5, "num_problems": 1.0}, records=[], per_problem=[row])
    report = EvalReport(result=result, settings={"dataset": "d.parquet", "checkpoint": "[m]"}, layout="[x]",
                        resumed_problems=0, run_id="", outputs={})
    print_report(report, 2)
    out = capsys.readouterr().out
    assert "✗ [/]" in out and "[bold]7" in out and "What is [red]x[/red]?" in out and "[m]" in out


def test_report_shows_escape_sequences_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    from dapo_cli.cli.eval import print_report
    from dapo_cli.eval.run import EvalReport, EvalResult

    # a problem that clears the screen and plants an OSC 8 hyperlink, an answer that rings and retitles the
    # window, a dataset file name holding ESC: none reaches the terminal raw, each shows as its escape
    row = {"problem_id": "0", "correct": 1, "samples": 2, "accuracy": 0.5, "majority": "\x1b]0;pwned\x07",
           "majority_correct": False, "ground_truth": "7", "problem": "\x1b[2JWhat is \x1b]8;;http://x\x1b\\1+1?"}
    result = EvalResult(metrics={"avg@2": 0.5, "num_problems": 1.0}, records=[], per_problem=[row])
    report = EvalReport(result=result, settings={"dataset": "d\x1b[31m.parquet", "checkpoint": "c"}, layout="l",
                        resumed_problems=0, run_id="", outputs={})
    print_report(report, 2)
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b[2JWhat is \\x1b]8;;http://x\\x1b\\" in out and "\\x1b]0;pwn" in out  # ESC \\ (ST): "\\" kept
    assert "d\\x1b[31m.parquet" in out


def test_an_error_line_shows_a_file_names_escape_escaped(tmp_path: Path) -> None:
    result = runner.invoke(app, ["eval", str(tmp_path / "m\x1b[2J"), "--dataset", "x.parquet", "--no-track"])
    assert result.exit_code == 2
    assert "\x1b" not in result.stderr and "m\\x1b[2J" in error_line(result)
