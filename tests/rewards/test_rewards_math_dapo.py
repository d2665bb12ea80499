"""Tests for ``dapo_cli.rewards.math_dapo``: the released DAPO verifier, quirks included.

Every expected value is derived by hand in the comment next to it, following the
normalisation order: text after the last "=" -> SUBSTITUTIONS -> REMOVED_EXPRESSIONS
-> first $..$ pair -> unwrap \\text / \\textbf / \\overline (shortest) and \\boxed (longest)
-> \\fracab, \\sqrta -> delete "$" -> drop commas if the rest isdigit() -> strip().

Where the brief's prose and the released code (verl ``math_dapo.py``) differ, the tests
follow the code and say so ("verl:").
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dapo_cli.rewards import math_dapo
from dapo_cli.rewards.bounds import MAX_GROUND_TRUTH_CHARS
from dapo_cli.rewards.math_dapo import (
    INVALID,
    REMOVED_EXPRESSIONS,
    SUBSTITUTIONS,
    TEX_REWRITES,
    WINDOW_CHARS,
    compute_score,
    extract_answer,
    normalize_final_answer,
)

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


def pred_of(response: str) -> str:
    return compute_score(response, "unused")["pred"]


# ----------------------------------------------------------------- result shape


def test_correct_and_wrong_results_have_exact_shape_and_types() -> None:
    right = compute_score("so the total is 12.\nAnswer: 12", "12")
    wrong = compute_score("so the total is 12.\nAnswer: 13", "12")
    assert right == {"score": 1.0, "acc": True, "pred": "12"}
    assert wrong == {"score": -1.0, "acc": False, "pred": "13"}
    assert type(right["score"]) is float and type(right["acc"]) is bool
    assert type(wrong["score"]) is float and type(wrong["acc"]) is bool


def test_no_answer_line_is_invalid_and_scores_minus_one() -> None:
    # "The answer is 5" has no ":" after "answer" -> no match -> "[INVALID]", which
    # normalises to itself (no rule touches it) -> differs from "5".
    assert compute_score("The answer is 5", "5") == {"score": -1.0, "acc": False, "pred": INVALID}
    assert compute_score("", "5") == {"score": -1.0, "acc": False, "pred": INVALID}


def test_invalid_ground_truth_quirk_matches_a_missing_answer() -> None:
    # verl compares normalised strings only, so a ground truth that is literally
    # "[INVALID]" equals the placeholder of a response without an answer.
    assert compute_score("no answer here", "[INVALID]")["acc"] is True


# ------------------------------------------------------- the 300-character window


def test_window_is_300_code_points() -> None:
    assert WINDOW_CHARS == 300


@pytest.mark.parametrize(
    ("filler", "expected"),
    [
        # "Answer: 42" is 10 chars; 10 + "\n" + 289 "x" = 300 -> the window is the whole
        # string, so the answer (and not the earlier "Answer: 7", which lies outside) is read.
        (289, "42"),
        # One more filler char: total 301, the window drops the leading "A" and starts at
        # "nswer: 42" -> no match in the window; "Answer: 7" is further out -> "[INVALID]".
        (290, INVALID),
    ],
)
def test_answer_just_inside_vs_just_outside_the_window(filler: int, expected: str) -> None:
    response = "Answer: 7\n" + "Answer: 42" + "\n" + "x" * filler
    assert len(response) == 10 + 11 + filler
    assert pred_of(response) == expected


def test_window_counts_code_points_not_bytes() -> None:
    # "é" is 2 bytes in UTF-8 but one code point: "Answer: 9" (9 chars) + "\n" + 290 "é"
    # = 300 code points (591 bytes) -> still inside the window.
    assert pred_of("Answer: 9" + "\n" + "é" * 290) == "9"
    assert pred_of("Answer: 9" + "\n" + "é" * 291) == INVALID


# ---------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("Answer: 1\nAnswer: 2\nAnswer: 3", "3"),  # several lines: the last match wins
        ("answer : 5", "5"),  # case-insensitive, \s* before the colon
        ("ANSWER:5", "5"),  # no space needed
        ("Answer:\t\t6", "6"),  # \s* after the colon eats tabs
        ("Answer: 5", "5"),  # no newline at the end: [^\n]+ runs to the end of the string
        ("Answer:\n5", "5"),  # quirk: \s* crosses the newline, the capture is the next line
        ("Final Answer: 8\nThat is all.", "8"),  # only the Answer line is captured
        # Unicode case-insensitivity: U+017F (long s) folds to "s", so "Anſwer" matches.
        ("An\u017fwer: 4", "4"),
        # Non-overlapping: the first "Answer:" captures the rest of the line, "Answer: 5";
        # findall resumes after it. Normalising "Answer: 5": no "an "/"a " ("An" is
        # capitalised), spaces go -> "Answer:5"; nothing else applies.
        ("Answer: Answer: 5", "Answer:5"),
    ],
)
def test_extraction(response: str, expected: str) -> None:
    assert pred_of(response) == expected


def test_extract_answer_returns_raw_capture_or_none() -> None:
    assert extract_answer("x\nAnswer:  $\\frac{1}{2}$ \nmore") == "$\\frac{1}{2}$ "
    assert extract_answer("nothing to see") is None


# ------------------------------------------------------------------ normalisation


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        # --- text after the last "=" ---
        ("x = 5", "5"),  # split("=")[-1] = " 5" -> spaces removed -> "5"
        ("a = b = 7", "7"),  # last "=" wins
        ("5 = x", "x"),  # quirk: the right-hand side is kept even when it is the variable
        # --- "an " / "a " removal, anywhere (quirk) ---
        ("a 5", "5"),  # "a " -> "" -> "5"
        ("an 8", "8"),  # "an " -> "" -> "8"
        # "banana ": "an " needs a,n,space: (1,2,3)="ana", (3,4,5)="ana" -> none. "a " at
        # (5,6) -> "banan".
        ("banana ", "banan"),
        ("Canada 3", "Canad3"),  # "a " at the end of "Canada" -> "Canad3"
        # --- "$" handling ---
        ("$5$", "5"),  # first pair kept -> "$5$" -> "$" deleted
        # "$1$ and $2$": "and" has no "an " ("an" then "d"); spaces -> "$1$and$2$";
        # the first pair swallows the rest of the line -> "$1$" -> "1".
        ("$1$ and $2$", "1"),
        # "$$5$$": the first pair is the empty "$$" (lazy) and ".*" eats "5$$" -> "$$" -> "".
        ("$$5$$", ""),
        ("$5", "5"),  # a single "$" is only deleted
        ("$5.$", "5"),  # ".$" -> "$" gives "$5$" -> "5"
        ("\\$5", "5"),  # "\$" -> "" (before the pair step)
        # "The value is $x^2$ here": no "an "/"a " ("value", "is"); spaces go ->
        # "Thevalueis$x^2$here" -> first pair -> "$x^2$" -> "x^2".
        ("The value is $x^2$ here", "x^2"),
        # Only on the ground-truth side can a newline occur: "." does not cross it, so each
        # line keeps its own first pair: "$1$\n$2$" -> "1\n2" (not digits) -> strip -> "1\n2".
        ("$1$\n$2$", "1\n2"),
        # --- commas ---
        ("1,000", "1000"),  # "1000".isdigit() -> commas dropped
        ("1,2", "12"),  # quirk: any comma-separated digits collapse
        ("(1,2)", "(1,2)"),  # "(12)" is not all digits -> commas kept
        ("1,000.5", "1,000.5"),  # "1000.5" is not all digits
        ("1{,}000", "1000"),  # "{,}" removed
        ("1,\\!000", "1000"),  # ",\!" removed
        # --- unicode digits: str.isdigit is True for superscripts and other scripts ---
        ("1,\u00b2", "1\u00b2"),  # "1²".isdigit() is True -> comma dropped -> "1²"
        ("\u0661,\u0660\u0660\u0660", "\u0661\u0660\u0660\u0660"),  # Arabic-Indic 1,000 -> "١٠٠٠"
        ("\u00bd", "\u00bd"),  # "½".isdigit() is False; kept as is
        # --- units and the removal list ---
        ("5 degrees", "5"),  # spaces -> "5degrees" -> "degrees" removed
        ("90^\\circ", "90"),
        ("90^{\\circ}", "90"),
        # "10\text{ cm}": "\ " does not occur ("\t"), space -> "10\text{cm}" -> "cm"
        # removed -> "10\text{}" -> "\text{}" removed -> "10".
        ("10\\text{ cm}", "10"),
        # "7\mbox{ cm}" -> "7\mbox{cm}" -> mbox->text "7\text{cm}" -> "7\text{}" -> "7".
        ("7\\mbox{ cm}", "7"),
        # "5\text{ m}" -> "5\text{m}" -> "\text{m}"->"\text{}" -> removed -> "5".
        ("5\\text{ m}", "5"),
        # Order matters: "5\text{ m}^2" -> "5\text{}^2" -> "\text{}^2" is removed before the
        # bare "\text{}" -> "5" (the other order would leave "5^2").
        ("5\\text{ m}^2", "5"),
        ("12 inches", "12"),
        ("3 ways", "3"),
        ("\\$25 dollars", "25"),
        # "5\;\text{cm}" -> "cm" gone -> "5\;\text{}" -> "\text{}" gone -> "5\;" -> "\;" gone.
        ("5\\;\\text{cm}", "5"),
        ('"5"', "5"),  # quotes removed
        ("tissue", "tis"),  # quirk: "sue" is removed inside words
        # "1, 2, \ldots": spaces -> "1,2,\ldots" -> "\ldots" removed -> "1,2," -> "12" digits.
        ("1, 2, \\ldots", "12"),
        ("5\\text{\ns}", "5"),  # ground-truth only: "\text{<newline>s}" removed
        ("5\\mathrm{th}", "5"),
        # --- "and" ---
        ("x\\text{ and }y", "x,y"),  # -> "x\text{and}y" -> "\text{and}"->"," -> "x,y"
        ("x,\\text{ and }y", "x,y"),  # ",\text{and}" -> "," first, so no double comma
        ("1\\text{ and }2", "12"),  # -> "1,2" -> digits -> "12"
        # --- unwrapping ---
        ("\\text{(A)}", "(A)"),
        ("\\textbf{B}", "B"),
        ("0.\\overline{3}", "0.3"),
        ("\\boxed{5}", "5"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # greedy: up to the last "}"
        # Greedy quirk: "\boxed{5} \boxed{6}" -> spaces -> "\boxed{5}\boxed{6}" -> the one
        # match runs from the first "\boxed{" to the last "}" -> "5}\boxed{6".
        ("\\boxed{5} \\boxed{6}", "5}\\boxed{6"),
        # \text is unwrapped first: "\boxed{\text{(C)}}" -> "\boxed{(C)}" -> "(C)".
        ("\\boxed{\\text{(C)}}", "(C)"),
        # --- TeX shorthand ---
        ("\\frac12", "\\frac{1}{2}"),
        ("\\fracab", "\\frac{a}{b}"),
        ("\\frac123", "\\frac{1}{2}3"),  # only two characters are taken
        ("\\dfrac12", "\\dfrac{1}{2}"),  # matches the "frac" inside "dfrac"
        ("\\frac1{2}", "\\frac{1}{{}2}"),  # quirk: (.) takes the "{"
        ("\\frac{1}{2}", "\\frac{1}{2}"),  # braced: untouched
        ("\\sqrt3", "\\sqrt{3}"),
        ("2\\sqrt32", "2\\sqrt{3}2"),
        ("\\sqrt{3}", "\\sqrt{3}"),
        # --- leading zeros are kept ---
        ("007", "007"),
        # --- surrounding whitespace; the digit test happens before the strip (quirk) ---
        ("\t42\r", "42"),
        ("1,000\r", "1,000"),  # "1000\r".isdigit() is False -> comma kept -> strip -> "1,000"
    ],
)
def test_normalize_final_answer(raw: str, expected: str) -> None:
    assert normalize_final_answer(raw) == expected


def test_replacement_lists_are_ordered_tuples() -> None:
    assert isinstance(SUBSTITUTIONS, tuple) and isinstance(REMOVED_EXPRESSIONS, tuple)
    # "an " must come before "a " ("an 8" -> "8", not "n8"); ",\text{and}" before "\text{and}".
    subs = [before for before, _ in SUBSTITUTIONS]
    assert subs.index("an ") < subs.index("a ")
    assert subs.index(",\\text{and}") < subs.index("\\text{and}")
    assert REMOVED_EXPRESSIONS.index("\\text{}^2") < REMOVED_EXPRESSIONS.index("\\text{}")
    assert len(SUBSTITUTIONS) == 10 and len(REMOVED_EXPRESSIONS) == 41


# --------------------------------------------------------- end-to-end comparisons


@pytest.mark.parametrize(
    ("response", "ground_truth", "acc"),
    [
        ("Answer: 007", "7", False),  # "007" != "7": exact string match, no numeric parse
        ("Answer: 007", "007", True),
        ("Answer: x = 5", "5", True),
        ("Answer: x=5", "y = 5", True),  # both sides keep only the text after "="
        ("Answer: 1000", "1,000", True),  # ground truth normalised too: "1,000" -> "1000"
        ("Answer: 5", "\\boxed{5}", True),  # ground truth "\boxed{5}" -> "5"
        ("Answer: 5", "5 degrees", True),
        ("Answer: $\\frac12$", "\\frac{1}{2}", True),  # "$\frac12$" -> "\frac{1}{2}"
        ("Answer: \\boxed{\\frac{1}{2}}", "\\frac12", True),
        ("Answer: 0.5", "\\frac{1}{2}", False),  # no numeric equivalence
        ("Answer: $$5$$", "5", False),  # "$$5$$" -> "" (see above)
        ("Answer: \u0661,\u0660\u0660\u0660", "1000", False),  # "١٠٠٠" != "1000"
        ("Answer: 42\r\n", "42", True),  # CRLF: "42\r" is stripped at the end
        ("Answer: 1,000\r\n", "1000", False),  # CRLF quirk: "1,000\r" keeps its comma
        ("Answer: 5\n\nI hope this helps!", "5", True),
    ],
)
def test_compute_score_cases(response: str, ground_truth: str, acc: bool) -> None:
    result = compute_score(response, ground_truth)
    assert result["acc"] is acc
    assert result["score"] == (1.0 if acc else -1.0)


# ------------------------------------------------------------------ hostile input


def _best_ms(fn: Callable[[str, str], object], response: str, truth: str) -> float:
    """Best of three wall times in ms (robust to a busy shared core)."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        fn(response, truth)
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def test_megabyte_of_answer_fragments_is_fast_and_reads_only_the_window() -> None:
    response = "Answer:" * 150_000  # 1.05 MB
    # Window = last 300 chars; 300 = 42*7 + 6 -> it starts with "nswer:" then 42 x "Answer:".
    # The first full "Answer:" captures the other 41 (no newline) -> pred "Answer:" * 41.
    assert pred_of(response) == "Answer:" * 41
    assert _best_ms(compute_score, response, "5") < 50.0


