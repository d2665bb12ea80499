"""Step splitting, the states of a solution, first steps of completions, the balanced choice."""

from __future__ import annotations

import random

import pytest

from dapo_cli.direct_advantage.steps import (
    choose_solutions,
    first_step,
    split_steps,
    state_prefixes,
    unescape_delimiter,
)

WORKED = "5+7+0=12\n8+4+1=13\nAnswer: 132"


def test_steps_split_at_newlines_and_concatenate_back():
    steps = split_steps(WORKED)
    assert steps == ["5+7+0=12\n", "8+4+1=13\n", "Answer: 132"]
    assert "".join(steps) == WORKED


@pytest.mark.parametrize(
    ("text", "steps"),
    [
        ("", []),
        ("Answer: 5", ["Answer: 5"]),
        ("a\n", ["a\n"]),
        ("a\n\nb", ["a\n\n", "b"]),  # a run of delimiters stays with the step before
        ("\nb", ["\n", "b"]),
    ],
)
def test_split_edge_cases(text, steps):
    assert split_steps(text) == steps
    assert "".join(split_steps(text)) == text


def test_other_delimiters():
    assert split_steps("a\n\nb\nc\n\nd", "\n\n") == ["a\n\n", "b\nc\n\n", "d"]
    assert unescape_delimiter("\\n\\n") == "\n\n"
    assert unescape_delimiter("\n") == "\n"


def test_states_of_a_finished_solution_are_its_prefixes_before_the_last_step():
    assert state_prefixes(WORKED) == [(0, ""), (1, "5+7+0=12\n"), (2, "5+7+0=12\n8+4+1=13\n")]
    assert state_prefixes("Answer: 5") == [(0, "")]
    assert state_prefixes("") == [(0, "")]


def test_states_after_an_open_last_step_or_a_cut_off_step():
    assert state_prefixes("a\nb\n") == [(0, ""), (1, "a\n"), (2, "a\nb\n")]  # ended right after a delimiter
    assert state_prefixes("a\nb\nhalf a ste") == [(0, ""), (1, "a\n"), (2, "a\nb\n")]  # cut off mid-step


def test_max_states_spaces_them_evenly():
    solution = "".join(f"s{i}\n" for i in range(8)) + "end"  # 9 steps: depths 0..8
    assert [d for d, _ in state_prefixes(solution, max_states=3)] == [0, 4, 8]
    assert [d for d, _ in state_prefixes(solution, max_states=1)] == [0]
    assert len(state_prefixes(solution, max_states=50)) == 9


def test_first_step_of_completions():
    assert first_step("8+4+1=13\nAnswer: 132", truncated=False) == first_step("8+4+1=13\n", truncated=True)
    open_step = first_step("8+4+1=13\nAnswer: 132", truncated=False)
    assert (open_step.text, open_step.terminal, open_step.valid) == ("8+4+1=13\n", False, True)
    final = first_step("Answer: 132", truncated=False)
    assert (final.text, final.terminal, final.valid) == ("Answer: 132", True, True)
    stop = first_step("", truncated=False)
    assert (stop.text, stop.terminal, stop.valid) == ("", True, True)
    assert not first_step("8+4+1=1", truncated=True).valid  # cut off inside its first step


def test_choice_balances_right_and_wrong_and_skips_duplicates():
    texts = ["r1", "r1", "r2", "w1", "w2", "w3", "w4", "w1"]
    right = [True, True, True, False, False, False, False, False]
    chosen = choose_solutions(texts, right, 4, random.Random(0))
    assert len(chosen) == 4 and len({texts[i] for i in chosen}) == 4
    assert sum(right[i] for i in chosen) == 2
    assert 1 not in chosen and 7 not in chosen  # duplicates count once (their first copy)


def test_choice_fills_from_the_other_side_when_one_is_short():
    texts = ["r", "w1", "w2", "w3", "w4"]
    right = [True, False, False, False, False]
    chosen = choose_solutions(texts, right, 4, random.Random(1))
    assert 0 in chosen and len(chosen) == 4
    only_wrong = choose_solutions(["a", "b"], [False, False], 6, random.Random(0))
    assert only_wrong == [0, 1]  # fewer distinct solutions than asked: all of them
    odd = choose_solutions(["r1", "r2", "w1", "w2"], [True, True, False, False], 3, random.Random(0))
    assert sum(i < 2 for i in odd) == 2  # the right half gets ceil(3 / 2)


def test_choice_is_seeded():
    texts = [f"w{i}" for i in range(10)] + [f"r{i}" for i in range(10)]
    right = [False] * 10 + [True] * 10
    assert choose_solutions(texts, right, 6, random.Random(3)) == choose_solutions(texts, right, 6, random.Random(3))
