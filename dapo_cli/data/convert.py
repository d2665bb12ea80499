"""Turn a raw answer into an integer target, rewording the problem where needed.

DAPO trains on integer answers only (Yu et al. 2025, §3 "Dataset transformation"):
an answer such as :math:`\\frac{a+\\sqrt{b}}{c}` becomes the question "find
:math:`a+b+c`", so a rule-based verifier can compare integers. The answer is read
with the safe parser :func:`~dapo_cli.rewards.math_equiv.parse_answer` and
classified into one of :data:`CONVERSIONS`:

==========  ==================================================  =============================
conversion  value                                               target
==========  ==================================================  =============================
integer     an integer literal (``27``, ``27.0``, ``1,000``,     the integer itself; problem
            ``$27$``, ``27^\\circ``, ``27\\text{ cm}``)           unchanged
expression  an integer-valued expression                        its value; problem unchanged
            (``12\\times18\\times11``, ``2^{10}``, ``\\frac{12}{4}``)
fraction    :math:`\\pm m/n`, :math:`\\gcd(m,n)=1`, :math:`n>1`   :math:`m+n`
surd        :math:`(a+b\\sqrt c)/d` with :math:`b\\ne0`, c>1      :math:`|a|+|b|+c+d` (terms with
            square-free, :math:`\\gcd(a,b,d)=1`, :math:`d\\ge1`    a = 0 or d = 1 are left out)
pi          :math:`\\pm (m/n)\\,\\pi`                              :math:`m+n` (:math:`m` if n = 1)
==========  ==================================================  =============================

The sentence appended to the problem states the form with explicit signs and the
conditions that make the representation unique (for the surd form: the value
:math:`p+q\\sqrt c` fixes rational p, q and square-free c; then
:math:`d=\\operatorname{lcm}(\\operatorname{den} p, \\operatorname{den} q)`,
:math:`a=pd`, :math:`b=qd` is the only choice with :math:`\\gcd(a,b,d)=1`).
Letters are chosen so as not to clash with letters the problem already uses in
its mathematics (``m, n`` → ``p, q`` → …).

Integers and integer-valued expressions are read first by the exact, bounded reader
:func:`~dapo_cli.data.expressions.integer_value` (no sympy: the common case stays
fast); an expression keeps its own conversion name, ``expression``, so its rows can be
found and filtered (``extra_info.conversion``): its value is the target, which is not
always what the problem asks for (Gaokao 2023 line 368 asks for the dimensions of a box,
``12\\times18\\times11``, and gets the target 2376). An integer value that reader does
not take (``\\sqrt[3]{8}``, a power over its bounds) is dropped as ``integer_expression``.
Everything else is dropped with a reason code from :data:`DROP_REASONS`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import sympy

from dapo_cli.data.expressions import integer_value
from dapo_cli.rewards.bounds import MAX_GROUND_TRUTH_CHARS
from dapo_cli.rewards.math_equiv import (
    MAX_CHARS,
    canonical_string,
    is_small,
    normalize_text,
    parse_answer,
)

CONVERSIONS: tuple[str, ...] = ("integer", "expression", "fraction", "surd", "pi")
"""How a kept answer became an integer, in the order of the summary table."""

MAX_PROBLEM_CHARS = 32_768
"""Longest problem text kept (``problem_too_long`` beyond).

