"""update_policy on a real tiny model: micro-batching must not change the update."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from fakes import ScriptedRollout  # noqa: E402

from dapo_cli.config import apply_techniques, load_config  # noqa: E402
from dapo_cli.data.loader import Prompt, PromptStream  # noqa: E402
from dapo_cli.engine.torch import TorchEngine  # noqa: E402
from dapo_cli.models import load_policy  # noqa: E402
from dapo_cli.engine.dist import SingleProcess
from dapo_cli.train.rounds import InlineRounds
from dapo_cli.train import collect_batch, compute_advantages  # noqa: E402
from dapo_cli.train.update import fill_old_log_probs, update_policy  # noqa: E402
from dapo_cli.train.objective import build_objective  # noqa: E402


def script(prompt: str, j: int) -> tuple[str, int, bool]:
    # ragged lengths 3..9; the first two samples of each group are right
    k = int(prompt[1:])
    return (f"Answer: {k if j < 2 else -1}", 3 + (2 * j + k) % 7, False)


def mini_batch_grads(model_dir: Path, mode: str, micro: int, extra: list[str] = (), *, metrics_out: dict | None = None,
                     behaviour: bool = False) -> list[list[torch.Tensor]]:
    """The accumulated gradient at each optimizer step of one update_policy call (its metrics into ``metrics_out``).

    ``behaviour``: the rollout engine's log-probs are set to the old ones minus a fixed pseudo-random shift per token
    (up to ±0.3), so a rollout correction has ratios to act on."""
    cfg = load_config(None, [*extra,
        "rollout.n=4", "data.train_batch_size=4", "trainer.ppo_mini_batch_size=2", f"trainer.ppo_micro_batch_size={micro}",
        "rollout.max_response_length=10", "algorithm.overlong_buffer.len=4", f"algorithm.loss_agg_mode={mode}",
        "trainer.lr=1e-2", "trainer.lr_warmup_steps=0", "trainer.grad_clip=0",
    ])
    cfg = apply_techniques(cfg, dynamic_sampling=False)
    model, _ = load_policy(model_dir, dtype=torch.float64)  # float64: compare at 1e-10, free of fp32 rounding
    engine = TorchEngine(model, lr=cfg.trainer.lr, weight_decay=0.0, warmup_steps=0, grad_clip=0.0)
    grads: list[list[torch.Tensor]] = []
    step = engine.step

    def recording_step():
        grads.append([p.grad.detach().clone() for p in engine.module.parameters()])
        return step()

    engine.step = recording_step
    prompts = [Prompt(text=f"p{k}", ground_truth=str(k), problem_id=str(k)) for k in range(4)]
    batch = collect_batch(InlineRounds(ScriptedRollout(script), PromptStream(prompts, seed=0, shuffle=False), cfg, SingleProcess()), cfg, step=1, pad_id=0).batch
    compute_advantages(batch, cfg)
    fill_old_log_probs(engine, batch, build_objective(cfg), cfg.trainer.ppo_micro_batch_size)
    if behaviour:
        gen = torch.Generator().manual_seed(4)
        shift = 0.6 * torch.rand(batch.old_log_probs.shape, generator=gen, dtype=torch.float64) - 0.3
        batch.rollout_log_probs = batch.old_log_probs - shift * batch.response_mask
    metrics = update_policy(engine, batch, build_objective(cfg), cfg.trainer, step=1)
    assert metrics["actor/num_updates"] == 2  # 4 groups / 2 per mini-batch
    if metrics_out is not None:
        metrics_out.update(metrics)
    return grads


SPLIT_CASES = [
    # (loss_agg_mode, extra settings): every registered policy loss, and each rollout correction on rollout log-probs
    # that differ from the trainer's (behaviour), so that its weights or masks act
    ("token-mean", []),
    ("seq-mean-token-mean", []),
    ("seq-mean-token-sum-norm", []),
    ("seq-mean-token-mean", ["algorithm.policy_loss=gspo", "algorithm.gspo.clip_ratio_low=0.01", "algorithm.gspo.clip_ratio_high=0.01"]),
    ("token-mean", ["algorithm.policy_loss=gspo", "algorithm.gspo.clip_ratio_low=0.01", "algorithm.gspo.clip_ratio_high=0.01"]),
    ("token-mean", ["algorithm.policy_loss=cispo", "algorithm.cispo.clip_ratio_high=0.05"]),
    ("seq-mean-token-mean", ["algorithm.policy_loss=gmpo", "algorithm.gmpo.log_clip_low=0.05", "algorithm.gmpo.log_clip_high=0.05"]),
    ("token-mean", ["algorithm.rollout_is.enable=true", "algorithm.rollout_is.mode=seq_tis"]),
    ("token-mean", ["algorithm.rollout_is.enable=true", "algorithm.rollout_is.mode=geo_mask", "algorithm.rollout_is.geo_bound=1.02"]),
    ("seq-mean-token-mean", ["algorithm.policy_loss=gspo", "algorithm.rollout_is.enable=true", "algorithm.rollout_is.mode=opsm",
                             "algorithm.rollout_is.opsm_delta=0.01"]),
]
"""Every loss, and each correction that acts (token_tis: the truncated-IS test below)."""


@pytest.mark.parametrize(("mode", "extra"), SPLIT_CASES)
@pytest.mark.slow
def test_micro_batch_size_does_not_change_the_update(tiny_model_dir, mode, extra):
    # Each mini-batch has 2 groups x 4 samples = 8 responses; micro-batches of 8 (one pass),
    # 3 (3+3+2, ragged) and 1 must accumulate the same gradient before each optimizer step
    # (the second step's gradient also checks that the first steps were equal), because the
    # micro-batch losses use the mini-batch's global token / sequence counts; and log the same metrics (token means
    # weighted by tokens, sequence means by responses). The second step's ratios are not 1 (the first step moved the
    # policy), so clip fractions are not trivially 0.
    behaviour = any(e.startswith("algorithm.rollout_is") for e in extra)
    whole_metrics: dict = {}
    whole = mini_batch_grads(tiny_model_dir, mode, 8, extra, metrics_out=whole_metrics, behaviour=behaviour)
    assert len(whole) == 2
    assert max(float(g.abs().max()) for g in whole[0]) > 1e-3  # a real gradient
    if "algorithm.rollout_is.mode=geo_mask" in extra or "algorithm.rollout_is.mode=opsm" in extra:
        assert 0 < whole_metrics["rollout/masked_seq_frac"] < 1  # some responses masked, not all
    for micro in (3, 1):
        split_metrics: dict = {}
        split = mini_batch_grads(tiny_model_dir, mode, micro, extra, metrics_out=split_metrics, behaviour=behaviour)
        for step_whole, step_split in zip(whole, split):
            for a, b in zip(step_whole, step_split):
                torch.testing.assert_close(b, a, rtol=1e-8, atol=1e-10)
        assert split_metrics.keys() == whole_metrics.keys()
        for key, value in whole_metrics.items():
            assert split_metrics[key] == pytest.approx(value, rel=1e-8, abs=1e-10), (micro, key)


def test_a_non_finite_loss_skips_the_update_and_is_counted(tiny_model_dir):
    cfg = apply_techniques(load_config(None, [
        "rollout.n=4", "data.train_batch_size=4", "trainer.ppo_mini_batch_size=2",
        "rollout.max_response_length=10", "algorithm.overlong_buffer.len=4",
    ]), dynamic_sampling=False)
    model, _ = load_policy(tiny_model_dir)
    engine = TorchEngine(model, lr=1e-2, weight_decay=0.0, warmup_steps=0, grad_clip=1.0)
    before = [p.detach().clone() for p in engine.module.parameters()]
    prompts = [Prompt(text=f"p{k}", ground_truth=str(k), problem_id=str(k)) for k in range(4)]
    batch = collect_batch(InlineRounds(ScriptedRollout(script), PromptStream(prompts, seed=0, shuffle=False), cfg, SingleProcess()), cfg, step=1, pad_id=0).batch
    compute_advantages(batch, cfg)
    fill_old_log_probs(engine, batch, build_objective(cfg), cfg.trainer.ppo_micro_batch_size)
    batch.advantages[:] = float("nan")  # every mini-batch's loss becomes NaN
    metrics = update_policy(engine, batch, build_objective(cfg), cfg.trainer, step=1)
    assert metrics["actor/skipped_updates"] == 2 and metrics["actor/num_updates"] == 0
    assert all(torch.equal(a, b) for a, b in zip(before, engine.module.parameters()))
    assert all(p.grad is None for p in engine.module.parameters())  # nothing left to leak into the next step
    assert engine.params_finite()
    with torch.no_grad():
        next(engine.module.parameters())[0, 0] = float("inf")
    assert not engine.params_finite()  # what TrainingSession.save checks before writing a checkpoint


@pytest.mark.slow
def test_optional_kl_penalty_to_a_frozen_reference(tiny_model_dir):
    from dapo_cli.components import model_loader

    cfg = apply_techniques(load_config(None, [
        "rollout.n=4", "data.train_batch_size=4", "trainer.ppo_mini_batch_size=2", "trainer.ppo_epochs=2",
        "rollout.max_response_length=10", "algorithm.overlong_buffer.len=4",
        "algorithm.use_kl_loss=true", "algorithm.kl_loss_coef=0.5", "algorithm.kl_loss_type=low_var_kl",
    ]), dynamic_sampling=False)
    model, _ = load_policy(tiny_model_dir)
    ref = model_loader(tiny_model_dir, torch.float32)()  # a fresh load of the initial policy, not a deepcopy
    engine = TorchEngine(model, lr=1e-2, weight_decay=0.0, warmup_steps=0, grad_clip=1.0, ref_model=ref)
    prompts = [Prompt(text=f"p{k}", ground_truth=str(k), problem_id=str(k)) for k in range(4)]
    batch = collect_batch(InlineRounds(ScriptedRollout(script), PromptStream(prompts, seed=0, shuffle=False), cfg, SingleProcess()), cfg, step=1, pad_id=0).batch
    compute_advantages(batch, cfg)
    fill_old_log_probs(engine, batch, build_objective(cfg), cfg.trainer.ppo_micro_batch_size)
    # before any update the policy is the reference: log-probs agree exactly
    torch.testing.assert_close(batch.ref_log_probs, batch.old_log_probs, rtol=0, atol=1e-6)
    metrics = update_policy(engine, batch, build_objective(cfg), cfg.trainer, step=1)
    # 2 epochs x 2 mini-batches: after the first step the policy has moved, so the k3 estimate
    # exp(ref - logp) - (ref - logp) - 1 >= 0 becomes positive on average
    assert metrics["actor/num_updates"] == 4
    assert metrics["actor/kl_loss"] > 0
    assert all(not p.requires_grad for p in ref.parameters())


def tis_grads(model_dir: Path, *, enable: bool, cap: float, shift: float) -> tuple[list[torch.Tensor], dict]:
    """Gradient of one update when the rollout engine's log-probs are the trainer's minus ``shift``."""
    from dapo_cli.train.update import rollout_mismatch

    cfg = apply_techniques(load_config(None, [
        "rollout.n=4", "data.train_batch_size=4", "trainer.ppo_mini_batch_size=4", "trainer.ppo_micro_batch_size=3",
        "rollout.max_response_length=10", "algorithm.overlong_buffer.len=4", "trainer.grad_clip=0",
        f"algorithm.rollout_is.enable={str(enable).lower()}", f"algorithm.rollout_is.cap={cap}",
    ]), dynamic_sampling=False)
    model, _ = load_policy(model_dir, dtype=torch.float64)
    engine = TorchEngine(model, lr=1e-2, weight_decay=0.0, warmup_steps=0, grad_clip=0.0)
    grads: list[torch.Tensor] = []
    step = engine.step

    def recording_step():
        grads.extend(p.grad.detach().clone() for p in engine.module.parameters())
        return step()

    engine.step = recording_step
    prompts = [Prompt(text=f"p{k}", ground_truth=str(k), problem_id=str(k)) for k in range(4)]
    batch = collect_batch(InlineRounds(ScriptedRollout(script), PromptStream(prompts, seed=0, shuffle=False), cfg, SingleProcess()), cfg, step=1, pad_id=0).batch
    compute_advantages(batch, cfg)
    fill_old_log_probs(engine, batch, build_objective(cfg), cfg.trainer.ppo_micro_batch_size)
    batch.rollout_log_probs = batch.old_log_probs - shift  # pi_old / pi_rollout = exp(shift) on every token
    update_policy(engine, batch, build_objective(cfg), cfg.trainer, step=1)
    return grads, rollout_mismatch(batch, build_objective(cfg), cfg.algorithm.rollout_is, SingleProcess())


@pytest.mark.parametrize(("cap", "factor"), [(1.5, 1.5), (3.0, 2.0)])
@pytest.mark.slow
def test_truncated_importance_sampling_scales_the_gradient_by_the_truncated_ratio(tiny_model_dir, cap, factor):
    # ratio exp(log 2) = 2 on every token: the weight is min(2, cap), a constant, so the whole
    # gradient is that constant times the uncorrected one (one update, ratio 1 to pi_old)
    plain, metrics_off = tis_grads(tiny_model_dir, enable=False, cap=cap, shift=math.log(2))
    corrected, metrics_on = tis_grads(tiny_model_dir, enable=True, cap=cap, shift=math.log(2))
    # relative error of each tensor in norm, 1e-6 rather than 1e-12: the model is float64, but
    # transformers' attention softmax runs in float32, so a 1.5x larger upstream gradient rounds
    # differently there (measured: 2.6e-7 of the largest entry)
    for a, b in zip(plain, corrected):
        assert float((b - factor * a).norm() / (factor * a).norm()) < 1e-6
    assert metrics_off["rollout/logprob_diff_mean"] == pytest.approx(math.log(2), rel=1e-9)
    assert metrics_off["rollout/logprob_diff_max"] == pytest.approx(math.log(2), rel=1e-6)
    assert "rollout/is_weight_mean" not in metrics_off
    assert metrics_on["rollout/is_weight_mean"] == pytest.approx(factor, rel=1e-9)
    assert metrics_on["rollout/is_truncated_frac"] == (1.0 if cap < 2 else 0.0)


@pytest.mark.slow
def test_micro_batch_loss_norm_is_what_per_micro_batch_frameworks_compute(tiny_model_dir):
    # token-mean normalised per micro-batch is NOT the mini-batch token mean: the gradients differ
    exact = mini_batch_grads(tiny_model_dir, "token-mean", 3)
    per_micro = mini_batch_grads(tiny_model_dir, "token-mean", 3, extra=["algorithm.loss_norm=micro_batch"])
    whole_micro = mini_batch_grads(tiny_model_dir, "token-mean", 8, extra=["algorithm.loss_norm=micro_batch"])
    diff = max(float((a - b).abs().max()) for a, b in zip(exact[0], per_micro[0]))
    assert diff > 1e-4
    for a, b in zip(exact[0], whole_micro[0]):  # one micro-batch per mini-batch: the same thing
        torch.testing.assert_close(b, a, rtol=1e-8, atol=1e-10)
