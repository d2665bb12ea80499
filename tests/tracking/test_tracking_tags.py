"""The DAPO_PARENT_RUN_ID / DAPO_EXTRA_TAGS contract: what a starter sets is what ``dapo train`` reads back."""

from __future__ import annotations

import pytest

from dapo_cli.errors import UserError
from dapo_cli.tracking import EXTRA_TAGS_ENV, PARENT_RUN_ENV
from dapo_cli.tracking.tags import child_env, extra_tags_from_env


def test_child_env_round_trips_through_extra_tags_from_env() -> None:
    env = child_env("p" * 32, {"b": "2", "a": "1"})
    assert env == {PARENT_RUN_ENV: "p" * 32, EXTRA_TAGS_ENV: '{"a": "1", "b": "2"}'}  # sorted keys: a stable value
    assert (PARENT_RUN_ENV, EXTRA_TAGS_ENV) == ("DAPO_PARENT_RUN_ID", "DAPO_EXTRA_TAGS")
    assert extra_tags_from_env(env) == {"a": "1", "b": "2"}


def test_extra_tags_from_env_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(EXTRA_TAGS_ENV, raising=False)
    assert extra_tags_from_env() is None
    monkeypatch.setenv(EXTRA_TAGS_ENV, '{"team": "rl", "n": [1]}')
    assert extra_tags_from_env() == {"team": "rl", "n": "[1]"}  # non-strings as JSON
    monkeypatch.setenv(EXTRA_TAGS_ENV, '"x"')
    with pytest.raises(UserError, match=r"must be a JSON object of tag names to values, got str"):
        extra_tags_from_env()
