"""`experiments/smollm2-ladder.yaml`, the ladder's testbed on the real model (issues 36, 49): its data, the base
policy's regime and the clip's work in the naive-GRPO rung, on a shortened run. Not the accuracies: those
are the ladder's result (docs/real-model-ladder.md).

``model.path`` stays the experiment's ``gguf:smollm2-135m-instruct`` (the ``smollm2_dir`` fixture puts the
imported folder where that name resolves, as `make smollm2` does).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.experiment import experiment_runs, store_uri

from dapo_cli.config import load_config
from dapo_cli.data.loader import load_rows
from dapo_cli.data.synthetic import get_task

pytestmark = pytest.mark.gguf
EXPERIMENT = Path(__file__).resolve().parents[2] / "experiments" / "smollm2-ladder.yaml"
GRPO = ["--no-overlong-filtering", "--no-clip-higher", "--no-overlong-shaping", "--no-token-level-loss", "--no-dynamic-sampling"]


@pytest.fixture(scope="module")
def cfg():
    return load_config(EXPERIMENT)


def problems(rows: list[dict]) -> set[str]:
    return {r["extra_info"]["raw_problem"] for r in rows}


def test_the_testbed_s_held_out_problems_are_never_trained_on(cfg) -> None:
    data = cfg.data
    train = [r for spec in data.train_files for r in load_rows(spec, split="train", synthetic_size=data.synthetic_train_size)]
    val = [r for spec in data.val_files for r in load_rows(spec, split="val", synthetic_size=data.synthetic_val_size)]
    assert len(train) == data.synthetic_train_size and len(val) == data.synthetic_val_size == 400
    assert len(problems(val)) == data.synthetic_val_size and not problems(train) & problems(val)


def test_the_base_policy_gives_the_overlong_token_level_and_dynamic_sampling_techniques_work(cfg, smollm2_dir: Path) -> None:
    from dapo_cli.ablate.regime import math_dapo_score, sample_regimes
    from dapo_cli.models import format_prompt, load_policy
    from dapo_cli.rollout.fast import FastRolloutEngine

    # the documented measurement (benchmarks/ladder_regime.py --tasks fewshot3-add-2digit --prompts 64 --limits 48:
    # 7.0% truncated, median spread 4.0x, 45% all-equal, 19.7% right): the first 64 train problems of
    # fewshot-add-2digit (the benchmark's shared problems) in the testbed's example turns, G samples each
    task = get_task(cfg.data.train_files[0].removeprefix("synthetic:"))
    rows = [{**r, "prompt": task.messages(r["extra_info"]["raw_problem"])}
            for r in load_rows("synthetic:fewshot-add-2digit", split="train", synthetic_size=64)]
    model, tokenizer = load_policy(smollm2_dir)
    prompts = [format_prompt(tokenizer, r["prompt"]) for r in rows]
    assert max(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts) <= cfg.data.max_prompt_length
    truths = [r["reward_model"]["ground_truth"] for r in rows]
    [regime] = sample_regimes(FastRolloutEngine(model, tokenizer), prompts, truths, math_dapo_score, n=cfg.rollout.n,
                              limits=[cfg.rollout.max_response_length])
    assert regime.samples == 64 * cfg.rollout.n and regime.unmet() == [], regime
    # the soft punishment's ramp starts above the longest right answer (`a + b = c` / `Answer: c`, the worked
    # example turns' form, plus EOS), so it acts on runaway text, never on a right answer
    sums = [re.fullmatch(r"What is (\d+)\+(\d+)\?", r["extra_info"]["raw_problem"]).groups() for r in rows]
    right = max(len(tokenizer(f"{a} + {b} = {int(a) + int(b)}\nAnswer: {int(a) + int(b)}", add_special_tokens=False)["input_ids"])
                for a, b in sums) + 1
    assert cfg.rollout.max_response_length - cfg.algorithm.overlong_buffer.len > right, right


def test_several_updates_a_rollout_make_the_clip_bind_in_the_grpo_rung(cfg, smollm2_dir: Path, tmp_path: Path) -> None:
    # one step of the yaml's settings on half its batch (4 prompts x 8 in 4 mini-batches of the yaml's size: the
    # full 8 x 8 took 90 s of `make test`), validation shrunk to 2 problems
    assert cfg.data.train_batch_size // cfg.trainer.ppo_mini_batch_size == 8  # the yaml: 8 updates a rollout
    prompts = cfg.data.train_batch_size // 2
    sets = {"trainer.total_steps": 1, "data.train_batch_size": prompts, "data.synthetic_val_size": 2,
            "trainer.log_samples_freq": 0, "trainer.output_dir": str(tmp_path / "runs"),
            "tracking.tracking_uri": store_uri(tmp_path)}
    args = ["train", str(EXPERIMENT), *GRPO, *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]]
    result = subprocess.run([sys.executable, "-m", "dapo_cli", *args], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    _, [run] = experiment_runs(tmp_path, cfg.tracking.experiment)
    m = run.data.metrics
    assert m["actor/num_updates"] == prompts // cfg.trainer.ppo_mini_batch_size == 4
    assert m["train/batch_responses"] == prompts * cfg.rollout.n == 32
    # after the first mini-batch the policy has moved: the ratio leaves 1 and the symmetric clip (0.2) binds
    assert m["actor/ppo_kl"] > 0 and m["actor/pg_clipfrac"] > 0, {k: v for k, v in m.items() if k.startswith("actor/")}