@pytest.mark.parametrize(
    "response",
    [
        "a" * 1_000_000,
        "\\boxed{" * 150_000,
        "Answer: " + "\\boxed{" * 150_000,
        "Answer: " + "$" * 1_000_000,
        "Answer" + " " * 1_000_000,
        "Answer: " + "\\frac" * 200_000,
    ],
    ids=["a", "boxed", "answer-boxed", "dollars", "spaces", "frac"],
)
def test_megabyte_hostile_inputs_score_in_milliseconds(response: str) -> None:
    assert compute_score(response, "5")["acc"] is False
    assert _best_ms(compute_score, response, "5") < 50.0


# ------------------------------------------- linear normalisation, bit-identical to the release

# The released rule's rewrites, verbatim (verl math_dapo.py): the reference the scanners must equal.
RELEASED_REWRITES = (
    (r".*?\$(.*?)\$.*", r"$\1$"),
    (r"\\text\{(.*?)\}", r"\1"),
    (r"\\textbf\{(.*?)\}", r"\1"),
    (r"\\overline\{(.*?)\}", r"\1"),
    (r"\\boxed\{(.*)\}", r"\1"),
    (r"frac([^{])(.)", r"frac{\1}{\2}"),
    (r"sqrt([^{])", r"sqrt{\1}"),
)


