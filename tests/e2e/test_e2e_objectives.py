"""`dapo train` with each registered policy loss and with the rollout corrections on stale samples, end to end:
what MLflow recorded (the loss's own metrics, the mismatch metrics, what a correction masked)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.experiment import experiment_runs, write_experiment
from typer.testing import CliRunner

from dapo_cli.cli import app

STEPS = 2


def write_config(tmp: Path, model_dir: Path, **algorithm: object) -> Path:
    """4 prompts × 4 samples, 16-token responses, 2 mini-batches (so the second update's ratios are not 1); dynamic
    sampling on the shaped score (the untrained policy answers nothing right)."""
    rollout = algorithm.pop("rollout", {})
    cfg = {
        "data": {"train_files": ["synthetic:add-3digit"], "val_files": ["synthetic:add-3digit"],
                 "synthetic_train_size": 64, "synthetic_val_size": 6, "train_batch_size": 4, "max_prompt_length": 32},
        "model": {"path": str(model_dir)},
        "rollout": {"n": 4, "max_response_length": 16, "worker_threads": 1, **rollout},
        "algorithm": {"overlong_buffer": {"len": 8}, "overlong_filter": False,  # the untrained policy's responses are
                      "filter_groups": {"metric": "score", "max_num_gen_batches": 4},  # mostly truncated: keep them
                      **algorithm},
        "trainer": {"total_steps": STEPS, "ppo_mini_batch_size": 2, "ppo_micro_batch_size": 3, "lr": 1e-3,
                    "lr_warmup_steps": 0, "save_freq": 0, "test_freq": 0, "log_samples_freq": 0},
        "validation": {"k": 2},
        "engine": {"num_threads": 1},
    }
    return write_experiment(tmp, cfg, "objectives")


def recorded(tmp: Path) -> dict[str, list[tuple[int, float]]]:
    client, runs = experiment_runs(tmp, "objectives")
    assert len(runs) == 1
    rid = runs[0].info.run_id
    return {key: sorted((m.step, m.value) for m in client.get_metric_history(rid, key)) for key in runs[0].data.metrics}


def train(tmp: Path, model_dir: Path, **algorithm: object) -> dict[str, list[tuple[int, float]]]:
    result = CliRunner().invoke(app, ["train", str(write_config(tmp, model_dir, **algorithm))])
    assert result.exit_code == 0, result.output
    return recorded(tmp)


@pytest.mark.slow
@pytest.mark.parametrize(("loss", "own", "not_logged"), [
    ("gspo", ["actor/seq_clipfrac", "actor/seq_clipfrac_high", "actor/seq_clipfrac_low", "actor/seq_ratio_dev"],
     ["actor/clipfrac_high", "actor/is_weight_mean"]),
    ("cispo", ["actor/is_weight_mean", "actor/is_clipfrac_high", "actor/is_clipfrac_low"],
     ["actor/clipfrac_high", "actor/seq_clipfrac"]),
    ("gmpo", ["actor/clipfrac_high", "actor/clipfrac_low", "actor/pg_clipfrac"], ["actor/seq_clipfrac", "actor/is_weight_mean"]),
])
def test_each_policy_loss_trains_and_logs_its_own_clip_metrics(tiny_model_dir, tmp_path, loss, own, not_logged):
    metrics = train(tmp_path, tiny_model_dir, policy_loss=loss)
    for key in (*own, "actor/pg_loss", "actor/ppo_kl", "rollout/token_prob_ratio_mean", "rollout/logprob_diff_mean"):
        assert [s for s, _ in metrics[key]] == list(range(1, STEPS + 1)), key
    assert not set(not_logged) & set(metrics)  # each loss logs its own clip at its own level, not the others
    # the rollout engine samples with the trainer's weights and float32 numbers: the ratio is 1 to about 1e-5
    assert all(abs(v - 1) < 1e-4 for _, v in metrics["rollout/token_prob_ratio_mean"])
    assert all(v >= 1 for _, v in metrics["rollout/token_prob_ratio_mult_error"])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["geo_mask", "opsm", "seq_tis"])
def test_stale_samples_with_each_correction_log_what_it_masked_or_weighted(tiny_model_dir, tmp_path, mode):
    # one step of staleness: the worker samples with the weights before the last update, so pi_old / pi_rollout moves
    metrics = train(tmp_path, tiny_model_dir, rollout={"max_staleness": 1}, rollout_is={"mode": mode})
    assert max(v for _, v in metrics["async/version_lag_max"]) == 1.0  # stale samples were trained on
    for key in ("rollout/geo_mask_seq_frac", "rollout/opsm_seq_frac", "rollout/token_prob_ratio_min"):
        assert [s for s, _ in metrics[key]] == list(range(1, STEPS + 1)), key
    if mode == "seq_tis":
        assert "rollout/masked_seq_frac" not in metrics
        assert all(0 < v for _, v in metrics["rollout/is_weight_mean"])
    else:
        masked = dict(metrics["rollout/masked_seq_frac"])
        assert all(0.0 <= v <= 1.0 for v in masked.values()) and set(masked) == set(range(1, STEPS + 1))
        assert "rollout/is_weight_mean" not in metrics  # a mask, not a weight
        if mode == "geo_mask":  # it drops exactly what the diagnostic says it would
            assert masked == dict(metrics["rollout/geo_mask_seq_frac"])
        # at step 2 the samples lag one update of lr 1e-3: some response drifted past the bounds
        assert masked[2] > 0
