"""`torchrun --nproc_per_node 2 -m dapo_cli train` with vLLM rollouts: one in-process engine per rank
(``external_launcher``, vLLM's data-parallel size = the world size), on vLLM's CPU build."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fixtures.experiment import experiment_runs, write_experiment

from distributed.test_distributed_train import run

pytestmark = pytest.mark.vllm


def test_two_ranks_each_with_a_vllm_engine_train_and_agree(tmp_path: Path, head32_model_dir: Path) -> None:
    cfg = {
        "data": {"train_files": ["synthetic:add-3digit"], "val_files": ["synthetic:add-3digit"],
                 "synthetic_train_size": 64, "synthetic_val_size": 4, "train_batch_size": 4, "max_prompt_length": 32},
        "model": {"path": str(head32_model_dir)},
        "rollout": {"engine": "vllm", "n": 2, "max_response_length": 12, "gpu_memory_utilization": 0.05},
        "algorithm": {"overlong_buffer": {"len": 4}},
        "trainer": {"total_steps": 2, "ppo_mini_batch_size": 4, "ppo_micro_batch_size": 8, "lr": 1e-3,
                    "lr_warmup_steps": 1, "save_freq": 0, "test_freq": 0, "log_samples_freq": 0},
        "validation": {"k": 1},
    }
    config = write_experiment(tmp_path, cfg, "vllm-ddp")
    run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "dapo_cli", "train", str(config), "--no-dynamic-sampling"], tmp_path)
    client, [mlrun] = experiment_runs(tmp_path, "vllm-ddp")  # rank 1 recorded nothing
    assert mlrun.info.status == "FINISHED" and mlrun.data.params["rollout.engine"] == "vllm"
    diffs = client.get_metric_history(mlrun.info.run_id, "rollout/logprob_diff_max")
    assert len(diffs) == 2 and max(m.value for m in diffs) < 1e-3  # each rank's engine synced with the DDP trainer
    generated = client.get_metric_history(mlrun.info.run_id, "train/samples_generated")
    assert [m.value for m in sorted(generated, key=lambda m: m.step)] == [8, 8]  # 4 prompts x 2 from both ranks