Every per-row step is linear in the text, so this bounds the work and memory of one
row rather than rescuing a slow step. 32,768 characters is ~8,000 tokens at the 3-4
characters per token of English and LaTeX: four times DAPO's 2,048-token prompt limit
(``data.max_prompt_length``, past which training drops the prompt anyway) and 28 times
the longest problem of the public sets (1,144 characters, Gaokao 2023).
"""

DROP_REASONS: dict[str, str] = {
    "no_problem": "the record has no problem text",
    "problem_too_long": f"the problem text is over {MAX_PROBLEM_CHARS:,} characters (a prepared row's prompt: over that plus the DAPO instruction)",
    "no_answer": "no answer found (empty answer, no \\boxed{} in the solution)",
    "answer_too_long": f"the answer is over {MAX_CHARS} characters (a prepared ground truth: over {MAX_GROUND_TRUTH_CHARS:,})",
    "choice": "a multiple-choice letter such as (A)",
    "text": "the answer is words, not mathematics",
    "multiple_answers": "several answers (joined by 'or'/'and', or a list holding more than one)",
    "equation_or_inequality": "an equation or inequality (=, <, \\le, ...)",
    "interval_or_set": "an interval or set ([a, b), \\{...\\}, \\cup, \\infty)",
    "scientific_notation": "an approximate magnitude such as 4.5e33 or 3\\times10^{8}",
    "unparseable": "the safe parser cannot read it",
    "tuple": "a tuple or list of values",
    "has_variables": "the answer contains variables",
    "complex": "a non-real complex number",
    "non_integer_decimal": "a non-integer decimal (approximate, e.g. 1.6)",
    "integer_expression": "an integer value the exact expression reader does not take (e.g. \\sqrt[3]{8}, 2^{1000})",
    "irrational": "a real number with no supported integer form (e.g. e^{-1}, \\sqrt{2}+\\sqrt{3})",
    "duplicate": "an earlier row has the same problem text (case and whitespace folded) and ground truth",
    "conflicting_duplicate": "the problem text also appears with another ground truth (all its rows are dropped)",
    "non_integer_ground_truth": "a prepared row whose reward_model.ground_truth is not an integer",
    "empty_prompt": "a prepared row with an empty prompt",
    "malformed_row": "a prepared row whose prompt, reward_model or extra_info does not have the DAPO schema's types",
    "limit": "beyond --limit",
}
"""Every reason a row can be dropped for, with its meaning (shown by the summary and docs)."""


MAX_SURD_RADICAND = 10**12
"""Square-freeness is checked by factoring, so the radicand c is kept small."""

LETTER_SETS: dict[int, tuple[tuple[str, ...], ...]] = {
    1: (("k",), ("n",), ("t",)),
    2: (("m", "n"), ("p", "q"), ("u", "v"), ("j", "k")),
    3: (("a", "b", "c"), ("p", "q", "r"), ("u", "v", "w"), ("j", "k", "l")),
    4: (("a", "b", "c", "d"), ("p", "q", "r", "s"), ("j", "k", "m", "n"), ("t", "u", "v", "w")),
}
"""Letter names for the unknowns of a form, tried in order; the first set the problem does not use wins."""

_CHOICE = re.compile(r"\(?[A-Z]\)?")
_JOINED = re.compile(r"(?<![A-Za-z\\])(?:or|and)(?![A-Za-z])")
_RELATION = re.compile(r"[=<>≤≥≠]|\\(?:le|ge|leq|geq|neq|ne|lt|gt|approx|sim|equiv|Rightarrow|implies)(?![a-zA-Z])")
_SET = re.compile(r"\\infty|∞|\\cup|\\cap|\\\{|\\\}|\\in(?![a-zA-Z])|\\emptyset|\\varnothing|\\mathbb|\\setminus")
_INTERVAL = re.compile(r"^[\[(].*,.*[\])]$")
_SCIENTIFIC = re.compile(r"(?<![A-Za-z])\d\.?\d*\s*[eE][+-]?\d|(?:\\times|\\cdot|\*)\s*10\s*\^")
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{4,}")
_DECIMAL = re.compile(r"\d\.|\.\d")
_INTEGER_LITERAL = re.compile(r"[+-]?\d+(?:\.0*)?")
_SEGMENT_OPENER = re.compile(r"\$|\\[(\[]")


@dataclass(frozen=True)
class Converted:
    """A kept answer: the problem as it will be asked, its integer target and how it was derived."""

    problem: str
    ground_truth: str
    conversion: str
    canonical: str
    """The parsed answer, canonically printed (LaTeX)."""


@dataclass(frozen=True)
class Dropped:
    """A dropped row: a key of :data:`DROP_REASONS` and a short detail."""

    reason: str
    detail: str = ""


# ---------------------------------------------------------------------------
# Classification


def _text_reason(answer: str, normalized: str | None) -> str | None:
    """Reasons that are visible in the text itself, before any parsing."""
    bare = re.sub(r"\\text(?:bf)?\{([^{}]*)\}", r"\1", answer).replace("$", "")
    if _CHOICE.fullmatch("".join(bare.split())):
        return "choice"
    if _JOINED.search(bare):
        return "multiple_answers"
    if _RELATION.search(answer):
        return "equation_or_inequality"
    if _SET.search(answer) or (normalized is not None and _INTERVAL.match(normalized) and re.search(r"[\[\]]", normalized)):
        return "interval_or_set"
    if normalized is None:
        return "unparseable"
    if not normalized:
        return "text" if re.search(r"[A-Za-z]", answer) else "unparseable"
    if _SCIENTIFIC.search(normalized):
        return "scientific_notation"
    if _WORD.search(normalized):
        return "text"
    return None


def _names_variables(normalized: str) -> bool:
    """Whether the text names a variable, even one that cancels (``I(0)`` parses to 0)."""
    bare = re.sub(r"\\(?:frac|sqrt|pi|cdot|times|div|ast)(?![a-zA-Z])", " ", normalized)
    if re.search(r"\\[A-Za-z]", bare):  # a Greek letter
        return True
    return bool(set(re.findall(r"[A-Za-z]", bare)) - {"e", "i"})


def _simplified(value: sympy.Expr) -> sympy.Expr:
    """Denominators rationalised and products expanded, when the expression is small enough."""
    if not is_small(value):
        return value
    return sympy.expand(sympy.radsimp(value))


def _is_square_free(c: int) -> bool:
    return all(exponent == 1 for exponent in sympy.factorint(c).values())


def surd_parts(value: sympy.Expr) -> tuple[int, int, int, int] | None:
    """(a, b, c, d) with ``value`` = (a + b√c)/d, b ≠ 0, c > 1 square-free, d ≥ 1, gcd(a, b, d) = 1; else None.

    ``value`` must already be simplified (:func:`_simplified`): a rational part and
    one rational multiple of a square root of an integer.
    """
    terms = dict(value.as_coefficients_dict())
    rational = terms.pop(sympy.S.One, sympy.S.Zero)
    if len(terms) != 1:
        return None
    ((radical, coefficient),) = terms.items()
    if not (isinstance(radical, sympy.Pow) and radical.exp == sympy.S.Half and radical.base.is_Integer):
        return None
    c = int(radical.base)
    if not (1 < c <= MAX_SURD_RADICAND and _is_square_free(c)):
        return None
    if not (rational.is_Rational and coefficient.is_Rational):
        return None
    d = math.lcm(int(rational.q), int(coefficient.q))
    return int(rational * d), int(coefficient * d), c, d


def _pi_multiple(value: sympy.Expr) -> sympy.Rational | None:
    ratio = value / sympy.pi
    return ratio if ratio.is_Rational and ratio != 0 else None


# ---------------------------------------------------------------------------
# Rewording


def math_segments(text: str) -> list[str]:
    """The contents of the ``$$…$$``, ``$…$``, ``\\(…\\)`` and ``\\[…\\]`` segments of ``text``, in order.

    The same segments as ``re.finditer(r"\\$\\$(.+?)\\$\\$|\\$(.+?)\\$|\\\\\\((.+?)\\\\\\)|\\\\\\[(.+?)\\\\\\]",
    text, re.DOTALL)`` (leftmost opener, the first alternative that closes, the shortest
    non-empty content), in linear time: that expression re-scans the rest of the text
    from every opener that never closes (16.9 s for 40,000 ``\\(``), whereas here the
    next occurrence of each closer is looked up once per position it moves to.
    """
    segments: list[str] = []
    found: dict[str, int] = {}  # closer -> its first occurrence at or after the last bound asked (-1: none)

    def next_closer(closer: str, lower: int) -> int:
        # bounds asked for one closer only grow (opener position + a fixed offset), so a cached hit at
        # or after ``lower`` is still the first one, and a cached miss stays a miss
        cached = found.get(closer, -2)
        if cached == -1 or cached >= lower:
            return cached
        found[closer] = text.find(closer, lower)
        return found[closer]

    opener = _SEGMENT_OPENER.search(text)
    while opener is not None:
        p = opener.start()
        match: tuple[int, int, int] | None = None  # (content start, content end, match end)
        if text.startswith("$$", p) and (q := next_closer("$$", p + 3)) >= 0:
            match = (p + 2, q, q + 2)
        elif text[p] == "$" and (q := next_closer("$", p + 2)) >= 0:
            match = (p + 1, q, q + 1)
        elif text[p] == "\\" and (q := next_closer("\\)" if text[p + 1] == "(" else "\\]", p + 3)) >= 0:
            match = (p + 2, q, q + 2)
        if match is None:
            opener = _SEGMENT_OPENER.search(text, p + 1)
        else:
            segments.append(text[match[0] : match[1]])
            opener = _SEGMENT_OPENER.search(text, match[2])
    return segments


def math_letters(problem: str) -> set[str]:
    """Lower-case letters the problem uses as mathematics.

    Every letter inside ``$…$``, ``\\(…\\)`` or ``\\[…\\]`` (command names such as
    ``\\sqrt`` excluded); in a problem without such delimiters, every single-letter word.
    Linear in ``len(problem)``.
    """
    segments = math_segments(problem)
    if segments:
        return set(re.findall(r"[a-z]", re.sub(r"\\[A-Za-z]+", " ", " ".join(segments))))
    return set(re.findall(r"(?<![A-Za-z\\])[a-z](?![A-Za-z])", problem))


def pick_letters(problem: str, count: int) -> tuple[str, ...]:
    """The first of :data:`LETTER_SETS` [count] whose letters the problem does not use (else the first)."""
    used = math_letters(problem)
    options = LETTER_SETS[count]
    return next((letters for letters in options if not used.intersection(letters)), options[0])


def _join(names: tuple[str, ...]) -> str:
    """``$a$``, ``$a$ and $b$``, ``$a$, $b$, and $c$``."""
    quoted = [f"${n}$" for n in names]
    if len(quoted) <= 2:
        return " and ".join(quoted)
    return ", ".join(quoted[:-1]) + ", and " + quoted[-1]


def _sentence(form: str, conditions: str, names: tuple[str, ...]) -> str:
    return f"The answer can be written as ${form}$, where {conditions}. Find ${'+'.join(names)}$."


def fraction_instruction(negative: bool, problem: str) -> str:
    """Ask for m+n of ±m/n."""
    m, n = pick_letters(problem, 2)
    form = ("-" if negative else "") + f"\\frac{{{m}}}{{{n}}}"
    return _sentence(form, f"{_join((m, n))} are relatively prime positive integers", (m, n))


def pi_instruction(ratio: sympy.Rational, problem: str) -> str:
    """Ask for k of ±kπ, or m+n of ±mπ/n."""
    sign = "-" if ratio < 0 else ""
    if ratio.q == 1:
        (k,) = pick_letters(problem, 1)
        return _sentence(f"{sign}{k}\\pi", f"${k}$ is a positive integer", (k,))
    m, n = pick_letters(problem, 2)
    return _sentence(f"{sign}\\frac{{{m}\\pi}}{{{n}}}", f"{_join((m, n))} are relatively prime positive integers", (m, n))


def surd_instruction(a: int, b: int, d: int, problem: str) -> str:
    """Ask for the sum of the positive integers of (a + b√c)/d written with explicit signs."""
    square_free = "is not divisible by the square of any prime"
    if a == 0:
        names = pick_letters(problem, 2 if d == 1 else 3)
        coef, root = names[0], names[1]
        term = f"{coef}\\sqrt{{{root}}}"
        sign = "-" if b < 0 else ""
        if d == 1:
            return _sentence(sign + term, f"{_join(names)} are positive integers and ${root}$ {square_free}", names)
        den = names[2]
        conditions = f"{_join(names)} are positive integers, ${root}$ {square_free}, and ${coef}$ and ${den}$ are relatively prime"
        return _sentence(f"{sign}\\frac{{{term}}}{{{den}}}", conditions, names)
    names = pick_letters(problem, 3 if d == 1 else 4)
    whole, coef, root = names[0], names[1], names[2]
    term = f"{coef}\\sqrt{{{root}}}"
    if a > 0:
        numerator, outside = f"{whole}{'+' if b > 0 else '-'}{term}", ""
    elif b > 0:
        numerator, outside = f"{term}-{whole}", ""
    else:
        numerator, outside = f"{whole}+{term}", "-"
    if d == 1:
        form = f"-{whole}-{term}" if outside else numerator
        return _sentence(form, f"{_join(names)} are positive integers and ${root}$ {square_free}", names)
    den = names[3]
    conditions = (
        f"{_join(names)} are positive integers, ${root}$ {square_free}, "
        f"and the greatest common divisor of {_join((whole, coef, den))} is $1$"
    )
    return _sentence(f"{outside}\\frac{{{numerator}}}{{{den}}}", conditions, names)


def reword(problem: str, instruction: str) -> str:
    """The problem with the instruction appended (one space apart); unchanged when there is none."""
    return f"{problem.rstrip()} {instruction}" if instruction else problem


# ---------------------------------------------------------------------------
# Entry point


def convert(problem: str, answer: str | None) -> Converted | Dropped:
    """Classify ``answer`` and, when it has an integer form, return the reworded problem and target.

    Linear in ``len(problem)``; a problem over :data:`MAX_PROBLEM_CHARS` or an answer over
    :data:`~dapo_cli.rewards.math_equiv.MAX_CHARS` characters is dropped before any parsing.
    """
    if not problem.strip():
        return Dropped("no_problem")
    if len(problem) > MAX_PROBLEM_CHARS:
        return Dropped("problem_too_long", f"{len(problem)} characters")
    if answer is None or not answer.strip():
        return Dropped("no_answer")
    answer = answer.strip()
    if len(answer) > MAX_CHARS:
        return Dropped("answer_too_long", f"{len(answer)} characters")
    normalized = normalize_text(answer)
    reason = _text_reason(answer, normalized)
    if reason is not None:
        return Dropped(reason, answer)
    assert normalized is not None  # _text_reason returns "unparseable" otherwise
    exact = integer_value(normalized)
    if exact is not None:
        conversion = "integer" if _INTEGER_LITERAL.fullmatch("".join(normalized.split())) else "expression"
        return Converted(problem, str(exact), conversion, str(exact))
    parsed = parse_answer(answer)
    if parsed is None:
        return Dropped("unparseable", answer)
    if isinstance(parsed, tuple):
        return Dropped("tuple", answer)
    if parsed.free_symbols or _names_variables(normalized):
        return Dropped("has_variables", answer)
    value = _simplified(parsed)
    if value.has(sympy.I):
        return Dropped("complex", answer)
    canonical = canonical_string(value)
    if value.is_Integer:
        if not _INTEGER_LITERAL.fullmatch("".join(normalized.split())):
            return Dropped("integer_expression", answer)
        return Converted(problem, str(int(value)), "integer", canonical)
    if _DECIMAL.search(normalized):
        return Dropped("non_integer_decimal", answer)
    if value.is_Rational:
        instruction = fraction_instruction(bool(value < 0), problem)
        return Converted(reword(problem, instruction), str(abs(int(value.p)) + int(value.q)), "fraction", canonical)
    parts = surd_parts(value)
    if parts is not None:
        a, b, c, d = parts
        instruction = surd_instruction(a, b, d, problem)
        return Converted(reword(problem, instruction), str(abs(a) + abs(b) + c + (d if d > 1 else 0)), "surd", canonical)
    ratio = _pi_multiple(value)
    if ratio is not None:
        target = abs(int(ratio.p)) + (int(ratio.q) if ratio.q > 1 else 0)
        return Converted(reword(problem, pi_instruction(ratio, problem)), str(target), "pi", canonical)
    return Dropped("irrational", answer)
