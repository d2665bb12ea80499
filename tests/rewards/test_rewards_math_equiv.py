"""The safe math-equivalence parser: values, rejections, hostile strings, bounds, equivalence."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import sympy
from sympy import I, Rational, Symbol, pi, sqrt

from dapo_cli.rewards import math_equiv as M
from dapo_cli.rewards.math_equiv import canonical_string, is_equivalent, last_boxed, normalize_text, parse_answer

x, y = Symbol("x"), Symbol("y")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("27.0", 27),  # raw-amc23.jsonl line 1: "answer":27.0
        ("1,000", 1000),  # thousands separator when the whole answer is one number
        ("1{,}000", 1000),
        ("$27$", 27),
        ("27^\\circ", 27),
        ("27^{\\circ}", 27),
        ("5\\text{ cm}", 5),
        ("20 $cm^{2}$", 20),  # raw-gaokao2023en.jsonl: "answer": "20 $cm^{2}$"
        ("50\\%", 50),  # percent is a unit: 50% is 50
        ("\\$12", 12),
        ("\\boxed{5}", 5),
        ("+2", 2),  # raw-minerva_math.jsonl: \boxed{+2}
        ("-1./3", Rational(-1, 3)),  # raw-minerva_math.jsonl: \boxed{-1./3}
        (".48", Rational(12, 25)),
        ("\\frac{-1+\\sqrt{5}}{4}", (sqrt(5) - 1) / 4),  # gaokao: "$\\frac{-1+\\sqrt{5}}{4}$"
        ("\\dfrac{3}{4}", Rational(3, 4)),
        ("\\tfrac12", Rational(1, 2)),  # one-character LaTeX arguments
        ("\\frac53", Rational(5, 3)),  # gaokao: "$\\left(-\\frac53,0\\right)$"
        ("a/b", Symbol("a") / Symbol("b")),
        ("\\sqrt[3]{8}", 2),
        ("\\sqrt2", sqrt(2)),
        ("\\sqrt{12}", 2 * sqrt(3)),
        ("\\frac{1}{\\sqrt{2}}", sqrt(2) / 2),
        ("π", pi),
        ("\\frac{3\\pi}{10}", 3 * pi / 10),
        ("-\\frac{\\sqrt{5}}{5}", -sqrt(5) / 5),
        ("2\\cdot 3", 6),
        ("2\\times3", 6),
        ("2·3", 6),
        ("4.5e33", Rational(45) * 10**32),  # scientific notation, exact
        ("2\\frac58", Rational(21, 8)),  # mixed number 2 5/8 (gaokao "$2\\frac58$")
        ("-2\\frac58", Rational(-21, 8)),
        ("2\\frac{\\sqrt{3}}{3}", 2 * sqrt(3) / 3),  # not integers: a product
        ("e^{-1}", sympy.exp(-1)),  # e is Euler's number
        ("1-i", 1 - I),  # i is the imaginary unit
        ("-2^2", -4),  # unary minus binds looser than ^
        ("2^-1", Rational(1, 2)),
        ("2^{10}", 1024),
        ("2^3^2", 2**9),  # right-associative
        ("(1+\\sqrt{2})^2", (1 + sqrt(2)) ** 2),
        ("x^2y", x**2 * y),
        ("2(3)", 6),
        ("\\left( 1,2\\right)", (1, 2)),
        ("(1, 2)", (1, 2)),
        ("$48$, $384$", (48, 384)),  # gaokao: "$48$, $384$"
        ("\\mathrm{e}", sympy.E),
        ("\\alpha+1", Symbol("alpha") + 1),
    ],
)
def test_parse_answer_values(text: str, expected: object) -> None:
    got = parse_answer(text)
    if isinstance(expected, tuple):
        assert got == tuple(sympy.Integer(e) for e in expected)
    else:
        assert got == (sympy.Integer(expected) if isinstance(expected, int) else expected)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "\\text{a necessary but not a sufficient condition}",  # gaokao: words only
        "[2,3)",  # intervals and sets are not parsed
        "\\{2,3,5\\}",
        "x=1",
        "b > a > c",
        "1 000",  # two numbers side by side are not a product
        "1:58 am",  # gaokao
        "\\sin x",
        "Quadrant I",  # a word
        "1/0",
        "0^{-1}",
        "\\frac{1}{0}",
        "((1,2),3)",  # nested tuples
        "(1,2)+1",  # arithmetic on a tuple
        "\\sqrt[1]{2}",  # root index must be 2..64
        "\\sqrt[x]{2}",
        "x_1",
        "5!",
        "|x|",
        "\\boxed{5",  # unclosed box
        "\\text{unclosed",
    ],
)
def test_unparseable_answers_are_none(text: str) -> None:
    assert parse_answer(text) is None


def _hostile(marker: Path) -> list[str]:
    return [
        f"__import__('os').system('touch {marker}')",
        f"eval(\"__import__('os').system('touch {marker}')\")",
        f"exec(\"open('{marker}', 'w')\")",
        "lambda: 1",
        "().__class__",
        "().__class__.__bases__[0].__subclasses__()",
        'eval("1")',
        "Symbol('x')",
        "x.__class__",
        "import os",
        "__builtins__",
        "open('/etc/passwd').read()",
        "${__import__('os')}$",
        "\\boxed{__import__('os').system('true')}",
    ]


def test_hostile_strings_are_rejected_and_nothing_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    for text in _hostile(marker):
        assert parse_answer(text) is None, text
        assert is_equivalent(text, "1") is False
        assert is_equivalent("1", text) is False
    assert not marker.exists()


def test_sympify_and_eval_are_never_called(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parser builds sympy objects itself: make every text-evaluating entry point explode."""

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("text was handed to an evaluator")

    monkeypatch.setattr(sympy, "sympify", boom)
    monkeypatch.setattr(sympy, "parse_expr", boom, raising=False)
    monkeypatch.setattr("builtins.eval", boom)
    monkeypatch.setattr("builtins.exec", boom)
    parse_answer.cache_clear()
    assert parse_answer("\\frac{-1+\\sqrt{5}}{4}") == (sqrt(5) - 1) / 4
    assert is_equivalent("x^2-1", "(x-1)(x+1)")
    assert parse_answer("__import__('os')") is None


