"""The exact integer value of an arithmetic answer such as ``12\\times18\\times11``, without eval.

    integer_value("12\\times18\\times11") == 2376      # 12 * 18 = 216, 216 * 11 = 2376
    integer_value("\\frac{12}{4}+2^{3}") == 11          # 3 + 8
    integer_value("\\frac{1}{2}") is None               # not an integer: the fraction rule takes it

A small recursive-descent reader over text already normalised by
:func:`~dapo_cli.rewards.math_equiv.normalize_text` (``$`` removed, ``\\dfrac`` → ``\\frac``,
``\\left(`` → ``(``, thousands commas and units dropped). Nothing is ever evaluated as
code (no ``eval``, ``sympify`` or ``parse_expr``); arithmetic is exact
(:class:`fractions.Fraction`). The grammar::

    sum      := product (("+" | "-") product)*
    product  := signed (("\\times" | "\\cdot" | "*" | "\\ast" | "/" | "\\div") signed)*
    signed   := ("+" | "-") signed | power
    power    := atom ("^" exponent)?
    exponent := one digit | "{" sum "}" | "(" sum ")"
    atom     := integer | "(" sum ")" | "{" sum "}" | "\\frac" "{" sum "}" "{" sum "}" | "\\sqrt" "{" sum "}"

An integer literal may end in ``.0`` (``27.0``); ``\\frac`` must divide exactly for the
whole to be an integer; ``\\sqrt`` takes perfect squares only. Deliberately refused
(None, so the caller's general parser decides): juxtaposition (``2\\frac{1}{2}`` is a
mixed number, ``2(3)`` is ambiguous), a bare multi-digit exponent (LaTeX reads ``2^10``
as :math:`2^1 0`), a chained ``a^b^c`` (a LaTeX error), decimals, letters.

Bounded work and memory whatever the text: at most :data:`MAX_EXPRESSION_CHARS`
characters and :data:`MAX_DEPTH` levels of nesting; every intermediate numerator and
denominator has at most :data:`MAX_BITS` bits, and a power is refused *before* it is
computed when :math:`|e| \\cdot \\mathrm{bits}(b)` would exceed that (so ``9^{9^{9}}``,
:math:`9^{387420489}`, is refused at once).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from fractions import Fraction

MAX_EXPRESSION_CHARS = 200
"""Longest (normalised) text evaluated; longer answers go to the general parser."""

MAX_DEPTH = 24
"""Deepest nesting of groups, fractions, roots, powers and signs."""

MAX_BITS = 512
"""Largest numerator or denominator of any intermediate value (about 154 decimal digits)."""

# ASCII digits only: int() would also read "١٢" (Arabic-Indic), which no model answers as 12
_TOKEN = re.compile(r"\s*(?:([0-9]+)(?:\.0*)?(?![0-9.])|(\\[A-Za-z]+)|([-+*/^(){}]))")
_COMMANDS = {"\\times": "*", "\\cdot": "*", "\\ast": "*", "\\div": "/", "\\frac": "frac", "\\sqrt": "sqrt"}


class _Refused(Exception):
    """The text is not an expression this reader takes (or is over a bound)."""


def _tokens(text: str) -> list[str]:
    """Integer literals, operators and the known commands of ``text``; _Refused for anything else."""
    tokens: list[str] = []
    position, end = 0, len(text.rstrip())
    while position < end:
        match = _TOKEN.match(text, position)
        if match is None:
            raise _Refused
        number, command, symbol = match.groups()
        if command is not None:
            if command not in _COMMANDS:
                raise _Refused
            tokens.append(_COMMANDS[command])
        else:
            tokens.append(number if number is not None else symbol)
        position = match.end()
    return tokens


def _bounded(value: Fraction) -> Fraction:
    if value.numerator.bit_length() > MAX_BITS or value.denominator.bit_length() > MAX_BITS:
        raise _Refused
    return value


class _Reader:
    """One pass over the tokens; each method reads one rule of the grammar in the module docstring."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.at = 0
        self.depth = 0

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise _Refused
        self.at += 1
        return token

    def nested(self, rule: Callable[[], Fraction]) -> Fraction:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Refused
        try:
            return rule()
        finally:
            self.depth -= 1

    def sum(self) -> Fraction:
        value = self.product()
        while self.peek() in ("+", "-"):
            sign = self.take()
            other = self.product()
            value = _bounded(value + other if sign == "+" else value - other)
        return value

    def product(self) -> Fraction:
        value = self.signed()
        while self.peek() in ("*", "/"):
            operator = self.take()
            other = self.signed()
            if operator == "/" and other == 0:
                raise _Refused
            value = _bounded(value * other if operator == "*" else value / other)
        return value

    def signed(self) -> Fraction:
        if self.peek() in ("+", "-"):
            sign = self.take()
            value = self.nested(self.signed)
            return -value if sign == "-" else value
        return self.power()

    def power(self) -> Fraction:
        base = self.atom()
        if self.peek() != "^":
            return base
        self.take("^")
        token = self.peek()
        if token in ("{", "("):
            exponent = self.nested(self.group)
        elif token is not None and token.isdigit() and len(token) == 1:
            exponent = Fraction(int(self.take()))
        else:
            raise _Refused  # 2^10 (LaTeX: 2^1 0), 2^-1, 2^\frac..: say it with braces
        if self.peek() == "^":
            raise _Refused  # a^b^c
        return _power(base, exponent)

    def group(self) -> Fraction:
        closer = {"(": ")", "{": "}"}[self.take()]
        value = self.sum()
        self.take(closer)
        return value

    def braced(self) -> Fraction:
        if self.peek() != "{":
            raise _Refused  # \frac12: the general parser reads the single-character forms
        return self.nested(self.group)

    def atom(self) -> Fraction:
        token = self.peek()
        if token is None:
            raise _Refused
        if token.isdigit():
            if len(token) * math.log2(10) > MAX_BITS:
                raise _Refused
            return Fraction(int(self.take()))
        if token in ("(", "{"):
            return self.nested(self.group)
        if token == "frac":
            self.take()
            numerator, denominator = self.braced(), self.braced()
            if denominator == 0:
                raise _Refused
            return _bounded(numerator / denominator)
        if token == "sqrt":
            self.take()
            return _square_root(self.braced())
        raise _Refused


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    """``base ** exponent`` for an integer exponent, refused before computing when it would be over :data:`MAX_BITS`."""
    if exponent.denominator != 1:
        raise _Refused
    e = exponent.numerator
    if base == 0:
        if e <= 0:
            raise _Refused  # 0^0, 0^{-1}
        return base
    if abs(base) == 1:
        return base if e % 2 else abs(base)
    size = max(base.numerator.bit_length(), base.denominator.bit_length())
    if abs(e) * (size - 1) > MAX_BITS:  # |b| >= 2^(size-1), so the result has at least |e|·(size-1) bits
        raise _Refused
    return _bounded(base**e)


def _square_root(value: Fraction) -> Fraction:
    """The square root of a perfect-square integer (anything else is refused)."""
    if value.denominator != 1 or value < 0:
        raise _Refused
    root = math.isqrt(value.numerator)
    if root * root != value.numerator:
        raise _Refused
    return Fraction(root)


def integer_value(text: str) -> int | None:
    """The integer value of ``text`` by the grammar above; None when it is not one (or is refused)."""
    if len(text) > MAX_EXPRESSION_CHARS or not text.strip():
        return None
    try:
        reader = _Reader(_tokens(text))
        value = reader.sum()
        if reader.peek() is not None:
            return None
    except _Refused:
        return None
    return value.numerator if value.denominator == 1 else None
