"""The ladder testbed's regime measures (``dapo_cli.ablate.regime``), on hand-made groups; the real model's
regime at ``experiments/smollm2-ladder.yaml`` is checked in tests/e2e/test_e2e_real_model_ladder.py."""

from __future__ import annotations

import pytest

from dapo_cli.ablate.regime import Regime, math_dapo_score, measure_regime


def test_the_regime_counts_truncation_spread_equal_groups_accuracy_and_answers() -> None:
    # two groups of 4. Group 1: lengths 5, 20, 10, 40 (40 = the limit, not ended), right F T F F -> spread
    # 40/5 = 8x, mixed rewards. Group 2: lengths 10, 12, 15, 11, all wrong -> spread 15/10 = 1.5x, all equal.
    lengths = [5, 20, 10, 40, 10, 12, 15, 11]
    ended = [True, True, True, False, True, True, True, True]
    right = [False, True, False, False, False, False, False, False]
    answered = [True, True, False, False, True, False, False, False]
    r = measure_regime(lengths, ended, right, answered, limit=40, n=4)
    # 1 of 8 truncated; 1 of 2 groups >= 3x; median of (8.0, 1.5) = 4.75; 1 of 2 groups all-equal; 1 of 8 right;
    # mean length 123 / 8 = 15.375; 3 of 8 answered
    assert r == Regime(limit=40, samples=8, truncated=0.125, spread_3x=0.5, spread_median=4.75, all_equal=0.5,
                       accuracy=0.125, mean_length=15.375, answered=0.375)
    assert r.unmet() == []


def test_a_zero_length_response_counts_as_one_token_in_the_spread() -> None:
    # lengths 0 and 6: the ratio is 6 / max(1, 0) = 6x, not a division by zero
    r = measure_regime([0, 6], [True, True], [False, True], [False, True], limit=8, n=2)
    assert r.spread_median == 6.0 and r.spread_3x == 1.0


def test_each_unmet_precondition_is_named_with_its_value() -> None:
    base = Regime(limit=40, samples=256, truncated=0.078, spread_3x=0.59, spread_median=3.6, all_equal=0.66,
                  accuracy=0.117, mean_length=16.3, answered=0.52)
    assert base.unmet() == []
    worse = Regime(limit=64, samples=256, truncated=0.049, spread_3x=0.3, spread_median=2.9, all_equal=0.29,
                   accuracy=0.02 - 1e-9, mean_length=18.0, answered=0.53)
    assert worse.unmet() == [
        "truncated 4.9% < 5%", "median group length spread 2.9x < 3x", "all-equal groups 29% < 30%",
        "accuracy 2.0% outside 2%-60%",
    ]
    assert Regime(**{**base.__dict__, "accuracy": 0.61}).unmet() == ["accuracy 61.0% outside 2%-60%"]


def test_responses_that_do_not_make_whole_groups_are_refused() -> None:
    with pytest.raises(ValueError, match="5 responses do not make groups of 2"):
        measure_regime([1] * 5, [True] * 5, [False] * 5, [False] * 5, limit=8, n=2)


def test_the_score_is_the_training_verifier_s_with_whether_it_read_an_answer() -> None:
    assert math_dapo_score("7 + 5 = 12\nAnswer: 12", "12") == (True, True)
    assert math_dapo_score("Answer: 13", "12") == (False, True)
    assert math_dapo_score("7 + 5 = 12", "12") == (False, False)  # no Answer: line -> not read


def test_the_prompts_go_to_the_engine_in_chunks_that_change_no_sample() -> None:
    from dapo_cli.ablate.regime import sample_regimes
    from dapo_cli.config.tiny import TinyModelConfig
    from dapo_cli.models.tiny import build_tiny_model_for
    from dapo_cli.models.tokenizer import build_char_tokenizer
    from dapo_cli.rollout.fast import FastRolloutEngine

    tok = build_char_tokenizer()
    cfg = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    engine = FastRolloutEngine(build_tiny_model_for(cfg, tok), tok)
    calls: list[int] = []
    generate = engine.generate
    engine.generate = lambda prompts, n, params: calls.append(len(prompts)) or generate(prompts, n, params)  # type: ignore[method-assign]
    prompts, truths = [f"What is {i}+{i}?\n" for i in range(7)], [str(2 * i) for i in range(7)]

    def score(text: str, truth: str) -> tuple[bool, bool]:
        return truth in text, "Answer" in text

    whole = sample_regimes(engine, prompts, truths, score, n=4, limits=[3, 9], seed=5, chunk=7)
    chunked = sample_regimes(engine, prompts, truths, score, n=4, limits=[3, 9], seed=5, chunk=3)
    assert calls == [7, 3, 3, 1]  # one call, then ceil(7 / 3) calls of at most 3 prompts
    assert chunked == whole and whole[0].samples == 28
