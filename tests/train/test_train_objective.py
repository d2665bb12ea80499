"""The run's objective (``train/objective.py``): resolved from the config once, the update reads nothing else."""

from __future__ import annotations

import pytest
import torch

from dapo_cli.algo import objectives
from dapo_cli.algo.cispo import cispo_loss
from dapo_cli.algo.losses import dapo_loss
from dapo_cli.batch import RolloutBatch
from dapo_cli.config import load_config
from dapo_cli.train.objective import build_objective

ASYNC = ["rollout.max_staleness=1"]


def test_the_objective_binds_the_loss_its_settings_and_the_correction_once() -> None:
    dapo = build_objective(load_config(None))
    assert dapo.loss is dapo_loss and dapo.correction is None and dapo.correction_args == {}
    assert dict(dapo.loss_args) == {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": None}
    cispo = build_objective(load_config(None, ["algorithm.policy_loss=cispo", "algorithm.rollout_is.enable=true",
                                               "algorithm.rollout_is.mode=seq_tis", "algorithm.entropy_coeff=0.01"]))
    assert cispo.loss is cispo_loss and cispo.correction == "seq_tis" and dict(cispo.correction_args) == {"cap": 2.0}
    assert cispo.corrected and cispo.with_entropy and cispo.entropy_coeff == 0.01
    # asynchronous rollouts always correct (behaviour_correction), with the default mode
    assert build_objective(load_config(None, ASYNC)).correction == "token_tis"


def test_after_it_is_built_no_registry_is_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    objective = build_objective(load_config(None, ["algorithm.rollout_is.enable=true"]))

    def refuse(name: str):
        raise AssertionError(f"looked up {name!r} again")

    monkeypatch.setattr(objectives, "get_policy_loss", refuse)
    # one response of three tokens, A = +1, the rollout engine's log-probs equal the old ones: the loss runs whole
    logp = torch.log(torch.tensor([[0.5, 0.4, 0.9]], dtype=torch.float64)).requires_grad_()
    one = torch.ones(1, 3, dtype=torch.bool)
    micro = RolloutBatch(
        prompt_ids=torch.zeros(1, 1, dtype=torch.long), prompt_mask=torch.ones(1, 1, dtype=torch.bool),
        response_ids=torch.zeros(1, 3, dtype=torch.long), response_mask=one, lengths=torch.tensor([3]),
        truncated=torch.tensor([False]), texts=["abc"], group_ids=torch.tensor([0]), ground_truths=["1"], prompts=["p"],
        pad_id=0, loss_mask=one, advantages=torch.tensor([1.0], dtype=torch.float64), old_log_probs=logp.detach().clone(),
        rollout_log_probs=logp.detach().clone(),
    )
    mask = objective.trained_mask(micro)
    loss, metrics = objective(logp, None, micro, mask, {})
    # ratio 1 and weight 1 on every token: token-mean of -A = -1
    assert float(loss.detach()) == pytest.approx(-1.0, abs=1e-12) and metrics["actor/clipfrac_high"] == 0.0
