"""The exact integer-expression reader: hand-checked values, what it refuses, and bounded work on hostile text."""

from __future__ import annotations

import time

import pytest

from dapo_cli.data.convert import Converted, Dropped, convert
from dapo_cli.data.expressions import (
    MAX_BITS,
    MAX_DEPTH,
    MAX_EXPRESSION_CHARS,
    integer_value,
)
from dapo_cli.rewards.math_equiv import normalize_text


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("12\\times18\\times11", 2376),  # 12 * 18 = 216; 216 * 11 = 2376 (raw-gaokao2023en.jsonl line 368)
        ("(2+3)\\cdot 4", 20),  # 5 * 4
        ("2^{10}", 1024),
        ("2^3", 8),  # one digit: LaTeX's own superscript
        ("\\frac{12}{4}+2^{3}", 11),  # 3 + 8
        ("-\\frac{6}{3}", -2),
        ("(3+4)^2", 49),
        ("\\sqrt{16}", 4),
        ("2^{-1}\\times 4", 2),  # 1/2 * 4
        ("7*6", 42),
        ("100 \\div 4", 25),
        ("10-3-2", 5),  # left-associative: (10-3)-2, not 10-(3-2) = 9
        ("2^{3^{2}}", 512),  # 2^9 (braced, so right-nested)
        ("-2^{2}", -4),  # the sign binds looser than the power
        ("\\frac{\\frac{1}{2}}{\\frac{1}{4}}", 2),  # (1/2)/(1/4)
        ("27.0", 27),
        ("0", 0),
    ],
)
def test_values(text: str, value: int) -> None:
    assert integer_value(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "\\frac{1}{2}",  # not an integer: the fraction rule takes it
        "7/2",
        "\\sqrt{15}",
        "2^10",  # LaTeX reads 2^1 0: refused, not guessed
        "2\\frac{1}{2}",  # a mixed number, not a product
        "2(3)",  # juxtaposition
        "9^9^9",  # a double superscript (a LaTeX error)
        "x+1",
        "2.5*4",
        "\\frac12",
        "1/0",
        "0^{0}",
        "0^{-1}",
        "\\sqrt[3]{8}",
        "",
        "(1+2",
        "1+2)",
        "١٢",  # Arabic-Indic digits: int() reads them, no model writes them
    ],
)
def test_refused(text: str) -> None:
    assert integer_value(text) is None


def test_bounds_are_exact() -> None:
    assert integer_value(f"2^{{{MAX_BITS - 1}}}") == 2 ** (MAX_BITS - 1)  # 512 bits: at the bound
    assert integer_value(f"2^{{{MAX_BITS}}}") is None  # 513 bits
    assert integer_value("(" * MAX_DEPTH + "1" + ")" * MAX_DEPTH) == 1
    assert integer_value("(" * (MAX_DEPTH + 1) + "1" + ")" * (MAX_DEPTH + 1)) is None
    at_cap = "+".join(["1"] * (MAX_EXPRESSION_CHARS // 2)) + "0"  # 1+1+...+10: 200 characters
    assert len(at_cap) == MAX_EXPRESSION_CHARS and integer_value(at_cap) == MAX_EXPRESSION_CHARS // 2 - 1 + 10
    assert integer_value(at_cap + "0") is None


@pytest.mark.parametrize(
    "text",
    [
        "9^{9^{9}}",  # 9^387420489: refused before computing
        "9^{9^{9^{9}}}",
        "2^{100000}",
        "(" * 10_000 + "1" + ")" * 10_000,
        "2^{" * 60 + "2" + "}" * 60,
        "\\times".join(["9" * 99] * 40),  # 40 factors of 99 digits: over MAX_BITS after the third
        "\\sqrt{" * 60 + "4" + "}" * 60,
        "1" * 5_000,
    ],
    ids=["tower3", "tower4", "huge-power", "deep", "deep-power", "long-product", "deep-root", "long-literal"],
)
def test_hostile_input_finishes_fast(text: str) -> None:
    start = time.perf_counter()
    integer_value(text)
    convert("Compute it.", text)  # the whole conversion, the general parser included
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize(
    ("answer", "conversion", "truth"),
    [
        ("$12\\times18\\times11$", "expression", "2376"),  # gaokao line 368: 12 * 18 * 11
        ("2^{10}", "expression", "1024"),
        ("\\dfrac{12}{4}", "expression", "3"),  # normalised to \frac first
        ("\\left(3+4\\right)^2", "expression", "49"),
        ("27.0", "integer", "27"),  # a literal stays "integer"
        ("$1,234$", "integer", "1234"),
    ],
)
def test_convert_keeps_integer_expressions(answer: str, conversion: str, truth: str) -> None:
    result = convert("Compute it.", answer)
    assert isinstance(result, Converted) and (result.conversion, result.ground_truth) == (conversion, truth)
    assert result.problem == "Compute it."


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ("\\frac{12}{7}\\times 2", None),  # 24/7: not an integer, the fraction rule: 24 + 7 = 31
        ("3 \\times 10^{8}", "scientific_notation"),  # checked before any evaluation
        ("2x\\times 3", "has_variables"),
        ("9^9^9", "unparseable"),
    ],
)
def test_non_integer_expressions_keep_their_reasons(answer: str, reason: str | None) -> None:
    result = convert("Compute it.", answer)
    if reason is None:
        assert isinstance(result, Converted) and (result.conversion, result.ground_truth) == ("fraction", "31")
    else:
        assert isinstance(result, Dropped) and result.reason == reason


def test_normalised_text_is_what_is_read() -> None:
    assert normalize_text("$\\dfrac{12}{4}$") == "\\frac{12}{4}" and integer_value(normalize_text("$\\dfrac{12}{4}$")) == 3
