"""Old log-probs and entropy from the update's own forward (``config.schema.old_log_probs_from_update``).

With one epoch and one mini-batch per step, the separate no-grad pass (``fill_old_log_probs``) is
replaced by the update's forwards. These tests check it changes nothing a run computes: the
gradient, every metric, the old log-probs and entropy written into the batch, the mismatch metric,
under any micro-batch size, on one and on two ranks, and through ``run_train``.

Run as a script (``python test_train_old_log_probs.py MODEL_DIR OUT.pt``, or under torchrun) it is
the worker of the two-rank test.
"""

from __future__ import annotations

import json
import contextlib
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from fakes import Recorder, ScriptedRollout

from dapo_cli.config import apply_techniques, load_config
from dapo_cli.data.loader import Prompt, PromptStream
from dapo_cli.engine.torch import TorchEngine
from dapo_cli.models import load_policy
from dapo_cli.engine.dist import SingleProcess
from dapo_cli.train.rounds import InlineRounds
from dapo_cli.train import collect_batch, compute_advantages, step_metrics
from dapo_cli.config.schema import behaviour_correction, old_log_probs_from_update, uses_worker
from dapo_cli.train.update import fill_old_log_probs, rollout_mismatch, update_policy
from dapo_cli.train.objective import build_objective

GROUPS, SAMPLES = 4, 4


def script(prompt: str, j: int) -> tuple[str, int, bool]:
    # ragged lengths 3..9 (one truncated row per group); the first two samples of each group are right
    k = int(prompt[1:])
    return (f"Answer: {k if j < 2 else -1}", 3 + (2 * j + k) % 7, j == 3)


def config(*extra: str, micro: int = 16):
    cfg = load_config(None, [
        f"rollout.n={SAMPLES}", f"data.train_batch_size={GROUPS}", f"trainer.ppo_mini_batch_size={GROUPS}",
        f"trainer.ppo_micro_batch_size={micro}", "rollout.max_response_length=10", "algorithm.overlong_buffer.len=4",
        "trainer.lr=1e-2", "trainer.lr_warmup_steps=0", "trainer.grad_clip=0", *extra,
    ])
    return apply_techniques(cfg, dynamic_sampling=False)


def one_update(model_dir: Path, cfg, *, old_from_update: bool, dtype=torch.float64, dist=None) -> dict:
    """Gradient, metrics, old log-probs and entropy of one update_policy call, with or without old log-probs from the update."""
    torch.manual_seed(0)
    model, _ = load_policy(model_dir, dtype=dtype)
    engine = TorchEngine(model, lr=cfg.trainer.lr, weight_decay=0.0, warmup_steps=0, grad_clip=0.0, dist=dist)
    grads: list[list[torch.Tensor]] = []
    step = engine.step

    def recording_step():
        grads.append([p.grad.detach().clone() for p in engine.module.parameters()])
        return step()

    engine.step = recording_step
    prompts = [Prompt(text=f"p{k}", ground_truth=str(k), problem_id=str(k)) for k in range(GROUPS)]
    collected = collect_batch(InlineRounds(ScriptedRollout(script), PromptStream(prompts, seed=0, shuffle=False), cfg, dist or SingleProcess()), cfg, step=1, pad_id=0, dist=dist,
                              worker=uses_worker(cfg.rollout))
    batch = collected.batch
    compute_advantages(batch, cfg)
    if not old_from_update:
        fill_old_log_probs(engine, batch, build_objective(cfg), cfg.trainer.ppo_micro_batch_size)
    corrected = behaviour_correction(cfg)
    if corrected:  # behaviour log-probs unrelated to the trainer's: weights min(pi_old / pi_behav, C) vary, some truncated
        gen = torch.Generator().manual_seed(1)
        behav = -2 - 6 * torch.rand(batch.response_ids.shape, generator=gen, dtype=torch.float64)  # pi_old is ~e^-4.6 here
        batch.rollout_log_probs = (behav * batch.response_mask).to(dtype)
    else:
        batch.rollout_log_probs = None
    metrics = update_policy(engine, batch, build_objective(cfg), cfg.trainer, step=1, old_from_update=old_from_update)
    if not corrected:
        batch.rollout_log_probs = (batch.old_log_probs - 0.01 * batch.response_mask).to(batch.old_log_probs.dtype)

    metrics.update(rollout_mismatch(batch, build_objective(cfg), cfg.algorithm.rollout_is, dist or SingleProcess()))
    metrics.update(step_metrics(collected, batch, cfg, dist, worker=uses_worker(cfg.rollout)))
    return {"grads": grads, "metrics": metrics, "old": batch.old_log_probs, "entropy": batch.entropy,
            "group_ids": batch.group_ids}


