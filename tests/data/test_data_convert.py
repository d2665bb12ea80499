"""Answer → integer target: every conversion rule and drop reason, hand-checked on the shared files."""

from __future__ import annotations

import json
import math
import random
import re
import time
from pathlib import Path

import pytest
import sympy

from dapo_cli.data import convert as convert_module
from dapo_cli.data.convert import (
    DROP_REASONS,
    MAX_PROBLEM_CHARS,
    Converted,
    Dropped,
    convert,
    math_letters,
    math_segments,
    pick_letters,
    surd_instruction,
    surd_parts,
)
from dapo_cli.rewards.math_equiv import parse_answer

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
GAOKAO = DATA / "raw-gaokao2023en.jsonl"
needs_data = pytest.mark.skipif(not GAOKAO.is_file(), reason=f"shared data not found at {DATA}")
PROBLEM = "Compute the value."  # no letters: the first letter set is always free

SQUARE_FREE = "is not divisible by the square of any prime"


def gaokao(line: int) -> dict:
    """Record on 1-based ``line`` of raw-gaokao2023en.jsonl."""
    return json.loads(GAOKAO.read_text(encoding="utf-8").splitlines()[line - 1])


def kept(answer: str, problem: str = PROBLEM) -> Converted:
    result = convert(problem, answer)
    assert isinstance(result, Converted), result
    return result


# ---------------------------------------------------------------------------
# integer: kept as it is


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("27.0", "27"),  # raw-amc23.jsonl line 1: "answer":27.0
        ("-1.0", "-1"),  # raw-amc23.jsonl line 16: "answer":-1.0
        ("3159.0", "3159"),  # raw-amc23.jsonl line 4
        ("$2,900$", "2900"),  # raw-gaokao2023en.jsonl line 203: "answer": "$2,900$"
        ("20 $cm^{2}$", "20"),  # gaokao line 117: "answer": "20 $cm^{2}$"
        ("$8164961$", "8164961"),  # gaokao: "answer": "$8164961$"
        ("100", "100"),  # raw-minerva_math.jsonl line 8: "...=\\boxed{100}$ parsecs away."
        ("+2", "2"),  # minerva: "\\boxed{+2}."
        ("27^\\circ", "27"),
        ("45\\text{ cm}", "45"),
        ("100 \\%", "100"),  # minerva: "\\boxed{100} \\%$ complete."
        ("1{,}625", "1625"),
    ],
)
def test_integer_answers_keep_the_problem(answer: str, truth: str) -> None:
    result = kept(answer)
    assert (result.conversion, result.ground_truth, result.problem) == ("integer", truth, PROBLEM)


# ---------------------------------------------------------------------------
# fraction: ±m/n → m+n


def test_fraction_positive() -> None:
    # gaokao line 13: "answer": "$\\frac{2}{3}$" → m/n = 2/3, m+n = 5
    result = kept("$\\frac{2}{3}$")
    assert (result.conversion, result.ground_truth) == ("fraction", "5")
    assert result.problem == (
        "Compute the value. The answer can be written as $\\frac{m}{n}$, where $m$ and $n$ are relatively "
        "prime positive integers. Find $m+n$."
    )


def test_fraction_negative_and_letters_avoid_the_problem() -> None:
    # gaokao line 20: "Let $S_{n}$ be the sum of the first $n$ members of a geometric sequence $\\{a_{n}\\}$ ..."
    # "answer": "$-\\frac{1}{2}$" → the problem uses n, so p, q; p+q = 1+2 = 3
    result = kept("$-\\frac{1}{2}$", "Let $S_{n}$ be the sum of the first $n$ members.")
    assert result.ground_truth == "3"
    assert result.problem.endswith(
        "The answer can be written as $-\\frac{p}{q}$, where $p$ and $q$ are relatively prime positive integers. Find $p+q$."
    )


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("$-\\frac{3}{4}$", "7"),  # gaokao line 74: 3+4
        ("$2\\frac58$", "29"),  # gaokao line 275: mixed number 2 5/8 = 21/8 → 21+8
        ("\\frac{4}{6}", "5"),  # reduced first: 2/3 → 2+3
        ("\\frac{13}{12}", "25"),  # gaokao: "$\\frac{13}{12}$"
    ],
)
def test_fraction_targets(answer: str, truth: str) -> None:
    result = kept(answer)
    assert (result.conversion, result.ground_truth) == ("fraction", truth)


# ---------------------------------------------------------------------------
# surd: (a + b√c)/d → sum of the positive integers in the stated form


