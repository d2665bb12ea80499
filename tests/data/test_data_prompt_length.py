"""Prompts over data.max_prompt_length are dropped, counted and reported (verl's filter_overlong_prompts)."""

from __future__ import annotations

from dapo_cli.data.loader import build_prompts, dropped_note, keep_fitting
from dapo_cli.data.schema import make_row


def test_prompts_longer_than_the_limit_are_dropped_and_counted() -> None:
    rows = [make_row("x" * n, "1", index=n, template="{problem}") for n in (5, 50, 6)]
    kept, dropped = build_prompts(rows, lambda m: m[0]["content"], len, 6)  # one "token" per character
    assert [p.problem_id for p in kept] == ["5", "6"] and dropped == 1
    assert [p.text for p in kept] == ["xxxxx", "xxxxxx"] and [p.ground_truth for p in kept] == ["1", "1"]


def test_keep_fitting_keeps_items_and_texts_in_order_and_the_limit_is_inclusive() -> None:
    items, texts = ["a", "b", "c"], ["xx", "xxx", "x"]
    assert keep_fitting(items, texts, len, 2) == (["a", "c"], ["xx", "x"], 1)
    assert keep_fitting(items, texts, len, 3) == (items, texts, 0)


def test_the_note_says_how_many_of_how_many_and_the_setting() -> None:
    assert dropped_note("training prompts", 0, 10, 64) is None
    note = dropped_note("training prompts", 3, 960, 2048)
    assert note is not None and note.startswith("dropped 3 of 960 training prompts longer than data.max_prompt_length=2048 tokens")