def assert_same(a: dict, b: dict, tol: float) -> None:
    assert len(a["grads"]) == len(b["grads"]) == 1
    for x, y in zip(a["grads"][0], b["grads"][0]):
        torch.testing.assert_close(x, y, rtol=tol, atol=tol * 1e-2)
    assert set(a["metrics"]) == set(b["metrics"])
    for key, value in a["metrics"].items():
        assert b["metrics"][key] == pytest.approx(value, rel=tol, abs=tol * 1e-2), key
    torch.testing.assert_close(a["old"], b["old"], rtol=0, atol=tol)
    torch.testing.assert_close(a["entropy"], b["entropy"], rtol=0, atol=tol)


def test_the_condition_is_one_optimizer_step_without_kl_or_truncated_is():
    assert old_log_probs_from_update(config())
    assert not old_log_probs_from_update(config(f"trainer.ppo_mini_batch_size={GROUPS // 2}"))  # 2 steps
    assert not old_log_probs_from_update(config("trainer.ppo_epochs=2"))
    assert not old_log_probs_from_update(config("algorithm.use_kl_loss=true"))
    assert old_log_probs_from_update(config("algorithm.rollout_is.enable=true"))  # π_prox is the update's forward too
    # geo_mask drops responses by π_old before the update's denominators: π_old must come first
    assert not old_log_probs_from_update(config("algorithm.rollout_is.enable=true", "algorithm.rollout_is.mode=geo_mask"))
    assert not old_log_probs_from_update(config(f"data.gen_batch_size={2 * GROUPS}"))  # rounds may train more groups
    assert old_log_probs_from_update(load_config(None, ["data.train_batch_size=8", "trainer.ppo_mini_batch_size=8"]))


@pytest.mark.parametrize("extra", [
    [],
    ["algorithm.loss_agg_mode=seq-mean-token-mean"],
    ["algorithm.entropy_coeff=0.01"],
    ["algorithm.clip_ratio_c=3.0", "algorithm.loss_agg_mode=seq-mean-token-sum-norm"],
    ["algorithm.rollout_is.enable=true", "algorithm.rollout_is.cap=1.5"],  # the weights from the update's own forward
    ["rollout.max_staleness=1"],  # asynchronous rollouts: the decoupled objective, pi_prox from the update's forward
    ["algorithm.policy_loss=gspo", "algorithm.loss_agg_mode=seq-mean-token-mean"],  # every registered loss
    ["algorithm.policy_loss=cispo"],
    ["algorithm.policy_loss=gmpo", "algorithm.loss_agg_mode=seq-mean-token-mean"],
    ["algorithm.rollout_is.enable=true", "algorithm.rollout_is.mode=seq_tis"],  # the corrections that allow it
    ["rollout.max_staleness=1", "algorithm.rollout_is.mode=opsm", "algorithm.policy_loss=gspo"],
])
@pytest.mark.slow
def test_the_update_and_every_metric_equal_the_separate_pass_under_any_micro_batch(tiny_model_dir, extra):
    separate = one_update(tiny_model_dir, config(*extra), old_from_update=False)
    assert max(float(g.abs().max()) for g in separate["grads"][0]) > 1e-3  # a real gradient
    assert separate["metrics"]["actor/entropy"] > 0 and separate["metrics"]["rollout/logprob_diff_mean"] > 0
    cfg = config(*extra)
    if behaviour_correction(cfg) and cfg.algorithm.rollout_is.mode in ("token_tis", "seq_tis"):
        assert 0 < separate["metrics"]["rollout/is_truncated_frac"] < 1  # the weights vary: some truncated, some not
    if behaviour_correction(cfg) and cfg.algorithm.rollout_is.mode == "opsm":
        assert 0 < separate["metrics"]["rollout/masked_seq_frac"] < 1
    for micro in (16, 3, 1):
        assert_same(separate, one_update(tiny_model_dir, config(*extra, micro=micro), old_from_update=True), 1e-10)


