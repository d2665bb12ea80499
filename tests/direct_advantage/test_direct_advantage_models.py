"""The critic (scalar head, BCE on soft targets, save/load, calibration) and the actor update on a tiny model."""

from __future__ import annotations

import pytest
import torch

from dapo_cli.direct_advantage.actor import (
    candidate_batch,
    sequence_log_probs,
    train_actor,
)
from dapo_cli.direct_advantage.critic import (
    build_critic,
    critic_phase,
    fit_metrics,
    load_critic,
    predict,
    save_critic,
    train_critic,
)
from dapo_cli.engine.torch import TorchEngine
from dapo_cli.models import load_policy

TEXTS = ["What is 1+2?\n", "What is 1+2?\n1+2+0=3\n", "What is 5+5?\n", "What is 5+5?\n5+5+0=10\n"]
TARGETS = [0.25, 0.75, 0.5, 1.0]


@pytest.mark.slow
def test_critic_starts_at_the_prior_and_fits_soft_targets(tiny_model_dir):
    torch.manual_seed(0)
    model, tokenizer = build_critic(tiny_model_dir, device=torch.device("cpu"), dtype=torch.float32)
    assert predict(model, tokenizer, TEXTS, batch_size=2) == pytest.approx([0.5] * 4)  # zero head
    model.set_prior(0.3)
    assert predict(model, tokenizer, TEXTS, batch_size=4) == pytest.approx([0.3] * 4, abs=1e-6)
    m = train_critic(model, tokenizer, TEXTS, TARGETS, lr=3e-3, epochs=60, batch_size=4, micro_batch_size=3,
                     weight_decay=0.0, grad_clip=1.0, seed=0)
    assert m["optimizer_steps"] == 60 and m["train_bce_last_epoch"] < m["train_bce_first_epoch"]
    pred = predict(model, tokenizer, TEXTS, batch_size=3)
    assert pred == pytest.approx(TARGETS, abs=0.1)
    metrics, table = fit_metrics(pred, TARGETS, "train_")
    assert metrics["train_bce"] == pytest.approx(metrics["train_bce_floor"], abs=0.02)  # BCE floor: the targets' entropy
    assert metrics["train_bce"] < metrics["train_bce_constant"]
    assert sum(row["count"] for row in table) == 4


@pytest.mark.slow
def test_critic_batches_do_not_change_the_gradient(tiny_model_dir):
    def fitted(micro: int) -> list[float]:
        torch.manual_seed(0)
        model, tok = build_critic(tiny_model_dir, device=torch.device("cpu"), dtype=torch.float32)
        train_critic(model, tok, TEXTS, TARGETS, lr=1e-2, epochs=1, batch_size=4, micro_batch_size=micro,
                     weight_decay=0.0, grad_clip=0.0, seed=0)
        return predict(model, tok, TEXTS, batch_size=4)

    assert fitted(1) == pytest.approx(fitted(4), abs=1e-5)


@pytest.mark.slow
def test_critic_save_load_round_trip(tiny_model_dir, tmp_path):
    torch.manual_seed(0)
    model, tokenizer = build_critic(tiny_model_dir, device=torch.device("cpu"), dtype=torch.float32)
    train_critic(model, tokenizer, TEXTS, TARGETS, lr=1e-2, epochs=3, batch_size=2, micro_batch_size=2,
                 weight_decay=0.0, grad_clip=1.0, seed=0)
    save_critic(model, tokenizer, tmp_path / "critic")
    again, tok2 = load_critic(tmp_path / "critic", device=torch.device("cpu"), dtype=torch.float32)
    assert predict(again, tok2, TEXTS, batch_size=4) == pytest.approx(predict(model, tokenizer, TEXTS, batch_size=4), abs=1e-6)


@pytest.mark.slow
def test_critic_phase_holds_out_problems_and_plots_calibration(tiny_model_dir, tmp_path):
    rows = [
        {"state": i, "problem": f"p{i % 5}", "prompt": t, "prefix": "", "depth": 0, "terminal": i == 3, "value": y}
        for i, (t, y) in enumerate(zip(TEXTS * 3, TARGETS * 3))
    ]
    out, metrics, calibration = critic_phase(
        rows, backbone_path=tiny_model_dir, out_dir=tmp_path / "critic", device=torch.device("cpu"), dtype=torch.float32,
        lr=1e-3, epochs=1, batch_size=4, micro_batch_size=4, holdout=0.4, weight_decay=0.0, grad_clip=1.0, seed=0,
    )
    assert len(out) == 11  # the finished solution (state 3) is scored exactly, so the critic does not learn it
    assert {r["split"] for r in out} == {"train", "holdout"}
    split_of = {r["problem"]: r["split"] for r in out}
    assert all(split_of[r["problem"]] == r["split"] for r in out)  # a problem is wholly in one split
    assert (tmp_path / "critic" / "calibration.png").stat().st_size > 1000
    assert (tmp_path / "critic" / "value_head.safetensors").is_file()
    assert {"train_bce", "train_bce_floor", "train_ece", "holdout_bce", "holdout_mae"} <= set(metrics)
    assert {row["split"] for row in calibration} == {"train", "holdout"}


