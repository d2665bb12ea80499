"""Generation, scoring, summary and resume of dapo_cli/eval/run.py with a scripted fake engine."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dapo_cli.data.schema import make_row
from dapo_cli.errors import UserError
from dapo_cli.eval.limits import MAX_SEQUENCES_PER_CALL, check_memory, sequences_per_call
from dapo_cli.eval.problems import group_problems
from dapo_cli.eval.run import (
    CHECKPOINT_FILE,
    EvalOptions,
    GenerationCheckpoint,
    SampleRecord,
    eval_settings,
    evaluate_problems,
    generate_calls,
    generate_records,
    problem_batches,
    resolve_checkpoint,
    run_eval,
    summarize,
    write_outputs,
)
from fixtures.scripted_engine import PARAMS, ScriptedEngine


def two_problems():
    rows = [make_row("one plus one", "2", index=0), make_row("two plus two", "4", index=1)]
    return group_problems(rows)


def test_evaluate_problems_hand_computed_metrics() -> None:
    problems = two_problems()
    prompts = ["P0", "P1"]
    script = {
        # problem 0 (truth 2): correct, wrong "3", correct, invalid → c = 2; majority "2" (2×) → right
        "P0": ["Answer: 2", "Answer: 3", "Answer: 2", "no answer here at all"],
        # problem 1 (truth 4): "5", "5", "4", "4" → c = 2; tie 5/4 → earliest first occurrence "5" → wrong
        "P1": ["Answer: 5", "Answer: 5", "Answer: 4", "Answer: 4"],
    }
    result = evaluate_problems(
        ScriptedEngine(script), problems, prompts, k=4, params=PARAMS, verifier="math_dapo", pass_k=(1, 2, 4)
    )
    m = result.metrics
    assert list(m) == [
        "avg@4", "pass@1", "pass@2", "pass@4", "maj@4", "avg@4_stderr", "avg@4_ci95_low", "avg@4_ci95_high",
        "mean_length", "truncation_rate", "num_problems", "num_samples",
    ]
    # 4 of 8 samples correct
    assert m["avg@4"] == pytest.approx(0.5, abs=1e-12)
    assert m["pass@1"] == pytest.approx(0.5, abs=1e-12)
    # both problems have c = 2 of n = 4: pass@2 = 1 - C(2,2)/C(4,2) = 5/6; pass@4 = 1
    assert m["pass@2"] == pytest.approx(5 / 6, abs=1e-12)
    assert m["pass@4"] == pytest.approx(1.0, abs=1e-12)
    assert m["maj@4"] == pytest.approx(0.5, abs=1e-12)
    # per-problem accuracies are both 0.5 → stderr 0 and a degenerate CI
    assert m["avg@4_stderr"] == pytest.approx(0.0, abs=1e-12)
    assert (m["avg@4_ci95_low"], m["avg@4_ci95_high"]) == pytest.approx((0.5, 0.5), abs=1e-12)
    # lengths: min(len, 10): "Answer: 2" is 9 chars; "no answer here at all" 21 → 10 (truncated)
    # P0: 9 + 9 + 9 + 10, P1: 9 × 4 → 73 / 8; one of eight truncated
    assert m["mean_length"] == pytest.approx(73 / 8, abs=1e-12)
    assert m["truncation_rate"] == pytest.approx(1 / 8, abs=1e-12)
    assert (m["num_problems"], m["num_samples"]) == (2.0, 8.0)
    assert [(r["problem_id"], r["correct"], r["majority"], r["majority_correct"]) for r in result.per_problem] == [
        ("0", 2, "2", True),
        ("1", 2, "5", False),
    ]
    first = result.records[0]
    assert (first.problem_id, first.sample_index, first.pred, first.acc, first.score) == ("0", 0, "2", True, 1.0)
    assert result.records[3].pred == "[INVALID]" and result.records[3].truncated


def test_summary_metrics_on_unequal_problems() -> None:
    # problem 0: 3/4 correct, problem 1: 0/4 → avg@4 = 3/8, per-problem accs 0.75, 0:
    # s = sqrt(((0.375)^2 * 2) / 1) = 0.53033..., stderr = s / sqrt(2) = 0.375
    problems = two_problems()
    records = [
        SampleRecord("0", j, "x", "2", j < 3, 1.0 if j < 3 else -1.0, "2", 5, False) for j in range(4)
    ] + [SampleRecord("1", j, "x", "9", False, -1.0, "4", 5, False) for j in range(4)]
    m = summarize(problems, records, k=4, pass_k=(1,)).metrics
    assert m["avg@4"] == pytest.approx(3 / 8, abs=1e-12)
    assert m["avg@4_stderr"] == pytest.approx(0.375, abs=1e-12)
    # bootstrap over {0.75, 0}: resample means ∈ {0, 0.375, 0.75}; 95% interval = extremes
    assert (m["avg@4_ci95_low"], m["avg@4_ci95_high"]) == (0.0, 0.75)
    assert m["maj@4"] == pytest.approx(0.5, abs=1e-12)


def test_k_and_pass_k_checked() -> None:
    problems = two_problems()
    with pytest.raises(UserError, match="--avg must be at least 1"):
        evaluate_problems(ScriptedEngine(), problems, ["a", "b"], k=0, params=PARAMS, verifier="math_dapo")
    with pytest.raises(UserError, match="--pass-k values must lie in 1..4"):
        evaluate_problems(ScriptedEngine(), problems, ["a", "b"], k=4, params=PARAMS, verifier="math_dapo", pass_k=(8,))


def test_batches_are_fixed_and_seeded_per_batch() -> None:
    assert problem_batches(5, 2) == [range(0, 2), range(2, 4), range(4, 5)]
    assert problem_batches(3, 0) == [range(0, 3)]
    engine = ScriptedEngine()
    rows = [make_row(f"q{i}", "1", index=i) for i in range(5)]
    problems = group_problems(rows)
    generate_records(engine, problems, [f"p{i}" for i in range(5)], k=2, params=PARAMS, verifier="math_dapo", batch_problems=2)
    assert [(prompts, seed) for prompts, _, seed in engine.calls] == [
        (["p0", "p1"], 5), (["p2", "p3"], 6), (["p4"], 7),
    ]


def test_resume_skips_finished_batches_and_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    rows = [make_row(f"q{i}", str(1 + i % 3), index=i) for i in range(5)]
    problems = group_problems(rows)
    prompts = [f"p{i}" for i in range(5)]
    settings = {"k": 3, "seed": 5}
    full = generate_records(ScriptedEngine(), problems, prompts, k=3, params=PARAMS, verifier="math_dapo", batch_problems=2)

    # a "killed" run: batch 0 finished and was checkpointed, batch 1 was being written (torn line)
    ckpt = GenerationCheckpoint(tmp_path, settings)
    ckpt.append(0, [r for r in full if r.problem_id in {"0", "1"}])
    with (tmp_path / CHECKPOINT_FILE).open("a") as handle:
        handle.write('{"batch": 1, "records": [{"problem_')

    resumed = GenerationCheckpoint(tmp_path, settings)
    assert sorted(resumed.done) == [0]
    engine = ScriptedEngine()
    new = generate_records(
        engine, problems, prompts, k=3, params=PARAMS, verifier="math_dapo", batch_problems=2,
        skip_batches=frozenset(resumed.done), on_batch=resumed.append,
    )
    assert [p for p, _, _ in engine.calls] == [["p2", "p3"], ["p4"]]  # only the rest was generated
    assert resumed.records() == full == resumed.records()[:6] + new
    lines = (tmp_path / CHECKPOINT_FILE).read_text().splitlines()
    assert [json.loads(line).get("batch") for line in lines] == [None, 0, 1, 2]  # torn line dropped


def test_resume_with_other_settings_is_a_user_error(tmp_path: Path) -> None:
    GenerationCheckpoint(tmp_path, {"k": 3, "seed": 5})
    with pytest.raises(UserError, match=r"other settings \(seed: 5 then, 6 now\); use another --output DIR"):
        GenerationCheckpoint(tmp_path, {"k": 3, "seed": 6})


def test_outputs_are_written_with_exact_keys(tmp_path: Path) -> None:
    problems = two_problems()
    script = {"P0": ["Answer: 2"] * 2, "P1": ["Answer: 1", "Answer: 4"]}
    result = evaluate_problems(ScriptedEngine(script), problems, ["P0", "P1"], k=2, params=PARAMS, verifier="math_dapo", pass_k=(1,))
    paths = write_outputs(tmp_path, result, {"avg_k": 2})
    summary = json.loads(paths["summary"].read_text())
    assert set(summary["metrics"]) == {
        "avg@2", "pass@1", "maj@2", "avg@2_stderr", "avg@2_ci95_low", "avg@2_ci95_high",
        "mean_length", "truncation_rate", "num_problems", "num_samples",
    }
    table = pq.read_table(paths["generations"]).to_pylist()
    assert [(r["problem_id"], r["sample_index"], r["acc"]) for r in table] == [
        ("0", 0, True), ("0", 1, True), ("1", 0, False), ("1", 1, True),
    ]
    # avg@2 = 3/4 = mean of the saved acc column
    assert summary["metrics"]["avg@2"] == pytest.approx(sum(r["acc"] for r in table) / len(table), abs=1e-12)


def test_resolve_checkpoint_layouts(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text("{}")
    ours = tmp_path / "step_20"
    (ours / "model").mkdir(parents=True)
    (ours / "model" / "config.json").write_text("{}")
    assert resolve_checkpoint(str(plain)) == str(plain.resolve())
    assert resolve_checkpoint(str(ours)) == str((ours / "model").resolve())
    assert resolve_checkpoint("Qwen/Qwen2.5-Math-7B") == "Qwen/Qwen2.5-Math-7B"
    with pytest.raises(UserError, match="checkpoint not found"):
        resolve_checkpoint(str(tmp_path / "nope"))
    with pytest.raises(UserError, match="holds no config.json"):
        resolve_checkpoint(str(tmp_path))


# --------------------------------------------------------------------------- bounded generation


def test_generate_calls_never_exceed_the_cap() -> None:
    assert generate_calls(3, 4, None) == [(range(0, 3), 4)]  # no cap: one call
    assert generate_calls(3, 4, 12) == [(range(0, 3), 4)]  # fits: one call, as before
    assert generate_calls(5, 4, 8) == [(range(0, 2), 4), (range(2, 4), 4), (range(4, 5), 4)]
    assert generate_calls(1, 600, 256) == [(range(0, 1), 256), (range(0, 1), 256), (range(0, 1), 88)]
    for problems, k, cap in [(1, 2_000_000, 256), (7, 33, 32), (3, 5, 1)]:
        calls = generate_calls(problems, k, cap)
        assert max(len(idx) * n for idx, n in calls) <= cap
        assert sum(len(idx) * n for idx, n in calls) == problems * k


def test_k_beyond_the_cap_is_drawn_in_chunks_with_distinct_seeds() -> None:
    rows = [make_row(f"q{i}", "1", index=i) for i in range(2)]
    problems = group_problems(rows)
    engine = ScriptedEngine()
    k = 2 * MAX_SEQUENCES_PER_CALL + 88
    records = generate_records(
        engine, problems, ["p0", "p1"], k=k, params=PARAMS, verifier="math_dapo", batch_problems=1,
        max_sequences=sequences_per_call(k, 0),
    )
    # 2 batches (B = 2): batch b, chunk c samples with seed 5 + b + c·B
    assert [(prompts, n, seed) for prompts, n, seed in engine.calls] == [
        (["p0"], 256, 5), (["p0"], 256, 7), (["p0"], 88, 9), (["p1"], 256, 6), (["p1"], 256, 8), (["p1"], 88, 10),
    ]
    assert [r.sample_index for r in records if r.problem_id == "0"] == list(range(k))
    assert summarize(problems, records, k=k).metrics["num_samples"] == 2 * k
    # K within the cap: exactly the calls of an unchunked run
    small = ScriptedEngine()
    generate_records(small, problems, ["p0", "p1"], k=4, params=PARAMS, verifier="math_dapo", batch_problems=1,
                     max_sequences=sequences_per_call(4, 0))
    assert small.calls == [(["p0"], 4, 5), (["p1"], 4, 6)]


def _options(**changes: object) -> EvalOptions:
    base = {
        "checkpoint": "no/such/checkpoint", "dataset": "no/such/dataset.parquet", "k": 4, "pass_k": (), "temperature": 1.0,
        "top_p": 1.0, "max_tokens": 20480, "verifier": "math_dapo", "engine": "hf", "batch_size": 0, "seed": 0,
        "tracking_backend": "null",
    }  # fmt: skip
    return EvalOptions(**{**base, **changes})  # type: ignore[arg-type]


def test_an_avg_that_cannot_fit_is_refused_before_anything_loads() -> None:
    # measured before: --avg 2000000 --limit 1 allocated 10 GB at once and was killed at 20.7 GB
    opts = _options(k=2_000_000, limit=1, memory_limit_bytes=64 << 30)
    with pytest.raises(UserError, match=r"--avg 2000000 samples × 1 problem × up to --max-tokens 20480 tokens would hold "
                                         r"about 306.0 GiB of responses, more than the 64.0 GiB of memory here; "
                                         r"lower --avg, --max-tokens or --limit") as info:
        run_eval(opts)  # the checkpoint and dataset do not exist: refused before either is looked at
    assert "\n" not in str(info.value)
    check_memory(_options(k=32, memory_limit_bytes=64 << 30), 30, 2_000)  # AIME avg@32: ~0.2 GiB, fine


def test_a_generate_call_that_cannot_fit_names_batch_size() -> None:
    opts = _options(k=4, batch_size=4_000, max_tokens=1_000, memory_limit_bytes=50_000_000)
    with pytest.raises(UserError, match=r"one generate call of 4000 sequences × \(100 prompt \+ 1000 new tokens\) .*"
                                         r"lower --batch-size or --max-tokens"):
        check_memory(opts, 1_000, 100)
    check_memory(_options(k=4, batch_size=400, max_tokens=1_000, memory_limit_bytes=50_000_000), 1_000, 100)


def test_chunking_is_part_of_the_settings_only_when_it_splits_k(tmp_path: Path) -> None:
    source = tmp_path / "d.parquet"
    source.write_bytes(b"x")
    assert "sequences_per_call" not in eval_settings(_options(k=32), "m", source, 30)
    assert "sequences_per_call" not in eval_settings(_options(k=32, batch_size=64), "m", source, 30)
    assert eval_settings(_options(k=600), "m", source, 1)["sequences_per_call"] == MAX_SEQUENCES_PER_CALL
    assert eval_settings(_options(k=600, batch_size=100), "m", source, 1)["sequences_per_call"] == 100


# --------------------------------------------------------------------------- automatic batch size (--batch-size 0)


def test_auto_batch_size_packs_whole_problems_up_to_64_sequences() -> None:
    from dapo_cli.config.schema import EvalConfig
    from dapo_cli.eval.limits import AUTO_SEQUENCES_PER_CALL, problems_per_call

    assert EvalConfig().batch_size == 0 and EvalConfig().engine == "fast"  # the defaults: auto, the fast engine
    assert AUTO_SEQUENCES_PER_CALL == 64
    # (K, sequences per call, problems per call): 64 // K problems; one problem when K > 64; chunks of 256 beyond
    for k, sequences, problems in [(1, 64, 64), (4, 64, 16), (32, 64, 2), (40, 64, 1), (64, 64, 1), (100, 100, 1),
                                   (256, 256, 1), (600, 256, 1)]:
        assert (sequences_per_call(k, 0), problems_per_call(k, 0)) == (sequences, problems), k
    # an explicit --batch-size keeps its meaning: that many sequences, batch_size // K whole problems
    assert (sequences_per_call(4, 32), problems_per_call(4, 32)) == (32, 8)
    assert (sequences_per_call(32, 16), problems_per_call(32, 16)) == (16, 1)  # K chunked in 16s


def test_auto_batches_hold_several_problems_per_generate_call() -> None:
    from dapo_cli.eval.limits import problems_per_call

    rows = [make_row(f"q{i}", "1", index=i) for i in range(20)]
    problems = group_problems(rows)
    engine = ScriptedEngine()
    generate_records(engine, problems, [f"p{i}" for i in range(20)], k=4, params=PARAMS, verifier="math_dapo",
                     batch_problems=problems_per_call(4, 0), max_sequences=sequences_per_call(4, 0))
    # 16 problems × 4 = 64 sequences, then the other 4 problems: 2 calls, not 20, seeded 5 + b
    assert [(len(prompts), n, seed) for prompts, n, seed in engine.calls] == [(16, 4, 5), (4, 4, 6)]


def test_settings_record_the_auto_batches(tmp_path: Path) -> None:
    source = tmp_path / "d.parquet"
    source.write_bytes(b"x")
    settings = eval_settings(_options(k=4, engine="fast"), "m", source, 20)
    assert (settings["batch_size"], settings["batch_problems"], settings["engine"]) == (0, 16, "fast")
    assert "sequences_per_call" not in settings  # K=4 is never split


def test_an_output_dir_of_the_old_defaults_is_refused_with_one_line(tmp_path: Path) -> None:
    # before: --engine hf and --batch-size 0 = one problem's K per call, i.e. batch_problems 1
    source = tmp_path / "d.parquet"
    source.write_bytes(b"x")
    old = {**eval_settings(_options(k=4, engine="fast"), "m", source, 20), "engine": "hf", "batch_problems": 1}
    ckpt = GenerationCheckpoint(tmp_path / "out", old)
    ckpt.append(0, [SampleRecord("0", j, "r", "1", True, 1.0, "1", 3, False) for j in range(4)])
    before = (tmp_path / "out" / CHECKPOINT_FILE).read_text()
    with pytest.raises(UserError) as info:
        GenerationCheckpoint(tmp_path / "out", eval_settings(_options(k=4, engine="fast"), "m", source, 20))
    assert str(info.value) == (
        f"{tmp_path / 'out' / CHECKPOINT_FILE}: line 1 says it holds generations made with other settings (batch_problems: 1 "
        "then, 16 now; engine: 'hf' then, 'fast' now); use another --output DIR (or delete the file to start afresh)"
    )
    assert (tmp_path / "out" / CHECKPOINT_FILE).read_text() == before  # nothing rewritten


def test_memory_check_counts_the_auto_call() -> None:
    from dapo_cli.eval.limits import memory_needed

    # auto with K=4 on 1,000 problems: 64 sequences per call (not 256, not one problem's 4)
    # held = 1000·4·(2·4·1000 + 400) = 33,600,000; per call = 64·((100 + 1000)·9 + 1000·8) = 64·17,900 = 1,145,600
    assert memory_needed(4, 1_000, 1_000, 100, 0) == (33_600_000, 1_145_600)
    # one problem of K=4: the call holds its 4 sequences only
    assert memory_needed(4, 1, 1_000, 100, 0)[1] == 4 * 17_900
    # a call-sized refusal names the 64 sequences of the auto call
    with pytest.raises(UserError, match=r"^one generate call of 64 sequences × \(100000 prompt \+ 1000 new tokens\)"):
        check_memory(_options(k=4, max_tokens=1_000, memory_limit_bytes=50_000_000), 16, 100_000)
