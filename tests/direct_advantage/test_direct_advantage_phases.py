"""The data phases on a deterministic completer: solution choice, Monte-Carlo value targets,
candidate steps and their advantages, the gap filter, dedup of identical steps, state-wise batches."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from dapo_cli.direct_advantage.phases import (
    TrainProblem,
    advantages_phase,
    candidate_steps,
    generate_phase,
    mc_values_phase,
    state_batches,
)
from dapo_cli.rollout.base import SamplingParams

sys.path.insert(0, str(Path(__file__).parent))

from da_fakes import ScriptedEngine

PROMPT = "What is 1+2?\n"
WORKED = "1+2+0=3\nAnswer: 3"


def params(chunk: int) -> SamplingParams:
    return SamplingParams(max_tokens=16, seed=100 + chunk)


def gen_row(response: str, acc: bool, *, chosen: bool = True, truncated: bool = False, problem: str = "p0") -> dict:
    return {"problem": problem, "prompt": PROMPT, "ground_truth": "3", "sample": 0, "response": response, "acc": acc,
            "length": len(response), "truncated": truncated, "steps": 1, "chosen": chosen}


COMPLETIONS = {
    PROMPT: ["Answer: 3", "Answer: 4", WORKED, "Answer: 3"],  # from the problem alone: 3 of 4 right
    PROMPT + "1+2+0=3\n": ["Answer: 3", "Answer: 9"],  # after the first step: 1 of 2 (cycled)
}


def completer() -> ScriptedEngine:
    return ScriptedEngine(lambda prompt: COMPLETIONS[prompt])


def test_generate_samples_scores_and_chooses_a_balanced_few():
    script = {"p0\n": ["Answer: 3", "Answer: 4", "Answer: 3", "Answer: 5"], "p1\n": ["Answer: 7", "Answer: 8"]}
    engine = ScriptedEngine(lambda p: script[p])
    problems = [TrainProblem("a", "p0\n", "3"), TrainProblem("b", "p1\n", "7")]
    rows, metrics = generate_phase(
        engine, problems, samples=4, chosen=2, params_for=params, verifier="math_dapo", delimiter="\n", seed=0, max_sequences=4,
    )
    assert len(rows) == 8 and [r["sample"] for r in rows] == [0, 1, 2, 3] * 2
    assert [c[2].seed for c in engine.calls] == [100, 101]  # one call per problem here, each its own seed
    for key in ("a", "b"):
        picked = [r for r in rows if r["problem"] == key and r["chosen"]]
        assert len(picked) == 2 and {r["acc"] for r in picked} == {True, False}
        assert len({r["response"] for r in picked}) == 2
    assert metrics["samples"] == 8 and metrics["acc"] == pytest.approx(4 / 8)
    assert metrics["chosen"] == 4 and metrics["chosen_acc"] == pytest.approx(0.5)


def test_mc_value_targets_are_the_success_rates_of_the_completions():
    rows, metrics = mc_values_phase(
        completer(), [gen_row(WORKED, True), gen_row("Answer: 4", False), gen_row("Answer: 5", False, chosen=False)],
        completions=4, params_for=params, verifier="math_dapo", delimiter="\n",
    )
    open_states = {r["prefix"]: r for r in rows if not r["terminal"]}
    assert set(open_states) == {"", "1+2+0=3\n"}
    assert open_states[""]["value"] == pytest.approx(0.75)
    assert open_states[""]["sources"] == 2  # the problem alone is shared by both chosen solutions: completed once
    assert open_states["1+2+0=3\n"]["value"] == pytest.approx(0.5)  # scored on prefix + completion
    assert open_states["1+2+0=3\n"]["completions"] == ["Answer: 3", "Answer: 9", "Answer: 3", "Answer: 9"]
    finished = {r["prefix"]: r["value"] for r in rows if r["terminal"]}
    assert finished == {WORKED: 1.0, "Answer: 4": 0.0}  # a finished solution's value is its reward
    assert metrics["states"] == 2 and metrics["states_without_dedup"] == 3
    assert metrics["samples"] == 8 and metrics["terminal_states"] == 2


def test_mc_values_score_the_prefix_and_completion_together():
    engine = ScriptedEngine(lambda prompt: [""])  # stops at once: the answer is already in the prefix
    rows, _ = mc_values_phase(
        engine, [gen_row("Answer: 3\n", True)], completions=2, params_for=params, verifier="math_dapo", delimiter="\n",
    )
    assert {r["prefix"]: r["value"] for r in rows if not r["terminal"]}["Answer: 3\n"] == 1.0


def critic(texts: list[str]) -> list[float]:
    return [0.8 if t.endswith("=3\n") else 0.2 for t in texts]


def mc_rows() -> list[dict]:
    rows, _ = mc_values_phase(
        completer(), [gen_row(WORKED, True), gen_row("Answer: 4", False)], completions=4, params_for=params,
        verifier="math_dapo", delimiter="\n",
    )
    return rows


def test_candidates_are_distinct_first_steps_with_counts():
    state = next(r for r in mc_rows() if r["prefix"] == "" and not r["terminal"])
    cands = {c["action"]: c for c in candidate_steps(state, "\n")}
    assert set(cands) == {"Answer: 3", "Answer: 4", "1+2+0=3\n"}
    assert cands["Answer: 3"]["count"] == 2  # identical steps are one candidate
    assert cands["Answer: 3"]["terminal"] and cands["Answer: 3"]["reward"] == 1.0
    assert not cands["1+2+0=3\n"]["terminal"]


def test_a_completion_cut_off_inside_its_first_step_gives_no_candidate():
    state = {"completions": ["1+2+0=", "Answer: 3"], "completion_acc": [False, True], "completion_truncated": [True, False]}
    assert [c["action"] for c in candidate_steps(state, "\n")] == ["Answer: 3"]


def test_advantages_use_exact_rewards_for_finishing_steps_and_the_critic_otherwise():
    rows, metrics = advantages_phase(mc_rows(), critic, delimiter="\n", terminal_value="verifier", min_gap=0.1)
    first = {r["action"]: r for r in rows if r["prefix"] == ""}
    # q: Answer: 3 -> 1 (verifier), Answer: 4 -> 0 (verifier), 1+2+0=3\n -> 0.8 (critic); mean 0.6
    assert first["Answer: 3"]["q_source"] == "verifier" and first["1+2+0=3\n"]["q_source"] == "critic"
    assert {a: round(r["advantage"], 6) for a, r in first.items()} == {"Answer: 3": 0.4, "Answer: 4": -0.6, "1+2+0=3\n": 0.2}
    assert all(r["gap"] == pytest.approx(1.0) and r["kept"] for r in first.values())
    second = {r["action"]: r["advantage"] for r in rows if r["prefix"] == "1+2+0=3\n"}
    assert second == {"Answer: 3": pytest.approx(0.5), "Answer: 9": pytest.approx(-0.5)}
    assert metrics["states"] == 2 and metrics["states_kept"] == 2 and metrics["candidates"] == 5
    assert metrics["samples"] == 1  # one critic query: the open step


def test_terminal_value_critic_scores_every_step_with_the_critic():
    rows, metrics = advantages_phase(mc_rows(), critic, delimiter="\n", terminal_value="critic", min_gap=0.1)
    first = {r["action"]: r for r in rows if r["prefix"] == ""}
    assert {r["q_source"] for r in first.values()} == {"critic"}
    assert first["1+2+0=3\n"]["advantage"] == pytest.approx(0.8 - 0.4)
    second = [r for r in rows if r["prefix"] == "1+2+0=3\n"]
    assert all(not r["kept"] for r in second)  # the critic gives both answers 0.2: gap 0 < 0.1
    assert metrics["states_kept"] == 1 and metrics["samples"] == 5


def test_gap_filter_drops_states_whose_candidates_are_alike():
    state = {"state": 0, "problem": "p0", "prompt": PROMPT, "prefix": "", "depth": 0, "terminal": False, "value": 1.0,
             "completions": ["Answer: 3", "Answer: 3"], "completion_acc": [True, True], "completion_truncated": [False, False]}
    close = {**state, "state": 1, "completions": ["1+2+0=3\n", "1+2+1=3\n"], "completion_acc": [True, True]}
    rows, metrics = advantages_phase([state, close], lambda ts: [0.5, 0.55], delimiter="\n", terminal_value="verifier", min_gap=0.1)
    assert [r["kept"] for r in rows] == [False, False, False]
    assert metrics["states_single_candidate"] == 1 and metrics["states_kept"] == 0
    rows, _ = advantages_phase([close], lambda ts: [0.5, 0.55], delimiter="\n", terminal_value="verifier", min_gap=0.05)
    assert all(r["kept"] for r in rows)


def test_the_phase_keeps_what_algo_gap_filter_keeps(monkeypatch):
    """The tested ``algo.direct_advantage.gap_filter`` is the function the phase runs (no inline copy)."""
    import dapo_cli.direct_advantage.phases as phases
    from dapo_cli.algo.direct_advantage import gap_filter

    calls = []

    def spy(advantages, state_index, min_gap):
        calls.append(min_gap)
        return ~gap_filter(advantages, state_index, min_gap)  # inverted, so only a call to it explains the rows

    monkeypatch.setattr(phases, "gap_filter", spy)
    rows, metrics = advantages_phase(mc_rows(), critic, delimiter="\n", terminal_value="verifier", min_gap=0.1)
    assert calls == [0.1]
    assert not any(r["kept"] for r in rows) and metrics["states_kept"] == 0  # every state had gap 1.0 >= 0.1


def test_state_batches_keep_a_states_candidates_together():
    states = [5, 5, 9, 9, 9, 2, 7]
    batches = state_batches(states, 2, torch.Generator().manual_seed(0))
    assert sorted(i for b in batches for i in b) == list(range(len(states)))
    assert [len({states[i] for i in b}) for b in batches] == [2, 2]
    for b in batches:
        for s in {states[i] for i in b}:
            assert {i for i, x in enumerate(states) if x == s} <= set(b)
    again = state_batches(states, 2, torch.Generator().manual_seed(0))
    assert again == batches