@pytest.fixture()
def engine(tiny_model_dir):
    torch.manual_seed(0)
    policy, tokenizer = load_policy(tiny_model_dir)
    ref, _ = load_policy(tiny_model_dir)
    return TorchEngine(policy, lr=1e-3, weight_decay=0.0, warmup_steps=0, grad_clip=0.0, device="cpu", ref_model=ref), tokenizer


def test_candidate_rows_score_the_step_tokens_and_eos_after_a_final_step(engine):
    _, tokenizer = engine
    batch = candidate_batch(tokenizer, ["What is 1+2?\n", "Q\n"], ["1+2+0=3\n", "Answer: 3"], [False, True])
    assert batch.response_mask.sum(-1).tolist() == [8, 10]  # 8 characters; 9 characters + EOS
    assert batch.response_ids[1, 9].item() == tokenizer.eos_token_id
    assert batch.prompt_mask.sum(-1).tolist() == [13, 2] and not batch.prompt_mask[1, 0]  # left-padded


def test_sequence_log_prob_is_the_sum_over_the_step(engine):
    eng, tokenizer = engine
    rows = [{"prompt": "What is 1+2?\n", "prefix": "", "action": "Answer: 3", "terminal": True}]
    got = sequence_log_probs(eng, tokenizer, rows, micro_batch_size=4, reference=False)
    ids = tokenizer("What is 1+2?\nAnswer: 3", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    with torch.no_grad():
        logp = torch.log_softmax(eng.module(torch.tensor([ids])).logits[0, :-1], -1)
    start = len(tokenizer("What is 1+2?\n", add_special_tokens=False)["input_ids"])
    manual = sum(float(logp[t - 1, ids[t]]) for t in range(start, len(ids)))
    assert float(got[0]) == pytest.approx(manual, abs=1e-4)
    assert float(sequence_log_probs(eng, tokenizer, rows, micro_batch_size=4, reference=True)[0]) == pytest.approx(manual, abs=1e-4)


ROWS = [
    {"state": 0, "problem": "p", "depth": 0, "prompt": "What is 1+2?\n", "prefix": "", "action": a, "terminal": t, "q": q, "advantage": adv}
    for a, t, q, adv in [("Answer: 3", True, 1.0, 0.5), ("Answer: 4", True, 0.0, -0.5)]
] + [
    {"state": 1, "problem": "p", "depth": 1, "prompt": "What is 1+2?\n", "prefix": "1+2+0=3\n", "action": a, "terminal": True, "q": q, "advantage": adv}
    for a, q, adv in [("Answer: 3", 0.9, 0.3), ("Answer: 9", 0.3, -0.3)]
]


def test_actor_moves_log_ratios_towards_the_scaled_advantages(engine):
    eng, tokenizer = engine
    out, m = train_actor(eng, tokenizer, ROWS, beta=0.5, epochs=3, batch_states=2, micro_batch_size=4, seed=0)
    assert m["start_log_ratio_abs_max"] == pytest.approx(0.0, abs=1e-5)  # pi = pi_ref before the update
    assert m["optimizer_steps"] == 3 and m["loss_after"] < m["loss_before"]
    assert m["sign_agreement"] == 1.0
    assert [r["target_log_ratio"] for r in out] == pytest.approx([1.0, -1.0, 0.6, -0.6])


@pytest.mark.slow
def test_actor_update_does_not_depend_on_micro_batching(tiny_model_dir):
    def final(micro: int) -> list[float]:
        torch.manual_seed(0)
        policy, tokenizer = load_policy(tiny_model_dir)
        ref, _ = load_policy(tiny_model_dir)
        eng = TorchEngine(policy, lr=1e-2, weight_decay=0.0, warmup_steps=0, grad_clip=0.0, device="cpu", ref_model=ref)
        out, _ = train_actor(eng, tokenizer, ROWS, beta=0.5, epochs=1, batch_states=2, micro_batch_size=micro, seed=0)
        return [r["log_prob"] for r in out]

    assert final(1) == pytest.approx(final(3), abs=1e-4)  # a state split over micro-batches keeps its weight