@pytest.mark.parametrize(
    ("answer", "truth", "form", "names"),
    [
        # gaokao line 2: "$-1-\\sqrt{3}$" = -(1 + 1√3) → 1+1+3
        ("$-1-\\sqrt{3}$", "5", "-a-b\\sqrt{c}", "abc"),
        # gaokao line 306: "$2-\\sqrt{3}$" → 2+1+3
        ("$2-\\sqrt{3}$", "6", "a-b\\sqrt{c}", "abc"),
        # gaokao line 338: "$\\sqrt{5}-1$" → 1+1+5
        ("$\\sqrt{5}-1$", "7", "b\\sqrt{c}-a", "abc"),
        # gaokao line 176: "$4+4\\sqrt{2}$" → 4+4+2
        ("$4+4\\sqrt{2}$", "10", "a+b\\sqrt{c}", "abc"),
        # gaokao line 33: "$\\sqrt{5}$" = 1√5 → 1+5
        ("$\\sqrt{5}$", "6", "m\\sqrt{n}", "mn"),
        # gaokao: "$4\\sqrt{2}$" → 4+2
        ("$4\\sqrt{2}$", "6", "m\\sqrt{n}", "mn"),
        # gaokao line 44: "$-\\frac{\\sqrt{5}}{5}$" = -(1√5)/5 → 1+5+5
        ("$-\\frac{\\sqrt{5}}{5}$", "11", "-\\frac{a\\sqrt{b}}{c}", "abc"),
        # gaokao line 137: "$\\frac{\\sqrt{30}}{8}$" → 1+30+8
        ("$\\frac{\\sqrt{30}}{8}$", "39", "\\frac{a\\sqrt{b}}{c}", "abc"),
        # gaokao line 49: "$\\frac{1+\\sqrt{2}}{2}$" → 1+1+2+2
        ("$\\frac{1+\\sqrt{2}}{2}$", "6", "\\frac{a+b\\sqrt{c}}{d}", "abcd"),
        # gaokao line 66: "$\\frac{-1+\\sqrt{5}}{4}$" = (√5 - 1)/4 → 1+1+5+4
        ("$\\frac{-1+\\sqrt{5}}{4}$", "11", "\\frac{b\\sqrt{c}-a}{d}", "abcd"),
        # (2 - 3√2)/5 → 2+3+2+5
        ("\\frac{2-3\\sqrt{2}}{5}", "12", "\\frac{a-b\\sqrt{c}}{d}", "abcd"),
        # -(1+√3)/2 → 1+1+3+2
        ("-\\frac{1+\\sqrt{3}}{2}", "7", "-\\frac{a+b\\sqrt{c}}{d}", "abcd"),
        # 1/√2 = √2/2 (denominator rationalised) → 1+2+2
        ("\\frac{1}{\\sqrt{2}}", "5", "\\frac{a\\sqrt{b}}{c}", "abc"),
        # √12 = 2√3 (square factor extracted) → 2+3
        ("\\sqrt{12}", "5", "m\\sqrt{n}", "mn"),
        # (2+2√3)/4 = (1+√3)/2: gcd(a, b, d) = 1 → 1+1+3+2
        ("\\frac{2+2\\sqrt{3}}{4}", "7", "\\frac{a+b\\sqrt{c}}{d}", "abcd"),
    ],
)
def test_surd_forms(answer: str, truth: str, form: str, names: str) -> None:
    result = kept(answer)
    assert (result.conversion, result.ground_truth) == ("surd", truth)
    sentence = result.problem[len(PROBLEM) + 1 :]
    assert sentence.startswith(f"The answer can be written as ${form}$, where ")
    assert sentence.endswith(f"Find ${'+'.join(names)}$.")


def test_surd_wording_states_uniqueness_conditions() -> None:
    four = surd_instruction(1, 1, 2, PROBLEM)
    assert four == (
        "The answer can be written as $\\frac{a+b\\sqrt{c}}{d}$, where $a$, $b$, $c$, and $d$ are positive integers, "
        f"$c$ {SQUARE_FREE}, and the greatest common divisor of $a$, $b$, and $d$ is $1$. Find $a+b+c+d$."
    )
    three = surd_instruction(0, -1, 5, PROBLEM)
    assert three == (
        "The answer can be written as $-\\frac{a\\sqrt{b}}{c}$, where $a$, $b$, and $c$ are positive integers, "
        f"$b$ {SQUARE_FREE}, and $a$ and $c$ are relatively prime. Find $a+b+c$."
    )
    whole = surd_instruction(4, 4, 1, PROBLEM)  # d = 1: no gcd condition is needed
    assert whole == (
        "The answer can be written as $a+b\\sqrt{c}$, where $a$, $b$, and $c$ are positive integers "
        f"and $c$ {SQUARE_FREE}. Find $a+b+c$."
    )