def test_old_from_update_refuses_a_plan_of_several_optimizer_steps(tiny_model_dir):
    with pytest.raises(RuntimeError, match="one optimizer step"):
        one_update(tiny_model_dir, config(f"trainer.ppo_mini_batch_size={GROUPS // 2}"), old_from_update=True)


# ---------------------------------------------------------------- two ranks


def worker() -> None:
    from dapo_cli.components import build_collective
    from dapo_cli.engine.dist import shutdown_process_group

    model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    torch.set_num_threads(1)
    cfg = config(micro=3)
    dist = build_collective(cfg.engine)
    results = {
        "world_size": dist.world_size,
        "from_update": one_update(model_dir, cfg, old_from_update=True, dtype=torch.float32, dist=dist),
        "separate": one_update(model_dir, cfg, old_from_update=False, dtype=torch.float32, dist=dist),
    }
    if dist.is_main:
        torch.save(results, out)
    dist.barrier()
    dist.close()
    shutdown_process_group()


def run_worker(model_dir: Path, out: Path, nproc: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    launch = [sys.executable] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    proc = subprocess.run([*launch, __file__, str(model_dir), str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out, weights_only=False)


@pytest.mark.slow
def test_two_ranks_with_old_from_update_give_the_one_process_update_and_metrics(tiny_model_dir, tmp_path):
    one = run_worker(tiny_model_dir, tmp_path / "one.pt", 1)
    two = run_worker(tiny_model_dir, tmp_path / "two.pt", 2)
    assert one["world_size"] == 1 and two["world_size"] == 2
    for case in (one["from_update"], two["from_update"], two["separate"]):
        for x, y in zip(one["separate"]["grads"][0], case["grads"][0]):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6)
        for key, value in one["separate"]["metrics"].items():
            if key.startswith("timing/"):
                continue
            assert case["metrics"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    # rank 0 holds the first half of the groups: its old log-probs are the one-process rows of those groups
    rows = torch.isin(one["from_update"]["group_ids"], two["from_update"]["group_ids"])
    torch.testing.assert_close(two["from_update"]["old"], one["from_update"]["old"][rows][:, : two["from_update"]["old"].shape[1]], rtol=0, atol=1e-5)


# ---------------------------------------------------------------- through run_train


def recorded_run(tiny_model_dir, out, monkeypatch, *, mini: int, extra: tuple[str, ...] = ()) -> dict:
    """The metrics per step of a 2-step ``run_train`` on the tiny model (``mini``: mini-batch groups)."""
    from dapo_cli.train import loop

    recorder = Recorder()

    @contextlib.contextmanager
    def fake_tracker(*_a, **_k):
        yield recorder

    monkeypatch.setattr(loop, "open_tracker", fake_tracker)
    cfg = load_config(None, [
        f"model.path={tiny_model_dir}", "data.train_files=[synthetic:add-3digit]", "data.val_files=[]",
        "data.synthetic_train_size=32", f"data.train_batch_size={GROUPS}", "data.max_prompt_length=32",
        f"rollout.n={SAMPLES}", "rollout.max_response_length=12", "algorithm.overlong_buffer.len=4",
        "trainer.total_steps=2", f"trainer.ppo_mini_batch_size={mini}", "trainer.ppo_micro_batch_size=5",
        "trainer.save_freq=0", "trainer.test_freq=0", "trainer.log_samples_freq=0", "trainer.collapse_patience=0",
        f"trainer.output_dir={out}", "tracking.backend=null", "engine.device=cpu",
        "trainer.lr=1e-3", "trainer.lr_warmup_steps=0", *extra,
    ])
    cfg = apply_techniques(cfg, dynamic_sampling=False)
    assert old_log_probs_from_update(cfg) is (mini == GROUPS)
    loop.run_train(cfg, quiet=True)
    return recorder.metrics


@pytest.mark.slow
def test_run_train_logs_the_same_metrics_without_the_separate_pass(tiny_model_dir, tmp_path, monkeypatch):
    from_update = recorded_run(tiny_model_dir, tmp_path / "from_update", monkeypatch, mini=GROUPS)
    separate = recorded_run(tiny_model_dir, tmp_path / "separate", monkeypatch, mini=GROUPS // 2)
    # step 1: the same rollouts and the same old policy; every metric the separate pass logs is logged
    assert set(from_update[1]) == set(separate[1])
    for key in ("actor/entropy", "actor/mean_prob", "rollout/logprob_diff_mean", "reward/score_mean", "train/loss_tokens"):
        assert from_update[1][key] == pytest.approx(separate[1][key], rel=1e-4, abs=1e-6), key
    assert from_update[1]["actor/num_updates"] == 1 and separate[1]["actor/num_updates"] == 2
    assert from_update[1]["actor/pg_clipfrac"] == 0.0 and from_update[1]["actor/ppo_kl"] == 0.0  # the ratio is exactly 1
    assert from_update[2]["timing/old_log_prob"] < separate[2]["timing/old_log_prob"]


@pytest.mark.slow
def test_bfloat16_autocast_trains_with_its_own_old_log_probs(tiny_model_dir, tmp_path, monkeypatch):
    # engine.autocast=bfloat16: the update's forward (bfloat16 matmuls) is also π_old's, so the ratio is
    # still exactly 1; the float32 sampler's log-probs now differ from the trainer's by bfloat16
    # rounding (the mismatch metric says by how much), against float32 rounding without autocast.
    mixed = recorded_run(tiny_model_dir, tmp_path / "mixed", monkeypatch, mini=GROUPS, extra=("engine.autocast=bfloat16",))
    full = recorded_run(tiny_model_dir, tmp_path / "full", monkeypatch, mini=GROUPS)
    for step in (1, 2):
        assert mixed[step]["actor/pg_clipfrac"] == 0.0 and mixed[step]["actor/ppo_kl"] == 0.0
        assert all(math.isfinite(v) for v in mixed[step].values() if isinstance(v, float))
    assert full[1]["rollout/logprob_diff_mean"] < 1e-5
    assert 1e-4 < mixed[1]["rollout/logprob_diff_mean"] < 5e-2
    assert mixed[1]["reward/score_mean"] == full[1]["reward/score_mean"]  # the same rollouts: the sampler is float32
    assert mixed[1]["actor/entropy"] == pytest.approx(full[1]["actor/entropy"], rel=5e-2)


if __name__ == "__main__":
    worker()


@pytest.mark.slow
def test_each_step_logs_its_compute(tiny_model_dir, tmp_path, monkeypatch):
    """compute/*: the generated tokens are the step's response lengths summed (response_length/mean x samples),
    the trained tokens the loss tokens, and the FLOPs 2N per generated + 6N per trained token, N counted from the
    tiny model's config.json. The same whatever the micro-batch split (mini-batches of 2 groups against 4)."""
    from dapo_cli.models.flops import matmul_params

    logged = recorded_run(tiny_model_dir, tmp_path / "a", monkeypatch, mini=GROUPS)
    split = recorded_run(tiny_model_dir, tmp_path / "b", monkeypatch, mini=GROUPS // 2)
    # the tiny model (models/shipped/tiny/config.json): 4 layers, hidden 128, 4 heads of 32, kv 4, MLP 512
    cfg = json.loads((Path(tiny_model_dir) / "config.json").read_text())
    n = matmul_params(layers=cfg["num_hidden_layers"], hidden=cfg["hidden_size"], heads=cfg["num_attention_heads"],
                      kv_heads=cfg["num_key_value_heads"], head_dim=cfg["head_dim"],
                      intermediate=cfg["intermediate_size"], vocab=cfg["vocab_size"])
    for step in (1, 2):
        m = logged[step]
        gen = m["response_length/mean"] * m["train/samples_generated"]
        assert m["compute/generated_tokens"] == pytest.approx(gen, rel=1e-9)
        assert m["compute/trained_tokens"] == m["train/loss_tokens"]
        assert m["compute/flops"] == pytest.approx(2 * n * gen + 6 * n * m["train/loss_tokens"], rel=1e-9)
    assert split[1]["compute/generated_tokens"] == logged[1]["compute/generated_tokens"]
    assert split[1]["compute/trained_tokens"] == logged[1]["compute/trained_tokens"]