def released_normalize(answer: str) -> str:
    """normalize_final_answer exactly as released (regular expressions and all)."""
    text = answer.split("=")[-1]
    for before, after in SUBSTITUTIONS:
        text = text.replace(before, after)
    for expr in REMOVED_EXPRESSIONS:
        text = text.replace(expr, "")
    for pattern, repl in RELEASED_REWRITES:
        text = re.sub(pattern, repl, text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


# Fragments that make every rewrite fire, fail, nest and cross lines.
FRAGMENTS = [
    "$", "$", "\n", "\\text{", "\\textbf{", "\\overline{", "\\boxed{", "}", "}", "{", "a", "1", " ", "=",
    ",", "\\", "\r", "frac", "sqrt", "\\frac12", "\\text", "an ", "\\$", "x",
]  # fmt: skip


@pytest.mark.slow
def test_each_rewrite_equals_the_released_regular_expression_on_random_text() -> None:
    rng = random.Random(0)
    assert [released for released, _ in TEX_REWRITES] == [f"{p} -> {r}" for p, r in RELEASED_REWRITES]
    for _ in range(8_000):
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 14)))
        for (pattern, repl), (_, rewrite) in zip(RELEASED_REWRITES, TEX_REWRITES, strict=True):
            assert rewrite(text) == re.sub(pattern, repl, text), (pattern, text)
        assert normalize_final_answer(text) == released_normalize(text), text


