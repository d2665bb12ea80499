"""The benchmark scripts' own machinery (never their timings: no test here measures time).

What must hold for their tables to mean anything: the RL benchmark's model directory gives
dapo and TRL the same vocabulary, the long-tail batch really has one runaway row for every
engine, the step windows are the steps the docs name, and every script starts.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import common
import rl_step_vs_trl

SCRIPTS = ["rl_step_vs_trl.py", "rollout_vs_generate.py", "update_throughput.py", "dynamic_sampling_overhead.py",
           "tracking_overhead.py", "prepare_data_speed.py", "async_rollout.py", "lora_vs_full.py", "bf16_logprob_gap.py",
           "logprob_chunk.py", "decode_speed.py", "ladder_regime.py", "prefix_cache.py", "ladder_child.py"]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    shape = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64}
    return common.build_policy_dir(tmp_path_factory.mktemp("bench-model") / "model", shape)


def test_the_benchmark_model_gives_dapo_and_a_plain_fast_tokenizer_the_same_vocabulary(policy_dir):
    from _trl_worker import PROBE
    from transformers import AutoConfig, PreTrainedTokenizerFast

    from dapo_cli.models import load_policy

    model, ours = load_policy(policy_dir)
    theirs = PreTrainedTokenizerFast.from_pretrained(policy_dir)  # how the TRL worker loads it
    assert AutoConfig.from_pretrained(policy_dir).model_type == "qwen2"
    assert len(ours) == len(theirs) == model.config.vocab_size
    ids = theirs(PROBE, add_special_tokens=False)["input_ids"]
    assert ids == ours(PROBE, add_special_tokens=False)["input_ids"] and len(ids) == len(PROBE)  # one id a character
    assert theirs.decode(ids) == PROBE  # spaces and newlines survive (a byte-level Qwen2 tokenizer drops them)
    assert theirs.eos_token_id == ours.eos_token_id and theirs.pad_token_id == ours.pad_token_id


@pytest.mark.slow
def test_the_long_tail_batch_has_exactly_one_runaway_row_for_every_engine(policy_dir):
    import rollout_vs_generate as bench

    from dapo_cli.models import load_policy
    from dapo_cli.rollout.base import SamplingParams
    from dapo_cli.rollout.fast import FastRolloutEngine
    from dapo_cli.rollout.hf import HFRolloutEngine

    model, tokenizer = load_policy(policy_dir)
    prompts = [f"What is {i}+1?\n" for i in range(15)] + ["What is 9+9?#"]
    handles = bench.hooks_for("long-tail", model, tokenizer)
    try:
        for engine in (HFRolloutEngine(model, tokenizer), FastRolloutEngine(model, tokenizer)):
            out = engine.generate(prompts, 1, SamplingParams(max_tokens=40, seed=0))
            assert out.lengths[-1] == 40 and bool(out.truncated[-1]) and set(out.texts[-1]) == {"~"}
            assert int(out.lengths[:-1].max()) < 40 and not out.truncated[:-1].any()
    finally:
        for h in handles:
            h.remove()
    handles = bench.hooks_for("no-eos", model, tokenizer)
    try:
        out = FastRolloutEngine(model, tokenizer).generate(prompts[:2], 4, SamplingParams(max_tokens=12, seed=0))
        assert out.lengths.tolist() == [12] * 8 and out.truncated.all()
    finally:
        for h in handles:
            h.remove()


def test_the_step_window_is_steps_5_to_19():
    ends = [float(i * i) for i in range(1, 21)]  # step k ends at k^2: step k lasts 2k - 1
    times = rl_step_vs_trl.step_times(ends)
    assert times[0] == 3.0  # step 2
    assert rl_step_vs_trl.steady(ends) == float(2 * 12 - 1)  # the median of steps 5..19 is step 12's


def test_each_dapo_variant_is_compared_with_the_trl_run_of_the_same_precision(tmp_path):
    runs, compare = rl_step_vs_trl.variants(plain_forward=True, bf16=True)
    assert [v.name for v in runs] == ["TRL", "dapo", "dapo plain", "TRL bf16", "dapo bf16"]
    assert compare == [("float32", "TRL", "dapo"), ("float32, dapo plain forward", "TRL", "dapo plain"),
                       ("bfloat16", "TRL bf16", "dapo bf16"), ("dapo bf16 vs TRL float32", "TRL", "dapo bf16")]
    assert [v.name for v in rl_step_vs_trl.variants(plain_forward=False, bf16=False)[0]] == ["TRL", "dapo"]
    # the dapo runs' settings are valid for the schema (autocast included)
    from dapo_cli.config import load_config

    words = rl_step_vs_trl.dapo_words(tmp_path / "model", tmp_path, 16, 20, 2, "fast", autocast="bfloat16")
    sets = [w for prev, w in zip(words, words[1:]) if prev == "--set"]
    cfg = load_config(None, [str(x) for x in sets])
    assert cfg.engine.autocast == "bfloat16" and cfg.rollout.max_response_length == 16


def test_a_ragged_update_batch_is_right_padded_and_the_shared_forward_feeds_only_real_tokens(policy_dir):
    import torch
    import update_throughput

    from dapo_cli.models import load_policy

    tokenizer = load_policy(policy_dir)[1]
    batch = update_throughput.make_batch(tokenizer, 16, seed=0, ragged=True)
    lengths = batch.response_mask.sum(-1)
    assert int(lengths.max()) == 16 and int(lengths.min()) >= 8 and bool((lengths < 16).any())
    assert torch.equal(batch.response_mask, torch.arange(16)[None, :] < lengths[:, None])
    assert bool((batch.response_ids[~batch.response_mask] == tokenizer.pad_token_id).all())
    tokens, shared, _ = update_throughput.work(policy_dir, 16, "shared prompt", ragged=True)
    n, s = batch.prompt_ids.shape
    assert tokens == n * s + int(lengths.sum())
    _, plain, _ = update_throughput.work(policy_dir, 16, "plain", ragged=True)
    assert plain == n * (s + 16)
    # shared: the 8 distinct prompts once + each row's real tokens but its last
    assert shared < plain and shared - int((lengths - 1).sum()) <= 8 * s


@pytest.mark.slow
def test_the_bf16_gap_splits_whole_groups_and_reads_the_ratio_as_exp_of_the_difference(policy_dir):
    import bf16_logprob_gap
    from dapo_cli.models import load_policy

    model, tokenizer = load_policy(policy_dir)
    batch = bf16_logprob_gap.sample(model, tokenizer, 3, 2, 4)
    first, rest = bf16_logprob_gap.two_micro_batches(batch)
    assert first.tolist() == [0, 1] and rest.tolist() == [2, 3, 4, 5]  # group 0, then groups 1 and 2
    assert batch.rollout_log_probs.shape == batch.response_ids.shape
    # one token at r = 1.5 (beyond the clip and 1e-3), one at r = exp(2e-5) (beyond 1e-5 only), one masked out
    a = torch.tensor([[math.log(1.5), 2e-5, 7.0]])
    mask = torch.tensor([[True, True, False]])
    row = bf16_logprob_gap.gap_row("x", a, torch.zeros(1, 3), mask, 1e-5)
    assert row[2] == "4.05e-01" and row[4] == "5.00e-01"  # max |Δ| = log 1.5, max |r - 1| = 0.5
    assert row[5:] == ["50.00%", "50.0%", "100.0%"]


def test_the_prepare_data_input_has_the_documented_answer_mix(tmp_path):
    import prepare_data_speed

    kinds = prepare_data_speed.write_input(tmp_path / "raw.jsonl", 4000)
    assert sum(kinds.values()) == 4000
    assert 0.45 < kinds["integer"] / 4000 < 0.56 and 0.11 < kinds["fraction"] / 4000 < 0.17
    assert kinds["duplicate"] > 0 and kinds["boxed"] > 0


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.slow
def test_every_benchmark_starts(script):
    proc = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage:" in proc.stdout


def test_the_trl_worker_imports_nothing_but_the_standard_library_at_module_level():
    source = (BENCH / "_trl_worker.py").read_text()
    top = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert all(line.split()[1].split(".")[0] in {"__future__", "json", "re", "sys", "tempfile", "time"} for line in top), top


def test_a_watched_child_reports_its_peak_memory_even_when_killed():
    # 200 MB touched then freed: the high-water mark keeps it; a child killed by SIGKILL still has its last peak
    grow = "b = bytearray(200 * 2**20); del b; import time; time.sleep(0.5)"
    done = common.run_watched([sys.executable, "-c", grow], env=dict(os.environ), every=0.05)
    assert done.returncode == 0 and done.peak >= 200 * 2**20
    killed = common.run_watched([sys.executable, "-c", grow + "; import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
                                env=dict(os.environ), every=0.05)
    assert killed.returncode == -9 and killed.peak >= 200 * 2**20


def test_the_memory_lines_say_how_each_side_ended(capsys):
    results = rl_step_vs_trl.Results()
    results.peaks = {(64, "dapo"): [(5.0e9, False)], (64, "TRL"): [(9.04e9, False)], (128, "dapo"): [(6.2e9, False)],
                     (128, "TRL"): [(23.7e9, True)], (512, "dapo"): [(15.0e9, False)]}
    runs, _ = rl_step_vs_trl.variants(plain_forward=False, bf16=False)
    results.print_memory("SmolLM2-135M", runs, [64, 128], [512])
    assert capsys.readouterr().out.splitlines() == [
        "peak memory (SmolLM2-135M, L=64): dapo 5.0 GB, TRL 9.0 GB",
        "peak memory (SmolLM2-135M, L=128): dapo 6.2 GB, TRL killed for memory at 23.7 GB",
        "peak memory (SmolLM2-135M, L=512): dapo 15.0 GB, TRL not run",
    ]