PATHOLOGICAL = [
    "2^{10^{10}}",  # exponent 10^10: rejected before sympy computes it
    "9^{9^{9^{9}}}",
    "10^{-5000}",
    "2^{2^{2^{2^{2^{2}}}}}",
    "e^{e^{e^{e^{e^{e}}}}}",
    "e^{e^{x}}",  # tower with a variable
    "e^{x^{10000}}",
    "\\sqrt{" + "9" * 480 + "}",  # huge radicand (sympy factors radicands)
    "\\sqrt[10]{" + "9" * 75 + "}" + "\\sqrt[10]{" + "7" * 75 + "}",  # radicands merge in a product
    "\\sqrt[2]{2-(\\frac{\\sqrt[3]{7}}{i})^{9999}}",  # a 9000-bit Gaussian integer under a root
    "(((\\sqrt[3]{7})(x))^{999})^{9999}",  # 7^{3329667} hidden in a product
    "((y+0.5)^{999})^{\\frac{3}{\\pi+99999999999}}",  # sympy alone: 184 s (expands (y+1/2)^999)
    "\\sqrt{(\\sqrt[3]{7}-x)^{9999}}",
    "x^{10^{1470}+y}",
    "(1+\\sqrt{2})^{10000}",
    "(" * 40 + "1" + ")" * 40,  # nesting deeper than MAX_DEPTH
    "-" * 499 + "1",
    "{" * 250 + "1" + "}" * 249,
    "\\frac" * 100 + "1" * 100,
    "1" + "+1" * 300,  # over MAX_CHARS
]