@pytest.mark.parametrize(
    "text",
    [
        "$a$b$\nc$d$\n$$5$$",  # first pair per line; "$$5$$" -> ""
        "\\text{\\text{a}}\n\\text{b",  # shortest, no nesting; an unclosed one stays
        "\\boxed{1}\\boxed{2}\n\\boxed{x\n}",  # greedy to the line's last "}"; never across "\n"
        "\\overline{1}}\\overline{",
    ],
)
def test_line_and_nesting_quirks_match_the_release(text: str) -> None:
    assert normalize_final_answer(text) == released_normalize(text)


@pytest.mark.parametrize(
    "ground_truth",
    [
        "7" * 20_000,  # released: 1.6 s (the first-$-pair regex retries from every position)
        "\\text{" * 3_000,  # every unclosed \text{ re-scanned the rest of the line
        "\\boxed{" * 3_000,
        "$" + "1" * 20_000,
    ],
    ids=["digits", "text", "boxed", "one-dollar"],
)
def test_normalisation_is_linear_in_the_ground_truth(ground_truth: str) -> None:
    # 20,000 characters: the released regular expressions need 0.2-1.6 s here, the
    # scanners under a millisecond; 0.1 s leaves a 100x margin for a busy machine.
    best = min(_timed(normalize_final_answer, ground_truth) for _ in range(3))
    assert best < 0.1


