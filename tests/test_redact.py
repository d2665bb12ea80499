"""`dapo_cli/redact.py`: a URL's userinfo never reaches a message, a param or a tag."""

from __future__ import annotations

import pytest

from dapo_cli.redact import redact


@pytest.mark.parametrize(("text", "expected"), [
    ("http://user:secret@host:5000", "http://***@host:5000"),
    ("https://token@host/api", "https://***@host/api"),  # a token as the user name is a secret too
    ("a http://u:p@h/x and b https://v:q@g/y", "a http://***@h/x and b https://***@g/y"),
    ("postgresql+psycopg2://me:p%40ss@db:5432/mlflow", "postgresql+psycopg2://***@db:5432/mlflow"),
    ("http://u:p:with:colons@h", "http://***@h"),
    # nothing to hide: left byte for byte
    ("sqlite:///mlflow.db", "sqlite:///mlflow.db"),
    ("http://host:5000/path?q=a@b", "http://host:5000/path?q=a@b"),  # '@' after the path is not userinfo
    ("mail me@example.org", "mail me@example.org"),
    ("", ""),
])
def test_the_userinfo_of_every_url_is_replaced(text, expected):
    assert redact(text) == expected


def test_mlflows_own_error_text_loses_both_copies_of_the_password():
    # what MLflow raised for prepare-data against a closed port (the URI quoted twice)
    text = ("MLflow store http://u:secret@127.0.0.1:9 failed: API request to http://u:secret@127.0.0.1:9/api/2.0/"
            "mlflow/experiments/get-by-name failed with exception HTTPConnectionPool(host='127.0.0.1', port=9)")
    out = redact(text)
    assert "secret" not in out and out.count("http://***@127.0.0.1:9") == 2


def test_the_modules_examples_hold():
    import doctest

    import dapo_cli.redact

    result = doctest.testmod(dapo_cli.redact)
    assert result.attempted == 3 and result.failed == 0


@pytest.mark.parametrize(("text", "expected"), [
    ("plain text, é and 漢字 stay", "plain text, é and 漢字 stay"),
    ("\x1b[2J", "\\x1b[2J"),  # clear screen
    ("a\x07b", "a\\x07b"),  # bell
    ("line\nnext\r", "line\\nnext\\r"),
    ("\u202eevil", "\\u202eevil"),  # right-to-left override
])
def test_control_characters_are_shown_as_their_escapes(text, expected):
    from dapo_cli.redact import escape_controls

    assert escape_controls(text) == expected


def test_a_value_quoted_in_a_message_is_escaped_and_bounded() -> None:
    import sys

    from dapo_cli.redact import shown

    assert shown("a\x1b[2J" + "x" * 100, limit=20) == "'a\\x1b[2Jxxxxxxxx..."
    assert shown([1, "\u202e"]) == "[1, '\\u202e']"
    assert shown(10 ** (sys.get_int_max_str_digits() + 1)) == "a number too long to show"