@pytest.mark.parametrize("text", PATHOLOGICAL)
def test_pathological_inputs_are_rejected_quickly(text: str) -> None:
    parse_answer.cache_clear()
    start = time.monotonic()
    assert parse_answer(text) is None
    assert is_equivalent(text, text + "+1") is False
    assert time.monotonic() - start < 3.0


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("\\frac{1}{2}", "0.5", True),
        ("1/2", "\\dfrac{1}{2}", True),
        ("27.0", "27", True),
        ("1,000", "1000", True),
        ("$27$", "27^\\circ", True),
        ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", True),
        ("(1+\\sqrt{2})^2", "3+2\\sqrt{2}", True),  # (1+√2)² = 1 + 2√2 + 2
        ("(1+\\sqrt{2})^2 - 3 - 2\\sqrt{2}", "0", True),  # an exact zero that evalf cannot resolve: bound < 1e-60
        ("2\\pi", "\\pi+\\pi", True),
        ("e^{-1}", "\\frac{1}{e}", True),
        ("(1+i)(1-i)", "2", True),  # 1 - i² = 2
        ("1-i", "-i+1", True),
        ("4.5e33", "4.5\\times10^{33}", True),
        ("x^2-1", "(x-1)(x+1)", True),
        ("\\frac{x^2-1}{x-1}", "x+1", True),
        ("2^x 2^y", "2^{x+y}", True),
        ("(x+1)^{9999}(x-1)^{9999}", "(x^2-1)^{9999}", True),  # cancellation at ~2200 digits
        ("(1,2)", "(1, 2)", True),
        ("\\left(1,\\frac{1}{2}\\right)", "(1, 0.5)", True),
        ("[2,+\\infty)", "[2, +\\infty)", True),  # unparseable but identical text
        ("(1,2)", "(2,1)", False),  # tuples are ordered
        ("(1,2)", "(1,2,3)", False),
        ("(1,2)", "1", False),
        ("x^2-1", "(x-1)(x+2)", False),
        ("10^{-30}", "0", False),  # exact rationals compare exactly
        ("0.333333", "1/3", False),
        ("\\pi", "3.14159", False),
        ("x^{10000}", "x^{10000}+1", False),  # relative error 1e-2000, still different
        ("(x+1)^{9999}(x-1)^{9999}+1", "(x^2-1)^{9999}", False),
        ("\\sqrt{2}", "1.41421356237", False),
        ("50\\%", "0.5", False),  # percent is stripped, not divided
        ("", "", False),
        ("A", "B", False),
    ],
)
@pytest.mark.slow
def test_is_equivalent(a: str, b: str, expected: bool) -> None:
    assert is_equivalent(a, b) is expected
    assert is_equivalent(b, a) is expected


def test_non_strings_are_not_equivalent() -> None:
    assert is_equivalent(1, "1") is False  # type: ignore[arg-type]
    assert parse_answer(None) is None  # type: ignore[arg-type]


def test_timeout_is_a_deadline_between_bounded_steps() -> None:
    # Structural equality needs no evaluation; numeric evaluation starts only before the deadline.
    assert is_equivalent("\\frac{2}{4}", "\\frac{1}{2}", timeout_s=0.0) is True
    assert is_equivalent("(1+\\sqrt{2})^2", "3+2\\sqrt{2}", timeout_s=0.0) is False
    assert is_equivalent("(1+\\sqrt{2})^2", "3+2\\sqrt{2}", timeout_s=2.0) is True


def test_sample_points_are_fixed_and_generic() -> None:
    # (1000 + 37 j + 211 k) / (613 + 17 j + 5 k): j = symbol number, k = point number
    point = M._sample_point([x, y], 1)
    assert point == {x: Rational(1211, 618), y: Rational(1248, 635)}


def test_canonical_string() -> None:
    assert canonical_string(parse_answer("-0.75")) == "- \\frac{3}{4}"
    assert canonical_string(parse_answer("(1, \\sqrt{2})")) == "(1, \\sqrt{2})"
    assert canonical_string(parse_answer("0.5")) == canonical_string(parse_answer("\\frac12"))
    assert canonical_string(Rational(27)) == "27"


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ("so \\boxed{1} and then \\boxed{\\frac{a}{b}}.", "\\frac{a}{b}"),  # the last box
        ("\\fbox{3}", "3"),
        ("\\boxed{2} then \\fbox{7}", "7"),
        ("=\\boxed{1.6} \\mathrm{~cm}", "1.6"),  # raw-minerva_math.jsonl line 1
        ("\\boxed{{1}+{2}}", "{1}+{2}"),  # balanced braces
        ("\\boxed{1", None),
        ("no box", None),
    ],
)
def test_last_boxed(text: str, content: str | None) -> None:
    assert last_boxed(text) == content


def test_normalize_text() -> None:
    assert normalize_text("$\\left(-\\frac53,0\\right)$") == "(-\\frac53,0)"
    assert normalize_text("$36\\sqrt{7}cm^{3}$") == "36\\sqrt{7}"  # gaokao: trailing unit word
    assert normalize_text("x" * (M.MAX_CHARS + 1)) is None
    assert normalize_text("\\text{cm") is None
