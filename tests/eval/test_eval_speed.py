"""Generation speed of dapo eval (dapo_cli/eval/speed.py): timed generate calls, exact rates from the records."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dapo_cli.data.schema import make_row, write_dapo_parquet
from dapo_cli.eval.generations import CHECKPOINT_FILE, SampleRecord
from dapo_cli.eval.problems import group_problems
from dapo_cli.eval.run import EvalOptions, generate_records, run_eval
from dapo_cli.eval.speed import PREFILL_KEYS, SPEED_KEYS, Stopwatch, speed_line, throughput

from fixtures.scripted_engine import PARAMS, ScriptedEngine


def ticking(step: float) -> Callable[[], float]:
    """A clock that moves ``step`` seconds at every reading: each timed block lasts exactly ``step``."""
    counter = itertools.count()
    return lambda: step * next(counter)


def record(problem: str, index: int, length: int) -> SampleRecord:
    return SampleRecord(problem, index, "r", "1", True, 1.0, "1", length, False)


def test_stopwatch_sums_only_the_timed_blocks() -> None:
    readings = iter([10.0, 12.5, 100.0, 101.0])  # two blocks: 2.5 s and 1 s; the 87.5 s between is not counted
    watch = Stopwatch(lambda: next(readings))
    with watch:
        pass
    with watch:
        pass
    assert watch.seconds == 3.5


def test_throughput_is_samples_and_tokens_over_generation_seconds() -> None:
    records = [record("0", 0, 10), record("0", 1, 20), record("1", 0, 7), record("1", 1, 3)]
    speed = throughput(records, 2.5)
    # 4 samples, 10 + 20 + 7 + 3 = 40 tokens in 2.5 s: 1.6 samples/s, 16 tokens/s
    assert speed == {"eval/gen_samples": 4.0, "eval/gen_tokens": 40.0, "eval/gen_seconds": 2.5,
                     "eval/samples_per_s": 1.6, "eval/gen_tokens_per_s": 16.0}
    assert tuple(speed) == SPEED_KEYS
    assert speed_line(speed) == "generation: 4 samples, 40 tokens in 2.5 s: 1.60 samples/s, 16.0 tokens/s"
    nothing = throughput([], 0.0)  # a resumed run with every batch already done
    assert math.isnan(nothing["eval/samples_per_s"]) and math.isnan(nothing["eval/gen_tokens_per_s"])
    assert speed_line(nothing) is None
    # with the engine's prefill counts: 40 of 200 prompt tokens run, the other 160 (80%) from the prefix cache
    cached = throughput(records, 2.5, {"prompt_tokens": 200, "computed_tokens": 40})
    assert tuple(cached) == SPEED_KEYS + PREFILL_KEYS and cached["eval/prompt_tokens"] == 200 and cached["eval/prefill_tokens"] == 40
    assert speed_line(cached) == ("generation: 4 samples, 40 tokens in 2.5 s: 1.60 samples/s, 16.0 tokens/s; "
                                  "prefill: 40 of 200 prompt tokens computed (80.0% served by the prefix cache)")


def test_only_generate_calls_are_timed() -> None:
    problems = group_problems([make_row(f"q{i}", "1", index=i) for i in range(5)])
    engine = ScriptedEngine()
    watch = Stopwatch(ticking(0.25))
    generate_records(engine, problems, [f"p{i}" for i in range(5)], k=2, params=PARAMS, verifier="math_dapo",
                     batch_problems=2, stopwatch=watch)
    assert len(engine.calls) == 3 and watch.seconds == 0.75  # 3 calls × 0.25 s; scoring between them untimed


def _dataset(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "set.parquet"
    write_dapo_parquet([make_row(f"{i}+1=", str(i + 1), index=i, template="{problem}") for i in range(n)], path)
    return path


def _options(model: Path, data: Path, out: Path, **changes: object) -> EvalOptions:
    base = {"checkpoint": str(model), "dataset": str(data), "k": 2, "pass_k": (), "temperature": 1.0, "top_p": 1.0,
            "max_tokens": 6, "verifier": "math_dapo", "engine": "fast", "batch_size": 0, "seed": 0, "output": out,
            "tracking_backend": "null"}  # fmt: skip
    return EvalOptions(**{**base, **changes})  # type: ignore[arg-type]


@pytest.mark.slow
def test_run_eval_reports_the_rates_of_what_it_generated(tiny_model_dir: Path, tmp_path: Path) -> None:
    data, out = _dataset(tmp_path, 5), tmp_path / "out"
    report = run_eval(_options(tiny_model_dir, data, out, batch_size=4), clock=ticking(0.25))
    lengths = [r["length"] for r in pq.read_table(out / "generations.parquet").to_pylist()]
    # --batch-size 4, K=2: 2 problems per call, 3 calls of 0.25 s each
    assert {k: report.speed[k] for k in SPEED_KEYS} == {"eval/gen_samples": 10.0, "eval/gen_tokens": float(sum(lengths)), "eval/gen_seconds": 0.75,
                            "eval/samples_per_s": 10 / 0.75, "eval/gen_tokens_per_s": sum(lengths) / 0.75}

    # the default batch size: up to 64 // 2 = 32 problems per call, so all 5 problems × 2 in one call
    again = run_eval(_options(tiny_model_dir, data, tmp_path / "auto"), clock=ticking(0.25))
    assert again.settings["batch_problems"] == 32 and again.speed["eval/gen_seconds"] == 0.25
    assert again.speed["eval/samples_per_s"] == 10 / 0.25


@pytest.mark.slow
def test_a_resumed_run_times_only_the_batches_it_generates(tiny_model_dir: Path, tmp_path: Path) -> None:
    # K=32 with the auto batch size: 2 problems per batch, so 3 problems are batches {0, 1} and {2}
    data, out = _dataset(tmp_path, 3), tmp_path / "out"
    opts = _options(tiny_model_dir, data, out, k=32, max_tokens=4)
    complete = run_eval(opts, clock=ticking(1.0))
    assert complete.settings["batch_problems"] == 2 and complete.speed["eval/gen_samples"] == 96
    lines = (out / CHECKPOINT_FILE).read_text().splitlines()
    assert [json.loads(line).get("batch") for line in lines] == [None, 0, 1]
    (out / CHECKPOINT_FILE).write_text("\n".join(lines[:2]) + "\n")  # killed after batch 0
    (out / "generations.parquet").unlink()

    resumed = run_eval(opts, clock=ticking(1.0))
    assert resumed.resumed_problems == 2
    new = [r for r in resumed.result.records if r.problem_id == "2"]
    assert {k: resumed.speed[k] for k in SPEED_KEYS} == throughput(new, 1.0) and resumed.speed["eval/gen_samples"] == 32
    assert resumed.result.records == complete.result.records  # the same samples as the uninterrupted run
