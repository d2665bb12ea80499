"""`dapo train --set rollout.engine=vllm` end to end on vLLM's CPU build: the train-inference gap and the
truncated IS weight as MLflow recorded them, the per-step sync time, a checkpoint that
`dapo eval --engine vllm` reads, held-out accuracy on vLLM against the fast engine, and one ablation child.

The policy is warm-started here (head_dim 32, which vLLM's CPU attention needs; ~17 s): an untrained one
answers nothing, and two accuracies of zero would agree whatever the engines did.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.experiment import experiment_runs, write_experiment
from typer.testing import CliRunner

from dapo_cli.cli import app

pytestmark = pytest.mark.vllm
runner = CliRunner()

STEPS = 5
GAP_BOUND = 1e-3
"""Largest per-token |log π_old − log π_vLLM| allowed in any step (float32 on both sides; measured ≤ 1e-6)."""
TRAIN = {
    "data": {"train_files": ["synthetic:add-2digit"], "val_files": ["synthetic:add-2digit"],
             "synthetic_train_size": 256, "synthetic_val_size": 8, "train_batch_size": 4, "max_prompt_length": 32},
    "rollout": {"engine": "vllm", "n": 4, "max_response_length": 48, "gpu_memory_utilization": 0.1},
    "algorithm": {"overlong_buffer": {"len": 8}, "rollout_is": {"enable": True}},
    "trainer": {"total_steps": STEPS, "ppo_mini_batch_size": 2, "ppo_micro_batch_size": 8, "lr": 1e-4,
                "lr_warmup_steps": 1, "save_freq": STEPS, "test_freq": 0, "log_samples_freq": 0},
    "validation": {"k": 2},
}


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Worked-solution warm-start on 2-digit addition: ~40% at T=1 (measured 0.41 on 64 problems)."""
    from dapo_cli.config.tiny import TinyModelConfig
    from dapo_cli.warmstart import warm_start

    cfg = TinyModelConfig(
        hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, max_position_embeddings=128, task="add-2digit",
        sft_steps=400, sft_batch_size=32, sft_direct_frac=0.0, eval_problems=16,
    )
    out = tmp_path_factory.mktemp("warm-head32")
    warm_start(cfg, out, progress=False)
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, policy_dir: Path):
    """One `dapo train` on vLLM rollouts (in this process, like a user's command): its folder and result."""
    tmp = tmp_path_factory.mktemp("vllm-train")
    config = write_experiment(tmp, {**TRAIN, "model": {"path": str(policy_dir)}}, "vllm-e2e")
    result = runner.invoke(app, ["train", str(config)])
    return tmp, result


def test_training_on_vllm_records_the_gap_the_is_weights_and_the_sync_time(trained):
    tmp, result = trained
    assert result.exit_code == 0, result.output
    assert result.output.count("no sleep mode") == 1  # said once, not once per step
    client, [run] = experiment_runs(tmp, "vllm-e2e")
    assert run.info.status == "FINISHED" and run.data.params["rollout.engine"] == "vllm"

    def history(key: str) -> list[float]:
        return [m.value for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]

    assert len(history("rollout/logprob_diff_max")) == STEPS
    assert max(history("rollout/logprob_diff_max")) < GAP_BOUND
    assert all(0 <= v <= m for v, m in zip(history("rollout/logprob_diff_mean"), history("rollout/logprob_diff_max")))
    # truncated IS applied: min(π_old / π_vLLM, C) per token, ≈ 1 when the engines agree
    assert history("rollout/is_weight_mean") and all(abs(v - 1) < 1e-2 for v in history("rollout/is_weight_mean"))
    syncs = history("timing/weight_sync")
    assert len(syncs) == STEPS and all(0 < s < 5 for s in syncs)
    assert (tmp / "runs").is_dir() and list((tmp / "runs").glob(f"*/*/checkpoints/step_{STEPS:06d}/model/config.json"))


def test_the_checkpoint_evaluates_on_vllm_as_on_the_fast_engine(trained, tmp_path: Path):
    """Held-out accuracy of one checkpoint on both engines: each inside the other's 95% interval."""
    from dapo_cli.data.schema import write_dapo_parquet
    from dapo_cli.data.synthetic import generate_rows

    tmp, result = trained
    assert result.exit_code == 0, result.output
    [checkpoint] = (tmp / "runs").glob(f"*/*/checkpoints/step_{STEPS:06d}")
    data = tmp_path / "heldout.parquet"
    write_dapo_parquet(generate_rows("add-2digit", 40, seed=1, split="test"), data)
    found = {}
    for engine in ("vllm", "fast"):
        args = [
            "eval", str(checkpoint), "--engine", engine, "--dataset", str(data), "--avg", "4", "--max-tokens", "48",
            "--top-p", "1.0", "--json", "--quiet", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
            "--experiment", "vllm-eval",
        ]
        if engine == "vllm":  # a process of its own, as a user runs it: stdout holds the JSON object alone
            proc = subprocess.run([sys.executable, "-m", "dapo_cli", *args], capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, proc.stderr[-3000:]
            found[engine] = json.loads(proc.stdout)
        else:
            out = runner.invoke(app, args)
            assert out.exit_code == 0, out.output
            found[engine] = json.loads(out.stdout)
    acc = {e: r["metrics"]["avg@4"] for e, r in found.items()}
    low = {e: r["metrics"]["avg@4_ci95_low"] for e, r in found.items()}
    high = {e: r["metrics"]["avg@4_ci95_high"] for e, r in found.items()}
    assert 0.05 < acc["fast"] < 0.95, acc  # a policy that is neither always wrong nor always right
    assert low["fast"] <= acc["vllm"] <= high["fast"] and low["vllm"] <= acc["fast"] <= high["vllm"], found


def test_an_ablation_child_trains_on_vllm(policy_dir: Path, tmp_path: Path):
    cfg = {**TRAIN, "model": {"path": str(policy_dir)},
           "trainer": {**TRAIN["trainer"], "total_steps": 2, "save_freq": 2}, "validation": {"k": 1}}
    config = write_experiment(tmp_path, cfg, "vllm-ablate")
    out = runner.invoke(app, ["ablate", str(config), "--ladder", "--only", "dapo", "--set", "rollout.engine=vllm"])
    assert out.exit_code == 0, out.output
    _, runs = experiment_runs(tmp_path, "vllm-ablate")
    children = [r for r in runs if r.data.params.get("rollout.engine") == "vllm"]
    assert children and all(r.info.status == "FINISHED" for r in children)