def _timed(fn: Callable[[str], object], text: str) -> float:
    start = time.perf_counter()
    fn(text)
    return time.perf_counter() - start


def test_ground_truth_over_the_cap_is_unscorable_and_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    # "5" padded with spaces normalises to "5": at the cap it still matches, one over it is unscorable
    at_cap = "5" + " " * (MAX_GROUND_TRUTH_CHARS - 1)
    assert compute_score("Answer: 5", at_cap) == {"score": 1.0, "acc": True, "pred": "5"}
    seen: list[int] = []
    real = math_dapo.normalize_final_answer
    monkeypatch.setattr(math_dapo, "normalize_final_answer", lambda text: seen.append(len(text)) or real(text))
    assert compute_score("Answer: 5", at_cap + " ") == {"score": -1.0, "acc": False, "pred": "5"}
    assert seen == [1]  # only the prediction was normalised
    seen.clear()
    assert compute_score("Answer: 5", "5" * 200_000)["acc"] is False  # the prepare-data row that hung eval
    assert seen == [1]


# ----------------------------------------------------------------------- real data


@pytest.mark.slow
def test_aime_ground_truths_are_fixed_points_and_score_themselves() -> None:
    if not DATA.is_dir():
        pytest.skip(f"shared data folder not found at {DATA}")
    from dapo_cli.data.schema import read_dapo_rows

    rows = read_dapo_rows(DATA / "aime-2024.parquet")
    truths = sorted({row["reward_model"]["ground_truth"] for row in rows})
    assert len(rows) == 960  # 30 problems x 32 copies
    assert len(truths) == 29  # two of the 30 problems share the answer 104
    for truth in truths:
        # AIME answers are integers 0..999 without leading zeros: every rule leaves them alone.
        assert normalize_final_answer(truth) == truth
        assert compute_score(f"Long reasoning...\nAnswer: {truth}", truth)["acc"] is True
        assert compute_score(f"Answer: 0{truth}", truth)["acc"] is False  # leading zero
