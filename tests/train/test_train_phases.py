"""The trainer's phases with scripted rollouts: each DAPO technique's observable effect."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from fakes import ScriptedRollout  # noqa: E402

from dapo_cli.config import apply_techniques, load_config  # noqa: E402
from dapo_cli.data.loader import Prompt, PromptStream  # noqa: E402
from dapo_cli.errors import UserError  # noqa: E402
from dapo_cli.engine.dist import SingleProcess
from dapo_cli.train.rounds import InlineRounds
from dapo_cli.train import collect_batch, compute_advantages, score_and_shape  # noqa: E402

# Prompt "pK" has ground truth "K". Its kind decides how the G=4 samples answer:
#   all-right prompts (K % 3 == 0), all-wrong (K % 3 == 1), mixed 2/4 (K % 3 == 2).
PROMPTS = [Prompt(text=f"p{k}", ground_truth=str(k), problem_id=str(k)) for k in range(12)]


def answer_script(prompt: str, j: int) -> tuple[str, int, bool]:
    k = int(prompt[1:])
    kind = k % 3
    right = kind == 0 or (kind == 2 and j < 2)
    return (f"Answer: {k if right else k + 100}", 4, False)


def make_cfg(**sets: object):
    overrides = [f"{k}={v}" for k, v in {
        "rollout.n": 4, "data.train_batch_size": 2, "trainer.ppo_mini_batch_size": 1,
        "rollout.max_response_length": 10, "algorithm.overlong_buffer.len": 4, **sets,
    }.items()]
    return load_config(None, overrides)


def collect(cfg, script=answer_script, prompts=PROMPTS):
    stream = PromptStream(prompts, seed=0, shuffle=False)
    rollout = ScriptedRollout(script)
    return collect_batch(InlineRounds(rollout, stream, cfg, SingleProcess()), cfg, step=1, pad_id=0), rollout


def test_dynamic_sampling_keeps_only_mixed_groups_and_fills_the_batch():
    cfg = make_cfg()
    collected, rollout = collect(cfg)
    batch = collected.batch
    # Rounds of 2 prompts in stream order: (p0 right, p1 wrong) keeps nothing,
    # (p2 mixed, p3 right) keeps p2, (p4 wrong, p5 mixed) keeps p5 → 2 groups after 3 rounds.
    assert rollout.calls == [2, 2, 2]
    assert sorted(set(batch.ground_truths)) == ["2", "5"]
    for g in batch.group_ids.unique():
        acc = batch.acc[batch.group_ids == g].float()
        assert 0 < acc.mean() < 1  # every trained group has non-constant accuracy
    assert collected.metrics["train/num_gen_batches"] == 3
    assert collected.rounds_used == 3
    assert collected.metrics["train/samples_generated"] == 24
    assert collected.metrics["train/kept_group_frac"] == pytest.approx(2 / 6)
    assert len(collected.generated) == 24


def test_without_dynamic_sampling_one_round_trains_every_group():
    from dapo_cli.train import step_metrics

    cfg = apply_techniques(make_cfg(), dynamic_sampling=False)
    collected, rollout = collect(cfg)
    assert rollout.calls == [2]
    assert sorted(set(collected.batch.ground_truths)) == ["0", "1"]  # all-right and all-wrong groups stay
    assert not collected.filtered and collected.metrics == {}  # nothing filtered: the step's records say how much signal
    assert step_metrics(collected, None, cfg)["train/kept_group_frac"] == 0.0  # neither group carries signal
    compute_advantages(collected.batch, cfg)
    assert torch.all(collected.batch.advantages == 0)


def test_dynamic_sampling_exhausted_trains_on_partial_or_raises():
    cfg = make_cfg(**{"algorithm.filter_groups.max_num_gen_batches": 2})
    collected, rollout = collect(cfg)
    assert rollout.calls == [2, 2]
    assert sorted(set(collected.batch.ground_truths)) == ["2"]  # one of the two groups wanted
    cfg = make_cfg(**{"algorithm.filter_groups.max_num_gen_batches": 2, "algorithm.filter_groups.on_exhausted": "error"})
    with pytest.raises(UserError, match="dynamic sampling kept 1/2 groups in 2 rounds"):
        collect(cfg)


def test_dynamic_sampling_with_no_informative_group_returns_no_batch():
    cfg = make_cfg(**{"algorithm.filter_groups.max_num_gen_batches": 1})
    collected, _ = collect(cfg)  # first round: p0 all right, p1 all wrong
    assert collected.batch is None
    assert collected.metrics["train/kept_group_frac"] == 0.0


def lengths_script(prompt: str, j: int) -> tuple[str, int, bool]:
    # lengths 5, 8, 10 (truncated), 3 for the four samples; all answer correctly.
    length, truncated = [(5, False), (8, False), (10, True), (3, False)][j]
    return (f"Answer: {prompt[1:]}", length, truncated)


def test_soft_overlong_punishment_shapes_rewards_in_the_buffer():
    # L_max = 10, L_cache = 4: no penalty up to 6; inside the buffer ((10-4) - L)/4:
    #   L=5 → 0; L=8 → (6-8)/4 = -0.5; L=10 → (6-10)/4 = -1.0; L=3 → 0.
    cfg = apply_techniques(make_cfg(), dynamic_sampling=False, overlong_shaping=True)
    batch = collect(cfg, lengths_script)[0].batch
    assert batch.scores[:4].tolist() == [1.0, 1.0, 1.0, 1.0]
    assert batch.rewards[:4].tolist() == pytest.approx([1.0, 0.5, 0.0, 1.0], abs=1e-6)
    off = apply_techniques(cfg, overlong_shaping=False)
    batch = collect(off, lengths_script)[0].batch
    assert torch.equal(batch.rewards, batch.scores)


def test_overlong_filtering_drops_truncated_responses_from_the_loss():
    cfg = apply_techniques(make_cfg(), dynamic_sampling=False, overlong_filtering=True)
    batch = collect(cfg, lengths_script)[0].batch
    assert batch.loss_mask[2].sum() == 0 and batch.response_mask[2].sum() == 10
    assert torch.equal(batch.loss_mask[[0, 1, 3]], batch.response_mask[[0, 1, 3]])
    off = apply_techniques(cfg, overlong_filtering=False)
    batch = collect(off, lengths_script)[0].batch
    assert torch.equal(batch.loss_mask, batch.response_mask)


def test_dynamic_sampling_on_shaped_score_keeps_groups_that_differ_only_in_length():
    # All four samples are right (acc constant) but their shaped rewards differ (lengths 5, 8, 10, 3).
    cfg = make_cfg(**{"algorithm.filter_groups.metric": "score", "algorithm.filter_groups.max_num_gen_batches": 1})
    assert collect(cfg, lengths_script)[0].batch is not None
    cfg = dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, filter_groups=dataclasses.replace(cfg.algorithm.filter_groups, metric="acc")))
    assert collect(cfg, lengths_script)[0].batch is None


def test_score_and_shape_uses_the_configured_verifier():
    cfg = apply_techniques(make_cfg(**{"reward.verifier": "strict_box"}), dynamic_sampling=False)
    batch = collect(cfg)[0].batch  # "Answer: K" has no \boxed{} → strict_box marks all wrong
    assert not batch.acc.any()
    score_and_shape(batch, make_cfg())
    assert batch.acc.any()


def test_step_metrics_report_the_length_spread_and_what_truncation_cuts():
    from dapo_cli.train import step_metrics

    # p0 (K=0): lengths 2, 4, 6, 8 (sample j: 2j + 2), none truncated;
    # p1 (K=1): samples 0 and 1 truncated at 10 tokens (sample 0's text already holds "1", sample 1's
    #           does not), samples 2 and 3 of length 4: group lengths 10, 10, 4, 4.
    def script(prompt: str, j: int) -> tuple[str, int, bool]:
        k = int(prompt[1:])
        if k == 0:
            return ("Answer: 0", 2 * j + 2, False)
        if j < 2:
            return ("1 + 0 = 1, then" + " 1" * 8 if j == 0 else "loop " * 4, 10, True)
        return ("Answer: 1", 4, False)

    cfg = apply_techniques(make_cfg(), dynamic_sampling=False)
    collected, _ = collect(cfg, script)
    metrics = step_metrics(collected, None, cfg)  # from what was generated, not the trained batch
    # group p0: mean 5, population std sqrt(((3)²+1²+1²+3²)/4) = sqrt(5), cv sqrt(5)/5
    # group p1: mean 7, std 3, cv 3/7                         → means over the two groups
    assert metrics["response_length/group_std_mean"] == pytest.approx((5 ** 0.5 + 3) / 2, abs=1e-9)
    assert metrics["response_length/group_cv_mean"] == pytest.approx((5 ** 0.5 / 5 + 3 / 7) / 2, abs=1e-9)
    # 2 truncated responses: both end in a loop (" 1" x 8, "loop " x 4); one holds its ground truth "1"
    assert metrics["overlong/truncated_frac"] == pytest.approx(2 / 8)
    assert metrics["overlong/truncated_with_answer_frac"] == pytest.approx(1 / 2)
    assert metrics["overlong/truncated_looping_frac"] == pytest.approx(1.0)
    # neither loop begins p1's correct "Answer: 1" (the work of its correct siblings)
    assert metrics["overlong/truncated_on_correct_path_frac"] == pytest.approx(0.0)
    collected, _ = collect(cfg)  # nothing truncated: the share is not defined, so not logged
    assert "overlong/truncated_with_answer_frac" not in step_metrics(collected, None, cfg)


def test_the_session_counts_barren_steps_and_says_when_the_run_collapsed():
    from dapo_cli.train.session import RunState, TrainingSession

    s = object.__new__(TrainingSession)  # only the counter's state: no engines
    s.cfg, s.state = load_config(None, ["trainer.collapse_patience=2"]), RunState()
    s.count_barren(False)
    assert (s.state.barren_steps, s.collapsed) == (1, False)
    s.count_barren(False)
    assert (s.state.barren_steps, s.collapsed) == (2, True)
    s.count_barren(True)
    assert (s.state.barren_steps, s.collapsed) == (0, False)
    s.cfg.trainer.collapse_patience, s.state.barren_steps = 0, 99  # 0: the guard is off
    assert not s.collapsed


def test_the_step_clock_records_each_lap_since_the_previous_one(monkeypatch):
    from dapo_cli.train import records

    now = iter([10.0, 12.5, 13.0, 16.0])
    monkeypatch.setattr(records.time, "perf_counter", lambda: next(now))
    clock = records.StepClock()  # starts at 10
    assert clock.lap("timing/gen_and_score") == 2.5
    assert clock.lap("timing/old_log_prob") == 0.5  # since the previous lap, not the start
    assert clock.laps == {"timing/gen_and_score": 2.5, "timing/old_log_prob": 0.5}
    assert records.elapsed(clock.t0) == 6.0


def test_a_phase_says_what_runs_and_times_it_from_the_previous_lap(monkeypatch):
    from dapo_cli.train import records

    class Reporter:
        said: list[tuple[int, str]] = []

        def phase(self, step: int, label: str) -> None:
            self.said.append((step, label))

    now = iter([0.0, 4.0, 9.0])
    monkeypatch.setattr(records.time, "perf_counter", lambda: next(now))
    reporter = Reporter()
    clock = records.StepClock(reporter, step=3)  # starts at 0
    with clock.phase("generate + score", "timing/gen_and_score"):  # ends at 4
        pass
    with clock.phase(None, "timing/old_log_prob"):  # says nothing, ends at 9: 5 s since the previous lap
        pass
    with clock.phase("update"):  # said, not timed
        pass
    assert reporter.said == [(3, "generate + score"), (3, "update")]
    assert clock.laps == {"timing/gen_and_score": 4.0, "timing/old_log_prob": 5.0}


def test_the_run_state_is_what_a_checkpoint_writes_and_a_resume_reads() -> None:
    from dapo_cli.resume_state import TrainerState
    from dapo_cli.train.session import RunState

    state = RunState(start_step=0, barren_steps=2, mlflow_run_id="abc", base_val=0.25, last_val=0.5)
    saved = state.saved()
    assert saved == {"barren_steps": 2, "mlflow_run_id": "abc", "base_val": 0.25, "last_val": 0.5}
    # a checkpoint at step 7 read back (the checked state): the same values, the run continuing after step 7
    back = RunState.from_saved(TrainerState(step=7, stream={"epoch": 0, "position": 3}, **{**saved, "mlflow_run_id": "abc"}))
    assert back == RunState(start_step=7, barren_steps=2, mlflow_run_id="abc", base_val=0.25, last_val=0.5)