@pytest.mark.parametrize(
    "answer",
    ["\\frac{-1+\\sqrt{5}}{4}", "-1-\\sqrt{3}", "\\frac{\\sqrt{30}}{8}", "\\frac{6-4\\sqrt{18}}{10}", "\\frac{3}{\\sqrt{12}}", "7\\sqrt{50}"],
)
def test_surd_parts_invariants(answer: str) -> None:
    value = sympy.expand(sympy.radsimp(parse_answer(answer)))
    a, b, c, d = surd_parts(value)
    assert (a + b * sympy.sqrt(c)) / d == value
    assert math.gcd(a, b, d) == 1 and d >= 1 and b != 0
    assert c > 1 and all(e == 1 for e in sympy.factorint(c).values())


def test_surd_parts_rejects_other_shapes() -> None:
    assert surd_parts(sympy.sqrt(2) + sympy.sqrt(3)) is None  # two radicals
    assert surd_parts(sympy.Rational(3, 4)) is None  # no radical
    assert surd_parts(sympy.cbrt(2)) is None  # not a square root


# ---------------------------------------------------------------------------
# pi: ±(m/n)π


@pytest.mark.parametrize(
    ("answer", "truth", "form"),
    [
        ("$\\frac{\\pi}{3}$", "4", "\\frac{m\\pi}{n}"),  # gaokao line 6: 1+3
        ("$\\frac{3\\pi}{10}$", "13", "\\frac{m\\pi}{n}"),  # gaokao line 35: 3+10
        ("\\frac{\\pi}{2}", "3", "\\frac{m\\pi}{n}"),  # raw-minerva_math.jsonl: "\\boxed{\\frac{\\pi}{2}}$"
        ("$64\\pi$", "64", "k\\pi"),  # gaokao line 224
        ("-\\frac{\\pi}{6}", "7", "-\\frac{m\\pi}{n}"),
        ("-2\\pi", "2", "-k\\pi"),
    ],
)
def test_pi_multiples(answer: str, truth: str, form: str) -> None:
    result = kept(answer)
    assert (result.conversion, result.ground_truth) == ("pi", truth)
    assert f"The answer can be written as ${form}$, where " in result.problem


# ---------------------------------------------------------------------------
# drops


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (None, "no_answer"),
        ("", "no_answer"),  # gaokao line 168: "answer": ""
        ("1" * 501, "answer_too_long"),
        ("A", "choice"),  # gaokao line 170
        ("(C)", "choice"),
        ("$5$ or $9$", "multiple_answers"),  # gaokao line 186
        ("$0.05$ and $0.6$", "multiple_answers"),
        ("$x=9$", "equation_or_inequality"),  # gaokao line 287
        ("b > a > c", "equation_or_inequality"),
        ("$\\{x|-2\\leq x < 1\\}$", "equation_or_inequality"),  # gaokao line 1 (a set written as an inequality)
        ("$[2,3)$", "interval_or_set"),  # gaokao line 58
        ("$\\{2,3,5\\}$", "interval_or_set"),  # gaokao line 10
        ("$(-\\infty,-3)$", "interval_or_set"),
        ("4.5e33", "scientific_notation"),  # raw-minerva_math.jsonl line 2: "\\boxed{4.5e33}"
        ("3 \\times 10^{8}", "scientific_notation"),
        ("1:58 am", "unparseable"),  # gaokao line 127
        ("$C_{400}^{40} \\cdot C_{200}^{20}$", "unparseable"),
        ("$(1,3)$", "tuple"),  # gaokao line 71
        ("$48$, $384$", "tuple"),
        ("$x-4$", "has_variables"),  # gaokao line 225
        ("I(0)", "has_variables"),  # minerva: "\\boxed{I(0)}" (parses to 0, but names a variable)
        ("\\omega", "has_variables"),
        ("$1+2i$", "complex"),  # gaokao line 46
        ("1.6", "non_integer_decimal"),  # raw-minerva_math.jsonl line 1: "\\boxed{1.6} \\mathrm{~cm}"
        ("$1.50$", "non_integer_decimal"),  # gaokao line 142
        ("$22.1cm^{2}$", "non_integer_decimal"),
        ("\\sqrt[3]{8}", "integer_expression"),  # = 2, but a cube root is outside the exact reader's grammar
        ("2^{1000}", "integer_expression"),  # 1000 bits: over dapo_cli.data.expressions.MAX_BITS (512)
        ("2.5\\times 4", "integer_expression"),  # = 10 from a decimal: the exact reader takes integers only
        ("$e^{-1}$", "irrational"),  # gaokao line 65
        ("$\\sqrt{113}-\\sqrt{65}$", "irrational"),  # gaokao line 169
        ("\\sqrt[3]{2}", "irrational"),
        ("$Quadrant I$", "text"),  # gaokao line 60
        ("$\\text{a necessary but not a sufficient condition}$", "text"),
    ],
)
def test_drop_reasons(answer: str | None, reason: str) -> None:
    result = convert(PROBLEM, answer)
    assert isinstance(result, Dropped) and result.reason == reason
    assert reason in DROP_REASONS


def test_empty_problem_is_dropped() -> None:
    assert convert("  ", "5") == Dropped("no_problem")


def test_problem_over_the_cap_is_dropped_before_any_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    at_cap = "x" * (MAX_PROBLEM_CHARS - 6) + " $a$ ?"
    assert len(at_cap) == MAX_PROBLEM_CHARS and isinstance(convert(at_cap, "1/2"), Converted)
    monkeypatch.setattr(convert_module, "parse_answer", lambda text: pytest.fail("parsed"))
    assert convert(at_cap + "x", "1/2") == Dropped("problem_too_long", f"{MAX_PROBLEM_CHARS + 1} characters")
    assert "problem_too_long" in DROP_REASONS and "answer_too_long" in DROP_REASONS and "too_long" not in DROP_REASONS


# The expression math_letters used (quadratic: 16.9 s on 40,000 "\("); math_segments must find the same.
RELEASED_SEGMENT = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)


def test_math_segments_equal_the_regular_expression_on_random_text() -> None:
    rng = random.Random(0)
    pieces = ["$", "$$", "\\", "(", ")", "[", "]", "a", "\n", "\\(", "\\)", "\\[", "\\]", "x y"]
    for _ in range(8_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 16)))
        expected = [next(g for g in m.groups() if g is not None) for m in RELEASED_SEGMENT.finditer(text)]
        assert math_segments(text) == expected, text


@pytest.mark.parametrize(
    "problem",
    ["\\(" * 20_000, "\\[" * 20_000, "\\(a$" * 10_000],
    ids=["parens", "brackets", "mixed"],
)
def test_math_segments_is_linear(problem: str) -> None:
    # 40,000 characters of openers that never close: the regular expression needed seconds, this well under 0.1 s
    start = time.perf_counter()
    math_segments(problem)
    assert time.perf_counter() - start < 0.1
    assert isinstance(convert(problem[: MAX_PROBLEM_CHARS], "1/2"), Converted)


# ---------------------------------------------------------------------------
# letters and the shared file end to end


def test_math_letters_and_pick_letters() -> None:
    assert math_letters("If $a\\cos B - b\\cos A=c$, find $\\angle B$.") == {"a", "b", "c"}
    assert math_letters("A team of 2 students is chosen from a class of m boys.") == {"a", "m"}  # words only
    assert pick_letters("If $a+b=c$ find $d$.", 4) == ("p", "q", "r", "s")
    assert pick_letters("Let $m$ and $n$ be given.", 2) == ("p", "q")
    assert pick_letters("$abcdefghijklmnopqrstuvwxyz$", 2) == ("m", "n")  # nothing free: the first set


@needs_data
def test_gaokao_lines_end_to_end() -> None:
    # line 66: "Given that $\\alpha$ is an acute angle and $\\cos \\alpha = \\frac{1+\\sqrt{5}}{4}$.
    # Find $\\sin \\frac{\\alpha}{2}$", "answer": "$\\frac{-1+\\sqrt{5}}{4}$" → (√5 - 1)/4: 1+1+5+4 = 11
    record = gaokao(66)
    result = convert(record["question"], record["answer"])
    assert result == Converted(
        record["question"]
        + " The answer can be written as $\\frac{b\\sqrt{c}-a}{d}$, where $a$, $b$, $c$, and $d$ are positive "
        f"integers, $c$ {SQUARE_FREE}, and the greatest common divisor of $a$, $b$, and $d$ is $1$. Find $a+b+c+d$.",
        "11",
        "surd",
        "- \\frac{1}{4} + \\frac{\\sqrt{5}}{4}",
    )
    # line 6: "In $\\triangle ABC$, $(a+c)(\\sin A - \\sin C) = b(\\sin A - \\sin B)$, what is the value of
    # $\\angle C$ in radian?", "answer": "$\\frac{\\pi}{3}$" → a, b, c are taken; m, n are free; 1+3 = 4
    record = gaokao(6)
    result = convert(record["question"], record["answer"])
    assert (result.ground_truth, result.conversion) == ("4", "pi")
    assert result.problem.endswith("$\\frac{m\\pi}{n}$, where $m$ and $n$ are relatively prime positive integers. Find $m+n$.")
